"""Every accelerator in the catalog predicts a training step and a serving step: finite, positive, and ordered by
its datasheet where two entries differ only in it."""

import math

import pytest

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cost.estimate import estimate
from meshplan.cost.serve_step import decode_time, step_context
from meshplan.spec.cluster import ClusterSpec, Pool
from meshplan.spec.plan import Plan
from meshplan.spec.serving import ServePlan

ACCELERATORS = [n for n in catalog.gpu_names() if n != "cpu"]


@pytest.mark.parametrize("name", ACCELERATORS)
def test_every_accelerator_trains_and_serves(name):
    gpu = catalog.gpu(name)
    model = catalog.model("llama3.2-1b")
    cluster = ClusterSpec(pools=(Pool(gpu=gpu, n_gpus=8, gpus_per_node=min(8, gpu.gpus_per_node)),))
    est = estimate(model, cluster, Plan(global_batch=16, seq_len=2048, dp=8, zero=1))
    assert 0 < est.step_time < math.inf
    ctx = step_context(model, cluster.pools[0], ServePlan(tp=1), catalog.engine("vllm"), load_constants())
    assert 0 < decode_time(ctx, batch=8, context=1024) < math.inf


def test_a_mi250x_is_counted_per_die():
    """Frontier-era runs count each of an MI250X's two dies as a GPU: the entry is half the package's datasheet
    (383 bf16 TFLOPS, 128 GB, 3.2768 TB/s)."""
    gcd = catalog.gpu("mi250x")
    assert gcd.peak_flops("bf16") == pytest.approx(383e12 / 2)
    assert gcd.hbm_bytes == pytest.approx(128e9 / 2)
    assert gcd.hbm_bandwidth == pytest.approx(3.2768e12 / 2)


def test_an_a800_is_an_a100_with_a_slower_nvlink():
    a800, a100 = catalog.gpu("a800"), catalog.gpu("a100-80gb")
    assert a800.peak_flops("bf16") == a100.peak_flops("bf16") and a800.hbm_bandwidth == a100.hbm_bandwidth
    assert a800.intra_bandwidth == pytest.approx(a100.intra_bandwidth * 400 / 600)

"""Layer separation (Stanza): a few GPUs of a data-parallel job hold the vocabulary layers, the rest the blocks.
The step is assembled from its parts as the module says, the parts follow their closed forms, what moves is the
vocabulary's gradient traffic, bad requests are refused in one line, and `estimate` and `plan` report it."""

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import catalog
from meshplan.cost.calib import gpu_calibration
from meshplan.cost.comm import collective_time
from meshplan.cost.estimate import estimate
from meshplan.cost.layer_separation import (
    best_separation,
    blocks_only,
    dense_options,
    separated_step,
    vocabulary_params,
)
from meshplan.cost.memory import bytes_per_param, layer_params
from meshplan.errors import SpecError
from meshplan.spec.cluster import GroupLink
from meshplan.spec.io import cluster_from_dict
from meshplan.spec.plan import Plan

MODEL = "llama3.2-1b"
STACK = catalog.framework("meshplan")


def cluster(fabric_gb_s: float):
    """Eight 8-GPU A100 machines whose scale-out link gives each GPU ``fabric_gb_s``."""
    return cluster_from_dict({"pools": [{"gpu": "a100-40gb", "n_gpus": 64, "gpus_per_node": 8, "levels": [
        {"name": "nvlink", "span": 8, "bandwidth_gb_s": 300, "latency_us": 3},
        {"name": "fabric", "span": 64, "bandwidth_gb_s": fabric_gb_s, "latency_us": 10}]}]}, catalog.gpu)


BASE = Plan(global_batch=64, seq_len=2048, dp=64, framework="meshplan")


def test_step_is_the_pipeline_plus_the_slower_sync():
    sep = separated_step(catalog.model(MODEL), cluster(0.2), BASE, stack=STACK, dense_workers=8)
    assert (sep.light_workers, sep.micro_batches) == (56, 2)  # ceil(64 / 56) micro-batches of one sample
    pipe = sep.micro_batches * max(sep.light_compute, sep.dense_compute, sep.exchange) + sep.fill
    assert sep.step_time == pytest.approx(pipe + max(sep.light_sync, sep.dense_sync) + sep.optimizer + sep.overhead)
    assert sep.bound == "exchange"  # 0.2 GB/s per GPU: the activations' trips pace it


def test_exchange_is_four_hidden_state_trips_over_the_busier_nic():
    model, clu = catalog.model(MODEL), cluster(1.0)
    sep = separated_step(model, clu, BASE, stack=STACK, dense_workers=4)
    x = 1 * 2048 * model.hidden * 2.0  # one micro-batch's bf16 hidden states
    link = GroupLink(bandwidth=1.0e9, latency=10e-6, level="fabric")
    cal = gpu_calibration(catalog.gpu("a100-40gb"))
    hop = collective_time("send_recv", x, size=2, link=link, calib=cal)
    assert hop == pytest.approx(10e-6 + x / (1.0e9 * cal.inter_eff), rel=1e-9)  # one message at the NIC's share
    # each dense worker serves 60 / 4 light workers: two tensors out and two in per micro-batch each
    assert sep.exchange == pytest.approx(2 * hop * 60 / 4)
    assert sep.fill == pytest.approx(3 * hop + sep.dense_compute / 15)


def test_light_workers_reduce_only_the_blocks():
    model, clu = catalog.model(MODEL), cluster(0.5)
    blocks = blocks_only(model)
    assert vocabulary_params(model, BASE) == model.vocab * model.hidden  # Llama-3.2-1B ties its embedding
    whole = estimate(model, clu, BASE, stack=STACK)
    light = estimate(blocks, clu, BASE, stack=STACK)
    layers = sum(b.n_layers * sum(layer_params(b.layer)) for b in model.blocks)
    share = (layers + vocabulary_params(blocks, BASE)) / (layers + vocabulary_params(model, BASE))
    # On a slow network the all-reduce is bandwidth-bound: it shrinks by the vocabulary's share of the gradients
    assert light.time.dp_comm / whole.time.dp_comm == pytest.approx(share, rel=0.02)
    assert 0.75 < share < 0.85  # Llama-3.2-1B: the tied 128256 x 2048 embedding is ~21 % of its parameters


@settings(max_examples=20, deadline=None)
@given(m=st.sampled_from((1, 2, 4, 8, 16)), slow=st.floats(0.1, 5.0), fast_factor=st.floats(1.0, 20.0))
def test_more_bandwidth_never_slows_it_and_dense_work_splits(m, slow, fast_factor):
    model = catalog.model(MODEL)
    a = separated_step(model, cluster(slow), BASE, stack=STACK, dense_workers=m)
    b = separated_step(model, cluster(slow * fast_factor), BASE, stack=STACK, dense_workers=m)
    assert b.step_time <= a.step_time * (1 + 1e-9)
    one = separated_step(model, cluster(slow), BASE, stack=STACK, dense_workers=1)
    # a dense worker's head work is its share of the light workers' micro-batches
    assert a.dense_compute * m / a.light_workers == pytest.approx(one.dense_compute / one.light_workers)


def test_it_pays_on_a_weak_network_only():
    model = catalog.model(MODEL)
    weak, strong = cluster(0.2), cluster(25.0)
    on_weak = best_separation(model, weak, BASE, stack=STACK)
    on_strong = best_separation(model, strong, BASE, stack=STACK)
    assert on_weak.step_time < estimate(model, weak, BASE, stack=STACK).step_time
    assert on_strong.step_time > estimate(model, strong, BASE, stack=STACK).step_time  # 1/4 of the GPUs idle on
    assert dense_options(64) == (1, 2, 4, 8, 16) and dense_options(4) == (1,)  # the blocks


def test_dense_worker_memory_is_the_vocabulary_and_its_logits():
    model = catalog.model(MODEL)
    sep = separated_step(model, cluster(1.0), BASE, stack=STACK, dense_workers=4)
    light = estimate(blocks_only(model), cluster(1.0), BASE.with_(global_batch=128), stack=STACK)
    states = vocabulary_params(model, BASE) * sum(bytes_per_param(BASE, STACK))
    # one micro-batch's logits at the loss backward as the stack keeps them: meshplan's eager cross-entropy holds
    # the fp32 log-softmax, its gradient and the softmax backward's output, 12 bytes a logit (memory.logits_bytes)
    logits = 2048 * model.vocab * 12.0
    held = 2 * 15 * 2048 * model.hidden * 2.0  # the hidden states of the 15 light workers it serves, two each
    assert sep.dense_peak == pytest.approx(states + logits + held + light.memory.reserved)
    assert sep.light_peak == pytest.approx(light.peak_memory + light.memory.activations)  # two micro-batches
    assert sep.fits


@pytest.mark.parametrize("change, match", [
    (dict(tp=2, dp=32), "tp, pp, cp and ep 1 and zero 0"),
    (dict(zero=1), "zero 0"),
])
def test_refuses_what_it_does_not_split(change, match):
    with pytest.raises(SpecError, match=match):
        separated_step(catalog.model(MODEL), cluster(1.0), BASE.with_(**change), stack=STACK, dense_workers=2)


def test_a_batch_too_small_for_many_light_workers_takes_more_dense_ones():
    # 60 samples on 64 GPUs: 63 or 62 light workers would leave some without a sample, from 4 dense workers on
    # each light worker has one, and the search goes on past the counts it refuses
    model, plan = catalog.model(MODEL), BASE.with_(global_batch=60)
    with pytest.raises(SpecError, match="without a micro-batch"):
        separated_step(model, cluster(0.2), plan, stack=STACK, dense_workers=1)
    sep = best_separation(model, cluster(0.2), plan, stack=STACK)
    assert sep is not None and sep.dense_workers >= 4 and sep.light_workers <= 60


def test_refuses_too_many_dense_workers():
    with pytest.raises(SpecError, match="between 1 and 31"):
        separated_step(catalog.model(MODEL), cluster(1.0), BASE, stack=STACK, dense_workers=32)


def meshplan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshplan.cli", *args], capture_output=True, text=True, timeout=120)


def test_estimate_and_plan_report_it(tmp_path):
    proc = meshplan_cli("estimate", "--model", MODEL, "--gpus", "64xa100-40gb", "--global-batch", "64", "--seq-len",
                        "2048", "--framework", "meshplan", "--dense-workers", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    sep = json.loads(proc.stdout)["layer_separation"]
    assert sep["dense_workers"] == 8 and sep["light_workers"] == 56 and sep["fits"]
    bad = meshplan_cli("estimate", "--model", MODEL, "--gpus", "64xa100-40gb", "--global-batch", "64", "--seq-len",
                       "2048", "--tp", "2", "--dense-workers", "8")
    assert bad.returncode == 2 and "--dense-workers" in bad.stderr and "Traceback" not in bad.stderr
    none = meshplan_cli("estimate", "--model", MODEL, "--gpus", "64xa100-40gb", "--global-batch", "64", "--seq-len",
                        "2048", "--dense-workers", "0")
    assert none.returncode == 2 and "between 1 and 31" in none.stderr and "Traceback" not in none.stderr
    weak = tmp_path / "weak.toml"
    weak.write_text('[[pools]]\ngpu = "a100-40gb"\nn_gpus = 64\ngpus_per_node = 8\n'
                    '[[pools.levels]]\nname = "nvlink"\nspan = 8\nbandwidth_gb_s = 300\nlatency_us = 3\n'
                    '[[pools.levels]]\nname = "fabric"\nspan = 64\nbandwidth_gb_s = 0.2\nlatency_us = 10\n')
    # Under a data-parallel-only stack the winner is plain data parallelism, which layer separation beats here
    plan = meshplan_cli("plan", "--model", MODEL, "--cluster", str(weak), "--global-batch", "64", "--seq-len", "2048",
                        "--framework", "byteps")
    assert plan.returncode == 0, plan.stderr
    assert "layer separation (Stanza)" in plan.stdout and "faster than the winner" in plan.stdout
    pinned = meshplan_cli("plan", "--model", MODEL, "--cluster", str(weak), "--global-batch", "64", "--seq-len", "2048",
                          "--framework", "byteps", "--micro-batch", "1", "--json")
    assert pinned.returncode == 0 and "layer_separation" in json.loads(pinned.stdout)  # a pin it keeps
    from meshplan.cli.plan import separation_alternative
    from meshplan.search import SearchRequest, search

    model, clu = catalog.model(MODEL), cluster(0.2)
    req = SearchRequest(global_batch=64, seq_len=2048, framework=catalog.framework("meshplan"), pins={"tp": 2})
    assert separation_alternative(model, clu, req, search(model, clu, req)) is None  # a pin it would break


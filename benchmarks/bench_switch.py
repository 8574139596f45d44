#!/usr/bin/env python
"""The live switch on 4 CPU processes: measured against the storage route and against the transition model.

1. Calibration: a chain of 7 switches of a tiny model (every kind of layout change) fits this host's two
   switch overheads (fixed, per tensor) on top of the link figures ``meshplan calibrate`` measured.
2. Check: a small model's full training state (small-llama, 6 M parameters, 72 MB of fp32 weights and AdamW
   moments) switches FSDP dp4 <-> TP2+SP x PP2 several times; median measured seconds vs the calibrated
   prediction (target: within 30 %).
3. The same transition through storage: DCP save of A, a new torchrun job for B that loads it (launch, import,
   build, load); median of several runs (target: the live switch at least 5x faster).

Usage: python benchmarks/bench_switch.py [repeats] [local-profile.toml]
(without a profile, ``meshplan calibrate --nproc 4`` writes one first, about a minute)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from meshplan import catalog
from meshplan.calibrate.transition_fit import fit_pair
from meshplan.cost.calib import gpu_calibration
from meshplan.cost.state_layout import geometry, state_groups
from meshplan.cost.transition import Placement, transfer_bytes
from meshplan.cost.transition_time import Overhead, SwitchCosts, new_groups, switch_time
from meshplan.runtime.config import RunConfig
from meshplan.spec.cluster import Pool
from meshplan.spec.io import gpu_from_dict, read_file
from meshplan.spec.plan import Plan

NPROC = 4
CHAIN = (dict(dp=4, zero=3), dict(tp=2, sp=True, dp=2, zero=1), dict(pp=2, dp=2, zero=1, schedule="1f1b"),
         dict(pp=4, schedule="gpipe"), dict(cp=2, dp=2, zero=3), dict(dp=4, zero=3, dp_shard=2),
         dict(tp=2, sp=True, cp=2), dict(dp=4, zero=0))
A, B = dict(dp=4, zero=3), dict(tp=2, sp=True, pp=2, schedule="1f1b")


def plan(model: str, **kw) -> Plan:
    seq = 32 if model == "tiny-llama" else 128
    return Plan(global_batch=8, seq_len=seq, precision="fp32", **kw)


def launch(cfgs: list[RunConfig], tmp: Path) -> float:
    path = tmp / f"cfg-{time.monotonic_ns()}.json"
    path.write_text(json.dumps([json.loads(c.to_json()) for c in cfgs]))
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={NPROC}", "--monitor-interval=0.2", "-m", "meshplan.runtime.worker",
                           str(path)], capture_output=True, text=True, timeout=900,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        sys.exit(f"a benchmark job failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - began


def rows(cfg: RunConfig) -> list[dict]:
    return [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]


def chain_cfg(model: str, layouts, tmp: Path, name: str, steps_between: int = 1) -> RunConfig:
    plans = [plan(model, **kw) for kw in layouts]
    sw = tuple({"step": (i + 1) * steps_between, "plan": p.to_dict()} for i, p in enumerate(plans[1:]))
    return RunConfig(plan=plans[0], model=model, steps=len(plans) * steps_between + 1, out_dir=str(tmp / name),
                     timeout_s=300, switches=sw)


def predicted(model: str, pa: Plan, pb: Plan, pool: Pool, overhead: Overhead):
    spec, stack = catalog.model(model), catalog.framework("meshplan")
    ids = np.arange(pa.n_gpus)
    x = transfer_bytes(Placement(geometry(spec, pa, stack), ids), Placement(geometry(spec, pb, stack), ids),
                       tensors=state_groups(spec), lost_gpus=np.array([], dtype=np.int64),
                       domain=pool.network()[0].span)
    t = switch_time(x, phys_b=ids, pool=pool, calib=gpu_calibration(pool.gpu), costs=SwitchCosts(groups_prebuilt=True),
                    new_groups=new_groups(pb), overhead=overhead)
    return t, float(x.tensors.max())


class _Fit:
    """A fit_pair input: measured seconds, the model's seconds without overheads, the busiest rank's tensors."""

    def __init__(self, measured: float, base: float, tensors: float):
        self.measured, self.tensors = measured, tensors
        self.time = type("T", (), {"total_s": base})()


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    tmp = Path(tempfile.mkdtemp(prefix="bench-switch-"))
    profile = sys.argv[2] if len(sys.argv) > 2 else str(tmp / "local.toml")
    if len(sys.argv) <= 2:
        subprocess.run([sys.executable, "-m", "meshplan.cli", "calibrate", "--nproc", str(NPROC), "--out", profile],
                       check=True, capture_output=True)
    gpu = gpu_from_dict(read_file(profile), profile)
    pool = Pool(gpu=gpu, n_gpus=NPROC)
    zero = Overhead(fixed_s=0.0, per_tensor_s=0.0)

    chain = chain_cfg("tiny-llama", CHAIN, tmp, "chain")
    launch([chain], tmp)
    fits = []
    for r in (r for r in rows(chain) if "switch" in r):
        i = r["switch"]
        t, n = predicted("tiny-llama", plan("tiny-llama", **CHAIN[i - 1]), plan("tiny-llama", **CHAIN[i]), pool, zero)
        fits.append(_Fit(r["seconds"], t.total_s, n))
    over = fit_pair(fits)
    print(f"host overheads fitted on {len(fits)} tiny-model switches: fixed {over.fixed_s * 1e3:.1f} ms, per tensor "
          f"{over.per_tensor_s * 1e6:.1f} us (links from {profile}: {gpu.intra_bandwidth / 1e9:.2f} GB/s, "
          f"{gpu.intra_latency * 1e6:.0f} us)")

    flips = [A, B] * (repeats // 2 + 1)
    live_cfg = chain_cfg("small-llama", flips[:repeats + 1], tmp, "live", steps_between=1)
    launch([live_cfg], tmp)
    live = [r for r in rows(live_cfg) if "switch" in r]
    t_ab, _ = predicted("small-llama", plan("small-llama", **A), plan("small-llama", **B), pool, over)
    t_ba, _ = predicted("small-llama", plan("small-llama", **B), plan("small-llama", **A), pool, over)
    pred = [t_ab.total_s if i % 2 == 0 else t_ba.total_s for i in range(len(live))]
    ratios = [r["seconds"] / p for r, p in zip(live, pred)]
    live_total = [r["seconds"] + r["build_s"] for r in live]
    print(f"live switch small-llama FSDP dp4 <-> TP2+SP x PP2 ({live[0]['bytes'] / 1e6:.1f} MB moved): move "
          f"{statistics.median(r['seconds'] for r in live):.3f} s median of {len(live)}, predicted "
          f"{statistics.median(pred):.3f} s, measured/predicted {statistics.median(ratios):.2f} (target 0.7-1.3); "
          f"with building B beside A {statistics.median(live_total):.2f} s")

    dcp = []
    for k in range(repeats):
        ck = tmp / f"ckpt-{k}"
        save = RunConfig(plan=plan("small-llama", **A), model="small-llama", steps=1, out_dir=str(tmp / f"save{k}"),
                         checkpoint_dir=str(ck), timeout_s=300)
        launch([save], tmp)
        saved = next(r for r in rows(save) if "checkpoint_s" in r)["checkpoint_s"]
        load = RunConfig(plan=plan("small-llama", **B), model="small-llama", steps=2, out_dir=str(tmp / f"load{k}"),
                         checkpoint_dir=str(ck), resume=True, timeout_s=300)
        wall = launch([load], tmp)
        steps = sum(r["step_time_s"] for r in rows(load) if "step_time_s" in r and not r.get("summary"))
        dcp.append(saved + wall - steps)
    print(f"storage route (DCP save {saved:.2f} s + new job: launch, import, build, load): "
          f"{statistics.median(dcp):.2f} s median of {repeats}; live switch {statistics.median(live_total):.2f} s "
          f"with B's build: {statistics.median(dcp) / statistics.median(live_total):.1f}x faster (target 5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fit the two constants of a live switch that the links do not explain, from published switches.

A reshard pays, beyond its bytes over the links, a fixed part (planning the transfer, synchronising the ranks)
and a part per tensor it copies (slicing, packing, one batched send/recv entry and, for a generation engine, one
weight load per tensor): ``t = transfer + fixed_s + per_tensor_s * tensors(busiest rank)``. NeMo-RL's refits
(``transition_anchors.toml``, role ``fit``) span 400 to 48,000 tensors per rank at nearly constant bytes per
second, which separates the two; the other anchors are checks. Least squares on relative error, both constants
>= 0, one pair per GPU generation that has fit anchors (only Hopper so far), written to
``transition_constants.toml``.

Usage: python -m meshplan.calibrate.transition_fit [--write]
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from meshplan import catalog
from meshplan.cost.calib import gpu_calibration
from meshplan.cost.rankmap import choose_rank_map
from meshplan.cost.state_layout import geometry, state_groups, weights_only
from meshplan.cost.transition import Placement, transfer_bytes
from meshplan.cost.transition_time import Overhead, SwitchCosts, SwitchTime, new_groups, switch_time
from meshplan.spec.io import parse_gpus
from meshplan.spec.plan import Plan

CONSTANTS_FILE = "transition_constants.toml"


@dataclass(frozen=True)
class Priced:
    """One anchor under the model."""

    anchor: dict
    generation: str
    time: SwitchTime
    tensors: float
    moved: float
    max_in: float

    @property
    def measured(self) -> float:
        """Midpoint of the published range (s)."""
        lo, hi = self.anchor["measured"]
        return (lo + hi) / 2


def load_anchors() -> list[dict]:
    """The anchors file."""
    path = resources.files("meshplan.calibrate").joinpath("transition_anchors.toml")
    return tomllib.loads(path.read_text())["anchor"]


def price(anchor: dict, overhead: Overhead, costs: SwitchCosts | None = None) -> Priced:
    """The anchor's switch under the model (communicators built ahead, as every anchor runs)."""
    model = catalog.model(anchor["model"])
    stack = catalog.framework("megatron-core")
    pa = Plan(global_batch=256, seq_len=4096, **anchor["a"])
    pb = Plan(global_batch=256, seq_len=4096, **anchor["b"])
    pool = parse_gpus(f"{pa.n_gpus}x{anchor['gpu']}", catalog.gpu).pools[0]
    domain = pool.network()[0].span
    ga, gb = geometry(model, pa, stack), geometry(model, pb, stack)
    if anchor.get("weights_only"):
        gb = weights_only(gb)
    tensors = state_groups(model)
    none = np.array([], dtype=np.int64)
    rmap = choose_rank_map(ga, np.arange(pa.n_gpus), gb, usable=np.arange(pa.n_gpus), lost=none, domain=domain,
                           tensors=tensors)
    x = transfer_bytes(Placement(ga, np.arange(pa.n_gpus)), Placement(gb, rmap.phys), tensors=tensors,
                       lost_gpus=none, domain=domain)
    t = switch_time(x, phys_b=rmap.phys, pool=pool, calib=gpu_calibration(pool.gpu),
                    costs=costs or SwitchCosts(groups_prebuilt=True), new_groups=new_groups(pb), overhead=overhead)
    return Priced(anchor=anchor, generation=pool.gpu.generation, time=t, tensors=float(x.tensors.max()),
                  moved=x.moved, max_in=float((x.in_local + x.in_fabric).max()))


def fit_pair(priced: list[Priced]) -> Overhead:
    """(fixed_s, per_tensor_s) >= 0 minimising the squared relative error of the predicted switch times."""
    y = np.array([p.measured - p.time.total_s for p in priced])
    w = 1.0 / np.array([p.measured for p in priced])
    a = np.stack([np.ones(len(priced)), np.array([p.tensors for p in priced])], axis=1)
    best = None
    for cols in ((0, 1), (0,), (1,)):  # the unconstrained fit, or one constant at 0 when the other goes negative
        coef = np.zeros(2)
        sol, *_ = np.linalg.lstsq(a[:, cols] * w[:, None], y * w, rcond=None)
        coef[list(cols)] = sol
        if (coef < 0).any():
            continue
        err = float(np.sum(((a @ coef - y) * w) ** 2))
        if best is None or err < best[0]:
            best = (err, coef)
    coef = best[1] if best else np.zeros(2)
    return Overhead(fixed_s=float(coef[0]), per_tensor_s=float(coef[1]))


def fit(anchors: list[dict]) -> dict[str, Overhead]:
    """One Overhead per generation with fit anchors."""
    zero = Overhead(fixed_s=0.0, per_tensor_s=0.0)
    by_gen: dict[str, list[Priced]] = {}
    for a in anchors:
        if a.get("role") == "fit":
            p = price(a, zero)
            by_gen.setdefault(p.generation, []).append(p)
    return {gen: fit_pair(ps) for gen, ps in by_gen.items()}


def constants_text(fitted: dict[str, Overhead], n_fit: int) -> str:
    """The constants file."""
    lines = [f"# Fitted by `python -m meshplan.calibrate.transition_fit --write` from {n_fit} published switches",
             "# (transition_anchors.toml, role = fit). Do not edit by hand: rerun the script.", ""]
    for gen, o in sorted(fitted.items()):
        lines += [f"[{gen}]", f"fixed_s = {o.fixed_s:.4g}", f"per_tensor_s = {o.per_tensor_s:.4g}", ""]
    return "\n".join(lines)


def report(anchors: list[dict], fitted: dict[str, Overhead]) -> list[str]:
    """Predicted vs published for every anchor, fit anchors also leave-one-out."""
    from meshplan.cost.transition_time import fitted_overhead

    fits = [a for a in anchors if a.get("role") == "fit"]
    out = [f"{'anchor':52s} {'role':5s} {'tensors':>8s} {'in GB':>7s} {'model s':>8s} {'LOO s':>7s}  published"]
    for a in anchors:
        p = price(a, fitted_overhead(catalog.gpu(a["gpu"]).generation, fitted))
        loo = ""
        if a.get("role") == "fit" and len(fits) > 2:
            rest = fit([f for f in fits if f is not a])
            loo = f"{price(a, rest.get(p.generation, Overhead(0.0, 0.0))).time.total_s:7.2f}"
        lo, hi = a["measured"]
        pub = f"{lo:g}-{hi:g} s" if lo != hi else f"{lo:g} s"
        out.append(f"{a['name'][:52]:52s} {a.get('role', ''):5s} {p.tensors:8.0f} {p.max_in / 1e9:7.2f} "
                   f"{p.time.total_s:8.2f} {loo:>7s}  {pub}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    anchors = load_anchors()
    fitted = fit(anchors)
    for gen, o in fitted.items():
        print(f"{gen}: fixed {o.fixed_s:.3f} s, per tensor {o.per_tensor_s * 1e6:.1f} us")
    print("\n".join(report(anchors, fitted)))
    if "--write" in args:
        n = sum(1 for a in anchors if a.get("role") == "fit")
        path = Path(__file__).with_name(CONSTANTS_FILE)
        path.write_text(constants_text(fitted, n))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

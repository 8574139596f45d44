"""Speed of the pipeline simulator (used inside search): events per second and wall time per case.

Run: python benchmarks/bench_sim.py. Prints figures only; no timing asserts.
"""

from __future__ import annotations

import time

from meshplan.cost.result import StageTimes
from meshplan.sim import build_graph, get_schedule, simulate_graph

CASES = (("1f1b", 8, 1, 64), ("interleaved_1f1b", 8, 2, 64), ("zb_h1", 8, 1, 64), ("zbv", 8, 2, 64),
         ("dualpipev", 8, 2, 64), ("1f1b", 64, 1, 1536), ("interleaved_1f1b", 64, 2, 1536),
         ("interleaved_1f1b", 64, 4, 1536))


def uniform(n_stages: int) -> StageTimes:
    """Equal stages: 10 ms forward, 10 ms I, 10 ms W, 0.2 ms sends, 1 GB activations."""
    return StageTimes(fwd=(0.01,) * n_stages, bwd_input=(0.01,) * n_stages, bwd_weight=(0.01,) * n_stages,
                      p2p=(2e-4,) * n_stages, act_bytes=(1e9,) * n_stages)


def run_case(name: str, pp: int, vpp: int, n_micro: int) -> str:
    """One line: generation, graph build and simulation times, events per second of the simulation."""
    t0 = time.perf_counter()
    sched = get_schedule(name, pp=pp, vpp=vpp, n_micro=n_micro)
    t1 = time.perf_counter()
    graph = build_graph(sched)
    t2 = time.perf_counter()
    tl = simulate_graph(graph, uniform(pp * vpp))
    t3 = time.perf_counter()
    ev = tl.n_events
    return (f"{name:17s} pp={pp:3d} v={vpp} m={n_micro:5d}  events={ev:8d}  generate {t1 - t0:6.3f} s  "
            f"graph {t2 - t1:6.3f} s  simulate {t3 - t2:6.3f} s  total {t3 - t0:6.3f} s  "
            f"{ev / (t3 - t2):10.0f} events/s (sim)  {ev / (t3 - t0):10.0f} events/s (all)  "
            f"bubble r0 {tl.bubble[0]:.4f}")


def main() -> None:
    """Print one line per case."""
    for case in CASES:
        print(run_case(*case), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Serving-search speed: the whole search (aggregated and disaggregated deployments, running-sequence caps) and
its explanation, median of repeated runs. Targets: Llama-3.1-70B on 8 H100 under 1 s; DeepSeek-V3 on 64 H200 with
disaggregation under 5 s.

Usage: python benchmarks/bench_serve.py [repeats]"""

import statistics
import sys
import time

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cost.serve_step import clear_memo
from meshplan.search.serve import search
from meshplan.search.serve_explain import explain
from meshplan.search.serve_request import ServeRequest, Slo
from meshplan.spec.serving import Workload

CASES = (
    ("llama3.1-70b", "8xh100-sxm", "bf16", Workload(input_len=1000, output_len=1000, concurrency=64),
     Slo(ttft=1.0, tpot=0.04), 1.0),
    ("llama3.1-70b", "8xh100-sxm", "bf16", Workload(input_len=1000, output_len=1000, concurrency=64),
     Slo(ttft=0.05, tpot=0.01), 5.0),  # nothing meets: the nearest option searches again
    ("deepseek-v3", "64xh200", "fp8", Workload(input_len=4000, output_len=1000, concurrency=512),
     Slo(ttft=2.0, tpot=0.05), 5.0),
)


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    consts = load_constants()
    print(f"{'case':58s} {'evaluated':>9s} {'median s':>9s} {'target s':>9s}  winner")
    for model, gpus, prec, work, slo, target in CASES:
        req = ServeRequest(model=catalog.model(model), cluster=catalog.cluster(gpus), engine=catalog.engine("vllm"),
                           work=work, slo=slo, precision=prec, constants=consts)
        times = []
        for _ in range(repeats):
            clear_memo()  # every run cold: the step-time memo would otherwise serve the repeats
            t = time.perf_counter()
            res = search(req)
            explain(res)
            times.append(time.perf_counter() - t)
        name = f"{model} {gpus} c={work.concurrency} ttft<={slo.ttft:g}s tpot<={slo.tpot:g}s"
        win = res.best.label() if res.best else "none meets"
        print(f"{name:58s} {len(res.candidates):9d} {statistics.median(times):9.2f} {target:9.1f}  {win}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

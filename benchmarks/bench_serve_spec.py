#!/usr/bin/env python
"""Speculative decoding against plain decoding on one replica, by load: the steady-state TPOT and output tokens/s
of Llama-3.1-70B on 8 H100 (vLLM 0.11 profile, TP 8, 1000-token prompts, 500-token replies) with no speculation,
an EAGLE head (3 drafts at 0.7 acceptance: 2.53 tokens a pass) and n-gram lookup at a low 0.3 acceptance, and
DeepSeek-V3 fp8 on 8 H200 (SGLang profile) with its MTP module (2 drafts at 0.85). Where the model says
speculation stops paying: the verifying pass runs k + 1 rows a sequence, free while the step streams weights,
not once the batch is compute-bound. Prints a table; no target (the acceptance is the user's data).

Usage: python benchmarks/bench_serve_spec.py"""

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cost.serve_load import predict_load
from meshplan.cost.serve_step import step_context
from meshplan.spec.serving import ServePlan, Workload
from meshplan.spec.speculation import Speculation

CASES = (
    ("llama3.1-70b", "8xh100-sxm", "vllm", ServePlan(tp=8, engine="vllm"), {
        "eagle k3 a0.7": Speculation(method="eagle", draft_tokens=3, acceptance=0.7),
        "ngram k3 a0.3": Speculation(method="ngram", draft_tokens=3, acceptance=0.3)}),
    ("deepseek-v3", "8xh200", "sglang", ServePlan(tp=8, ep=8, precision="fp8", engine="sglang"), {
        "mtp k2 a0.85": Speculation(method="mtp", draft_tokens=2, acceptance=0.85)}),
)
LOADS = (1, 8, 64, 256)


def main() -> int:
    consts = load_constants()
    for model, gpus, engine, plan, specs in CASES:
        m, pool, prof = catalog.model(model), catalog.cluster(gpus).pools[0], catalog.engine(engine)
        print(f"\n{model} on {gpus}, {engine} tp{plan.tp}: TPOT ms / output tokens/s by clients")
        print(f"{'':16s}" + "".join(f"{c:>20d}" for c in LOADS))
        for name, spec in {"none": None, **specs}.items():
            ctx = step_context(m, pool, ServePlan(**{**plan.__dict__, "speculation": spec}), prof, consts)
            preds = [predict_load(ctx, Workload(input_len=1000, output_len=500, concurrency=c)) for c in LOADS]
            print(f"{name:16s}" + "".join(f"{1e3 * p.tpot:>9.1f} / {p.output_tokens_per_s:>8,.0f}" for p in preds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

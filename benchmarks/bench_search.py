"""Search times of the planner on the issue's reference workloads (targets in seconds of wall time; the CPU
time is printed too, since other work on a shared machine stretches the wall time)."""

import time

from meshplan import catalog
from meshplan.search import SearchRequest, search
from meshplan.spec.model import decoder_model

CASES = (
    ("gpt3-175b", "1024xa100-80gb", 1536, 2048, 2.0),
    ("1t", "3072xa100-80gb", 1536, 2048, 2.0),
    ("llama3.1-405b", "16384xh100-sxm", 2048, 8192, 3.0),
    ("llama2-13b", "32xa100-80gb+32xh100-sxm+16xv100", 256, 4096, 10.0),
)


def model(name):
    """Catalog model, or the 1T GPT of Narayanan et al. 2021 Table 1 (128 layers, h=25600, 160 heads)."""
    if name == "1t":
        return decoder_model(name="gpt-1t", n_layers=128, hidden=25600, n_heads=160, n_kv_heads=160,
                             ffn_hidden=102400, vocab=51200, activation="gelu", norm="layernorm", bias=True,
                             tied_embeddings=True, position="learned", max_seq_len=2048)
    return catalog.model(name)


def main() -> None:
    for name, gpus, gb, seq, target in CASES:
        t, cpu = time.perf_counter(), time.process_time()
        res = search(model(name), catalog.cluster(gpus), SearchRequest(global_batch=gb, seq_len=seq, simulate=False))
        dt, cpu = time.perf_counter() - t, time.process_time() - cpu
        best = res.best
        what = f"{best.step_time:.2f} s/step on {best.cluster.describe()}" if best else "nothing fits"
        verdict = "OK " if dt < target else "SLOW"
        print(f"{name:14s} {gpus:34s} {dt:6.2f} s, CPU {cpu:5.2f} s (target {target:.0f} s) {verdict} "
              f"considered {res.considered}, evaluated {res.evaluated}; {what}")


if __name__ == "__main__":
    main()

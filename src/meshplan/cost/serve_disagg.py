"""Disaggregated serving: a prefill pool and a decode pool, each with its own layout, and the KV cache of every
prompt moved from one to the other over the cluster's links (DistServe, Zhong et al. OSDI'24; Splitwise, Patel
et al. ISCA'24; as vLLM's NixlConnector, SGLang's ``--disaggregation-mode`` and NVIDIA Dynamo run it).

Decode steps no longer carry prefills, so TPOT is the plain decode step; the first token comes back after the
prefill, the KV transfer and one decode step (vLLM's disaggregated proxy streams the decode instance's output).
Throughput is the lesser of the two pools' rates; waiting follows the same laws as aggregated serving (the prefill
pool is an M/D/1 queue per replica, a closed loop's surplus clients wait by Little's law).
"""

from __future__ import annotations

from meshplan.cost.comm import collective_time
from meshplan.cost.serve_load import (
    ServePrediction,
    about_mean,
    decode_spread,
    kv_capacity_tokens,
    kv_need,
    mean_prefill,
    resident_under_load,
)
from meshplan.cost.serve_memory import kv_bytes_per_token
from meshplan.cost.serve_spec import tokens_per_pass
from meshplan.cost.serve_step import StepContext, decode_time, prefill_time
from meshplan.spec.cluster import group_link
from meshplan.spec.serving import Workload


def kv_transfer_time(pre: StepContext, dec: StepContext, *, tokens: int) -> float:
    """Seconds to move one prompt's KV cache (every layer, whole heads) from a prefill replica to a decode
    replica: each of min(tp_p, tp_d) GPU pairs sends its share in parallel (NIXL/Mooncake one-sided reads, one
    rail per GPU), over NVLink when both replicas fit in one scale-up domain, else over the NICs."""
    nbytes = tokens * sum(kv_bytes_per_token(b.layer, pre.plan.kv_bytes) for b, _ in pre.model.layers())
    lanes = max(min(pre.plan.tp * pre.plan.pp, dec.plan.tp * dec.plan.pp), 1)
    span = max(pre.plan.gpus_per_replica, dec.plan.gpus_per_replica)
    link = group_link(pre.pool, size=2, stride=span)
    return collective_time("send_recv", nbytes / lanes, size=2, link=link, calib=pre.calib)


def predict_disagg(pre: StepContext, dec: StepContext, work: Workload, *, n_prefill: int,
                   n_decode: int) -> ServePrediction:
    """Steady state of ``n_prefill`` prefill replicas feeding ``n_decode`` decode replicas."""
    t_p = mean_prefill(pre, work)
    t_kv = kv_transfer_time(pre, dec, tokens=work.input_len)
    resident, _, limit = resident_under_load(dec, work, n_decode, _open_resident)
    t_d = decode_time(dec, batch=resident, context=work.mean_context)
    per_token = t_d / tokens_per_pass(dec)  # a speculating pass yields its mean acceptance length
    x_prefill = n_prefill / t_p  # requests/s the prefill pool finishes
    x_decode = n_decode * resident / (work.output_len * per_token)
    service = t_p + t_kv + work.output_len * per_token
    if work.offline:
        x = min(x_prefill, x_decode)
    elif work.concurrency:
        x = min(work.concurrency / service, x_prefill, x_decode)
    else:
        x = min(work.rate, x_prefill, x_decode)
    if x_prefill < x_decode and x >= 0.999 * x_prefill:
        limit = "prefill pool"
    rho = min(x / x_prefill, 0.95)
    behind = rho / (2 * (1 - rho)) * t_p  # M/D/1 at each prefill replica (Pollaczek-Khinchine)
    if work.offline:
        wait, fixed, prob = 0.0, 0.0, 0.0
    elif work.concurrency:
        admit = work.concurrency / x - service
        wait, fixed, prob = (admit, admit, 0.0) if admit > behind else (behind, 0.0, rho)
    else:
        rho_open = min(work.rate / max(min(x_prefill, x_decode), 1e-12), 0.999)
        wait, fixed, prob = rho_open / (1 - rho_open) * 0.5 * t_p, 0.0, rho_open
    ttft = wait + t_p + t_kv + t_d + pre.request_s
    gpus = n_prefill * pre.plan.gpus_per_replica + n_decode * dec.plan.gpus_per_replica
    occupancy = min(resident * kv_need(dec, work) / max(kv_capacity_tokens(dec), 1), 1.0)
    return ServePrediction(
        ttft=ttft, tpot=per_token, itl=dec.engine.multi_step * t_d, e2e=ttft + (work.output_len - 1) * per_token,
        tokens_per_pass=tokens_per_pass(dec),
        queue_wait=wait, output_tokens_per_s=x * work.output_len, requests_per_s=x,
        prompt_tokens_per_s=x * work.input_len, resident=resident,
        kv_capacity_tokens=kv_capacity_tokens(dec), kv_occupancy=occupancy,
        limited_by=limit, decode_step=t_d, prefill=t_p, wait_fixed=fixed, wait_prob=prob, kv_transfer=t_kv,
        prefill_spread=about_mean(tuple((prefill_time(pre, tokens=n), p) for n, p in work.bins("input"))),
        decode_spread=decode_spread(work, per_token), gpus=gpus)


def _open_resident(dec: StepContext, work: Workload, cap: int, n_decode: int) -> tuple[int, str]:
    """Resident requests of a decode replica under Poisson arrivals: Little's law R = lambda x O t_d(R)."""
    lam = work.rate / n_decode
    r = 1
    for _ in range(30):
        t_d = decode_time(dec, batch=r, context=work.mean_context) / tokens_per_pass(dec)
        nxt = max(min(int(round(lam * work.output_len * t_d)), cap), 1)
        if nxt == r:
            break
        r = nxt
    return r, "load" if r < cap else "kv cache"

"""Checking a search request against its model and cluster before the search: every pinned degree and option,
the prices, and whether the cluster can be filled at all. A bad pin is bad input (one line, exit 2), the same
words ``meshplan estimate`` gives for a whole plan; "nothing fits" is left for requests that are valid."""

from __future__ import annotations

from meshplan.errors import PlanError, SpecError, close_matches
from meshplan.search.request import SearchRequest
from meshplan.spec.checks import shape_violations, stack_violations
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan

DEGREES = ("tp", "cp", "pp", "dp")


def check_request(model: ModelSpec, cluster: ClusterSpec, request: SearchRequest) -> None:
    """Raise SpecError for a pin or price no plan field accepts, PlanError listing what the pins ask that the
    model, the cluster or the stack cannot give; return None for a request the search can answer."""
    probe = pinned_plan(request)
    _check_prices(cluster, request.prices)
    problems = pin_violations(model, cluster, request, probe)
    if problems:
        raise PlanError(problems)


def pinned_plan(request: SearchRequest) -> Plan:
    """A plan holding only the pins (every other degree 1): each pin is checked by the Plan's own field rules,
    under its own name. A pinned schedule implies a pipeline, so an unpinned pp is 2 for the schedule's checks."""
    pins = dict(request.pins)
    for name, value in pins.items():
        try:
            Plan(global_batch=request.global_batch, seq_len=request.seq_len, **{name: value})
        except SpecError as exc:
            raise SpecError(f"pin {name}", value, exc.expected, exc.suggestions) from None
    if "schedule" in pins and "pp" not in pins:
        pins["pp"] = 2
    if pins.get("vpp", 1) > 1 and "pp" not in pins:
        pins["pp"] = 2
    return Plan(global_batch=request.global_batch, seq_len=request.seq_len, precision=request.precision,
                framework=request.framework.name, state_copies=request.state_copies, **pins)


def pin_violations(model: ModelSpec, cluster: ClusterSpec, request: SearchRequest, probe: Plan) -> list[str]:
    """What the pins ask that this model, cluster and stack cannot give, in words."""
    pins, out = request.pins, []
    used = 1
    for d in DEGREES:
        used *= pins.get(d, 1)
    n = cluster.n_gpus
    if used > n or (len(cluster.pools) == 1 and n % used):
        given = "*".join(f"{d}={pins[d]}" for d in DEGREES if d in pins)
        out.append(f"pinned {given} = {used} GPUs must divide the cluster's {n}")
    if "pp" in pins and pins["pp"] == 1 and ("schedule" in pins or pins.get("vpp", 1) > 1):
        what = f"schedule {pins['schedule']}" if "schedule" in pins else f"vpp={pins['vpp']}"
        out.append(f"{what} needs a pipeline, pp is pinned to 1")
    mb = pins.get("micro_batch", 1) * pins.get("dp", 1)
    if request.global_batch % mb:
        out.append(f"global_batch={request.global_batch} must be a multiple of dp*micro_batch={mb} (pinned)")
    if request.seq_len % probe.cp:
        out.append(f"seq_len={request.seq_len} must be a multiple of the pinned cp={probe.cp}")
    if "dp_shard" in pins and "dp" in pins and pins["dp_shard"] and pins["dp"] % pins["dp_shard"]:
        out.append(f"dp_shard={pins['dp_shard']} must divide the pinned dp={pins['dp']}")
    if "dp_shard" in pins and pins.get("zero", 3) != 3 and pins["dp_shard"]:
        out.append(f"dp_shard={pins['dp_shard']} shards parameters (HSDP): it needs zero=3, zero is pinned to "
                   f"{pins['zero']}")
    if "schedule" in pins and "vpp" in pins:
        from meshplan.spec.schedules import is_csv, schedule_spec

        if not is_csv(probe.schedule_name):
            lo, hi = schedule_spec(probe.schedule_name).chunks
            if probe.vpp < lo or (hi and probe.vpp > hi):
                out.append(schedule_spec(probe.schedule_name).accepts(pp=probe.pp, vpp=probe.vpp, n_micro=10**6))
    if pins.get("recompute_layers") and pins.get("recompute", "full") != "full":
        out.append(f"recompute_layers={pins['recompute_layers']} counts fully recomputed layers, recompute is "
                   f"pinned to {pins['recompute']}")
    if pins.get("recompute_layers", 0) > model.n_layers:
        out.append(f"recompute_layers={pins['recompute_layers']} exceeds {model.name}'s {model.n_layers} layers")
    if "cp_kind" in pins and pins.get("cp") == 1:
        out.append(f"cp_kind={pins['cp_kind']} names how context parallelism exchanges keys and values, cp is "
                   "pinned to 1")
    if pins.get("etp", 1) > 1 and pins.get("tp", pins["etp"]) != pins["etp"]:  # _expert_options: etp is 1 or tp
        out.append(f"etp={pins['etp']} must be 1 or the tp degree (experts split like the dense layers), tp is "
                   f"pinned to {pins['tp']}")
    if pins.get("etp", 1) > 1 and "tp" not in pins:
        tps = [b.layer.attention.n_heads for b in model.blocks if b.layer.attention]
        if any(h % pins["etp"] for h in tps) or pins["etp"] > min(p.gpu.nvlink_domain for p in cluster.pools):
            out.append(f"etp={pins['etp']} must be 1 or a tp degree this model and cluster allow (dividing the "
                       "attention heads, within a scale-up domain)")
    if request.precision == "fp8" and all(p.gpu.peak.fp8 <= 0 for p in cluster.pools):
        out.append(f"precision fp8 needs FP8 tensor cores; {cluster.describe()} has none (use bf16)")
    return out + shape_violations(model, probe) + stack_violations(probe, request.framework) + \
        fill_violations(model, cluster, request)


def fill_violations(model: ModelSpec, cluster: ClusterSpec, request: SearchRequest) -> list[str]:
    """The cluster (or, when pools may idle, its smallest pool) is larger than any layout the search would try
    for this batch can occupy: dp at most the global batch, tp at most the heads within the scale-up domain, cp
    at most one rank per MIN_TOKENS_PER_CP_RANK tokens, pp at most the layers (pinned degrees as pinned)."""
    from meshplan.search.space import MIN_TOKENS_PER_CP_RANK, scale_up_domain

    heads = min((b.layer.attention.n_heads for b in model.blocks if b.layer.attention), default=1)
    pins = request.pins
    most = pins.get("dp", request.global_batch) * pins.get("tp", min(heads, scale_up_domain(cluster))) * \
        pins.get("cp", max(request.seq_len // MIN_TOKENS_PER_CP_RANK, 1)) * pins.get("pp", model.n_layers)
    least = min(p.n_gpus for p in cluster.pools) if request.allow_idle_pools else cluster.n_gpus
    if least <= most:
        return []
    return [f"{least:,} GPUs cannot all be used: a batch of {request.global_batch} sequences of {request.seq_len} "
            f"tokens fills at most dp*tp*cp*pp = {most:,} GPUs for {model.name} (tp within a scale-up domain, "
            f"cp of at least {MIN_TOKENS_PER_CP_RANK} tokens per rank); raise --global-batch or use fewer GPUs"]


def _check_prices(cluster: ClusterSpec, prices: dict) -> None:
    """Prices per GPU-hour are positive and name GPUs of this cluster (``*`` for all)."""
    names = [p.gpu.name for p in cluster.pools]
    for name, value in prices.items():
        if name != "*" and name not in names:
            raise SpecError("--price", f"{name}={value}", f"names a GPU not in the cluster ({', '.join(names)})",
                            close_matches(name, names))
        if not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
            raise SpecError("--price", f"{name}={value}" if name != "*" else value,
                            "must be a positive price per GPU-hour")

"""The search space: degree tuples (tp, cp, pp, dp, ep, etp) that tile the cluster, and per tuple the options
that do not change how GPUs are grouped (micro-batch, schedule and virtual stages, ZeRO stage and HSDP group,
context-parallel kind). Recompute is not enumerated: the driver picks the least recompute that fits.

Every option that is left out is counted under a reason, so reports can say what was never considered and why.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator, NamedTuple

from meshplan.search.request import SearchRequest
from meshplan.spec.checks import plan_violations, stack_violations
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import schedule_spec

MIN_TOKENS_PER_CP_RANK = 1024
"""Context parallelism below ~1k tokens per rank leaves attention too small to hide the KV exchange (Megatron
CP guidance: use it for sequences of 8k and more); shorter shards are pruned."""
MAX_CHUNK_LAYERS = 8
"""Interleaving candidates: chunk sizes of 1..8 layers (Megatron's num-layers-per-virtual-pipeline-stage)."""


class Degrees(NamedTuple):
    """How the cluster's GPUs are grouped."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    etp: int


class Leaf(NamedTuple):
    """One point of the space below a degree tuple (recompute and layer split are decided later)."""

    deg: Degrees
    micro_batch: int
    schedule: str
    vpp: int
    zero: int
    dp_shard: int
    cp_kind: str


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def scale_up_domain(cluster: ClusterSpec) -> int:
    """GPUs of the smallest scale-up (NVLink) domain over the pools: tp beyond it crosses the slow fabric."""
    return min(p.network()[0].span for p in cluster.pools)


def _pin_ok(req: SearchRequest, name: str, value) -> bool:
    return name not in req.pins or req.pins[name] == value


def use_sp(deg: Degrees, req: SearchRequest) -> bool:
    """Sequence parallelism whenever tp > 1 and tp divides the tokens per cp rank: it moves the same bytes as
    TP's all-reduces, shrinks activations and pipeline sends (Korthikanti et al. 2022 sec. 4.2.2). A pinned
    ``sp`` is kept as pinned (tp > 1), so a layout whose tokens tp cannot split is rejected, not silently
    changed."""
    if "sp" in req.pins:
        return bool(req.pins["sp"]) and deg.tp > 1
    return deg.tp > 1 and (req.seq_len // deg.cp) % deg.tp == 0


def _probe(deg: Degrees, req: SearchRequest, **kw) -> Plan:
    return Plan(global_batch=req.global_batch, seq_len=req.seq_len, precision=req.precision, tp=deg.tp,
                sp=use_sp(deg, req), cp=deg.cp, pp=deg.pp, dp=deg.dp, ep=deg.ep, etp=deg.etp,
                framework=req.framework.name, dp_sync=req.framework.sync_for(0), **kw)


def _expert_options(model: ModelSpec, tp: int, cp: int, dp: int) -> list[tuple[int, int]]:
    """(ep, etp) pairs: ep divides every block's experts and ep*etp divides tp*cp*dp; etp is 1 or tp."""
    if not model.is_moe:
        return [(1, 1)]
    experts = [b.layer.moe.n_experts for b in model.blocks if b.layer.moe]
    out = []
    for ep in divisors(min(experts)):
        for etp in sorted({1, tp}):
            if all(e % ep == 0 for e in experts) and (tp * cp * dp) % (ep * etp) == 0:
                out.append((ep, etp))
    return out


def degree_tuples(model: ModelSpec, cluster: ClusterSpec, req: SearchRequest, pruned: Counter) -> Iterator[Degrees]:
    """Every valid degree tuple; invalid or unpromising ones are counted in ``pruned`` by reason."""
    n, dom = cluster.n_gpus, scale_up_domain(cluster)
    for tp in divisors(n):
        if not _pin_ok(req, "tp", tp):
            continue
        if tp == 1 and req.pins.get("sp"):  # a pinned sequence parallelism needs a TP group to split over
            pruned["sp pinned, tp 1"] += 1
            continue
        if tp > dom and "tp" not in req.pins:
            pruned["tp crosses the scale-up domain"] += 1
            continue
        for cp in divisors(n // tp):
            if not _pin_ok(req, "cp", cp):
                continue
            if cp == 1 and "cp_kind" in req.pins:  # a pinned kind of context parallelism needs some
                pruned["cp_kind pinned, cp 1"] += 1
                continue
            if req.seq_len % cp or (cp > 1 and req.seq_len // cp < MIN_TOKENS_PER_CP_RANK and "cp" not in req.pins):
                pruned["cp shard too short"] += 1
                continue
            for pp in divisors(n // (tp * cp)):
                dp = n // (tp * cp * pp)
                if not (_pin_ok(req, "pp", pp) and _pin_ok(req, "dp", dp)):
                    continue
                if pp > model.n_layers or req.global_batch % dp:
                    pruned["divisibility"] += 1
                    continue
                for ep, etp in _expert_options(model, tp, cp, dp):
                    if not (_pin_ok(req, "ep", ep) and _pin_ok(req, "etp", etp)):
                        continue
                    deg = Degrees(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp)
                    probe = _probe(deg, req)
                    if plan_violations(model, cluster, probe):
                        pruned["divisibility"] += 1
                        continue
                    if stack_violations(probe, req.framework):
                        pruned["the framework cannot run it"] += 1
                        continue
                    yield deg


def micro_batches(req: SearchRequest, dp: int) -> list[int]:
    """Micro-batch sizes: divisors of the per-replica batch up to ``max_micro_batch``; powers of two only
    (the sizes kernels and published runs use) unless that leaves a single choice or the search is
    exhaustive."""
    if "micro_batch" in req.pins:
        mb = req.pins["micro_batch"]
        return [mb] if (req.global_batch // dp) % mb == 0 else []
    alld = [d for d in divisors(req.global_batch // dp) if d <= req.max_micro_batch]
    pow2 = [d for d in alld if d & (d - 1) == 0]
    return alld if req.exhaustive or len(pow2) < 2 else pow2


def vpp_options(n_layers: int, pp: int) -> list[int]:
    """Chunks per rank for interleaving: those giving chunks of 1..MAX_CHUNK_LAYERS layers (rounded both ways,
    so 126 layers on pp=8 offers vpp 7 and 8, the published Llama-3.1-405B layout)."""
    per_rank = n_layers / pp
    out = set()
    for c in range(1, MAX_CHUNK_LAYERS + 1):
        for v in (int(per_rank // c), -int(-per_rank // c)):
            if v >= 2 and pp * v <= n_layers:
                out.add(v)
    return sorted(out)


def _chunk_options(spec, n_layers: int, pp: int, req: SearchRequest) -> list[int]:
    """Chunks per rank a schedule is tried at: its fixed count, or the interleaving candidates
    (``vpp_options``; a pinned vpp is tried as given)."""
    lo, hi = spec.chunks
    if lo == hi:
        return [lo]
    opts = [req.pins["vpp"]] if "vpp" in req.pins else vpp_options(n_layers, pp)
    return [v for v in opts if v >= lo and (not hi or v <= hi)]


def pipeline_options(n_layers: int, pp: int, n_micro: int, req: SearchRequest,
                     pruned: Counter) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs valid for this pipeline among the schedules the stack runs (in the order its profile
    lists them), each accepting pp, vpp and the micro-batch count (``ScheduleSpec.accepts``); ``("", 1)``
    without pipelining."""
    if pp == 1:
        # A pinned schedule asks for a pipeline, whatever the schedule.
        return [("", 1)] if _pin_ok(req, "vpp", 1) and "schedule" not in req.pins else []
    out = []
    for name in req.framework.schedules:
        if not _pin_ok(req, "schedule", name):
            continue
        spec = schedule_spec(name)
        for v in _chunk_options(spec, n_layers, pp, req):
            if pp * v > n_layers or not _pin_ok(req, "vpp", v):
                continue
            if spec.accepts(pp=pp, vpp=v, n_micro=n_micro):
                pruned["schedule constraint"] += 1
                continue
            out.append((name, v))
    return out


def zero_options(deg: Degrees, req: SearchRequest, *, node: int, pruned: Counter) -> list[tuple[int, int]]:
    """(zero, dp_shard) pairs. Without exhaustive search, DDP is dropped: in the cost model ZeRO-1 moves fewer
    bytes than DDP's all-reduce and holds less. ZeRO-2 holds less than ZeRO-1 but reduce-scatters every
    micro-batch (``cost.dp.reduces_every_micro``), so both stay; it is offered only without pipelining (DeepSpeed
    forbids ZeRO-2 with pipelines and Megatron's distributed optimizer is ZeRO-1). HSDP groups span at least a
    node."""
    stack = req.framework
    top = 0 if stack.sharding == "none" else (stack.max_zero_with_pp if deg.pp > 1 else 3)
    group = deg.dp * deg.cp
    if group == 1:
        opts = [(0, 0)]
    else:
        low = [z for z in ([0, 1, 2] if deg.pp == 1 else [0, 1]) if z <= top]
        if not req.exhaustive and "zero" not in req.pins:
            keep = [z for z in low if z] or low
            pruned["dominated zero stage"] += len(low) - len(keep)
            low = keep
        opts = [(z, 0) for z in low]
        # A shard group of one rank (z3/1) is replication under another name: not a candidate.
        pinned = req.pins.get("dp_shard", 0)
        shards = [d for d in divisors(deg.dp) if d < deg.dp and d * deg.cp > 1 and (
            d == pinned or d * deg.tp * deg.cp >= node and d & (d - 1) == 0)]  # a pinned group as pinned
        if not req.exhaustive and not pinned:
            # HSDP groups of 1, 4, 16... nodes: memory and traffic change slowly with the group size.
            keep = [d for d in shards if (d * deg.tp * deg.cp // node).bit_length() % 2 == 1]
            pruned["hsdp group sizes skipped"] += len(shards) - len(keep)
            shards = keep
        opts += [(3, d) for d in shards] + [(3, 0)] if top == 3 else []
    out = [(z, s) for z, s in opts if _pin_ok(req, "zero", z)]
    if "dp_shard" in req.pins:
        want = req.pins["dp_shard"]
        out = [(z, s) for z, s in out if s == want or (want == deg.dp and s == 0)]
    return out


def cp_kinds(model: ModelSpec, deg: Degrees, req: SearchRequest) -> list[str]:
    """``ring`` always; ``a2a`` (Ulysses) where tp*cp divides every block's heads."""
    if deg.cp == 1:
        return ["ring"]
    heads = [b.layer.attention.n_heads for b in model.blocks if b.layer.attention]
    kinds = ["ring"] + (["a2a"] if all(h % (deg.tp * deg.cp) == 0 for h in heads) else [])
    return [k for k in kinds if _pin_ok(req, "cp_kind", k) and k in req.framework.context_parallel]


class Group(NamedTuple):
    """Leaves that differ only in their pipeline schedule and virtual stages (same per-layer costs, same
    static memory): bounded once before any of them is built."""

    base: Leaf
    pipelines: tuple[tuple[str, int], ...]


def groups(model: ModelSpec, deg: Degrees, req: SearchRequest, *, node: int, pruned: Counter) -> Iterator[Group]:
    """Every group of leaves below one degree tuple."""
    zeros = zero_options(deg, req, node=node, pruned=pruned)
    kinds = cp_kinds(model, deg, req)
    for mb in micro_batches(req, deg.dp):
        m = req.global_batch // (deg.dp * mb)
        pipes = tuple(pipeline_options(model.n_layers, deg.pp, m, req, pruned))
        if not pipes:
            continue
        for zero, shard in zeros:
            for kind in kinds:
                yield Group(base=Leaf(deg=deg, micro_batch=mb, schedule="", vpp=1, zero=zero, dp_shard=shard,
                                      cp_kind=kind), pipelines=pipes)


def leaves(model: ModelSpec, deg: Degrees, req: SearchRequest, *, node: int, pruned: Counter) -> Iterator[Leaf]:
    """Every leaf below one degree tuple."""
    for g in groups(model, deg, req, node=node, pruned=pruned):
        for sched, vpp in g.pipelines:
            yield g.base._replace(schedule=sched, vpp=vpp)


def leaf_plan(leaf: Leaf, req: SearchRequest, **kw) -> Plan:
    """The Plan of a leaf (sequence parallel whenever tp > 1), under the request's software stack (its gradient
    synchronisation too: a parameter-server stack's leaves push and pull)."""
    d = leaf.deg
    return Plan(global_batch=req.global_batch, seq_len=req.seq_len, micro_batch=leaf.micro_batch, tp=d.tp,
                sp=use_sp(d, req), cp=d.cp, cp_kind=leaf.cp_kind, pp=d.pp, vpp=leaf.vpp, schedule=leaf.schedule,
                dp=d.dp, zero=leaf.zero, dp_shard=leaf.dp_shard, ep=d.ep, etp=d.etp, precision=req.precision,
                framework=req.framework.name, state_copies=req.state_copies,
                dp_sync=req.framework.sync_for(leaf.zero), **kw)

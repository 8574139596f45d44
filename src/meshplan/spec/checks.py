"""Constraints that tie a plan to a model and a cluster. Every violation is listed, in words."""

from __future__ import annotations

from meshplan.errors import PlanError
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import is_csv, schedule_spec


def even_split(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """Layers per stage as even as possible; the remainder goes to the middle stages, since the first and last
    carry the embedding and the output head (Megatron-Bridge's uneven split does the same)."""
    base, rem = divmod(n_layers, n_stages)
    split = [base] * n_stages
    order = sorted(range(n_stages), key=lambda i: (i in (0, n_stages - 1), abs(i - (n_stages - 1) / 2)))
    for i in order[:rem]:
        split[i] += 1
    return tuple(split)


def layer_split(model: ModelSpec, plan: Plan) -> tuple[int, ...]:
    """Layers per virtual stage in pipeline order (stage s of chunk c is index c * pp + s)."""
    return plan.layer_split or even_split(model.n_layers, plan.n_stages)


def _attention_violations(model: ModelSpec, plan: Plan) -> list[str]:
    out = []
    for b in model.blocks:
        att = b.layer.attention
        if att is None:
            continue
        if att.n_heads % plan.tp:
            out.append(f"tp={plan.tp} must divide the {att.n_heads} attention heads of block '{b.name}'")
        if att.kind == "gqa" and att.n_kv_heads % plan.tp and plan.tp % att.n_kv_heads:
            out.append(f"tp={plan.tp} and the {att.n_kv_heads} kv heads of block '{b.name}' must divide one another")
        if plan.cp_kind == "a2a" and att.n_heads % (plan.tp * plan.cp):
            out.append(f"all-to-all context parallel needs tp*cp={plan.tp * plan.cp} to divide the "
                       f"{att.n_heads} heads of block '{b.name}'")
    return out


def _moe_violations(model: ModelSpec, plan: Plan) -> list[str]:
    out = []
    if not model.is_moe:
        if plan.ep > 1 or plan.etp > 1:
            out.append(f"ep={plan.ep}, etp={plan.etp}: expert parallelism needs a mixture-of-experts model")
        return out
    for b in model.blocks:
        if b.layer.moe and b.layer.moe.n_experts % plan.ep:
            out.append(f"ep={plan.ep} must divide the {b.layer.moe.n_experts} experts of block '{b.name}'")
    return out


def _folding_violations(model: ModelSpec, plan: Plan) -> list[str]:
    out = []
    if model.is_moe and (plan.tp * plan.cp * plan.dp) % (plan.ep * plan.etp):
        out.append(f"ep*etp={plan.ep * plan.etp} must divide tp*cp*dp={plan.tp * plan.cp * plan.dp} "
                   "(experts are folded inside the data/context/tensor ranks)")
    return out


def _pipeline_violations(model: ModelSpec, plan: Plan) -> list[str]:
    out = []
    if plan.layer_split:
        if len(plan.layer_split) != plan.n_stages:
            out.append(f"layer_split has {len(plan.layer_split)} entries, needs pp*vpp={plan.n_stages}")
        elif sum(plan.layer_split) != model.n_layers:
            out.append(f"layer_split sums to {sum(plan.layer_split)}, the model has {model.n_layers} layers")
    if plan.vpp > 1 and plan.pp == 1:
        out.append(f"vpp={plan.vpp} needs pp > 1")
    if plan.pp > 1 and not is_csv(plan.schedule_name):
        why = schedule_spec(plan.schedule_name).accepts(pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro)
        if why:
            out.append(why)
    return out


def replicas_per_pool(cluster: ClusterSpec, plan: Plan) -> tuple[int, ...]:
    """Data-parallel replicas each pool holds when dp is the outermost axis (every axis after it in the rank
    order has degree 1): replica d occupies global ranks [d n/dp, (d+1) n/dp) and pools are laid out in
    order over global ranks (``meshplan.cost.estimate.rank_pool``). Partial replicas round down."""
    size = plan.n_gpus // plan.dp
    return tuple(p.n_gpus // size for p in cluster.pools)


def replica_shares(plan: Plan, pool_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Micro-batches per step of each data-parallel replica, in dp order: ``batch_shares[i]`` for every replica on
    pool i (dp outermost, pools in order over global ranks, as ``replicas_per_pool``), else ``n_micro`` for all."""
    if not plan.batch_shares:
        return (plan.n_micro,) * plan.dp
    size = plan.n_gpus // plan.dp
    return tuple(s for n, s in zip(pool_sizes, plan.batch_shares) for _ in range(n // size))


def _shares_violations(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> list[str]:
    """Uneven batch shares: one per pool, each replica inside one pool, shares adding up to the batch."""
    shares, size = plan.batch_shares, plan.n_gpus // plan.dp
    if len(shares) != len(cluster.pools):
        return [f"batch_shares has {len(shares)} entries, the cluster has {len(cluster.pools)} pools"]
    out = []
    if plan.stride("dp") * plan.dp != plan.n_gpus:
        out.append(f"batch_shares needs each data-parallel replica on one pool: put dp outermost in rank_order "
                   f"(e.g. tp-cp-ep-pp-dp), not {plan.rank_order}")
    for p in cluster.pools:
        if p.n_gpus % size:
            out.append(f"batch_shares: pool {p.n_gpus}x{p.gpu.name} is not a whole number of replicas of "
                       f"tp*cp*pp={size} GPUs")
    reps = replicas_per_pool(cluster, plan)
    total = sum(r * s for r, s in zip(reps, shares)) * plan.micro_batch
    if total != plan.global_batch:
        terms = " + ".join(f"{r}*{s}" for r, s in zip(reps, shares))
        out.append(f"batch_shares {tuple(shares)} x replicas per pool {reps} x micro_batch={plan.micro_batch} "
                   f"= ({terms}) * {plan.micro_batch} = {total} sequences, global_batch is {plan.global_batch}")
    if plan.zero and any(r % plan.shard_group for r in reps):
        out.append(f"batch_shares: ZeRO shards over {plan.shard_group} replicas must stay inside one pool; set "
                   f"dp_shard to a divisor of every pool's replicas {reps}")
    if model.is_moe and any((plan.tp * plan.cp * r) % (plan.ep * plan.etp) for r in reps):
        out.append(f"batch_shares: ep*etp={plan.ep * plan.etp} must divide tp*cp*replicas of every pool {reps}")
    return out


def plan_violations(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> list[str]:
    """Every constraint the plan violates against this model and cluster, as readable sentences."""
    out: list[str] = []
    if plan.n_gpus != cluster.n_gpus:
        out.append(f"tp*cp*pp*dp = {plan.tp}*{plan.cp}*{plan.pp}*{plan.dp} = {plan.n_gpus} GPUs, "
                   f"the cluster has {cluster.n_gpus}")
    if plan.batch_shares:
        out += _shares_violations(model, cluster, plan)
    domains = max(cluster.n_gpus // cluster.pools[0].network()[0].span, 1)
    if plan.state_copies >= domains:
        out.append(f"state_copies={plan.state_copies} needs {plan.state_copies + 1} scale-up domains (nodes), so "
                   f"that each copy lives off its shard's node; the cluster has {domains}")
    if plan.precision == "fp8" and any(p.gpu.peak.fp8 <= 0 for p in cluster.pools):
        bad = [p.gpu.name for p in cluster.pools if p.gpu.peak.fp8 <= 0]
        out.append(f"precision fp8 needs FP8 tensor cores; {', '.join(bad)} has none (use bf16)")
    return out + model_violations(model, plan)


def model_violations(model: ModelSpec, plan: Plan) -> list[str]:
    """Every constraint the plan violates against the model and its own batch, whatever GPUs run it."""
    out: list[str] = []
    if not plan.batch_shares and plan.global_batch % (plan.dp * plan.micro_batch):
        out.append(f"global_batch={plan.global_batch} must be a multiple of dp*micro_batch="
                   f"{plan.dp * plan.micro_batch}")
    if plan.seq_len % plan.cp:
        out.append(f"seq_len={plan.seq_len} must be a multiple of cp={plan.cp}")
    if plan.sp and plan.tp > 1 and (plan.seq_len // plan.cp) % plan.tp:
        out.append(f"sequence parallel needs tp={plan.tp} to divide the {plan.seq_len // plan.cp} tokens per cp rank")
    if plan.zero and plan.dp % plan.shard_group:
        out.append(f"dp_shard={plan.dp_shard} must divide dp={plan.dp}")
    if model.max_seq_len and plan.seq_len > model.max_seq_len and model.position == "learned":
        out.append(f"seq_len={plan.seq_len} exceeds the model's learned positions ({model.max_seq_len})")
    return out + shape_violations(model, plan) + _folding_violations(model, plan) + _pipeline_violations(model, plan)


def shape_violations(model: ModelSpec, plan: Plan) -> list[str]:
    """What each degree alone asks of the model's shapes: tp of heads and FFN widths, cp and cp_kind of heads,
    ep of experts, pp*vpp of layers. Degrees of 1 ask nothing, so a plan holding only a user's pins (the rest 1)
    is checked exactly for those pins (``meshplan.search.pins``)."""
    out = []
    for b in model.blocks:
        if b.layer.moe is None and b.layer.ffn_hidden % plan.tp:
            out.append(f"tp={plan.tp} must divide ffn_hidden={b.layer.ffn_hidden} of block '{b.name}'")
    if not plan.layer_split and model.n_layers < plan.n_stages:
        out.append(f"pp*vpp={plan.n_stages} virtual stages exceed the model's {model.n_layers} layers")
    return out + _attention_violations(model, plan) + _moe_violations(model, plan)


def check_plan(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> None:
    """Raise PlanError listing every violated constraint, or return None."""
    bad = plan_violations(model, cluster, plan)
    if bad:
        raise PlanError(bad)


def stack_violations(plan: Plan, stack: FrameworkProfile) -> list[str]:
    """What the plan asks of its software stack that the stack cannot do (its capability fields), in words."""
    out = []
    name = stack.name
    if plan.tp > 1 and not stack.tensor_parallel:
        out.append(f"tp={plan.tp}: {name} has no tensor parallelism (use tp=1 or another framework)")
    if plan.cp > 1 and plan.cp_kind not in stack.context_parallel:
        kinds = ", ".join(stack.context_parallel) or "none"
        out.append(f"cp={plan.cp} with cp_kind={plan.cp_kind}: {name} runs context parallelism of kinds: {kinds}")
    if plan.ep > 1 and not stack.expert_parallel:
        out.append(f"ep={plan.ep}: {name} has no expert parallelism")
    if plan.pp > 1 and plan.schedule_name not in stack.schedules and not is_csv(plan.schedule_name):
        scheds = ", ".join(stack.schedules) or "none (no pipeline parallelism)"
        out.append(f"schedule {plan.schedule_name}: {name} runs the pipeline schedules {scheds}")
    if plan.zero and stack.sharding == "none":
        out.append(f"zero={plan.zero}: {name} has no ZeRO/FSDP sharding (use zero=0)")
    if plan.pp > 1 and plan.zero > stack.max_zero_with_pp:
        out.append(f"zero={plan.zero} with pp={plan.pp}: {name} combines pipelines with ZeRO stage "
                   f"<= {stack.max_zero_with_pp} only")
    if plan.recompute not in stack.recompute_modes:
        out.append(f"recompute={plan.recompute}: {name} offers {', '.join(stack.recompute_modes)}")
    if plan.dp * plan.cp > 1 and plan.sync not in stack.dp_syncs:
        out.append(f"dp_sync={plan.sync}: {name} synchronises gradients with {', '.join(stack.dp_syncs)}")
    return out

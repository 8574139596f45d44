"""Re-planning when the cluster or the job changes: search the new best layouts, price leaving the current one
for each (bytes per rank and link class, peak memory, seconds live and through a checkpoint) under the rank map
that keeps the most state in place, and decide.

Decision rule (``shared/notes/elastic.md`` sec. 5): switch to the option with the least
``C_switch + N_remaining * t_step``; when the current layout can still run, only if that beats staying and the
step gets faster by at least ``min_gain`` (hysteresis, so noise in the prediction does not make a job flap
between layouts); break-even ``N* = C_switch / (t_current - t_new)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from meshplan.cost.calib import gpu_calibration
from meshplan.cost.rankmap import RankMap, choose_rank_map
from meshplan.cost.state_layout import geometry, state_groups
from meshplan.cost.transition import Placement, TransferBytes, transfer_bytes
from meshplan.cost.transition_time import SwitchCosts, SwitchTime, new_groups, switch_time
from meshplan.errors import PlanError, SpecError
from meshplan.search.driver import search
from meshplan.search.request import SearchRequest
from meshplan.search.result import RankedPlan, SearchResult
from meshplan.spec.checks import check_plan
from meshplan.spec.cluster import ClusterSpec, Derating
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


@dataclass(frozen=True, kw_only=True)
class ClusterChange:
    """What happened to the GPUs: ids are the old world's ranks; added GPUs take the ids after them."""

    lost: tuple[int, ...] = ()
    """Old ranks whose GPU is gone (failed, preempted, drained)."""
    added: int = 0
    """New GPUs of the same type (whole scale-up domains keep groups inside one)."""
    slow: Derating = Derating()
    """GPUs and links now below their rating, by old GPU id and old scale-up domain (stragglers, degraded
    NICs): the current layout slows to their pace, and smaller worlds may idle them."""

    def __post_init__(self) -> None:
        if self.added < 0:
            raise SpecError("--add", self.added, "must be >= 0 GPUs")
        if set(self.lost) & {g for g, _ in self.slow.gpus}:
            raise SpecError("--slow-gpu", sorted(set(self.lost) & {g for g, _ in self.slow.gpus})[0],
                            "is also lost; a lost GPU is gone, not slow")

    def survivors(self, n_old: int) -> list[int]:
        """Old GPU ids that remain, then the added ones, in the new world's order."""
        lost = set(self.lost)
        return [g for g in range(n_old) if g not in lost] + list(range(n_old, n_old + self.added))


@dataclass(frozen=True, kw_only=True)
class ReplanRequest:
    """How to weigh a switch."""

    remaining_steps: int
    """Optimizer steps left in the job (the horizon a faster layout pays back over)."""
    min_gain: float = 0.03
    """Smallest relative step-time gain worth a switch when the current layout can still run (3-5 %: the
    elastic note's hysteresis; meshplan's step-time error on published runs has a median of ~3 %)."""
    options: int = 3
    """Candidate layouts whose switch is priced (the search's fastest)."""
    costs: SwitchCosts = field(default_factory=SwitchCosts)
    """Constants of the live and checkpoint routes."""

    def __post_init__(self) -> None:
        if not isinstance(self.remaining_steps, int) or self.remaining_steps < 0:
            raise SpecError("--remaining-steps", self.remaining_steps, "must be an integer >= 0")
        if not 0 <= self.min_gain < 1:
            raise SpecError("--min-gain", self.min_gain, "must be in [0, 1), e.g. 0.03 for 3 %")
        if self.options < 1:
            raise SpecError("--options", self.options, "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class SwitchOption:
    """One new layout and the switch to it."""

    ranked: RankedPlan
    """The layout with its predicted step."""
    rank_map: RankMap
    """Which GPU plays which new rank."""
    bytes: TransferBytes
    """Per-rank bytes under that map."""
    time: SwitchTime
    """Seconds and memory of the switch."""
    horizon_s: float
    """Switch plus the remaining steps on this layout (s)."""
    recovered: float = 0.0
    """Bytes of lost GPUs' state taken from peer copies (``Plan.state_copies``) instead of storage."""

    @property
    def to_move(self) -> float:
        """Bytes of the new state that are not in place under the chosen map (lost ones included)."""
        return self.bytes.total_need - self.rank_map.kept

    @property
    def to_move_default(self) -> float:
        """The same under the default rank order."""
        return self.bytes.total_need - self.rank_map.kept_default


@dataclass(frozen=True, kw_only=True)
class ReplanResult:
    """The decision and what it rests on."""

    current: Plan
    """The running layout."""
    current_step: float | None
    """Its step time under the new conditions (s); None when it cannot run any more."""
    current_reason: str
    """Why it cannot run (empty when it can)."""
    options: tuple[SwitchOption, ...]
    """Priced candidates, fastest step first."""
    choice: int | None
    """Index of the chosen option; None = keep the current layout."""
    reason: str
    """The decision in words."""
    break_even_steps: float | None
    """Steps after which the chosen switch has paid for itself (None when the current cannot run)."""
    search: SearchResult
    """The search over the new conditions."""
    new_cluster: ClusterSpec
    """The GPUs after the change."""
    change: ClusterChange
    """What changed."""


def idle_worlds(n: int, domain: int, *, keep: float = 0.9) -> tuple[int, ...]:
    """Smaller worlds worth searching: the largest multiple of domain * 2^k below ``n`` for each k, down to ``keep``
    of the GPUs (survivors rarely factor into degrees that divide the batch; these do)."""
    out, k = [], max(domain, 1)
    while k <= n:
        w = n // k * k
        if keep * n <= w < n and w not in out:
            out.append(w)
        k *= 2
    return tuple(out)


def search_worlds(new: ClusterSpec, domain: int, *, keep: float = 0.9) -> tuple[int, ...]:
    """``idle_worlds`` of the new cluster, and with derated parts also the worlds that idle each of its derated
    scale-up domains (``Derating.dropped`` picks them) and their ``idle_worlds``."""
    n, der = new.n_gpus, new.derating
    out = set(idle_worlds(n, domain, keep=keep))
    slow = {g // domain for g, _ in der.gpus} | {d for d, _ in der.links}
    for k in range(1, len(slow) + 1):
        w = n - k * domain
        if w >= keep * n:
            out |= {w} | {x for x in idle_worlds(w, domain, keep=keep * n / w)}
    return tuple(sorted(out, reverse=True))


def new_cluster_of(cluster: ClusterSpec, change: ClusterChange) -> ClusterSpec:
    """The cluster after ``change`` (one pool: replanning a mixed cluster is not supported yet)."""
    if not cluster.homogeneous:
        raise SpecError("--old-gpus", cluster.describe(), "replan supports a cluster of one GPU type so far")
    pool = cluster.pools[0]
    bad = [r for r in change.lost if not 0 <= r < pool.n_gpus]
    if bad:
        raise SpecError("--lose-ranks", bad[0], f"must name ranks of the old world, 0..{pool.n_gpus - 1}")
    bad = [g for g, _ in change.slow.gpus if g >= pool.n_gpus]
    if bad:
        raise SpecError("--slow-gpu", bad[0], f"must name GPUs of the old world, 0..{pool.n_gpus - 1}")
    n = pool.n_gpus - len(set(change.lost)) + change.added
    if n < 1:
        raise SpecError("--lose-ranks", f"{len(set(change.lost))} ranks", f"loses every GPU of the {pool.n_gpus} "
                        "and adds none: nothing is left to re-plan on")
    slow = change.slow.renumbered(change.survivors(pool.n_gpus), pool.network()[0].span)
    return replace(cluster, pools=(replace(pool, n_gpus=n),), derating=slow, name="")


def _current_step(model, cluster, plan: Plan, request: SearchRequest, change: ClusterChange) -> tuple:
    """The running layout's step under the new workload on its own GPUs, or None and why not."""
    from meshplan.cost.estimate import estimate

    if change.lost:
        return None, f"{len(set(change.lost))} of its {plan.n_gpus} GPUs are lost"
    moved = plan.with_(global_batch=request.global_batch, seq_len=request.seq_len)
    try:
        est = estimate(model, replace(cluster, derating=change.slow), moved, stack=request.framework)
    except (SpecError, PlanError) as exc:
        return None, f"it cannot run the new workload: {exc}"
    if est.peak_memory > request.max_memory_fraction * est.capacity:
        return None, (f"it needs {est.peak_memory / 2**30:.1f} GiB per GPU under the new workload, over the "
                      f"{request.max_memory_fraction:.0%} limit of {est.capacity / 2**30:.1f} GiB")
    return est.step_time, ""


def price_option(model: ModelSpec, stack, plan_a: Plan, rp: RankedPlan, *, cluster: ClusterSpec,
                 change: ClusterChange, rq: ReplanRequest) -> SwitchOption:
    """The switch from ``plan_a`` (old ranks = GPU ids 0..n-1) to one ranked layout."""
    pool = cluster.pools[0]
    domain = pool.network()[0].span
    tensors = state_groups(model)
    ga = geometry(model, plan_a, stack)
    gb = geometry(model, rp.plan, stack)
    n_old = plan_a.n_gpus
    usable = np.arange(n_old + change.added, dtype=np.int64)
    if cluster.derating and rp.cluster.n_gpus < cluster.n_gpus:  # the world the step was predicted on idles these
        drop = cluster.derating.dropped(cluster.n_gpus, rp.cluster.n_gpus, domain)
        old_ids = np.asarray(change.survivors(n_old), dtype=np.int64)
        usable = np.setdiff1d(usable, old_ids[[i for i in range(cluster.n_gpus) if i // domain in drop]])
    lost = np.asarray(sorted(set(change.lost)), dtype=np.int64)
    rmap = choose_rank_map(ga, np.arange(n_old), gb, usable=usable, lost=lost, domain=domain, tensors=tensors)
    xb = transfer_bytes(Placement(ga, np.arange(n_old)), Placement(gb, rmap.phys), tensors=tensors, lost_gpus=lost,
                        domain=domain)
    recovered = 0.0
    if xb.lost.sum() > 0 and plan_a.state_copies >= len({int(g) // domain for g in lost}):
        # Each lost shard has a copy on a surviving node (Plan.state_copies): it crosses the NICs instead of being
        # read from the last checkpoint, and no step is lost.
        recovered = float(xb.lost.sum())
        xb = replace(xb, in_fabric=xb.in_fabric + xb.lost, lost=np.zeros_like(xb.lost))
    st = switch_time(xb, phys_b=rmap.phys, pool=pool, calib=gpu_calibration(pool.gpu), costs=rq.costs,
                     new_groups=new_groups(rp.plan))
    return SwitchOption(ranked=rp, rank_map=rmap, bytes=xb, time=st, recovered=recovered,
                        horizon_s=st.total_s + rq.remaining_steps * rp.step_time)


def state_key(plan: Plan) -> Plan:
    """The plan with the fields that do not place state normalised: two layouts that differ only in micro-batch,
    recompute, batch or sequence length hold every tensor on the same ranks, so they switch alike."""
    return replace(plan, micro_batch=1, recompute="none", recompute_layers=0, global_batch=plan.dp,
                   seq_len=plan.cp * plan.tp, batch_shares=())


def _priced(model, stack, plan_a: Plan, ranked, *, cluster, change, rq) -> tuple[SwitchOption, ...]:
    """``price_option`` of each layout; layouts that place state alike share one rank map and transfer."""
    done: dict[Plan, SwitchOption] = {}
    out = []
    for rp in ranked:
        key = state_key(rp.plan)
        if key not in done:
            done[key] = price_option(model, stack, plan_a, rp, cluster=cluster, change=change, rq=rq)
        first = done[key]
        out.append(replace(first, ranked=rp, horizon_s=first.time.total_s + rq.remaining_steps * rp.step_time))
    return tuple(out)


def replan(model: ModelSpec, cluster: ClusterSpec, plan_a: Plan, *, change: ClusterChange, request: SearchRequest,
           rq: ReplanRequest) -> ReplanResult:
    """Search the new conditions, price the switch to the best few layouts, decide."""
    if plan_a.n_gpus != cluster.n_gpus:
        raise SpecError("--from", plan_a.n_gpus, f"the plan occupies {plan_a.n_gpus} GPUs but the old cluster has "
                        f"{cluster.n_gpus}; give the cluster it runs on with --old-gpus")
    check_plan(model, cluster, plan_a)
    new = new_cluster_of(cluster, change)
    domain = new.pools[0].network()[0].span
    # Only the fastest rq.options layouts are priced: the bound prunes against the last of them, and the
    # time/memory front (a table's extra rows) is not needed.
    req = replace(request, worlds=search_worlds(new, domain), top=rq.options, front=False)
    result = search(model, new, req)
    current_step, why = _current_step(model, cluster, plan_a, request, change)
    stack = request.framework
    options = _priced(model, stack, plan_a, result.plans[:rq.options], cluster=new, change=change, rq=rq)
    choice, reason, even = decide(options, current_step, why, rq)
    return ReplanResult(current=plan_a, current_step=current_step, current_reason=why, options=options,
                        choice=choice, reason=reason, break_even_steps=even, search=result, new_cluster=new,
                        change=change)


def decide(options: tuple[SwitchOption, ...], current_step: float | None, why: str,
           rq: ReplanRequest) -> tuple[int | None, str, float | None]:
    """(chosen option or None, reason, break-even steps)."""
    if not options:
        return None, ("no layout fits the new conditions" + (f" and the current one cannot run ({why})" if why
                                                             else "; keep the current layout")), None
    best = min(range(len(options)), key=lambda i: options[i].horizon_s)
    opt = options[best]
    if current_step is None:
        return best, (f"the current layout cannot run ({why}); #{best + 1} finishes the remaining "
                      f"{rq.remaining_steps} steps soonest, switch included"), None
    gain = (current_step - opt.ranked.step_time) / current_step
    stay = rq.remaining_steps * current_step
    if gain <= 0:
        return None, f"no candidate is faster than the current layout ({current_step:.3f} s per step)", None
    even = opt.time.total_s / (current_step - opt.ranked.step_time)
    if gain < rq.min_gain:
        return None, (f"#{best + 1} is only {gain:.2%} faster per step, under --min-gain {rq.min_gain:.0%}: stay"), even
    if opt.horizon_s >= stay:
        return None, (f"#{best + 1} saves {current_step - opt.ranked.step_time:.3f} s per step but needs {even:.0f} "
                      f"steps to pay back its {opt.time.total_s:.1f} s switch; {rq.remaining_steps} remain: stay"), even
    return best, (f"#{best + 1} is {gain:.1%} faster per step and pays back its {opt.time.total_s:.1f} s switch in "
                  f"{even:.0f} steps of the {rq.remaining_steps} remaining"), even

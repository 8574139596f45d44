"""RL phase switch: the generation layout for a training job's GPUs, from the serving planner, with the refit that
moves the trained weights into it priced by the transition model.

Colocated RL (NeMo-RL, verl, OpenRLHF; ``shared/notes/elastic.md`` sec. 1) alternates a training layout and a
generation engine on the same GPUs every iteration. The refit moves 16-bit weights only, never optimizer state
(NeMo-RL ``nccl_reshard_refit``: M-to-N shard overlaps, batched point-to-point, fan-out to replicas), so it is the
weights-only geometry of the engine's layout. Back to training, the training state is where it was: nothing moves.
The choice minimises refit + generation time of the rollout batch (``rollouts x output tokens / tokens per s``),
not throughput alone: a layout far from the training one may refit slower than it generates faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.calib import gpu_calibration
from meshplan.cost.rankmap import RankMap, choose_rank_map
from meshplan.cost.state_layout import geometry, state_groups, weights_only
from meshplan.cost.transition import Placement, TransferBytes, transfer_bytes
from meshplan.cost.transition_time import SwitchCosts, SwitchTime, new_groups, switch_time
from meshplan.errors import SpecError
from meshplan.search.serve import search as serve_search
from meshplan.search.serve_request import ServeCandidate, ServeRequest
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.serving import ServePlan


@dataclass(frozen=True, kw_only=True)
class GenerationOption:
    """One engine layout and the refit into it."""

    candidate: ServeCandidate
    """The serving planner's layout and prediction."""
    rank_map: RankMap
    """Which GPU plays which engine rank."""
    bytes: TransferBytes
    """Weights moved per rank."""
    time: SwitchTime
    """The refit's seconds and memory."""
    generate_s: float
    """Generating the rollout batch on this layout (s)."""

    @property
    def total_s(self) -> float:
        """Refit plus generation (s)."""
        return self.time.total_s + self.generate_s


@dataclass(frozen=True, kw_only=True)
class PhaseResult:
    """The generation phase's choice."""

    training: Plan
    """The training layout the weights come from."""
    options: tuple[GenerationOption, ...]
    """Priced engine layouts, fastest generation first."""
    choice: int | None
    """Index of the least refit + generation time; None when no layout fits."""
    reason: str
    """The choice in words."""
    rollouts: int
    """Prompts generated per phase."""


def engine_plan(sp: ServePlan) -> Plan:
    """The engine's layout in training-plan terms, for the state geometry: replicas are dp, no ZeRO (every
    replica holds its weights whole, sharded only over its tp x pp), experts over ep inside a replica."""
    return Plan(global_batch=sp.replicas, seq_len=sp.tp, tp=sp.tp, pp=sp.pp, dp=sp.replicas,
                ep=sp.ep if sp.ep > 1 else 1, zero=0)


def price_refit(model: ModelSpec, stack, plan_a: Plan, cand: ServeCandidate, *, cluster: ClusterSpec,
                costs: SwitchCosts, tokens: float) -> GenerationOption:
    """The weights-only switch from the training layout (GPU ids 0..n-1) to one engine layout, and the time to
    generate ``tokens`` output tokens on it."""
    pool = cluster.pools[0]
    domain = pool.network()[0].span
    gen = engine_plan(cand.plan)
    ga, gb = geometry(model, plan_a, stack), weights_only(geometry(model, gen, stack))
    tensors, none = state_groups(model), np.array([], dtype=np.int64)
    ids = np.arange(plan_a.n_gpus)
    rmap = choose_rank_map(ga, ids, gb, usable=ids, lost=none, domain=domain, tensors=tensors)
    xb = transfer_bytes(Placement(ga, ids), Placement(gb, rmap.phys), tensors=tensors, lost_gpus=none, domain=domain)
    st = switch_time(xb, phys_b=rmap.phys, pool=pool, calib=gpu_calibration(pool.gpu), costs=costs,
                     new_groups=new_groups(gen))
    return GenerationOption(candidate=cand, rank_map=rmap, bytes=xb, time=st,
                            generate_s=tokens / cand.pred.output_tokens_per_s)


def plan_generation(model: ModelSpec, cluster: ClusterSpec, plan_a: Plan, *, serve: ServeRequest, stack,
                    costs: SwitchCosts, options: int = 3) -> PhaseResult:
    """Search engine layouts on the training job's GPUs (aggregated, colocated), price the refit into the
    fastest ``options`` that meet the SLOs, and choose the least refit + generation time."""
    if plan_a.n_gpus != cluster.n_gpus:
        raise SpecError("--from", plan_a.n_gpus, f"the plan occupies {plan_a.n_gpus} GPUs, the cluster has "
                        f"{cluster.n_gpus}")
    rollouts = serve.work.concurrency
    found = serve_search(serve)
    fits = [c for c in found.candidates if c.meets and not c.disaggregated and c.gpus <= cluster.n_gpus]
    fits.sort(key=lambda c: -c.pred.output_tokens_per_s)
    shapes: dict[tuple, ServeCandidate] = {}
    for c in fits:  # the fastest of each replica shape (more replicas of one shape refit alike)
        shapes.setdefault((c.plan.tp, c.plan.pp, c.plan.ep), c)
    fits = list(shapes.values())
    tokens = rollouts * serve.work.output_len
    priced = [price_refit(model, stack, plan_a, c, cluster=cluster, costs=costs, tokens=tokens)
              for c in fits[:options]]
    if not priced:
        return PhaseResult(training=plan_a, options=(), choice=None, rollouts=rollouts,
                           reason="no engine layout fits these GPUs under the SLOs")
    best = min(range(len(priced)), key=lambda i: priced[i].total_s)
    opt = priced[best]
    why = (f"#{best + 1} generates the {rollouts} rollouts in {opt.generate_s:.1f} s after a {opt.time.total_s:.2f} s "
           f"refit, the least of the {len(priced)} layouts priced")
    return PhaseResult(training=plan_a, options=tuple(priced), choice=best, reason=why, rollouts=rollouts)

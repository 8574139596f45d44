"""Layer separation (Stanza: Wu, Xu, Li and Xiong, IEEE Trans. Services Computing 2020, arXiv:1812.10624): most
data-parallel workers train the layers that hold the computation, and a few *dense workers* hold the layers whose
parameters dominate the gradient traffic but cost little to compute, so those parameters are never exchanged
across the whole cluster. In Stanza's CNNs those are the fully connected layers; in a language model they are the
vocabulary layers: the input embedding (a lookup: V x h parameters, no FLOPs) and the output head (V x h, 2 V h
FLOPs a token against the blocks' ~2 N). A small model with a large vocabulary on a weak network is where it pays
(Llama-3.2-1B: 21 % of its parameters are the tied embedding, 2.6 % of its FLOPs the head).

The layout priced here is a data-parallel job (tp = pp = cp = ep = 1, no ZeRO) on n GPUs, m of them dense:

- w = n - m *light workers* run the transformer blocks on the global batch's G samples, b per micro-batch,
  k = ceil(G / (w b)) micro-batches each (the step waits for the busiest), and all-reduce the blocks' gradients;
- the m dense workers each serve w / m light workers: per micro-batch they send the embedded inputs (b s h
  activations) and take back their gradient, take the last block's output and send back its gradient after
  running the head and the loss; they all-reduce the vocabulary gradients among themselves only;
- per micro-batch a light worker and its dense worker form a two-stage pipeline (the light worker runs its next
  forward while the dense worker serves the last one), so k micro-batches take k times the slowest of the light
  compute, the dense worker's share of head compute and either NIC's share of the exchange, plus one round trip
  to fill and drain (GPipe's bubble with two stages, Huang et al. 2019 sec. 2.2). The trips and the blocks'
  all-reduce share a light worker's NIC only during the last micro-batch's backward; that overlap is not charged.

The light workers' blocks are priced by the cost model itself (``estimate`` of the model with its vocabulary
layers reduced to one token, ``blocks_only``), on all n GPUs (a ring over n rather than w ranks: 2(n-1)/n against
2(w-1)/w of the gradients, under 2 % apart at n >= 16), so every physics term of a block is the one the planner
uses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.cost.calib import gpu_calibration
from meshplan.cost.comm import collective_time, plan_links
from meshplan.cost.compute import memory_time
from meshplan.cost.dp import optimizer_time
from meshplan.cost.estimate import estimate
from meshplan.cost.memory import bytes_per_param, logits_bytes
from meshplan.cost.result import Estimate
from meshplan.cost.stage import Ctx, embedding_params, head_cost
from meshplan.errors import SpecError
from meshplan.spec.cluster import ClusterSpec, GroupLink, group_link
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan

EMBEDDING_GRAD_PASSES = 3.0
"""Embedding backward as memory traffic: read the incoming gradient, read and write the rows it adds into
(``embedding_dense_backward``'s scatter-add), in units of the gradient's bytes."""


@dataclass(frozen=True, kw_only=True)
class Separation:
    """One step of a layer-separated data-parallel job (s and bytes)."""

    dense_workers: int
    light_workers: int
    micro_batches: int
    """Micro-batches a light worker runs per step."""
    light_compute: float
    """A light worker's block compute per micro-batch (forward, backward, recompute)."""
    dense_compute: float
    """A dense worker's head, loss and embedding work for the w / m light micro-batches it serves at once."""
    exchange: float
    """NIC time of the busier side per light micro-batch (embedding out and back, last hidden state in and out)."""
    fill: float
    """One micro-batch's round trip the pipeline cannot hide."""
    light_sync: float
    """Exposed all-reduce of the blocks' gradients among the light workers."""
    dense_sync: float
    """All-reduce of the vocabulary gradients among the dense workers."""
    optimizer: float
    overhead: float
    step_time: float
    light_peak: float
    """A light worker's peak memory: the blocks, with two micro-batches' activations in flight."""
    dense_peak: float
    """A dense worker's peak memory: vocabulary parameters, gradients and optimizer states, logits, received
    hidden states."""
    capacity: float
    vocab_params: float

    @property
    def fits(self) -> bool:
        return max(self.light_peak, self.dense_peak) <= self.capacity

    @property
    def bound(self) -> str:
        """What paces the pipeline: ``light compute``, ``dense compute`` or ``exchange``."""
        stages = {"light compute": self.light_compute, "dense compute": self.dense_compute,
                  "exchange": self.exchange}
        return max(stages, key=stages.get)

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {**out, "fits": self.fits, "bound": self.bound}


def blocks_only(model: ModelSpec) -> ModelSpec:
    """The model a light worker trains: its vocabulary layers reduced to a single token, which keeps every block's
    shape and drops the embedding's and head's parameters, FLOPs and logits."""
    return replace(model, vocab=1, tied_embeddings=False)


def vocabulary_params(model: ModelSpec, plan: Plan) -> float:
    """Parameters of the embedding and output head (one matrix when tied): ``stage.embedding_params`` of a rank
    that holds both."""
    return embedding_params(model, plan, first=True, last=True, mtp=False)


def check_separable(model: ModelSpec, cluster: ClusterSpec, plan: Plan, dense_workers: int) -> None:
    """The layouts this module prices: a data-parallel job on one pool, fewer dense than light workers."""
    if len(cluster.pools) != 1:
        raise SpecError("--dense-workers", dense_workers, "layer separation is priced on one GPU type; "
                        f"{cluster.describe()} mixes several")
    if (plan.tp, plan.pp, plan.cp, plan.ep, plan.zero) != (1, 1, 1, 1, 0):
        raise SpecError("--dense-workers", dense_workers, "layer separation splits a data-parallel job: needs tp, "
                        f"pp, cp and ep 1 and zero 0 (the plan has tp{plan.tp} pp{plan.pp} cp{plan.cp} "
                        f"ep{plan.ep} z{plan.zero})")
    if not 1 <= dense_workers < plan.dp - dense_workers:
        raise SpecError("--dense-workers", dense_workers, f"must be between 1 and {max((plan.dp - 1) // 2, 1)}: "
                        f"fewer dense workers than the {plan.dp} GPUs' light ones")
    if plan.global_batch < (plan.dp - dense_workers) * plan.micro_batch:
        raise SpecError("--dense-workers", dense_workers, f"global batch {plan.global_batch} leaves some of the "
                        f"{plan.dp - dense_workers} light workers without a micro-batch of {plan.micro_batch}")


def _exchange_link(cluster: ClusterSpec) -> GroupLink:
    """A light worker's link to a dense worker: the scale-out NIC when the job spans machines (dense workers sit
    together on one machine, most light workers elsewhere), else the machine's own link."""
    levels = cluster.pools[0].network()
    lv = levels[-1]
    return GroupLink(bandwidth=lv.bandwidth, latency=lv.latency, level=lv.name)


def separated_step(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, stack: FrameworkProfile,
                   dense_workers: int, calib: dict | None = None) -> Separation:
    """The step of ``plan`` (data parallel over all of ``cluster``) with ``dense_workers`` of its GPUs holding the
    vocabulary layers (the module docstring)."""
    check_separable(model, cluster, plan, dense_workers)
    n, m = plan.dp, dense_workers
    w, b = n - m, plan.micro_batch
    k = -(-plan.global_batch // (w * b))
    light = estimate(blocks_only(model), cluster, plan.with_(global_batch=n * b * k), stack=stack, calib=calib)
    pool = cluster.pools[0]
    cal = gpu_calibration(pool.gpu, calib, library=stack.kernel_library)
    ctx = Ctx(model=model, plan=plan, stack=stack, gpu=pool.gpu, links=plan_links(plan, pool), calib=cal)
    head_f, head_b = head_cost(model, ctx)
    x = b * plan.seq_len * model.hidden * plan.act_bytes  # one micro-batch's hidden states (and their gradient)
    per_served = head_f + head_b + memory_time(EMBEDDING_GRAD_PASSES * x, gpu=pool.gpu, calib=cal)
    served = w / m
    hop = collective_time("send_recv", x, size=2, link=_exchange_link(cluster), calib=cal)
    light_compute = light.time.compute / k
    dense_compute = served * per_served
    exchange = 2 * hop * max(served, 1.0)  # each NIC sends two tensors a micro-batch and takes two (full duplex)
    fill = 3 * hop + per_served  # embedding out, hidden state in, gradient back; the first micro-batch's head
    vocab = vocabulary_params(model, plan)
    w_b, g_b, o_b = bytes_per_param(plan, stack)
    dense_sync = collective_time("all_reduce", vocab * g_b, size=m, link=group_link(pool, size=m, stride=1),
                                 calib=cal)
    dense_opt = optimizer_time(vocab, 0.0, plan=plan.with_(dp=1, global_batch=b), stack=stack,
                               hbm_bandwidth=pool.gpu.hbm_bandwidth, mem_eff=cal.mem_eff)
    optimizer = max(light.time.optimizer, dense_opt)
    pipe = k * max(light_compute, dense_compute, exchange) + fill
    step = pipe + max(light.time.dp_comm, dense_sync) + optimizer + light.time.overhead
    dense_peak = (vocab * (w_b + g_b + o_b) + logits_bytes(model, plan, stack) + 2 * served * x
                  + light.memory.reserved)
    return Separation(dense_workers=m, light_workers=w, micro_batches=k, light_compute=light_compute,
                      dense_compute=dense_compute, exchange=exchange, fill=fill, light_sync=light.time.dp_comm,
                      dense_sync=dense_sync, optimizer=optimizer, overhead=light.time.overhead, step_time=step,
                      light_peak=light.peak_memory + light.memory.activations, dense_peak=dense_peak,
                      capacity=light.capacity, vocab_params=vocab)


def dense_options(n: int) -> tuple[int, ...]:
    """Dense-worker counts ``best_separation`` tries on n GPUs: powers of two up to a quarter of them (Stanza
    keeps the dense workers few; an LLM's head, 3-7 % of its FLOPs, needs about that share of the GPUs to keep
    pace with the blocks)."""
    out, m = [], 1
    while m <= max(n // 4, 1) and m < n - m:
        out.append(m)
        m *= 2
    return tuple(out)


def best_separation(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, stack: FrameworkProfile,
                    limit: float = 1.0, calib: dict | None = None) -> Separation | None:
    """The fastest separation of ``plan`` over ``dense_options`` whose peaks stay within ``limit`` of the device
    memory, or None when none does (or the plan is not a data-parallel job)."""
    best = None
    for m in dense_options(plan.dp):
        try:
            sep = separated_step(model, cluster, plan, stack=stack, dense_workers=m, calib=calib)
        except SpecError:  # a layout it does not split, or a batch too small for this many light workers
            continue
        if max(sep.light_peak, sep.dense_peak) <= limit * sep.capacity and (best is None or
                                                                             sep.step_time < best.step_time):
            best = sep
    return best


def compare(sep: Separation, whole: Estimate) -> str:
    """One line: the separated step against every GPU training the whole model."""
    verdict = (f"{whole.step_time / sep.step_time:.2f}x faster than all {sep.dense_workers + sep.light_workers} "
               f"GPUs training the whole model ({whole.step_time:.3f} s)" if sep.step_time < whole.step_time else
               f"no faster than all GPUs training the whole model ({whole.step_time:.3f} s)")
    return (f"layer separation (Stanza): {sep.dense_workers} dense worker(s) hold the embedding and output head "
            f"({sep.vocab_params / 1e6:,.0f}M parameters), {sep.light_workers} light workers the blocks: step "
            f"{sep.step_time:.3f} s, paced by {sep.bound}; {verdict} (no published run covers this layout: the "
            "figure is the model's physics alone, without an error band)")

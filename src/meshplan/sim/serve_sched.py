"""One serving replica's scheduler, iteration by iteration: what the next forward pass carries.

The rules are the engine profile's (``EngineProfile``), the ones the analytic request layer
(``cost/serve_load.py``) averages over:

- **Admission** (vLLM ``Scheduler._schedule_prefills``, TensorRT-LLM ``capacityScheduler.cpp``): a waiting
  request joins while the running set is below ``max_num_seqs`` and the KV cache has room: for ``reserve``
  engines the blocks to its completion (TRT-LLM GuaranteedNoEvict), for ``lazy`` ones its prompt's blocks, the
  rest taken as it grows; a lazy engine that runs out of blocks preempts its newest request, which is prefilled
  again later with what it had generated (vLLM's recompute preemption).
- **Composition** (``mixed_batches``): vLLM V1 and TRT-LLM in-flight batching decode every running sequence and
  fill the rest of ``max_batched_tokens`` with prompt tokens in arrival order, in chunks when
  ``chunked_prefill`` (a prompt that does not fit whole otherwise waits, unless it is alone: the engine was
  built for it); vLLM V0 and SGLang 0.3 run a prefill-only step of whole prompts whenever one can be admitted,
  else a decode step.
- **Multi-step** scheduling (vLLM 0.6 ``--num-scheduler-steps``) decodes ``multi_step`` tokens per scheduling
  round; prompts join only between rounds.

Times come from the step model (``serve_step``: ``decode_time``, ``mixed_time``, ``prefill_time``), memoised on
rounded arguments, so the simulation and the analytic model share one set of physics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.cost.serve_load import kv_capacity_tokens
from meshplan.cost.serve_step import StepContext, decode_time, mixed_time, prefill_time


@dataclass(kw_only=True, eq=False)
class Request:
    """A request's progress through the replica (times in s from the run's start)."""

    arrival: float
    prompt: int
    """Prompt tokens."""
    output: int
    """Tokens to generate (the benchmark ignores EOS)."""
    prefilled: int = 0
    """Prompt tokens (after a preemption: prompt and regenerated tokens) in the KV cache."""
    generated: int = 0
    first: float = -1.0
    """Time of the first generated token (-1 before)."""
    end: float = -1.0
    redo: int = 0
    """Generated tokens a recompute preemption threw away, prefilled again with the prompt."""

    @property
    def to_prefill(self) -> int:
        """Tokens the engine must still prefill before this request decodes."""
        return self.prompt + self.redo - self.prefilled

    @property
    def cached(self) -> int:
        """Tokens this request holds in the KV cache."""
        return self.prefilled + (self.generated - self.redo if not self.to_prefill else 0)


@dataclass(frozen=True, kw_only=True)
class Iteration:
    """One forward pass: the sequences it decodes and the prompt tokens it prefills, per request."""

    decode: tuple[Request, ...]
    chunks: tuple[tuple[Request, int], ...]
    steps: int = 1
    """Decode steps the pass runs before the scheduler runs again (multi-step scheduling)."""


@dataclass(kw_only=True)
class Replica:
    """A replica's scheduler state: waiting and running requests and the KV blocks they hold."""

    ctx: StepContext
    waiting: list[Request] = field(default_factory=list)
    running: list[Request] = field(default_factory=list)
    _memo: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.block = self.ctx.engine.block_size
        self.capacity = kv_capacity_tokens(self.ctx) // self.block
        self.budget = self.ctx.engine.max_batched_tokens * self.ctx.plan.pp

    # ------------------------------------------------------------------ KV blocks
    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block)

    def _held(self, r: Request) -> int:
        """Blocks a running request holds now (reserve: to its completion)."""
        if self.ctx.engine.admission == "reserve":
            return self._blocks(r.prompt + r.output)
        return self._blocks(max(r.cached, 1))

    def free_blocks(self) -> int:
        return self.capacity - sum(self._held(r) for r in self.running)

    def _admit_need(self, r: Request) -> int:
        if self.ctx.engine.admission == "reserve":
            return self._blocks(r.prompt + r.output)
        return self._blocks(r.prompt + r.redo + 1)

    # ------------------------------------------------------------------ scheduling
    def _admit(self, room: int, *, whole_only: bool) -> list[tuple[Request, int]]:
        """Prompt tokens for the prefilling running requests first, then waiting ones in arrival order, within
        ``room`` tokens, the sequence cap and the KV cache."""
        chunked = self.ctx.engine.chunked_prefill and not whole_only
        chunks: list[tuple[Request, int]] = []
        for r in self.running:
            if r.to_prefill and room > 0:
                take = min(r.to_prefill, room) if chunked else (r.to_prefill if r.to_prefill <= room else 0)
                if take:
                    chunks.append((r, take))
                    room -= take
        free = self.free_blocks()
        while self.waiting and room > 0 and len(self.running) < self.ctx.engine.max_num_seqs:
            r = self.waiting[0]
            need = self._admit_need(r)
            if need > free:
                break
            alone = not chunks and room >= self.budget - len(self.running)
            if chunked:
                take = min(r.to_prefill, room)
            elif r.to_prefill <= room or alone:  # an engine built for a long prompt runs it alone
                take = r.to_prefill
            else:
                break
            self.waiting.pop(0)
            self.running.append(r)
            free -= need
            chunks.append((r, take))
            room -= take
        return chunks

    def next_iteration(self) -> Iteration | None:
        """What the next forward pass carries (None when there is nothing to run)."""
        decoding = [r for r in self.running if not r.to_prefill]
        engine = self.ctx.engine
        if engine.mixed_batches:
            chunks = self._admit(max(self.budget - len(decoding), 0), whole_only=False)
            if not decoding and not chunks:
                return None
            return Iteration(decode=tuple(decoding), chunks=tuple(chunks))
        chunks = self._admit(self.budget, whole_only=True)
        if chunks:  # a prefill step runs instead of the decode step (vLLM V0, SGLang 0.3)
            return Iteration(decode=(), chunks=tuple(chunks))
        if not decoding:
            return None
        return Iteration(decode=tuple(decoding), chunks=(), steps=max(engine.multi_step, 1))

    def preempt_for_growth(self) -> None:
        """A lazy engine whose decodes need more blocks than are free preempts its newest requests."""
        if self.ctx.engine.admission == "reserve":
            return
        while len(self.running) > 1:
            grow = sum(1 for r in self.running if not r.to_prefill and r.cached % self.block == 0)
            if self.free_blocks() >= grow:
                return
            victim = self.running.pop()
            victim.prefilled, victim.redo = 0, victim.generated
            self.waiting.insert(0, victim)

    # ------------------------------------------------------------------ time
    def duration(self, it: Iteration) -> float:
        """Seconds of the pass: a decode step, a prefill step, or both in one forward (memoised on rounded
        arguments: batch exact, contexts and chunks to 1/32 of their size)."""
        n = len(it.decode)
        ctx_len = sum(r.cached for r in it.decode) / n if n else 0.0
        if not it.chunks:
            key = ("d", n, _round(ctx_len))
            if key not in self._memo:
                self._memo[key] = decode_time(self.ctx, batch=n, context=key[2])
            return self._memo[key] * it.steps
        tokens = sum(t for _, t in it.chunks)
        # A chunk of t tokens after p cached ones attends to t (p + t / 2) keys, as t tokens of a 2p + t prompt
        seq = sum((2 * r.prefilled + t) * t for r, t in it.chunks) / tokens
        if not n and not self.ctx.engine.mixed_batches:
            k = len(it.chunks)
            key = ("p", _round(tokens / k), k)
            if key not in self._memo:
                self._memo[key] = prefill_time(self.ctx, tokens=key[1], prompts=k)
            return self._memo[key]
        key = ("m", n, _round(ctx_len), _round(tokens), _round(seq))
        if key not in self._memo:
            self._memo[key] = mixed_time(self.ctx, batch=n, context=key[2], chunk=key[3], seq=max(key[4], 1))
        return self._memo[key]


def _round(x: float) -> int:
    """``x`` to about 1/32 of itself (at least 1): the memo's grid."""
    x = max(int(round(x)), 1)
    step = max(1 << max(x.bit_length() - 6, 0), 1)
    return max(step * round(x / step), 1)

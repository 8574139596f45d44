"""The steady state of an engine that prefills beside the running decodes in one forward (``EngineProfile.
mixed_batches``: vLLM V1's shared token budget, TensorRT-LLM in-flight batching; ``chunked_prefill`` says whether
a prompt longer than the room is split).

Every iteration decodes the ``n_d`` running sequences and, to replace the ``n_d / O`` of them that finish, must
prefill ``n_d I / O`` prompt tokens on average. A prompt rides in an iteration's spare token budget
(``max_batched_tokens`` less the decodes), whole when it fits, in chunks when not, several together when the
demand is larger than one prompt; the iterations that carry one are ``mixed_time`` long (the decodes' weight
reads hide under the chunk's GEMMs: Sarathi-Serve, Agrawal et al. OSDI'24), the others decode only. The budget
caps the decoding set at ``B O / (O + I)`` (B per batch in flight): beyond it the prefills cannot keep up
(trtllm-bench sizes ``max_num_tokens`` as batch x (1 + ISL/OSL) for the same reason:
tensorrt_llm/bench/build/tuning.py ``finetune_setting``).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.serve_spec import tokens_per_pass, verify_rows
from meshplan.cost.serve_step import StepContext, decode_time, mixed_time, step_budget
from meshplan.spec.serving import Workload


@dataclass(frozen=True, kw_only=True)
class ChunkedState:
    """One replica's iterations in steady state (s)."""

    decoding: int
    """Sequences decoding in every iteration."""
    chunk: int
    """Prompt tokens a mixed iteration carries."""
    share: float
    """Share of iterations that carry prompt tokens."""
    t_decode: float
    """A decode-only iteration."""
    t_mixed: float
    """An iteration carrying a chunk."""
    first: float
    """The iterations that prefill one prompt, to its first token."""
    prompts: int = 1
    """Whole prompts one iteration's room holds: the batch a waiting queue is served in."""
    room: int = 1
    """Prompt tokens one mixed iteration has room for."""
    seq: int = 1
    """Length of the prompts whose causal attention the mixed iteration's chunk carries (length-biased)."""
    tokens_per_pass: float = 1.0
    """Tokens every iteration yields a decoding sequence (a speculating engine's mean acceptance length)."""

    def first_for(self, tokens: float) -> float:
        """The iterations that prefill a prompt of ``tokens`` to its first token: one when it fits the room, else
        tokens / room iterations' worth of full chunks (its last one partial)."""
        return max(tokens / self.room, 1.0) * self.t_mixed

    @property
    def iteration(self) -> float:
        """The mean iteration: every running sequence's time per ``tokens_per_pass`` output tokens."""
        return self.share * self.t_mixed + (1.0 - self.share) * self.t_decode


def chunked_state(ctx: StepContext, work: Workload, resident: int) -> ChunkedState:
    """The steady state with ``resident`` requests on one replica (see the module docstring)."""
    budget = step_budget(ctx)
    bins = work.bins("input")
    mean_in = sum(p * n for n, p in bins)
    # A chunk's tokens come from prompts in proportion to their length and each attends to its own prefix, so the
    # causal attention of the mix is that of prompts of E[I^2] / E[I] tokens.
    seq = max(int(round(sum(p * n * n for n, p in bins) / max(mean_in, 1e-9))), 1)
    out = max(work.output_len, 1)
    # A speculating decode takes k + 1 of the budget's tokens and yields tau: its sequence finishes tau / O per
    # iteration, and its replacement's prompt must ride in the same budget
    q, tau = verify_rows(ctx), tokens_per_pass(ctx)
    n_d = max(1, min(resident, int(budget / (q + tau * mean_in / out))))
    # An engine that never splits a prompt runs it whole in the iteration it joins (TRT-LLM without chunked context)
    room = max(budget - n_d * q, 1) if ctx.engine.chunked_prefill else max(budget - n_d * q, int(mean_in), 1)
    need = n_d * tau * mean_in / out
    chunk = max(1, int(min(room, max(need, mean_in))))
    share = min(need / chunk, 1.0)
    context = work.mean_context
    t_mixed = mixed_time(ctx, batch=n_d, context=context, chunk=chunk, seq=seq)
    # A prompt longer than the room rides in I / room iterations' worth of full chunks (its last one partial).
    first = max(mean_in / room, 1.0) * t_mixed
    return ChunkedState(decoding=n_d, chunk=chunk, share=share, t_decode=decode_time(ctx, batch=n_d, context=context),
                        t_mixed=t_mixed, first=first, prompts=max(int(room // max(mean_in, 1.0)), 1), room=room,
                        seq=seq, tokens_per_pass=tau)


def prompt_firsts(ctx: StepContext, work: Workload, st: ChunkedState) -> tuple[tuple[float, float], ...]:
    """(time to the first token, probability) per prompt length of ``work`` in the steady state ``st``: a prompt
    that fits the room rides one iteration beside the other prompts' tokens (the mean iteration's chunk, less a mean
    prompt, plus its own; priced at the shortest and longest such prompt and linear between, as the chunk's GEMMs
    are in its rows), a longer one its chunks (``ChunkedState.first_for``)."""
    bins = work.bins("input")
    mean_in = sum(p * n for n, p in bins)
    fits = [n for n, _ in bins if n <= st.room]
    if not fits:
        return tuple((st.first_for(n), p) for n, p in bins)
    short, long = min(fits), max(fits)

    def rides(tokens: int) -> float:
        chunk = max(int(round(st.chunk - mean_in + tokens)), 1)
        return mixed_time(ctx, batch=st.decoding, context=work.mean_context, chunk=chunk, seq=st.seq)

    t_short = rides(short)
    slope = (rides(long) - t_short) / (long - short) if long > short else 0.0
    return tuple((t_short + slope * (n - short) if n <= st.room else st.first_for(n), p) for n, p in bins)

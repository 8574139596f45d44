"""Serving on the reference decoder: a paged-free KV cache, continuous batching and greedy generation, on one
process or a tensor-parallel group (the runtime's DTensor TP), so ``meshplan check --serve`` can time real
prefill and decode steps and prove the generated tokens equal a single-process greedy reference.

The cache hooks the attention core, the one swappable part of ``Attention``: each layer keeps the keys and
values of every slot (after RoPE and the grouped-query expansion, its local heads under TP) and attends a decode
step's query over the slot's cached prefix. The scheduler is the iteration-level one the serving model assumes
(Orca, Yu et al. OSDI'22): each round admits at most one waiting request into a free slot (its prefill is a step
of its own), then runs one decode step for every running sequence, so the start-up wave of a closed loop spreads
out and arrivals desynchronise as they do behind a real server's jitter. It depends only on counts,
never on time, so every rank of a TP group takes the same steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from meshplan.errors import SpecError
from meshplan.runtime.models.decoder import Decoder
from meshplan.runtime.models.layers import Attention


@dataclass
class StepState:
    """What the current forward is: a prefill of one slot, or a decode step of several (shared by the layers)."""

    mode: str = "prefill"
    slots: torch.Tensor | None = None
    """Cache slots of the rows of this forward."""
    lengths: torch.Tensor | None = None
    """Cached tokens of each row's slot before this forward."""


class CachedCore:
    """An attention core with a KV cache of ``n_slots`` sequences of up to ``max_len`` tokens."""

    def __init__(self, state: StepState, n_slots: int, max_len: int):
        self.state, self.n_slots, self.max_len = state, n_slots, max_len
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def _alloc(self, k: torch.Tensor, v: torch.Tensor) -> None:
        h, dk, dv = k.shape[1], k.shape[-1], v.shape[-1]
        self.k = torch.zeros(self.n_slots, h, self.max_len, dk, dtype=k.dtype, device=k.device)
        self.v = torch.zeros(self.n_slots, h, self.max_len, dv, dtype=v.dtype, device=v.device)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
        """q, k, v: [rows, heads, seq, dim]."""
        if self.k is None:
            self._alloc(k, v)
        st = self.state
        if st.mode == "prefill":  # one prompt from position 0: causal attention over itself
            slot, n = int(st.slots[0]), k.shape[2]
            self.k[slot, :, :n], self.v[slot, :, :n] = k[0], v[0]
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        rows = torch.arange(len(st.slots), device=k.device)
        self.k[st.slots, :, st.lengths] = k[rows, :, 0]
        self.v[st.slots, :, st.lengths] = v[rows, :, 0]
        span = int(st.lengths.max()) + 1
        keys, values = self.k[st.slots, :, :span], self.v[st.slots, :, :span]
        mask = torch.arange(span, device=k.device)[None, :] <= st.lengths[:, None]  # [rows, span]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None, None, :])


def install_cache(model: Decoder, *, n_slots: int, max_len: int) -> StepState:
    """Give every attention layer a KV cache; returns the shared step state the engine sets before a forward."""
    state = StepState()
    for block in model.layers.values():
        att = block.attention
        if not isinstance(att, Attention):
            raise SpecError("model", type(att).__name__, "the KV cache hooks grouped-query attention only")
        att.core = CachedCore(state, n_slots, max_len)
    return state


def _full(logits) -> torch.Tensor:
    """Logits of the whole vocabulary on every rank (a vocab-parallel DTensor is gathered)."""
    return logits.full_tensor() if hasattr(logits, "full_tensor") else logits


@dataclass
class Request:
    """One request of the closed loop and what happened to it."""

    index: int
    prompt: torch.Tensor
    output_len: int
    arrival: float = 0.0
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    """Wall time of each generated token."""


def prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[torch.Tensor]:
    """``n`` prompts of ``length`` random token ids, each from its own seeded generator."""
    return [torch.randint(vocab, (length,), generator=torch.Generator().manual_seed(seed * 100_003 + i))
            for i in range(n)]


class Engine:
    """Continuous batching over ``n_slots`` cache slots of a model that already holds its KV caches."""

    def __init__(self, model: Decoder, state: StepState, n_slots: int, device: torch.device):
        self.model, self.state, self.device = model, state, device
        self.free = list(range(n_slots))
        self.running: dict[int, Request] = {}
        self.lengths = torch.zeros(n_slots, dtype=torch.long)

    def prefill(self, req: Request) -> bool:
        """Admit ``req`` into a free slot: one prefill step, which yields its first token; True when that was its
        only token (the slot is free again)."""
        slot = self.free[0]
        n = len(req.prompt)
        self.state.mode, self.state.slots = "prefill", torch.tensor([slot])
        logits = _full(self.model(req.prompt[None].to(self.device), torch.arange(n, device=self.device)))
        self._emit(req, int(logits[0, -1].argmax()))
        if len(req.tokens) >= req.output_len:
            return True
        self.free.pop(0)
        self.lengths[slot] = n
        self.running[slot] = req
        return False

    def decode(self) -> list[Request]:
        """One decode step of every running sequence; returns those that finished."""
        slots = sorted(self.running)
        idx = torch.tensor(slots)
        lengths = self.lengths[idx]
        last = torch.tensor([self.running[s].tokens[-1] for s in slots])[:, None]
        self.state.mode, self.state.slots, self.state.lengths = "decode", idx, lengths
        logits = _full(self.model(last.to(self.device), lengths[:, None].to(self.device)))
        done = []
        for row, s in enumerate(slots):
            req = self.running[s]
            self._emit(req, int(logits[row, -1].argmax()))
            self.lengths[s] += 1
            if len(req.tokens) >= req.output_len:
                done.append(self.running.pop(s))
                self.free.append(s)
        return done

    @staticmethod
    def _emit(req: Request, token: int) -> None:
        req.tokens.append(token)
        req.times.append(time.perf_counter())


def closed_loop(engine: Engine, reqs: list[Request], clients: int) -> list[Request]:
    """Serve ``reqs`` with ``clients`` closed-loop clients: each sends its next request when its last one ends."""
    queue, waiting, finished = list(reqs), [], []

    def issue() -> None:
        if queue:
            nxt = queue.pop(0)
            nxt.arrival = time.perf_counter()
            waiting.append(nxt)

    for _ in range(clients):
        issue()
    with torch.no_grad():
        while waiting or engine.running:
            if waiting and engine.free:  # one prefill per step, then the decode step (a wave spreads out)
                req = waiting.pop(0)
                if engine.prefill(req):
                    finished.append(req)
                    issue()
            for req in engine.decode() if engine.running else []:
                finished.append(req)
                issue()
    return finished


def greedy_reference(model: Decoder, prompt: torch.Tensor, output_len: int) -> tuple[list[int], list[float]]:
    """Greedy tokens without any cache (the whole sequence recomputed each step), and the margin between the
    best and second-best logit at each step (where a near-tie may flip under another reduction order)."""
    seq = prompt.clone()
    tokens, margins = [], []
    with torch.no_grad():
        for _ in range(output_len):
            logits = model(seq[None], torch.arange(len(seq)))[0, -1]
            top = torch.topk(logits, 2).values
            tokens.append(int(logits.argmax()))
            margins.append(float(top[0] - top[1]))
            seq = torch.cat([seq, torch.tensor([tokens[-1]])])
    return tokens, margins


def token_mismatches(results: list[dict]) -> list[str]:
    """Requests whose tokens differ from the greedy reference, except at a near-tie of the reference's two best
    logits (< 1e-4: another reduction order may flip it), which is reported but allowed."""
    from meshplan import catalog
    from meshplan.runtime.models.decoder import build_decoder

    torch.set_num_threads(1)
    refs: dict = {}
    bad = []
    for res in results:
        c = res["case"]
        spec = catalog.model(c["model"])
        texts = prompts(spec.vocab, c["requests"], c["input_len"], seed=c["seed"])
        for r in res["requests"]:
            key = (c["model"], c["seed"], c["input_len"], r["index"])
            if key not in refs or len(refs[key][0]) < c["output_len"]:
                model = refs.get(("model", c["model"], c["seed"])) or build_decoder(spec, seed=c["seed"])
                refs[("model", c["model"], c["seed"])] = model
                refs[key] = greedy_reference(model, texts[r["index"]], c["output_len"])
            want, margins = refs[key]
            got = r["tokens"]
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
            if first is not None and margins[first] >= 1e-4:
                bad.append(f"tp{c['tp']} request {r['index']}: token {first} is {got[first]}, reference "
                           f"{want[first]} (margin {margins[first]:.2g})")
    return bad

"""Speculative decoding: a cheap drafter proposes ``k`` tokens per running sequence, the model verifies all of
them (and the token after) in one forward pass, and the longest accepted prefix plus one token of its own is kept.

Under Leviathan et al. (ICML 2023, "Fast Inference from Transformers via Speculative Decoding") with each draft
token accepted with probability ``a`` independently, a pass yields ``(1 - a^(k+1)) / (1 - a)`` tokens (their
eq. 1): what the engines report as the mean acceptance length (vLLM's ``mean_acceptance_length``, SGLang's
``accept_length``). The drafters differ in what a draft token costs on the device (``SPEC_METHODS``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from meshplan.errors import SpecError
from meshplan.spec.model import LayerSpec, ModelSpec

SPEC_METHODS = {
    "mtp": "the model's own multi-token-prediction module drafts (DeepSeek-V3 sec. 2.2; vLLM deepseek_mtp, SGLang "
           "NEXTN, TensorRT-LLM MTP): per draft token one layer of the model's last block behind a 2h -> h input "
           "projection, and the model's output head",
    "eagle": "an EAGLE draft head (Li et al., ICML 2024; EAGLE-3, 2025) fed the model's hidden states: per draft "
             "token one dense decoder layer at the model's width behind a 2h -> h input projection, and the "
             "model's output head",
    "ngram": "prompt lookup: drafts are n-grams matched in the request's own tokens on the host (vLLM ngram, "
             "SGLang NGRAM); no device drafting",
    "draft": "a separate, smaller model of the same vocabulary decodes the k draft tokens itself (Leviathan et al. "
             "2023), on the replica's GPUs with the same tensor parallelism",
}
"""Drafters, by what a draft token costs."""

MAX_DRAFT_TOKENS = 16
"""Most draft tokens per pass: engines propose a handful (vLLM and SGLang examples use 1-7)."""


@dataclass(frozen=True, kw_only=True)
class Speculation:
    """How a replica speculates (a deployment knob, pinned by the user: its acceptance depends on the data)."""

    method: str
    """A drafter of ``SPEC_METHODS``."""
    draft_tokens: int
    """Tokens proposed per sequence per pass (vLLM ``num_speculative_tokens``, SGLang
    ``speculative_num_steps``, TensorRT-LLM ``max_draft_len``)."""
    acceptance: float
    """Probability that a draft token is accepted, given the ones before it were (0 <= a < 1)."""
    draft: ModelSpec | None = None
    """The draft model (``method = draft``)."""
    checkpoint: str = ""
    """The draft weights' name or path, for the exported launch command (an EAGLE head, a draft model)."""

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise SpecError("speculation.method", self.method, f"must be one of {', '.join(SPEC_METHODS)}")
        if not isinstance(self.draft_tokens, int) or not 1 <= self.draft_tokens <= MAX_DRAFT_TOKENS:
            raise SpecError("speculation.draft_tokens", self.draft_tokens,
                            f"must be a whole number from 1 to {MAX_DRAFT_TOKENS}")
        if not isinstance(self.acceptance, (int, float)) or not 0 <= self.acceptance < 1:  # NaN fails too
            raise SpecError("speculation.acceptance", self.acceptance, "must be a probability in [0, 1) (the "
                            "share of draft tokens accepted, given the ones before them were)")
        if (self.method == "draft") != (self.draft is not None):
            raise SpecError("speculation.draft", self.draft.name if self.draft else None,
                            "a draft model is needed by method draft, and only by it")

    @property
    def tokens_per_pass(self) -> float:
        """Mean tokens a verifying pass yields per sequence (Leviathan et al. 2023, eq. 1)."""
        a, k = self.acceptance, self.draft_tokens
        return (1.0 - a ** (k + 1)) / (1.0 - a)

    @property
    def verify_rows(self) -> int:
        """Tokens per sequence the model's verifying pass runs: the k drafts and the one after."""
        return self.draft_tokens + 1


def acceptance_for(length: float, draft_tokens: int) -> float:
    """The per-token acceptance that yields a mean acceptance length of ``length`` tokens per pass with
    ``draft_tokens`` drafts (the inverse of ``Speculation.tokens_per_pass``, by bisection: it increases in a)."""
    k = draft_tokens
    if not 1 <= length < k + 1:
        raise SpecError("--accept-length", length, f"must be at least 1 and below {k + 1} (1 + the {k} draft "
                        "tokens, which would all need accepting)")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if (1.0 - mid ** (k + 1)) / (1.0 - mid) < length:
            lo = mid
        else:
            hi = mid
    return lo


@lru_cache(maxsize=256)
def draft_layer(model: ModelSpec, spec: Speculation) -> LayerSpec | None:
    """The layer an MTP module or an EAGLE head runs per draft token (None for the other drafters): MTP, a layer
    of the last block (DeepSeek-V3 sec. 2.2: same as the main model's); EAGLE, a dense decoder layer at the
    model's width (the first block's layer without experts, its FFN as wide). Both read [embedding; hidden]."""
    if spec.method == "mtp":
        layer = model.blocks[-1].layer
    elif spec.method == "eagle":
        layer = replace(model.blocks[0].layer, moe=None)
    else:
        return None
    return replace(layer, in_hidden=2 * layer.hidden)

"""``meshplan serve``'s speculative-decoding flags, read into a ``Speculation`` (every value checked)."""

from __future__ import annotations

import math

DEFAULT_DRAFT_TOKENS = 3
"""Draft tokens per pass when none is given and the search cannot choose (an acceptance length was measured at
some length): the examples of vLLM (docs/features/spec_decode.md, num_speculative_tokens 3 for EAGLE and MTP) and
SGLang (--speculative-num-steps 3)."""
DRAFT_SEARCH = {"mtp": (1, 2, 3), "eagle": (1, 2, 3, 4, 5), "ngram": (1, 2, 3, 4, 5), "draft": (1, 2, 3, 4, 5)}
"""Draft lengths the search tries when a per-token acceptance is given and no length is pinned. MTP stops at 3:
DeepSeek-V3 ships one module, which longer drafts run again on its own output (vLLM warns that this lowers the
acceptance, vllm/config/speculative.py), and the engines' DeepSeek recipes draft 1-3 (SGLang
--speculative-num-steps 3, TensorRT-LLM num_nextn_predict_layers 3)."""


def draft_options(*, method: str, draft_tokens: int | None, acceptance: float | None) -> tuple[int, ...]:
    """The draft lengths ``serve`` searches: ``DRAFT_SEARCH``'s for a per-token acceptance with no pinned length;
    none (the pinned or default length only) otherwise."""
    return DRAFT_SEARCH.get(method, ()) if method and draft_tokens is None and acceptance is not None else ()


def speculation_from_flags(*, method: str, draft_tokens: int | None, acceptance: float | None,
                           accept_length: float | None, draft_model: str):
    """The speculation the flags pin, or None when ``--speculative`` is not given (any other of its flags then
    refused: nothing pinned is dropped)."""
    from meshplan.cli.common import resolve_model
    from meshplan.errors import SpecError
    from meshplan.spec.speculation import MAX_DRAFT_TOKENS, SPEC_METHODS, Speculation, acceptance_for

    if not method:
        given = [f for f, v in (("--draft-tokens", draft_tokens), ("--acceptance", acceptance),
                                ("--accept-length", accept_length), ("--draft-model", draft_model or None))
                 if v is not None]
        if given:
            raise SpecError(given[0], "given", "applies to speculative decoding only: add --speculative METHOD "
                            f"({', '.join(SPEC_METHODS)})")
        return None
    if method not in SPEC_METHODS:
        raise SpecError("--speculative", method, f"must be one of {', '.join(SPEC_METHODS)}")
    k = DEFAULT_DRAFT_TOKENS if draft_tokens is None else draft_tokens
    if (acceptance is None) == (accept_length is None):
        raise SpecError("--acceptance / --accept-length", acceptance if acceptance is not None else accept_length,
                        "give one: the share "
                        "of draft tokens accepted (e.g. 0.7), or the mean tokens a pass yields as the engine logs "
                        "it (vLLM mean_acceptance_length, SGLang accept_length, e.g. 2.5); it depends on the "
                        "drafter and the data, so meshplan does not assume one")
    if not isinstance(k, int) or not 1 <= k <= MAX_DRAFT_TOKENS:
        raise SpecError("--draft-tokens", k, f"must be a whole number from 1 to {MAX_DRAFT_TOKENS}")
    if accept_length is not None and not math.isfinite(accept_length):
        raise SpecError("--accept-length", accept_length, "must be a finite number of tokens")
    a = acceptance_for(accept_length, k) if accept_length is not None else acceptance
    if method in ("eagle", "draft") and not draft_model:
        what = "the EAGLE head's checkpoint (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)" if method == "eagle" \
            else "the draft model (catalog name, Hugging Face id or config.json, e.g. llama3.2-1b)"
        raise SpecError("--draft-model", "", f"--speculative {method} needs {what}: the engine loads it")
    if method in ("mtp", "ngram") and draft_model:
        raise SpecError("--draft-model", draft_model, f"--speculative {method} drafts without a separate model; "
                        "drop --draft-model")
    draft = resolve_model(draft_model) if method == "draft" else None
    return Speculation(method=method, draft_tokens=k, acceptance=a, draft=draft, checkpoint=draft_model)

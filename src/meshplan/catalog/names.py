"""The names a catalog entry answers to: its own, its ``aliases`` (checkpoints or board names of the same
architecture, each listed with its source in the entry's file), and the spellings sources print for either
(``meta-llama/Llama-3.1-70B-Instruct``, ``Meta-Llama-3.1-8B``, ``H100 SXM5``, ``nvidia/Llama-3.1-70B-Instruct-FP8``).

A name is compared by its key (``catalog_key``): lower case, a Hugging Face organisation prefix dropped, spaces and
underscores read as dashes, the words that name a tuning or a checkpoint format rather than an architecture
dropped (``instruct``, ``chat``, ``hf``, ``fp8``, ``awq``, ...; a row's precision column says how it runs), and a
dash between a word and a number closed (``llama-3.1`` is ``llama3.1``). Two entries whose names or aliases share
a key are refused when the catalog loads, so a key names one entry or none.
"""

from __future__ import annotations

import re

from meshplan.errors import SpecError

DECORATIONS = {
    # A checkpoint's tuning and storage format; the architecture is the same (the row's precision says how it runs).
    "models": frozenset({"meta", "instruct", "chat", "hf", "base", "it", "fp8", "dynamic", "static", "awq", "gptq",
                         "int4", "int8", "w4a16", "w8a8", "nvfp4", "mxfp4", "fp4", "bf16", "fp16"}),
    # Vendor and product-line words in front of a board's name ("NVIDIA H100", "AMD Instinct MI300X").
    "gpus": frozenset({"nvidia", "amd", "tesla", "geforce", "instinct", "intel", "habana", "google", "cloud"}),
}
"""Words that do not change which catalog entry a name means, per catalog."""


def catalog_key(kind: str, text: str) -> str:
    """The key ``text`` is compared by in catalog ``kind`` (see the module docstring)."""
    s = text.strip().lower().rsplit("/", 1)[-1]
    s = re.sub(r"[\s_]+", "-", s)
    drop = DECORATIONS.get(kind, frozenset())
    s = "-".join(w for w in s.split("-") if w and w not in drop)
    return re.sub(r"(?<=[a-z])-(?=\d)", "", s)


def alias_index(kind: str, entries: dict[str, dict]) -> dict[str, str]:
    """Key of every entry's name and aliases -> the entry's name; a key two entries share is refused."""
    index: dict[str, str] = {}
    for name, data in sorted(entries.items()):
        aliases = data.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
            raise SpecError(f"{kind}[{name}].aliases", aliases, "must be a list of names, e.g. [\"h100-sxm5\"]")
        for alias in (name, *aliases):
            key = catalog_key(kind, alias)
            if index.get(key, name) != name:
                raise SpecError(f"{kind}[{name}].aliases", alias, f"also names {kind}[{index[key]}]: a name must "
                                "mean one entry")
            index[key] = name
    return index

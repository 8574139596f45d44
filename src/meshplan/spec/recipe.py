"""A framework recipe as data: what a stack's published configuration pins for the runs it matches (a pipeline
layout, recompute modules, optimizer precision, compilation), with its source. Presets are catalog files
(``catalog/recipes/*.toml``); ``meshplan validate`` applies the matching ones to each published run, least specific
first, so the most specific recipe has the last word."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.errors import SpecError, close_matches
from meshplan.spec.framework import BEHAVIOUR_FIELDS

MATCH_KEYS = ("stack", "framework", "framework_version", "source", "model", "gpu", "pp", "vpp", "ep", "precision",
              "recompute", "pp_vpp", "mentions")
"""What a recipe can match on: the run's stack as its source names it, the chosen profile, the version (prefix),
the document the run comes from (a substring of its citation: a benchmark document that states its configuration
is a recipe for its tables), the model name (lower case, no dashes, substring), the GPU, degrees, precision, the
run's own recompute column (``""`` = not stated), (pp, vpp) pairs, and words the source's own notes or the run's
name mention."""
PLAN_SETS = ("recompute", "layer_split")
LAYER_SPLIT_RULES = ("ceil_rest_last",)
"""``ceil_rest_last``: ceil(decoder layers / stages) per virtual stage, the remainder and any MTP layers on the last
(Megatron-Bridge's DeepSeek-V3 layout_map)."""


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """What one framework recipe pins, for the runs it matches."""

    name: str
    """Recipe name (its file's stem)."""
    source: str
    """The public file and version the pinned values come from."""
    match: dict = field(default_factory=dict, hash=False)
    """MATCH_KEYS -> a value or a list of accepted values (every key must match)."""
    sets: dict = field(default_factory=dict, hash=False)
    """``framework`` (a profile name), profile behaviour fields, or plan fields (``recompute``, ``layer_split``
    by rule name) -> value."""

    def __post_init__(self) -> None:
        if not self.source:
            raise SpecError(f"recipe[{self.name}].source", self.source, "must cite the recipe's public source")
        for k in self.match:
            if k not in MATCH_KEYS:
                raise SpecError(f"recipe[{self.name}].match.{k}", self.match[k],
                                f"unknown key; allowed: {', '.join(MATCH_KEYS)}", close_matches(k, MATCH_KEYS))
        allowed = ("framework",) + BEHAVIOUR_FIELDS + PLAN_SETS
        for k, v in self.sets.items():
            if k not in allowed:
                raise SpecError(f"recipe[{self.name}].sets.{k}", v, f"unknown key; allowed: {', '.join(allowed)}",
                                close_matches(k, allowed))
        if "layer_split" in self.sets and self.sets["layer_split"] not in LAYER_SPLIT_RULES:
            raise SpecError(f"recipe[{self.name}].sets.layer_split", self.sets["layer_split"],
                            f"must be one of {', '.join(LAYER_SPLIT_RULES)}")
        if not self.sets:
            raise SpecError(f"recipe[{self.name}].sets", {}, "must set something")

    @property
    def specificity(self) -> int:
        """How many facts the recipe matches on (more = more specific)."""
        return len(self.match)

    def matches(self, facts: dict) -> bool:
        """Every match key agrees with the run's ``facts`` (``mentions``: any word in ``facts['text']``)."""
        for k, want in self.match.items():
            options = want if isinstance(want, list) and k != "pp_vpp" else [want]
            if k == "pp_vpp":
                if [facts["pp"], facts["vpp"]] not in [list(x) for x in want]:
                    return False
            elif k == "mentions":
                if not any(str(w).lower() in facts["text"] for w in options):
                    return False
            elif k == "framework_version":
                if not any(str(facts[k]).startswith(str(w).lower()) for w in options):
                    return False
            elif k == "source":
                if not any(str(w).lower() in facts[k] for w in options):
                    return False
            elif k == "model":
                if not any(str(w).lower().replace("-", "") in facts[k] for w in options):
                    return False
            elif facts[k] not in options:
                return False
        return True

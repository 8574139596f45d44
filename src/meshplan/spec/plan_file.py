"""Plan files: a ``[plan]`` table (Plan's fields) below the model and GPUs it was planned for, the stack settings that
differ from its preset, and what was predicted for it; read back exactly as ``meshplan plan --out`` writes them."""

from __future__ import annotations

from pathlib import Path

from meshplan.errors import SpecError
from meshplan.spec.io import build, check_keys, read_file
from meshplan.spec.plan import Plan
from meshplan.spec.typed import typed

PLAN_FILE_KEYS = {"model", "gpus", "cluster", "plan", "framework", "predicted"}


def plan_from_dict(d: dict, where: str = "plan") -> Plan:
    """A plan from a flat table whose keys are Plan's fields."""
    return build(Plan, d, where)


def read_plan_file(path: str | Path) -> tuple[Plan, dict]:
    """A plan file: ``[plan]`` table plus optional ``model``, ``gpus`` or ``cluster`` references and a
    ``[framework]`` table of the stack's settings that differ from the preset ``plan.framework`` names.

    Returns the plan and the dict of references (model, gpus, cluster, framework) the file carries.
    """
    d, where = read_file(path), str(path)
    if not isinstance(d, dict):
        raise SpecError(where, d, "must be a table of key = value with a [plan] table")
    if "plan" not in d:
        if d and not set(d) & {*_PLAN_REFS, "predicted"}:  # a bare table of Plan's fields
            return plan_from_dict(d, where), {}
        raise SpecError(f"{where}.plan", None, "is required: a plan file holds a [plan] table (global_batch, "
                        "seq_len, tp, dp, ...) below its model and gpus references")
    check_keys(where, d, PLAN_FILE_KEYS, ("plan",))
    refs = {k: d[k] for k in ("model", "gpus", "cluster", "framework", "predicted") if k in d}
    for key, example in _PLAN_REFS.items():
        if key in refs and not (isinstance(refs[key], str) and refs[key]):
            raise SpecError(f"{where}.{key}", refs[key], f"must be a string in quotes, e.g. {example}")
    if "framework" in refs and not isinstance(refs["framework"], dict):
        raise SpecError(f"{where}.framework", refs["framework"], "must be a table of stack settings, e.g. "
                        "grad_dtype = \"bf16\" (the stack's name is plan.framework)")
    predicted = typed(refs.get("predicted", {}), f"{where}.predicted", "table")
    check_keys(f"{where}.predicted", predicted, set(PREDICTED_KEYS))
    for k, v in predicted.items():
        typed(v, f"{where}.predicted.{k}", PREDICTED_KEYS[k])
    if not 0 < predicted.get("max_memory_fraction", 1.0) <= 4:
        raise SpecError(f"{where}.predicted.max_memory_fraction", predicted["max_memory_fraction"], "must be in (0, 4]")
    return plan_from_dict(d["plan"], f"{where}.plan"), refs


PREDICTED_KEYS = {"step_time_s": "pos", "peak_memory_gib": "pos", "max_memory_fraction": "num", "switch_s": "nonneg"}
"""The ``[predicted]`` table's keys (what ``meshplan plan --out`` and ``replan --out`` write) and each value's kind
(``typed``): a step and a peak are positive, a switch can be free; the fraction's range is checked beside."""

_PLAN_REFS = {"model": '"llama3-8b"', "gpus": '"8xh100-sxm"', "cluster": '"cluster.toml"'}


def plan_file_text(plan: Plan, *, model: str = "", gpus: str = "", framework: dict | None = None,
                   predicted: dict | None = None, cluster: str = "") -> str:
    """TOML text of a plan file that read_plan_file reads back; ``framework``: the stack settings that differ
    from the preset the plan names (``FrameworkProfile.changes_from``); ``cluster``: a cluster file the plan
    runs on (its levels, derating and servers, which the ``gpus`` shorthand cannot carry)."""
    import tomli_w

    doc: dict = {}
    if model:
        doc["model"] = model
    if cluster:
        doc["cluster"] = cluster
    elif gpus:
        doc["gpus"] = gpus
    doc["plan"] = plan.to_dict()
    if framework:
        doc["framework"] = dict(framework)
    if predicted:
        doc["predicted"] = predicted
    return tomli_w.dumps(doc)

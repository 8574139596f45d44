"""Published runs (the schema of ``../shared/validation/runs_visible.csv``) as (model, cluster, plan) triples.

Each row is translated from its own columns: the model's dims, the layout, and the software stack from
``framework`` and ``framework_version`` (a catalog profile). What a stack's published recipe pins beyond the
columns (a pipeline layout, recompute modules, optimizer precision, compilation, TP overlap) comes from the
matching recipes in ``catalog/recipes``. The free-text ``notes`` are read only for model facts the schema has no
column for (activation type, MLA ranks, first dense layers, capacity factor, head_dim), as the dataset's README
lists them. A row that cannot be expressed is returned with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from meshplan import catalog
from meshplan.calibrate.csvfile import csv_rows
from meshplan.calibrate.run_cells import flag, note_int, whole, zero_stage
from meshplan.cost.flops import model_flops
from meshplan.cost.stage import mtp_depth
from meshplan.errors import MeshplanError, SpecError
from meshplan.spec.checks import plan_violations, stack_violations
from meshplan.spec.cluster import ClusterSpec, Pool
from meshplan.spec.framework import BEHAVIOUR_FIELDS, FrameworkProfile
from meshplan.spec.model import BlockSpec, ModelSpec, MoESpec, decoder_model
from meshplan.spec.plan import Plan, precision_name, recompute_name
from meshplan.spec.recipe import Recipe

REQUIRED = ("id", "arch", "n_layers", "hidden", "ffn_hidden", "n_heads", "vocab", "seq_len", "global_batch", "gpu",
            "n_gpus", "tp", "pp", "dp", "step_time_s")


@dataclass(frozen=True, kw_only=True)
class Run:
    """One published run as specs, with its measured step time."""

    id: str
    """Row id."""
    model: ModelSpec
    """Model built from the row's columns."""
    cluster: ClusterSpec
    """Cluster of the row's GPUs."""
    plan: Plan
    """The published layout."""
    framework: FrameworkProfile
    """The stack that ran it: the preset its framework columns name, with its recipes' settings."""
    profile_note: str
    """How the preset was chosen from the columns."""
    recipes: tuple[str, ...]
    """Names of the recipes applied."""
    measured_s: float
    """Measured (or exactly derived) step time (s)."""
    row: dict
    """The raw row."""


def _activation(row: dict, notes: str) -> str:
    low = notes.lower()
    for word, act in (("squared-relu", "relu2"), ("squared relu", "relu2"), ("geglu", "geglu"), ("swiglu", "swiglu")):
        if word in low:
            return act
    if _arch(row) == "moe":
        return "swiglu"
    # GPT-style models use ffn = 4h with GeLU; any other width is a gated (SwiGLU) FFN.
    return "gelu" if whole(row, "ffn_hidden") == 4 * whole(row, "hidden") else "swiglu"


ARCHS = ("dense", "moe")


def _arch(row: dict) -> str:
    """``dense`` or ``moe`` (any case, as the dataset spells it)."""
    arch = (row.get("arch") or "").strip().lower()
    if arch not in ARCHS:
        raise SpecError("arch", row.get("arch"), f"must be one of {', '.join(ARCHS)}")
    return arch


def row_model(row: dict) -> ModelSpec:
    """The model of a row: dims from columns, the rest from the notes as the dataset README documents."""
    notes = row.get("notes", "")
    act = _activation(row, notes)
    gated_family = act in ("swiglu", "geglu")
    heads = whole(row, "n_heads")
    kw = dict(name=row.get("model") or row["id"], n_layers=whole(row, "n_layers"), hidden=whole(row, "hidden"),
              n_heads=heads, n_kv_heads=whole(row, "n_kv_heads", heads), ffn_hidden=whole(row, "ffn_hidden"),
              vocab=whole(row, "vocab"), activation=act, norm="rmsnorm" if gated_family else "layernorm",
              bias=not gated_family and act == "gelu", tied_embeddings=act == "gelu",
              head_dim=note_int(notes, r"head_dim\s*[=:]?\s*(\d+)"))
    if not row.get("n_kv_heads"):
        # MLA: the dataset leaves n_kv_heads empty; ranks from the notes, DeepSeek-V3 head widths.
        kw.update(attention_kind="mla", q_lora_rank=note_int(notes, r"q_lora\s*[=:]?\s*(\d+)", 1536),
                  kv_lora_rank=note_int(notes, r"kv_lora\s*[=:]?\s*(\d+)", 512), qk_rope_head_dim=64, v_head_dim=128,
                  head_dim=128)
    if _arch(row) == "moe":
        cf = re.search(r"capacity factor ([\d.]+)", notes, flags=re.IGNORECASE)
        moe = MoESpec(n_experts=whole(row, "n_experts"), top_k=whole(row, "top_k"),
                      expert_ffn_hidden=whole(row, "moe_ffn_hidden", whole(row, "ffn_hidden")),
                      n_shared_experts=whole(row, "n_shared_experts", 0),
                      capacity_factor=float(cf.group(1)) if cf else 0.0)
        kw.update(moe=moe, first_dense=note_int(notes, r"first (\d+) layers? dense"),
                  dense_ffn_hidden=whole(row, "ffn_hidden"), ffn_hidden=moe.expert_ffn_hidden)
    return decoder_model(**kw)


def row_cluster(row: dict) -> ClusterSpec:
    """The row's GPUs as one pool."""
    gpu = catalog.gpu((row.get("gpu") or "").strip())
    n = whole(row, "n_gpus")
    return ClusterSpec(pools=(Pool(gpu=gpu, n_gpus=n, gpus_per_node=whole(row, "gpus_per_node", 8)),))


INTERLEAVED = re.compile(r"(?<!not )(?<!no )(?<!non-)\binterleaved\b", re.IGNORECASE)
"""A note that says the schedule is interleaved (the word, not "interleaving ... not stated")."""


def _vpp(row: dict) -> int:
    """Virtual stages; unknown (the dataset's empty ``vpp``) means none, except a run its name or notes call
    interleaved, which has at least two."""
    if (row.get("vpp") or "").strip():
        return whole(row, "vpp")
    named = "interleav" in (row.get("id", "") + " " + row.get("model", "")).lower()
    return 2 if (named or INTERLEAVED.search(row.get("notes") or "")) and whole(row, "pp") > 1 else 1


def _micro_batch(row: dict, stack: FrameworkProfile) -> int:
    """Micro-batch size; unknown means the stack's default: 1 (Megatron-family recipes), or as many micro-batches
    as pipeline stages (torchtitan's pipeline_parallel_microbatches default), i.e. local batch / pp."""
    if (row.get("micro_batch") or "").strip():
        return whole(row, "micro_batch")
    pp, local = whole(row, "pp"), whole(row, "global_batch") // max(whole(row, "dp"), 1)
    if stack.default_micro_batch == "pp_stages" and pp > 1 and local % pp == 0:
        return local // pp
    return 1


HSDP = re.compile(r"\bhsdp\b|hybrid[ _-]?shard|sharded within (?:the|a|each|one) node", re.IGNORECASE)
"""How the dataset marks an HSDP row (shared/validation/README.md, ``zero``: "HSDP rows are 3, with a note: sharded
within the node, replicated across nodes")."""


def _dp_shard(row: dict) -> int:
    """FSDP's shard group: all of dp (0), except an HSDP row's: the data-parallel ranks of one node, tp x cp
    innermost (Megatron's and torchtitan's rank order), when they divide dp."""
    if zero_stage(row) != 3 or not HSDP.search(row.get("notes") or ""):
        return 0
    dp = whole(row, "dp")
    per_node = max(whole(row, "gpus_per_node", 8) // (whole(row, "tp") * whole(row, "cp", 1)), 1)
    return per_node if per_node < dp and dp % per_node == 0 else 0


def row_plan(row: dict, stack: FrameworkProfile) -> Plan:
    """The published layout under ``stack``; empty cells take the defaults (no interleaving, the stack's
    micro-batch, no recompute, no ZeRO)."""
    tp = whole(row, "tp")
    # A stack with one kind of context parallelism runs that kind (megatron-deepspeed: DeepSpeed-Ulysses all-to-all)
    kind = stack.context_parallel[0] if len(stack.context_parallel) == 1 else "ring"
    return Plan(global_batch=whole(row, "global_batch"), seq_len=whole(row, "seq_len"),
                micro_batch=_micro_batch(row, stack), tp=tp, sp=bool(flag(row, "sp")) and tp > 1,
                cp=whole(row, "cp", 1), cp_kind=kind, pp=whole(row, "pp"), vpp=_vpp(row), dp=whole(row, "dp"),
                zero=zero_stage(row), dp_shard=_dp_shard(row), ep=whole(row, "ep", 1),
                recompute=recompute_name(row.get("recompute") or "") or "none",
                precision=precision_name(row.get("precision") or "") or "bf16", framework=stack.name)


def row_facts(row: dict, profile: FrameworkProfile) -> dict:
    """What recipes match a run on (``meshplan.spec.recipe.MATCH_KEYS``). ``text`` is the run's id and the
    source's own notes (after ``src-notes:``), not the dataset's commentary on them."""
    notes = row.get("notes") or ""
    src = notes.split("src-notes:", 1)[1] if "src-notes:" in notes else ""
    return {"stack": (row.get("framework") or "").strip().lower(), "framework": profile.name,
            "framework_version": (row.get("framework_version") or "").strip().lower(),
            "source": (row.get("source") or "").lower(),
            "model": (row.get("model") or "").lower().replace("-", ""), "gpu": (row.get("gpu") or "").lower(),
            "pp": whole(row, "pp"), "vpp": _vpp(row), "ep": whole(row, "ep", 1),
            "precision": precision_name(row.get("precision") or "") or "bf16",
            "recompute": recompute_name(row.get("recompute") or ""),
            "text": ((row.get("id") or "") + " " + src).lower()}


def row_profile(row: dict) -> tuple[FrameworkProfile, str, list[Recipe]]:
    """The run's stack profile from its ``framework`` and ``framework_version`` columns, how it was chosen, and
    the recipes that match the run, least specific first; a recipe that names another preset (compiled torchtitan)
    switches the profile before the others are matched against it."""
    profile, note = catalog.framework_for(row.get("framework") or "", row.get("framework_version") or "")
    switches = [r for r in catalog.recipes() if "framework" in r.sets and r.matches(row_facts(row, profile))]
    for r in switches:
        profile = catalog.framework(r.sets["framework"])
        note += f"; recipe {r.name}: {profile.name}"
    facts = row_facts(row, profile)
    rest = sorted((r for r in catalog.recipes() if "framework" not in r.sets and r.matches(facts)),
                  key=lambda r: (r.specificity, r.name))
    return profile, note, switches + rest


def apply_recipe(recipe: Recipe, model: ModelSpec, plan: Plan,
                 profile: FrameworkProfile) -> tuple[Plan, FrameworkProfile]:
    """The plan and profile with what the recipe pins."""
    behaviour = {k: v for k, v in recipe.sets.items() if k in BEHAVIOUR_FIELDS}
    if behaviour:
        profile = profile.with_(**behaviour)
    if "recompute" in recipe.sets:
        plan = plan.with_(recompute=recipe.sets["recompute"])
    if recipe.sets.get("layer_split") == "ceil_rest_last":
        mtp = mtp_depth(model)
        decoder, stages = model.n_layers - mtp, plan.n_stages
        per = -(-decoder // stages)
        plan = plan.with_(layer_split=(per,) * (stages - 1) + (decoder - per * (stages - 1) + mtp,))
    return plan, profile


def whole_block_selective(plan: Plan, stack: FrameworkProfile, note: str) -> tuple[Plan, str]:
    """A run on a stack with no selective mode that calls its recompute "selective" names the stack's own
    selective checkpointing, which wraps whole blocks (fms-fsdp ``selective_checkpointing``, Composer
    ``activation_checkpointing_target``; their ``recompute_modes`` sources): read as full recompute, noted."""
    if plan.recompute != "selective" or "selective" in stack.recompute_modes or "full" not in stack.recompute_modes:
        return plan, note
    why = f"; recompute=selective read as full ({stack.name} checkpoints whole blocks)"
    return plan.with_(recompute="full"), note + why


def infer_recompute(row: dict, model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> Plan:
    """Fill an unknown recompute mode: a FLOP convention that counts a recompute forward says full recompute
    (the source measured it that way); otherwise the framework default, none."""
    if recompute_name(row.get("recompute") or ""):
        return plan
    if "recompute forward" in (row.get("flops_convention") or "").lower():
        return plan.with_(recompute="full")
    return plan


def _counted_flops_per_token(row: dict) -> float:
    """FLOPs per token that Megatron-Bridge's counter credited: its model TFLOP/s over its tokens/s (FLOP); 0
    for other stacks (their counters differ, e.g. the full s^2 attention term) or rows without both."""
    m = re.search(r"Model TFLOP/s/GPU = ([\d.]+)", row.get("notes") or "")
    if (not m or row.get("reported_metric") != "tokens_per_s_per_gpu"
            or (row.get("framework") or "").strip().lower() != "megatron-bridge"):
        return 0.0
    try:
        tokens_per_s = float(row.get("reported_value") or "nan")
    except ValueError:
        tokens_per_s = float("nan")
    if not 0 < tokens_per_s < float("inf"):
        raise SpecError("reported_value", row.get("reported_value"), "must be a positive tokens/s (the notes' "
                        "Model TFLOP/s/GPU is read against it)")
    return float(m.group(1)) * 1e12 / tokens_per_s


def with_mtp(model: ModelSpec, depth: int) -> ModelSpec:
    """The model plus ``depth`` multi-token-prediction modules (DeepSeek-V3 sec. 2.2): each is one more layer of
    the last block whose input projection maps [norm(embedding); norm(hidden)] (2h) to h, and one more pass
    through the shared output head (counted by ``cost.stage.mtp_depth``)."""
    last = model.blocks[-1]
    layer = replace(last.layer, in_hidden=2 * last.layer.hidden)
    return replace(model, blocks=model.blocks + (BlockSpec(name="mtp", n_layers=depth, layer=layer),))


def infer_mtp(row: dict, model: ModelSpec, plan: Plan) -> ModelSpec:
    """MTP modules the run trained: the dataset counts layers without them, and Megatron-Bridge's FLOP counter
    (training/utils/flop_utils.py) adds one layer and one logits pass per depth when mtp_num_layers is set, so
    the depth (0-2) is the one whose model FLOPs per token are closest to what the source counted."""
    counted = _counted_flops_per_token(row)
    if not counted:
        return model
    tokens = plan.global_batch * plan.seq_len
    return min([model] + [with_mtp(model, d) for d in (1, 2)],
               key=lambda m: abs(model_flops(m, plan) / tokens - counted))


def row_to_run(row: dict, *, model: ModelSpec | None = None) -> Run:
    """Translate one CSV row: its model (``model`` where the caller resolved it from a catalog, else the row's
    columns), cluster, stack profile and layout, with the matching recipes applied; raises MeshplanError with the
    reason when it cannot be expressed, its field named ``ROWID.COLUMN``."""
    rid = (row.get("id") or "").strip() or "?"
    try:
        return _row_to_run(row, rid, model)
    except SpecError as exc:
        if exc.field == rid or exc.field.startswith(f"{rid}."):
            raise
        raise SpecError(f"{rid}.{exc.field}", exc.value, exc.expected, exc.suggestions) from None


def _row_to_run(row: dict, rid: str, model: ModelSpec | None) -> Run:
    missing = [k for k in REQUIRED if not (row.get(k) or "").strip()]
    if missing:
        others = f" (also empty: {', '.join(missing[1:])})" if missing[1:] else ""
        raise SpecError(f"{rid}.{missing[0]}", row.get(missing[0]) or "", f"is empty: a required column{others}")
    profile, note, recipes = row_profile(row)
    model, cluster, plan = model or row_model(row), row_cluster(row), row_plan(row, profile)
    plan, note = whole_block_selective(plan, profile, note)
    bad = plan_violations(model, cluster, plan)
    if not bad:
        plan = infer_recompute(row, model, cluster, plan)
        model = infer_mtp(row, model, plan)
        for r in recipes:  # a switching recipe's profile is already chosen; what else it sets applies here
            plan, profile = apply_recipe(r, model, plan, profile)
        bad = plan_violations(model, cluster, plan) + stack_violations(plan, profile)
    if bad:
        layout = " ".join(f"{k}={row.get(k, '').strip()}" for k in ("tp", "pp", "dp", "cp", "ep", "vpp")
                          if (row.get(k) or "").strip())
        raise SpecError(f"{rid}.layout", layout, "; ".join(bad))
    measured = _float(row, "step_time_s")
    if not measured > 0:
        raise SpecError(f"{rid}.step_time_s", row["step_time_s"], "the measured step_time_s must be a positive "
                        "number of seconds")
    return Run(id=row["id"], model=model, cluster=cluster, plan=plan, framework=profile, profile_note=note,
               recipes=tuple(r.name for r in recipes), measured_s=measured, row=row)


def _float(row: dict, key: str) -> float:
    try:
        v = float(row[key])
    except ValueError:
        raise SpecError(key, row[key], "must be a number") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise SpecError(key, row[key], "must be a finite number")
    return v


def load_runs(path: str | Path) -> tuple[list[Run], list[tuple[str, str]]]:
    """All expressible runs of a CSV and the (id, reason) of every skipped row."""
    return read_runs(path, lambda header: _check_columns(str(path), header), row_to_run)


def read_runs(path: str | Path, check_header, to_run) -> tuple[list[Run], list[tuple[str, str]]]:
    """``to_run`` of every row of a CSV whose header ``check_header`` accepts, and the (id, reason) of every row it
    refuses (a one-line MeshplanError); an empty file is refused."""
    runs, skipped = [], []
    for line, row, why in csv_rows(path, check_header):
        try:
            if why:
                raise MeshplanError(why)
            runs.append(to_run(row))
        except MeshplanError as exc:
            skipped.append((row.get("id") or f"line {line}", str(exc)))
    if not runs and not skipped:
        raise SpecError("file", str(path), "has no rows")
    return runs, skipped


def _check_columns(path: str, header: list[str] | None) -> None:
    """A runs CSV names every REQUIRED column in its header (a plan file or another CSV does not)."""
    missing = [k for k in REQUIRED if k not in (header or ())]
    if missing:
        raise SpecError("file", path, f"is not a runs CSV: missing columns {', '.join(missing)} (the schema of "
                        "shared/validation/runs_visible.csv)")

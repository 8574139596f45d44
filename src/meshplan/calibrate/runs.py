"""Published runs (the schema of ``../shared/validation/runs_visible.csv``) as (model, cluster, plan) triples.

Each row is translated from its own columns; the free-text ``notes`` are read only for facts the schema has no
column for (activation type, MLA ranks, first dense layers, capacity factor, head_dim, TP overlap), exactly as
the dataset's README lists them. A row that cannot be expressed is returned with the reason.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, replace
from pathlib import Path

from meshplan import catalog
from meshplan.cost.estimate import model_flops
from meshplan.cost.stage import mtp_depth
from meshplan.errors import MeshplanError, SpecError
from meshplan.spec.checks import plan_violations
from meshplan.spec.cluster import ClusterSpec, Pool
from meshplan.spec.model import BlockSpec, ModelSpec, MoESpec, decoder_model
from meshplan.spec.plan import Plan

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
    measured_s: float
    """Measured (or exactly derived) step time (s)."""
    row: dict
    """The raw row."""


def _int(row: dict, key: str, default: int | None = None) -> int:
    v = (row.get(key) or "").strip()
    if not v:
        if default is None:
            raise SpecError(key, v, "is empty and has no default")
        return default
    try:
        return int(float(v))
    except ValueError:
        raise SpecError(key, v, "must be a number") from None


def _note_int(notes: str, pattern: str) -> int:
    m = re.search(pattern, notes, flags=re.IGNORECASE)
    return int(m.group(1)) if m else 0


def _activation(row: dict, notes: str) -> str:
    low = notes.lower()
    for word, act in (("squared-relu", "relu2"), ("squared relu", "relu2"), ("geglu", "geglu"), ("swiglu", "swiglu")):
        if word in low:
            return act
    if row["arch"] == "moe":
        return "swiglu"
    # GPT-style models use ffn = 4h with GeLU; any other width is a gated (SwiGLU) FFN.
    return "gelu" if _int(row, "ffn_hidden") == 4 * _int(row, "hidden") else "swiglu"


def row_model(row: dict) -> ModelSpec:
    """The model of a row: dims from columns, the rest from the notes as the dataset README documents."""
    notes = row.get("notes", "")
    act = _activation(row, notes)
    gated_family = act in ("swiglu", "geglu")
    heads = _int(row, "n_heads")
    kw = dict(name=row["model"] or row["id"], n_layers=_int(row, "n_layers"), hidden=_int(row, "hidden"),
              n_heads=heads, n_kv_heads=_int(row, "n_kv_heads", heads), ffn_hidden=_int(row, "ffn_hidden"),
              vocab=_int(row, "vocab"), activation=act, norm="rmsnorm" if gated_family else "layernorm",
              bias=not gated_family and act == "gelu", tied_embeddings=act == "gelu",
              head_dim=_note_int(notes, r"head_dim (\d+)"))
    if not row.get("n_kv_heads"):
        # MLA: the dataset leaves n_kv_heads empty; ranks from the notes, DeepSeek-V3 head widths.
        kw.update(attention_kind="mla", q_lora_rank=_note_int(notes, r"q_lora (\d+)") or 1536,
                  kv_lora_rank=_note_int(notes, r"kv_lora (\d+)") or 512, qk_rope_head_dim=64, v_head_dim=128,
                  head_dim=128)
    if row["arch"] == "moe":
        cf = re.search(r"capacity factor ([\d.]+)", notes, flags=re.IGNORECASE)
        moe = MoESpec(n_experts=_int(row, "n_experts"), top_k=_int(row, "top_k"),
                      expert_ffn_hidden=_int(row, "moe_ffn_hidden", _int(row, "ffn_hidden")),
                      n_shared_experts=_int(row, "n_shared_experts", 0),
                      capacity_factor=float(cf.group(1)) if cf else 0.0)
        kw.update(moe=moe, first_dense=_note_int(notes, r"first (\d+) layers dense"),
                  dense_ffn_hidden=_int(row, "ffn_hidden"), ffn_hidden=moe.expert_ffn_hidden)
    return decoder_model(**kw)


def row_cluster(row: dict) -> ClusterSpec:
    """The row's GPUs as one pool."""
    gpu = catalog.gpu(row["gpu"])
    n = _int(row, "n_gpus")
    return ClusterSpec(pools=(Pool(gpu=gpu, n_gpus=n, gpus_per_node=_int(row, "gpus_per_node", 8)),))


def _vpp(row: dict) -> int:
    """Virtual stages; unknown means none, except a run named interleaved, which has at least two."""
    if (row.get("vpp") or "").strip():
        return _int(row, "vpp")
    text = (row.get("id", "") + " " + row.get("model", "")).lower()
    return 2 if "interleav" in text and _int(row, "pp") > 1 else 1


def _before_flash(row: dict) -> bool:
    """The source is from before 2023, when FlashAttention (Dao et al., 2022) reached Megatron-LM and PyTorch:
    attention then ran as unfused kernels that materialize the score matrix."""
    years = _source_years(row)
    return bool(years) and min(years) <= 2022


def _source_years(row: dict) -> list[int]:
    """Years named in the row's source citation."""
    return [int(y) for y in re.findall(r"\b(20[0-3]\d)\b", row.get("source") or "")]


def _deepspeed_zero3_2021(row: dict) -> bool:
    """ZeRO-3 as DeepSpeed released it in 2021 (the term is DeepSpeed's; FSDP implementations flatten each
    unit): every parameter tensor is gathered by its own ``torch.distributed.all_gather``, after a
    ``torch.cuda.synchronize()`` that drains the compute stream first, and its gradient reduce-scattered by its
    own call (samyam/DeepSpeed deepspeed/runtime/zero/partition_parameters.py @67f957a, ``_allgather_param``,
    ``_reduce_scatter_gradient``): per-parameter latency, and gathers that cannot overlap compute."""
    text = " ".join(row.get(k) or "" for k in ("source", "model", "notes")).lower()
    years = _source_years(row)
    named = any(k in text for k in ("zero-3", "zero3", "zero stage 3", "deepspeed")) and "fsdp" not in text
    return (row.get("zero") or "").strip() == "3" and bool(years) and min(years) <= 2021 and named


def _micro_batch(row: dict, titan: bool) -> int:
    """Micro-batch size; unknown means the framework default: 1 for Megatron-family recipes, and for
    torchtitan pipelines as many micro-batches as pipeline stages (its pipeline_parallel_microbatches
    default), i.e. local batch / pp."""
    if (row.get("micro_batch") or "").strip():
        return _int(row, "micro_batch")
    pp, local = _int(row, "pp"), _int(row, "global_batch") // max(_int(row, "dp"), 1)
    if titan and pp > 1 and local % pp == 0:
        return local // pp
    return 1


def row_plan(row: dict) -> Plan:
    """The published layout; empty cells take the framework defaults (no interleaving, micro-batch 1, no
    recompute, no ZeRO), and TP overlap only where the notes name it."""
    notes = (row.get("notes") or "").lower()
    tp = _int(row, "tp")
    # Framework facts the schema has no column for, read from the source: torchtitan runs eager unless
    # compiled, and its selective checkpointing is the per-op policy.
    titan = "torchtitan" in (row.get("source") or "").lower()
    compiled = "compile" in (row.get("id", "") + " " + notes)
    return Plan(global_batch=_int(row, "global_batch"), seq_len=_int(row, "seq_len"),
                micro_batch=_micro_batch(row, titan), tp=tp, sp=bool(_int(row, "sp", 0)) and tp > 1,
                cp=_int(row, "cp", 1), pp=_int(row, "pp"), vpp=_vpp(row), dp=_int(row, "dp"),
                zero=_int(row, "zero", 0), ep=_int(row, "ep", 1), recompute=row.get("recompute") or "none",
                precision=row.get("precision") or "bf16",
                tp_comm_overlap=any(k in notes for k in ("tp-comm-overlap", "tp_comm_overlap", "asynctp")),
                fused_kernels=not titan or compiled, selective_policy="op" if titan else "attention",
                flash_attention=not _before_flash(row),
                **({"zero_gather": "param", "overlap_param_gather": False} if _deepspeed_zero3_2021(row) else {}))


def infer_recompute(row: dict, model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> Plan:
    """Fill an unknown recompute mode: a FLOP convention that counts a recompute forward says full recompute
    (the source measured it that way); otherwise the framework default, none."""
    if (row.get("recompute") or "").strip():
        return plan
    if "recompute forward" in (row.get("flops_convention") or "").lower():
        return plan.with_(recompute="full")
    return plan


def _counted_flops_per_token(row: dict) -> float:
    """FLOPs per token that Megatron-Bridge's counter credited: its model TFLOP/s over its tokens/s (FLOP); 0
    for other sources (their counters differ, e.g. the full s^2 attention term) or rows without both."""
    m = re.search(r"Model TFLOP/s/GPU = ([\d.]+)", row.get("notes") or "")
    if (not m or row.get("reported_metric") != "tokens_per_s_per_gpu"
            or "megatron-bridge" not in (row.get("source") or "").lower()):
        return 0.0
    return float(m.group(1)) * 1e12 / float(row["reported_value"])


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


# Megatron-Bridge's DeepSeek-V3 recipe (recipes/deepseek/deepseek_v3.py, layout_map) pins the pipeline layout for
# these (pp, vpp): ceil(layers / stages) decoder layers per virtual stage, the remainder, MTP and loss on the last.
MBRIDGE_DSV3_LAYOUTS = ((4, 1), (8, 1), (4, 2), (16, 1), (8, 2), (4, 4))


def _mbridge_deepseek_v3(row: dict) -> bool:
    """A DeepSeek-V3 run of Megatron-Bridge's recipe, whose pinned choices the functions below read."""
    name = (row.get("model") or "").lower().replace("-", "")
    return "megatron-bridge" in (row.get("source") or "").lower() and "deepseekv3" in name


def framework_split(row: dict, model: ModelSpec, plan: Plan) -> Plan:
    """The layer placement a framework recipe pins, where the source used one; else the plan unchanged."""
    if not _mbridge_deepseek_v3(row) or (plan.pp, plan.vpp) not in MBRIDGE_DSV3_LAYOUTS:
        return plan
    mtp = mtp_depth(model)
    decoder, stages = model.n_layers - mtp, plan.n_stages
    per = -(-decoder // stages)
    return plan.with_(layer_split=(per,) * (stages - 1) + (decoder - per * (stages - 1) + mtp,))


# Megatron-Bridge's DeepSeek-V3 performance configs (scripts/performance/configs/deepseek/*workload_base_configs.py,
# every stored version) set recompute_modules=["mla_up_proj"] on top of the recipe's recompute_granularity
# "selective" (recipes/deepseek/deepseek_v3.py) for these (gpu, pp, vpp, ep, precision; "" = any precision).
# Other GPUs and precisions changed their modules between versions and stay unmodelled.
MBRIDGE_DSV3_RECOMPUTE = {("b200", 16, 1, 8, ""): "mla_up_proj", ("gb200", 4, 4, 64, "bf16"): "mla_up_proj"}


def framework_recompute(row: dict, plan: Plan) -> Plan:
    """The selective recompute a framework's published config pins, where the row leaves recompute empty."""
    if (row.get("recompute") or "").strip() or not _mbridge_deepseek_v3(row):
        return plan
    gpu = (row.get("gpu") or "").lower()
    key = (gpu, plan.pp, plan.vpp, plan.ep)
    policy = MBRIDGE_DSV3_RECOMPUTE.get(key + (plan.precision,)) or MBRIDGE_DSV3_RECOMPUTE.get(key + ("",))
    return plan.with_(recompute="selective", selective_policy=policy) if policy else plan


def framework_optimizer(row: dict, plan: Plan) -> Plan:
    """Optimizer precision a framework recipe pins: Megatron-Bridge's DeepSeek-V3 recipe
    (recipes/deepseek/deepseek_v3.py) runs the precision-aware optimizer with bf16 main gradients and bf16 Adam
    moments (``main_grads_dtype``, ``exp_avg_dtype``, ``exp_avg_sq_dtype``; ``grad_reduce_in_fp32=False``)."""
    return plan.with_(grad_dtype="bf16", optimizer_dtype="bf16") if _mbridge_deepseek_v3(row) else plan


def row_to_run(row: dict) -> Run:
    """Translate one CSV row; raises MeshplanError with the reason when it cannot be expressed."""
    missing = [k for k in REQUIRED if not (row.get(k) or "").strip()]
    if missing:
        raise SpecError(row.get("id", "?"), ",".join(missing), "required columns are empty")
    model, cluster, plan = row_model(row), row_cluster(row), row_plan(row)
    bad = plan_violations(model, cluster, plan)
    if not bad:
        plan = infer_recompute(row, model, cluster, plan)
        model = infer_mtp(row, model, plan)
        plan = framework_split(row, model, plan)
        plan = framework_recompute(row, plan)
        plan = framework_optimizer(row, plan)
        bad = plan_violations(model, cluster, plan)
    if bad:
        raise SpecError(row["id"], "layout", "; ".join(bad))
    return Run(id=row["id"], model=model, cluster=cluster, plan=plan, measured_s=float(row["step_time_s"]), row=row)


def load_runs(path: str | Path) -> tuple[list[Run], list[tuple[str, str]]]:
    """All expressible runs of a CSV and the (id, reason) of every skipped row."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("file", str(p), "no such file")
    runs, skipped = [], []
    with p.open(newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                runs.append(row_to_run(row))
            except MeshplanError as exc:
                skipped.append((row.get("id", "?"), str(exc)))
    return runs, skipped

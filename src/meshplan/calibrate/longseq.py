"""Published long-sequence, CPU-offload and multimodal measurements (``shared/validation/longseq_offload_mm.csv``,
its ``LONGSEQ.md``) held against the training model.

A row is predicted when the training model describes it: one catalog model on one catalog GPU, a full layout
(tp, pp, dp, cp), one fixed sequence length, no CPU offload, and a throughput metric (TFLOP/s per GPU under a
known counting convention, tokens/s, or a step time). Such a row becomes a runs-CSV row and goes through
``runs.row_to_run``, so stack profiles and recipes apply to it as to any published run. Every other row (offload,
multimodal modules, variable lengths, capacity or ratio metrics, abstract-level claims) is skipped with the reason.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from meshplan import catalog
from meshplan.calibrate.runs import Run, read_runs, row_to_run
from meshplan.errors import SpecError, close_matches
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import precision_name

COLUMNS = ("id", "source", "url_or_repo_path", "model", "gpu", "n_gpus", "tp", "pp", "dp", "cp", "ep",
           "seq_len_or_dist", "offload", "precision", "framework", "metric", "value", "unit", "notes")
"""The header of ``longseq_offload_mm.csv`` (LONGSEQ.md, "Columns")."""

STEP_METRICS = ("tflops_per_gpu", "tokens_per_s_per_gpu", "tokens_per_s", "step_time", "iteration_time")
"""Metrics a predicted step time answers; the others (largest model or sequence that fits, ratios to a run
without offload, memory saved) are not step times."""

NO_OFFLOAD = re.compile(r"^\s*$|^none\b|\bno offload\b|\bdisabled\b", re.IGNORECASE)
"""An ``offload`` cell that says the run keeps everything on the GPU: empty, ``none (baseline)``, ``FSDP (no
offload)``, ``HybridDeviceOptimizer: disabled``."""

ZERO_OF_SHARDING = {"megatron_dist_opt": 1, "fsdp1": 3, "fsdp2": 3, "none": 0}
"""The ZeRO stage a stack runs when the row does not say: its profile's sharding (DeepSpeed's stage is a config
choice with no default worth assuming, so such rows are skipped)."""


def is_longseq_csv(header: list[str] | None) -> bool:
    """The header is ``longseq_offload_mm.csv``'s (it names the offload and sequence-distribution columns)."""
    return bool(header) and {"seq_len_or_dist", "offload", "metric", "value"} <= set(header)


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower().split("(", 1)[0])


def catalog_model(text: str) -> str:
    """The catalog model a row names ("LLAMA2-7B", "Llama 3.1 8B", "DeepSeek-V3 685B (with MTP)", "Llama-8B
    (Llama 3.1 8B)"): the longest catalog name that, with its punctuation dropped, starts the row's name or a
    parenthesised part of it with its own dropped."""
    keys = [_norm(text)] + [_norm(p) for p in re.findall(r"\(([^)]*)\)", text)]
    hits = [n for n in catalog.model_names() if _norm(n) and any(k.startswith(_norm(n)) for k in keys)]
    if not hits:
        raise SpecError("model", text, "names no catalog model (catalog/models)",
                        close_matches(text.lower(), catalog.model_names()))
    return max(hits, key=lambda n: len(_norm(n)))


def catalog_gpu(text: str) -> str:
    """The catalog GPU a row names ("H100 (DGX-H100)", "H100 96GB HBM2e, 500W cap (Grand Teton)"): the entry
    whose every dash-separated word the row's text contains, the most words (then the longest name) winning."""
    low = re.sub(r"[^a-z0-9]", "", text.lower())
    hits = [n for n in catalog.gpu_names() if all(w in low for w in n.split("-"))]
    if not hits:
        raise SpecError("gpu", text, "names no catalog GPU (catalog/gpus)", close_matches(text.lower(),
                                                                                         catalog.gpu_names()))
    return max(hits, key=lambda n: (len(n.split("-")), len(n)))


def fixed_seq_len(text: str) -> int:
    """The sequence length of a row that trains at one fixed length ("65536 fixed", "4096")."""
    m = re.fullmatch(r"\s*(\d+)(?:\s+fixed)?\s*", text)
    if not m:
        raise SpecError("seq_len_or_dist", text, "is not one fixed sequence length (variable, packed or unstated "
                        "lengths are not modelled yet)")
    return int(m.group(1))


def row_precision(text: str) -> str:
    """The row's precision: fp8 when its linears run in fp8 ("BF16 + Float8 linears", "FP8 blockwise")."""
    low = text.lower()
    if "fp8" in low or "float8" in low:
        return "fp8"
    name = precision_name(text.split("+", 1)[0])
    if name not in ("bf16", "fp16", "fp32"):
        raise SpecError("precision", text, "must name bf16, fp16, fp32 or fp8")
    return name


def global_batch(notes: str, dp: int, pp: int) -> int:
    """Sequences per step: the notes' "global batch N", or "local batch N" per data-parallel rank; unstated, one
    per data-parallel rank (without pipelining the batch only amortises the step's fixed costs)."""
    g = re.search(r"global batch (\d+)", notes, flags=re.IGNORECASE)
    if g:
        return int(g.group(1))
    loc = re.search(r"local batch (\d+)", notes, flags=re.IGNORECASE)
    if loc:
        return int(loc.group(1)) * dp
    if pp > 1:
        raise SpecError("notes", "", "state no batch, and a pipeline's bubble depends on it")
    return dp


def recompute_of(notes: str) -> str:
    """Activation recompute as the notes state it ("full AC", "selective AC"); empty when they do not."""
    m = re.search(r"\b(full|selective|no) (?:AC|activation checkpointing|recompute)\b", notes, flags=re.IGNORECASE)
    return {"no": "none"}.get(m.group(1).lower(), m.group(1).lower()) if m else ""


LOGGED_FLOPS_ATTENTION = {"nemo": "full", "megatron-bridge": "causal"}
"""How a stack's logged TFLOP/s counts core attention, for the stacks whose convention is known at the rows'
releases: NeMo's FLOPs callback (NVIDIA/NeMo nemo/utils/flops_formulas.py llama2/llama3, the 24.x/25.0x
releases: ``12 * enc_seq_len / hs``, the full s^2 score matrix, causal or not); Megatron-Bridge's from its first
release on (NVIDIA-NeMo/Megatron-Bridge v0.2.0 src/megatron/bridge/training/utils/flop_utils.py
num_floating_point_operations: ``seq_length / hidden_size / 2``, half the matrix; the pre-release July 2025 file
counted it whole). Megatron-LM counted the full matrix until core_r0.12.0 and half of it since (training.py
num_floating_point_operations, commit 8873b55d, 2025-03-06); its rows do not say their release, so their TFLOP/s
are not read."""


def logged_flops(model: ModelSpec, seq: int, batch: int, attention: str) -> float:
    """FLOPs per step as Megatron's and NeMo's counters write them for a dense decoder: 12 B s l h^2 (1 + g/a +
    s/h [halved when causal]) x q/h + ffn/h (x 3/2 gated) + V / (2 l h)) (Megatron-LM training.py
    num_floating_point_operations; NeMo flops_formulas.llama2 is the same sum with gated MLPs)."""
    layer, att = model.decoder, model.decoder.attention
    if model.is_moe or att is None or att.kind != "gqa":
        raise SpecError("model", model.name, "TFLOP/s are read for dense GQA/MHA decoders only")
    h, n = layer.hidden, model.n_layers
    q_ratio = att.n_heads * att.head_dim / h
    scores = seq / h / (2 if attention == "causal" else 1)
    gated = 1.5 if layer.gated else 1.0
    per = ((1 + att.n_kv_heads / att.n_heads + scores) * q_ratio + layer.ffn_hidden / h * gated
           + model.vocab / (2 * n * h))
    return 12.0 * batch * seq * n * h * h * per


def published_value(text: str) -> float:
    """A measurement as the set writes it: a number, an approximate one (``~300``), or a range (``16-21``: its
    midpoint)."""
    m = re.fullmatch(r"\s*[~≈]?\s*(\d+(?:\.\d+)?)(?:\s*[-–]\s*(\d+(?:\.\d+)?))?\s*", text)
    if not m or not float(m.group(1)) > 0:
        raise SpecError("value", text, "must be a positive number, ~number or range a-b")
    lo = float(m.group(1))
    return (lo + float(m.group(2))) / 2 if m.group(2) else lo


def measured_step(row: dict, *, model: ModelSpec, stack: FrameworkProfile, seq: int, batch: int,
                  n_gpus: int) -> float:
    """The row's measurement as seconds per step of ``batch`` sequences of ``seq`` tokens."""
    metric, value = (row.get("metric") or "").strip(), published_value(row.get("value") or "")
    if metric == "tokens_per_s_per_gpu":
        return batch * seq / (value * n_gpus)
    if metric == "tokens_per_s":
        return batch * seq / value
    if metric in ("step_time", "iteration_time"):
        unit = (row.get("unit") or "").strip().lower()
        scale = {"s": 1.0, "s/step": 1.0, "seconds": 1.0, "sec": 1.0, "ms": 1e-3, "ms/step": 1e-3}.get(unit)
        if scale is None:
            raise SpecError("unit", row.get("unit"), "a step time in s or ms")
        return value * scale
    attention = LOGGED_FLOPS_ATTENTION.get(stack.name)
    if attention is None:
        raise SpecError("metric", metric, f"{stack.name}'s TFLOP/s counting convention at the row's release is not "
                        f"known (read for {', '.join(LOGGED_FLOPS_ATTENTION)})")
    return logged_flops(model, seq, batch, attention) / (value * 1e12 * n_gpus)


def _layout(row: dict) -> dict[str, int]:
    out = {}
    for k in ("n_gpus", "tp", "pp", "dp", "cp", "ep"):
        v = (row.get(k) or "").strip()
        if not v and k in ("cp", "ep"):
            v = "1"
        if not v.isdigit() or int(v) < 1:
            raise SpecError(k, v, "the layout must state it as a whole number >= 1")
        out[k] = int(v)
    return out


def runs_row(row: dict, model: ModelSpec) -> dict:
    """The row in the runs-CSV schema (step_time_s left at 1: the measurement is converted once the stack profile
    is known): the catalog model's dimensions, the row's layout on its GPU's nodes, the stack's ZeRO stage,
    sequence parallelism under TP (Megatron's and torchtitan's TP plans), and its source, precision and notes as
    the text recipes match."""
    if not NO_OFFLOAD.search(row.get("offload") or ""):
        raise SpecError("offload", row.get("offload"), "CPU offload is not modelled yet")
    metric = (row.get("metric") or "").strip()
    if metric not in STEP_METRICS:
        raise SpecError("metric", metric, f"predicts no step time (one of {', '.join(STEP_METRICS)})")
    lay, seq = _layout(row), fixed_seq_len(row.get("seq_len_or_dist") or "")
    notes, att = row.get("notes") or "", model.decoder.attention
    framework = (row.get("framework") or "").strip()
    stack, _ = catalog.framework_for(framework)
    if stack.sharding not in ZERO_OF_SHARDING:
        raise SpecError("framework", framework, f"{stack.name} shards by its config ({stack.sharding}), and the row "
                        "does not say how")
    text, gpu = f"{row.get('source', '')}; {row.get('precision', '')}; {notes}", catalog_gpu(row.get("gpu") or "")
    where = " ".join(re.sub(r"[()]", " ", f"{row.get('source', '')} {row.get('url_or_repo_path', '')}").split())
    return {"id": row.get("id", ""), "source": where,
            "model": row.get("model", ""), "arch": "moe" if model.is_moe else "dense", "n_layers": str(model.n_layers),
            "hidden": str(model.hidden), "ffn_hidden": str(model.decoder.ffn_hidden),
            "n_heads": str(att.n_heads if att else 1), "n_kv_heads": str(att.n_kv_heads if att else 1),
            "vocab": str(model.vocab), "seq_len": str(seq),
            "global_batch": str(global_batch(notes, lay["dp"], lay["pp"])), "gpu": gpu, "n_gpus": str(lay["n_gpus"]),
            "gpus_per_node": str(catalog.gpu(gpu).gpus_per_node), "tp": str(lay["tp"]), "pp": str(lay["pp"]),
            "dp": str(lay["dp"]), "cp": str(lay["cp"]), "ep": str(lay["ep"]),
            "zero": str(ZERO_OF_SHARDING[stack.sharding]), "recompute": recompute_of(notes),
            "sp": "1" if lay["tp"] > 1 else "0", "precision": row_precision(row.get("precision") or ""),
            "framework": stack.stacks[0], "step_time_s": "1", "notes": f"src-notes: {framework}; {text}"}


def longseq_run(row: dict) -> Run:
    """One row as a run with its measured step time, or a SpecError saying why the training model cannot
    predict it (its field named ``ROWID.COLUMN``)."""
    rid = (row.get("id") or "").strip() or "?"
    try:
        model = catalog.model(catalog_model(row.get("model") or ""))
        run = row_to_run(runs_row(row, model), model=model)
        p = run.plan
        step = measured_step(row, model=model, stack=run.framework, seq=p.seq_len, batch=p.global_batch,
                             n_gpus=run.cluster.n_gpus)
    except SpecError as exc:
        if exc.field == rid or exc.field.startswith(f"{rid}."):
            raise
        raise SpecError(f"{rid}.{exc.field}", exc.value, exc.expected, exc.suggestions) from None
    return Run(id=run.id, model=run.model, cluster=run.cluster, plan=run.plan, framework=run.framework,
               profile_note=run.profile_note, recipes=run.recipes, measured_s=step, row=run.row)


def load_longseq_runs(path: str | Path) -> tuple[list[Run], list[tuple[str, str]]]:
    """Every row the training model predicts, as runs, and the (id, reason) of every other row."""

    def check(header: list[str] | None) -> None:
        missing = [c for c in COLUMNS if c not in (header or ())]
        if missing:
            raise SpecError("file", str(path), f"is not a long-sequence/offload/multimodal CSV: missing columns "
                            f"{', '.join(missing)} (the schema of shared/validation/longseq_offload_mm.csv)")

    return read_runs(path, check, longseq_run)


LONGSEQ_CSV = "longseq_offload_mm.csv"
"""The set's file name beside ``runs_visible.csv`` in ``shared/validation``."""


def same_job(a: Run, b: Run) -> bool:
    """Two rows of one published measurement: the GPU, the model's shape, the layout, the sequence and batch, and
    the step within 1 % (the two sets round the same published figure differently: 12.9008 and 12.901 s)."""
    pa, pb = a.plan, b.plan
    keys = ("tp", "pp", "dp", "cp", "ep", "seq_len", "global_batch")
    return (a.cluster.gpu.name == b.cluster.gpu.name and (a.model.n_layers, a.model.hidden) == (b.model.n_layers,
            b.model.hidden) and all(getattr(pa, k) == getattr(pb, k) for k in keys)
            and abs(a.measured_s / b.measured_s - 1) < 0.01)


def documents(text: str) -> set[str]:
    """The published documents a source cell names (``llama3_h100_202412_torchtitan.md``)."""
    return set(re.findall(r"[\w.-]+\.md\b", text.lower()))


def anchor_runs(visible: list[Run], folder: str | Path) -> list[Run]:
    """The long-sequence rows a joint calibration would add to the visible runs (``benchmarks/bench_longseq_fit.py``
    weighs it; the shipped fit does not, README "Long sequences"): the rows of ``folder``'s long-sequence set that
    the training model predicts, less those the visible runs already hold; empty when the folder has no such file.
    Each id is prefixed with its source as the visible ids are (``calibrate.loso.source_of`` groups by it): the
    visible source that cites the same document, so that leaving that source out leaves its long-sequence rows out
    too, else ``longseq``."""
    path = Path(folder) / LONGSEQ_CSV
    if not path.is_file():
        return []
    runs, _ = load_longseq_runs(path)
    cited = {doc: v.id.split("-")[0] for v in visible for doc in documents(v.row.get("source") or "")}
    out = []
    for r in runs:
        if any(same_job(r, v) for v in visible):
            continue
        group = next((cited[d] for d in sorted(documents(r.row.get("source") or "")) if d in cited), "longseq")
        out.append(replace(r, id=f"{group}-{r.id}"))
    return out

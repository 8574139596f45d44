"""``meshplan serve``: search the serving deployments of a model on a cluster under a workload and SLOs.

Exit status: 0 when a deployment meets the SLOs, 4 when none does (the reason and the nearest option are
printed), 2 for user errors.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional

import typer

NOTHING_MEETS_EXIT = 4
PERCENTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "mean": 0.5}
"""``--percentile`` names (``mean`` binds the median: with fixed lengths they coincide except for waiting)."""


def _percentile(text: str) -> float:
    from meshplan.errors import SpecError

    key = text.strip().lower()
    if key in PERCENTILES:
        return PERCENTILES[key]
    try:
        v = float(key.lstrip("p"))
    except ValueError:
        raise SpecError("--percentile", text, f"expected one of {', '.join(PERCENTILES)} or a number in "
                        "(0, 100)") from None
    if not 0 < v < 100:
        raise SpecError("--percentile", text, "must be between 0 and 100 (exclusive), e.g. 90")
    return v / 100


def _length_file_lines(flag: str, text: str, raw: str) -> list[tuple[str, str]]:
    """(length, weight) cells of a length file's lines, strictly: ``lengths`` says the rules."""
    from meshplan.errors import SpecError

    pairs: list[tuple[str, str]] = []
    header = False
    for no, line in enumerate(raw.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        cells = [c.strip() for c in line.replace(":", ",").split(",")]
        if not pairs and not header and cells[0][:1] not in "0123456789+-.":
            header = True  # a column header such as "length,weight"
            continue
        where = f"{flag} {text} line {no}"
        if len(cells) != 2:
            raise SpecError(where, line, "expected length,weight: a whole number of tokens >= 1, a comma and "
                            "a weight > 0")
        n, w = cells
        if not (n.isascii() and n.isdigit() and int(n) >= 1):
            raise SpecError(where, line, f"the length {n!r} must be a whole number of tokens >= 1")
        try:
            weight = float(w)
        except ValueError:
            weight = math.nan
        if not 0 < weight < math.inf:
            raise SpecError(where, line, f"the weight {w!r} must be a finite number > 0")
        pairs.append((n, w))
    if not pairs:
        raise SpecError(flag, text, "has no length,weight lines (only blank lines, # comments or a header): "
                        "give one line per length, e.g. 1024,3")
    return pairs


def lengths(flag: str, text: str) -> tuple[tuple[int, float], ...]:
    """``--input-len``/``--output-len``: a number of tokens (``1024``, ``1k``), a range drawn uniformly
    (``512-1536``, ``calibrate.serve_cells``), inline bins ``128:3,512:1`` (length:weight), a
    file of ``length,weight`` lines (a header line and ``#`` comments allowed) or a JSON list of [length, weight],
    or a benchmark dataset of the catalog (``sharegpt``: its lengths as the serving benchmarks sample them).

    A file of lines is read strictly: blank lines and ``#`` comments are skipped, one header line may come first
    (its first field not a number); every other line is a whole length >= 1 and a finite weight > 0, separated
    by a comma or a colon, else one error naming the file and the line."""
    import json
    from pathlib import Path

    from meshplan import catalog
    from meshplan.errors import SpecError

    text = str(text).strip()
    fmt = ("a whole number of tokens (1024, 1k), a range drawn uniformly (512-1536), bins like 128:3,512:1, a file "
           f"of length,weight lines, or a dataset ({', '.join(catalog.dataset_names())})")
    named = catalog.dataset_for(text)  # a dataset's name or a spelling its ``matches`` prefix takes ("ShareGPT_V3")
    if named is not None:
        return named.bins("output" if "output" in flag else "input")
    from meshplan.calibrate.serve_cells import MAX_TOKENS, length_bins

    if text.isascii() and text.isdigit():
        if not 1 <= int(text) <= MAX_TOKENS:
            raise SpecError(flag, text, f"must be 1 to {MAX_TOKENS:,} tokens")
        return ((int(text), 1.0),)
    path = Path(text)
    try:
        is_file = path.is_file()
    except OSError:  # a name the file system refuses (too long): not a file
        is_file = False
    if ":" not in text and not is_file:  # a count or a range, as the validation CSVs write them
        try:
            return length_bins(text, flag)
        except SpecError:
            raise SpecError(flag, text, f"expected {fmt}") from None
    if is_file:
        try:
            raw = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of the first line
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(flag, text, f"cannot be read as a text file of length,weight lines ({exc})") from None
        try:
            pairs = json.loads(raw) if raw.lstrip().startswith("[") else _length_file_lines(flag, text, raw)
        except json.JSONDecodeError as exc:
            raise SpecError(flag, text, f"is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    else:
        pairs = [part.split(":") for part in text.split(",")]
    try:
        bins = tuple((int(n), float(w)) for n, w in pairs)
    except (TypeError, ValueError):
        raise SpecError(flag, text, f"expected {fmt}") from None
    if not bins or any(not 1 <= n <= MAX_TOKENS or not 0 < w < math.inf for n, w in bins):
        raise SpecError(flag, text, f"every length must be 1 to {MAX_TOKENS:,} tokens and every weight a finite "
                        "number > 0")
    if not math.isfinite(sum(w for _, w in bins)):
        raise SpecError(flag, text, "the weights overflow when added: scale them down (only their ratios count)")
    return bins


def _ms(flag: str, value: float) -> float:
    from meshplan.errors import SpecError

    if not 0 <= value < math.inf:
        raise SpecError(flag, value, "must be a finite time in milliseconds >= 0 (0 = no target)")
    return value / 1e3


def build_request(*, model_ref: str, gpus: str, cluster_file: str, engine: str, work: dict, slo: dict,
                  layout: dict):
    """The ServeRequest the flags describe (every value checked, one-line errors)."""
    from meshplan import catalog
    from meshplan.calibrate.serve_constants import load_constants
    from meshplan.cli.common import resolve_cluster, resolve_model
    from meshplan.errors import SpecError
    from meshplan.search.serve_request import ServeRequest, Slo
    from meshplan.spec.serving import KV_DTYPES, MAX_CLIENTS, WEIGHT_DTYPES, workload_from_hist

    model = resolve_model(model_ref)
    cluster = resolve_cluster(gpus or None, cluster_file or None)
    if cluster.servers:
        raise SpecError("--gpus", cluster.describe(), "serving runs no parameter servers: drop the +Nxserver part")
    prof = catalog.engine(engine)
    for flag, key, opts in (("--precision", "precision", WEIGHT_DTYPES), ("--kv-dtype", "kv_dtype", KV_DTYPES)):
        if layout[key] not in opts:
            raise SpecError(flag, layout[key], f"must be one of {', '.join(opts)}")
    n = cluster.n_gpus
    for flag, key in (("--tp", "tp"), ("--pp", "pp"), ("--attn-dp", "attn_dp"), ("--replicas", "replicas")):
        if layout[key] and layout[key] > n:
            raise SpecError(flag, layout[key], f"exceeds the {n} GPUs of {cluster.describe()}")
    if layout["ep"] and model.decoder.moe is None:
        raise SpecError("--ep", layout["ep"], f"{model.name} has no experts (dense model): leave --ep unset")
    if layout["tp"] and layout["pp"] and layout["tp"] * layout["pp"] > n:
        raise SpecError("--tp x --pp", layout["tp"] * layout["pp"], f"exceeds the {n} GPUs of {cluster.describe()}")
    s = Slo(ttft=_ms("--ttft-ms", slo["ttft_ms"]), tpot=_ms("--tpot-ms", slo["tpot_ms"]),
            percentile=_percentile(slo["percentile"]))
    if not 0 <= work["rate"] < math.inf:
        raise SpecError("--rate", work["rate"], "must be a finite number of requests per second (0 = no open loop)")
    if work["concurrency"] > MAX_CLIENTS:
        raise SpecError("--concurrency", work["concurrency"], f"must be at most {MAX_CLIENTS:,} clients: a load that "
                        "large is an open loop (give --rate)")
    w = workload_from_hist(lengths("--input-len", work.pop("input_len")), lengths("--output-len",
                                                                                  work.pop("output_len")), **work)
    return ServeRequest(model=model, cluster=cluster, engine=prof, work=w, slo=s, constants=load_constants(),
                        **layout)


APPROXIMATE_EXIT = 3
"""Exit status when the exported launch cannot express part of the plan (as ``meshplan export``)."""


def export_winner(best, req, *, checkpoint: str, out_dir: str) -> tuple[str, ...]:
    """Write the winner's launch and benchmark scripts into ``out_dir``; returns what the engine cannot express."""
    from pathlib import Path

    from meshplan.cli.common import wrote
    from meshplan.export.serve import export_serving

    disagg = None
    if best.prefill is not None:
        disagg = {"prefill": best.prefill, "decode": best.plan, "prefill_replicas": best.prefill.replicas,
                  "decode_replicas": best.plan.replicas}
    done = export_serving(model=req.model, model_ref=checkpoint, plan=best.plan, engine=best.engine, work=req.work,
                          disagg=disagg, gpus_per_node=req.pool.gpus_per_node)
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in done.files.items():
        (folder / name).write_text(text)
    wrote(folder, f"{best.engine.name} launch and benchmark for {best.label()} ({', '.join(sorted(done.files))})")
    for note in done.approximations:
        print(f"approximation: {note}", file=sys.stderr)
    return done.approximations


def run_serve(req, *, top: int, as_json: bool, export: dict | None = None) -> int:
    """Search, explain, print, export the winner when asked; returns the exit status."""
    from meshplan.cli.common import print_json, term_width
    from meshplan.report.serve import render_text, result_json
    from meshplan.search.serve import search
    from meshplan.search.serve_explain import explain

    result = search(req)
    why = explain(result)
    if as_json:
        print_json(result_json(result, why, top))
    else:
        sys.stdout.write(render_text(result, why, top=top, width=term_width()))
    if result.best is None:
        return NOTHING_MEETS_EXIT
    if export:
        notes = export_winner(result.best, req, checkpoint=export["checkpoint"], out_dir=export["dir"])
        if notes and not export["allow_approximate"]:
            return APPROXIMATE_EXIT
    return 0


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command."""
    app.command("serve")(serve_cmd)


def serve_cmd(
    model: str = typer.Option(..., "--model", help="Model: catalog name, model file or HF config.json."),
    gpus: str = typer.Option("", "--gpus", help="GPUs, e.g. 8xh100-sxm (one GPU type)."),
    cluster: str = typer.Option("", "--cluster", help="Cluster file (one pool of GPUs and its network)."),
    engine: str = typer.Option("vllm", "--engine", help="Serving-engine profile (catalog/engines): vllm, "
                               "sglang, trtllm, tgi, lmdeploy, fastgen, or a versioned one such as vllm-0.6.0."),
    input_len: str = typer.Option(..., "--input-len", help="Prompt tokens per request: a number (1024, 1k), "
                                  "a range drawn uniformly (512-1536), bins LENGTH:WEIGHT,..., a file of "
                                  "length,weight lines, or a dataset (sharegpt)."),
    output_len: str = typer.Option(..., "--output-len", help="Generated tokens per request (same forms)."),
    concurrency: int = typer.Option(0, "--concurrency", help="Closed loop: requests in flight."),
    rate: float = typer.Option(0.0, "--rate", help="Open loop: Poisson arrivals per second. Neither: offline."),
    ttft_ms: float = typer.Option(0.0, "--ttft-ms", help="Time-to-first-token target (ms; 0 = none)."),
    tpot_ms: float = typer.Option(0.0, "--tpot-ms", help="Time-per-output-token target (ms; 0 = none)."),
    percentile: str = typer.Option("p90", "--percentile", help="Percentile the SLOs bind: p50, p90, p99..."),
    objective: str = typer.Option("throughput", "--objective", help="throughput (tokens/s per GPU), cost "
                                  "(tokens per dollar) or latency (lowest end-to-end)."),
    price: float = typer.Option(0.0, "--price", help="Dollars per GPU-hour (default: the catalog's)."),
    precision: str = typer.Option("bf16", "--precision",
                                  help="Weights: bf16, fp16, fp8, fp4 (Blackwell), int4 (AWQ/GPTQ)."),
    kv_dtype: str = typer.Option("bf16", "--kv-dtype", help="KV cache: bf16, fp16 or fp8."),
    tp: int = typer.Option(0, "--tp", min=0, help="Pin TP per replica (0 = searched)."),
    pp: int = typer.Option(0, "--pp", min=0, help="Pin pipeline stages per replica (0 = searched)."),
    ep: int = typer.Option(0, "--ep", min=0, help="Pin expert parallelism (MoE; 0 = searched)."),
    attn_dp: int = typer.Option(0, "--attn-dp", min=0, help="Pin data-parallel attention groups per replica (MoE "
                                "on sglang, vllm, trtllm: experts over tp x attn-dp GPUs; 1 = none; 0 = searched)."),
    replicas: int = typer.Option(0, "--replicas", min=0, help="Pin data-parallel replicas (0 = searched)."),
    max_num_seqs: int = typer.Option(0, "--max-num-seqs", min=0, help="Pin the engine's running-sequence cap "
                                     "(0 = the profile's, and lower caps searched)."),
    disagg: str = typer.Option("auto", "--disagg", help="auto (aggregated and disaggregated), off, or only."),
    top: int = typer.Option(5, "--top", min=1, help="Deployments in the table."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    export_dir: str = typer.Option("", "--export", help="Write the winner's launch.sh and bench.sh (and the "
                                   "engine's option files) into this folder."),
    checkpoint: str = typer.Option("", "--checkpoint", help="What the engine loads: a Hugging Face id or a "
                                   "path (needed by --export), e.g. meta-llama/Llama-3.1-70B-Instruct."),
    allow_approximate: bool = typer.Option(False, "--allow-approximate", help="Exit 0 even when the engine "
                                           "cannot express part of the plan (else 3, as meshplan export)."),
    speculative: str = typer.Option("", "--speculative", help="Speculative decoding: mtp (the model's own MTP "
                                    "module), eagle (an EAGLE head), ngram (prompt lookup) or draft (a draft "
                                    "model); needs --acceptance or --accept-length."),
    draft_tokens: Optional[int] = typer.Option(None, "--draft-tokens", help="Draft tokens per pass (default: "
                                               "1-5 searched with --acceptance, 3 with --accept-length)."),
    acceptance: Optional[float] = typer.Option(None, "--acceptance", help="Share of draft tokens accepted (0-1)."),
    accept_length: Optional[float] = typer.Option(None, "--accept-length", help="Mean tokens a pass yields, as "
                                                  "the engine logs it (alternative to --acceptance)."),
    draft_model: str = typer.Option("", "--draft-model", help="EAGLE head checkpoint (eagle) or draft model "
                                    "(draft: catalog name, HF id or config.json)."),
) -> None:
    """Find the serving deployment with the most throughput (or least cost, or latency) that meets the SLOs."""
    from meshplan.cli.serve_spec import draft_options, speculation_from_flags
    from meshplan.errors import SpecError

    if not 0 <= price < math.inf:
        raise SpecError("--price", price, "must be a finite number of dollars per GPU-hour (0 = the catalog's)")
    export = _export_option(export_dir, checkpoint, allow_approximate, engine)
    spec = speculation_from_flags(method=speculative, draft_tokens=draft_tokens, acceptance=acceptance,
                                  accept_length=accept_length, draft_model=draft_model)
    lengths = draft_options(method=speculative, draft_tokens=draft_tokens, acceptance=acceptance)
    req = build_request(
        model_ref=model, gpus=gpus, cluster_file=cluster, engine=engine,
        work=dict(input_len=input_len, output_len=output_len, concurrency=concurrency, rate=rate),
        slo=dict(ttft_ms=ttft_ms, tpot_ms=tpot_ms, percentile=percentile),
        layout=dict(precision=precision, kv_dtype=kv_dtype, tp=tp, pp=pp, ep=ep, attn_dp=attn_dp,
                    replicas=replicas, max_num_seqs=max_num_seqs, disagg=disagg, objective=objective, price=price,
                    speculation=spec, draft_options=lengths))
    code = run_serve(req, top=top, as_json=as_json, export=export)
    if code:
        raise typer.Exit(code)


def _export_option(export_dir: str, checkpoint: str, allow_approximate: bool, engine: str) -> dict | None:
    """``--export``'s folder, checked writable and the engine exportable before the search runs, with what the
    export needs."""
    from meshplan import catalog
    from meshplan.cli.common import output_path
    from meshplan.errors import SpecError
    from meshplan.export.serve import EXPORTERS

    if not export_dir:
        if checkpoint or allow_approximate:
            flag = "--checkpoint" if checkpoint else "--allow-approximate"
            raise SpecError(flag, checkpoint or True, "applies to --export only: give --export FOLDER with it")
        return None
    family = catalog.engine(engine).engine
    if family not in EXPORTERS:
        raise SpecError("--export", export_dir, f"has no launch to write for {engine} (engine family {family}); "
                        f"exports exist for {', '.join(EXPORTERS)}: drop --export or pick one of them")
    if not checkpoint:
        raise SpecError("--checkpoint", None, "is needed by --export: the Hugging Face id or path the engine "
                        "loads, e.g. meta-llama/Llama-3.1-70B-Instruct")
    if not checkpoint.strip():
        raise SpecError("--checkpoint", checkpoint, "is blank: give the Hugging Face id or path the engine loads, "
                        "e.g. meta-llama/Llama-3.1-70B-Instruct")
    folder = Path(export_dir)
    if folder.exists() and not folder.is_dir():
        raise SpecError("--export", export_dir, "is a file; give a folder (created if missing)")
    output_path("--export", str(folder / "launch.sh") if folder.is_dir() else export_dir)
    return {"dir": export_dir, "checkpoint": checkpoint, "allow_approximate": allow_approximate}

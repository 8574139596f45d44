"""``meshplan estimate``: step time, tokens/s, MFU and per-GPU memory of one plan, with breakdowns."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from meshplan.cli.common import (
    gib,
    output_path,
    print_json,
    resolve_cluster,
    resolve_framework,
    resolve_model,
    stack_changes,
    term_width,
    wrote,
)
from meshplan.errors import SpecError
from meshplan.spec.plan import Plan
from meshplan.spec.plan_file import read_plan_file

# Flag name -> Plan field, named like the validation CSV's columns.
PLAN_FLAGS = ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "micro_batch", "global_batch", "seq_len", "recompute",
              "sp", "precision", "schedule", "etp", "dp_shard", "cp_kind", "recompute_layers", "framework", "dp_sync")
# Flag name -> FrameworkProfile field: the stack's settings a command may change for one prediction.
STACK_FLAGS = ("tp_comm_overlap", "grad_dtype", "optimizer_dtype")


def build_plan(base: Plan | None, flags: dict, n_gpus: int) -> Plan:
    """A plan from a plan file and/or flags (flags win); dp defaults to what the GPU count leaves."""
    given = {k: v for k, v in flags.items() if v is not None}
    if base is not None:
        fields = base.to_dict()
        fields.update(given)
    else:
        fields = dict(given)
        for need in ("global_batch", "seq_len"):
            if need not in fields:
                raise SpecError(f"--{need.replace('_', '-')}", None, "is required without --plan")
    if "layer_split" in fields and isinstance(fields["layer_split"], list):
        fields["layer_split"] = tuple(fields["layer_split"])
    for k in ("tp", "pp", "cp"):
        if not isinstance(fields.get(k, 1), int) or fields.get(k, 1) < 1:
            raise SpecError(f"--{k}", fields[k], "must be an integer >= 1")
    if "dp" not in fields:
        rest = fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1)
        if n_gpus % rest:
            raise SpecError("--tp x --pp x --cp", rest, f"must divide the {n_gpus} GPUs (the data-parallel degree "
                            "is what they leave)")
        fields["dp"] = n_gpus // rest
    _check_knobs(fields, given)
    return Plan(**fields)


def _check_knobs(fields: dict, given: dict) -> None:
    """Knobs that mean nothing without another are refused, not dropped."""
    if fields.get("dp_shard") and not fields.get("zero"):
        raise SpecError("--dp-shard", fields["dp_shard"], "shards ZeRO/FSDP states: give --zero 1, 2 or 3 with it")
    if fields.get("schedule") and fields.get("pp", 1) == 1:
        raise SpecError("--schedule", fields["schedule"], "orders pipeline stages: give --pp 2 or more with it")
    if fields.get("recompute_layers") and fields.get("recompute", "none") != "full":
        raise SpecError("--recompute-layers", fields["recompute_layers"], "counts fully recomputed layers: give "
                        "--recompute full with it")
    if fields.get("cp_kind") and fields.get("cp", 1) == 1 and "cp_kind" in given:
        raise SpecError("--cp-kind", fields["cp_kind"], "names how context parallelism exchanges keys and values: "
                        "give --cp 2 or more with it")
    if fields.get("sp") and fields.get("tp", 1) == 1:
        raise SpecError("--sp", True, "splits the sequence over the TP group: give --tp 2 or more with it")


def render(est, model, cluster, plan, stack=None, width: int = 80) -> str:
    """Readable tables of the estimate in ``width`` columns."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    from meshplan.cost.bands import band_for
    from meshplan.cost.result import INSIDE_COMPUTE
    from meshplan.report.band import band_text
    from meshplan.report.layout import layout_text
    from meshplan.report.search import mfu_peak

    buf = StringIO()
    con = Console(file=buf, width=width, force_terminal=False, no_color=True, highlight=False)
    head = Table(title=f"{model.name} on {cluster.describe()}", show_header=False)
    layout = layout_text(plan)
    stack_line = plan.framework + (f" ({', '.join(f'{k}={v}' for k, v in stack_changes(stack).items())})"
                                   if stack is not None and stack_changes(stack) else "")
    for k, v in (("layout", layout), ("framework", stack_line), ("step time", f"{est.step_time:.3f} s"),
                 ("80 % band", band_text(band_for(model, cluster, plan), est.step_time)),
                 ("tokens/s", f"{est.tokens_per_s:,.0f}"),
                 ("MFU", f"{100 * est.mfu:.1f} %" + (f" ({mfu_peak(plan.precision)})" if plan.precision == "fp8"
                                                     else "")),
                 ("peak memory / GPU", f"{gib(est.peak_memory)} GiB of {gib(est.capacity)} GiB"
                  f"{'' if est.fits else '  (DOES NOT FIT)'}"), ("pipeline", est.pipeline_source)):
        head.add_row(k, v)
    con.print(head)
    t = Table(title="time per step", show_header=True)
    t.add_column("component")
    t.add_column("s", justify="right")
    t.add_column("%", justify="right")
    for k, v in est.time.as_dict().items():
        if v > 0:
            t.add_row(k.replace("_", " ") + (" (inside compute)" if k in INSIDE_COMPUTE else ""), f"{v:.3f}",
                      f"{100 * v / est.step_time:.1f}")
    con.print(t)
    m = Table(title="memory of the fullest GPU", show_header=True)
    m.add_column("component")
    m.add_column("GiB", justify="right")
    for k, v in est.memory.as_dict().items():
        m.add_row(k, gib(v))
    m.add_row("total", gib(est.peak_memory))
    con.print(m)
    return buf.getvalue()


def register(app: typer.Typer) -> None:
    """Add the ``estimate`` command."""

    @app.command()
    def estimate(
        model: Optional[str] = typer.Option(None, "--model", help="Catalog name, model TOML or HF config.json."),
        gpus: Optional[str] = typer.Option(None, "--gpus", help="e.g. 1024xa100-80gb or 32xa100-80gb+32xh100-sxm"
                                 "; +8xserver[@GB/s] adds CPU parameter servers."),
        cluster: Optional[str] = typer.Option(None, "--cluster", help="Cluster TOML file."),
        plan: Optional[str] = typer.Option(None, "--plan", help="Plan TOML file (flags override it)."),
        tp: Optional[int] = typer.Option(None, help="Tensor-parallel degree (default 1)."),
        pp: Optional[int] = typer.Option(None, help="Pipeline degree (default 1)."),
        dp: Optional[int] = typer.Option(None, help="Data-parallel degree (default: what the GPUs leave)."),
        cp: Optional[int] = typer.Option(None, help="Context-parallel degree (default 1)."),
        ep: Optional[int] = typer.Option(None, help="Expert-parallel degree (default 1)."),
        vpp: Optional[int] = typer.Option(None, help="Virtual stages per pipeline rank (default 1)."),
        zero: Optional[int] = typer.Option(None, help="ZeRO stage: 0, 1, 2 or 3 (3 = FSDP; default 0)."),
        etp: Optional[int] = typer.Option(None, help="Experts' tensor-parallel degree: 1 or tp (default 1)."),
        dp_shard: Optional[int] = typer.Option(None, "--dp-shard", help="HSDP shard group size."),
        dp_sync: Optional[str] = typer.Option(None, "--dp-sync", help="Gradient synchronisation: allreduce, "
                                              "reduce_scatter or ps (a parameter server on the cluster's CPU servers, "
                                              "--gpus ...+8xserver[@GB/s]); default: the ZeRO stage's collective."),
        micro_batch: Optional[int] = typer.Option(None, "--micro-batch"),
        global_batch: Optional[int] = typer.Option(None, "--global-batch"),
        seq_len: Optional[int] = typer.Option(None, "--seq-len"),
        recompute: Optional[str] = typer.Option(None, help="none | selective | full"),
        recompute_layers: Optional[int] = typer.Option(None, "--recompute-layers"),
        sp: Optional[bool] = typer.Option(None, "--sp/--no-sp", help="Sequence parallelism."),
        precision: Optional[str] = typer.Option(None, help="bf16 | fp16 | fp32 | fp8"),
        cp_kind: Optional[str] = typer.Option(None, "--cp-kind", help="ring | a2a"),
        framework: Optional[str] = typer.Option(None, "--framework",
                                                help="Software stack profile (catalog/frameworks), default: the "
                                                     "plan file's, else megatron-core."),
        tp_comm_overlap: Optional[bool] = typer.Option(None, "--tp-comm-overlap/--no-tp-comm-overlap",
                                                       help="Override the stack's TP communication overlap."),
        grad_dtype: Optional[str] = typer.Option(None, "--grad-dtype", help="Override the stack's gradient dtype."),
        optimizer_dtype: Optional[str] = typer.Option(None, "--optimizer-dtype",
                                                      help="Override the stack's Adam moment dtype."),
        schedule: Optional[str] = typer.Option(None, help="Pipeline schedule: 1f1b, interleaved_1f1b, gpipe, "
                                               "looped_bfs, zb_h1, zbv, dualpipev."),
        schedule_file: Optional[str] = typer.Option(None, "--schedule-file", help="Custom schedule CSV."),
        simulate: bool = typer.Option(False, "--simulate", help="Use the event simulator for the pipeline."),
        trace: Optional[str] = typer.Option(None, "--trace", help="Write a Chrome/Perfetto trace JSON."),
        dense_workers: Optional[int] = typer.Option(None, "--dense-workers",
                                                    help="Also price layer separation (Stanza): this many of a "
                                                         "data-parallel job's GPUs hold the embedding and output "
                                                         "head, the rest the blocks."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Predict step time and per-GPU memory of one plan."""
        if trace is not None:
            output_path("--trace", trace)
        base, refs = read_plan_file(plan) if plan is not None else (None, {})
        mdl = resolve_model(model, refs.get("model"))
        clu = resolve_cluster(gpus, cluster, refs.get("gpus") or refs.get("cluster"))
        local = locals()
        the_plan = build_plan(base, {k: local[k] for k in PLAN_FLAGS}, clu.n_gpus)
        stack = resolve_framework(the_plan.framework, file_settings=refs.get("framework"),
                                  flags={k: local[k] for k in STACK_FLAGS})
        if schedule_file and schedule:
            raise SpecError("--schedule", schedule, "and --schedule-file both name the schedule: give one")
        per_rank = -(-mdl.n_layers // the_plan.pp)
        if the_plan.recompute_layers > per_rank:
            raise SpecError("--recompute-layers", the_plan.recompute_layers, f"exceeds the {per_rank} layers per "
                            f"pipeline rank of {mdl.name} at pp={the_plan.pp} (0 = all of them)")
        sched_obj = _load_schedule(schedule_file, the_plan) if schedule_file else None
        if mdl.max_seq_len and the_plan.seq_len > mdl.max_seq_len:
            print(f"note: seq_len {the_plan.seq_len} exceeds {mdl.name}'s {mdl.max_seq_len} trained positions; the "
                  "prediction times the layout, not the model's quality at that length", file=sys.stderr)
        from meshplan.sim.predict import predict

        sep = _separation(mdl, clu, the_plan, stack, dense_workers)
        est = predict(mdl, clu, the_plan, stack=stack, schedule=sched_obj,
                      simulate=True if (simulate or trace is not None) else None)
        if trace is not None:
            _write_trace(trace, est, the_plan, sched_obj)
            wrote(trace, "Chrome/Perfetto trace of the predicted step")
        _print(est, sep, mdl, clu, the_plan, stack, as_json=as_json)


def _separation(model, cluster, plan: Plan, stack, dense_workers: int | None):
    """The layer-separated step ``--dense-workers`` asks for, or None."""
    if dense_workers is None:
        return None
    from meshplan.cost.layer_separation import separated_step

    return separated_step(model, cluster, plan, stack=stack, dense_workers=dense_workers)


def _print(est, sep, model, cluster, plan: Plan, stack, *, as_json: bool) -> None:
    """The estimate (and the separated step when asked) as JSON or as tables."""
    from meshplan.cost.bands import band_for
    from meshplan.report.band import band_json

    if as_json:
        print_json({"model": model.name, "gpus": cluster.describe(), "plan": plan.to_dict(),
                    "framework": {"name": stack.name, **stack_changes(stack)}, **est.as_dict(),
                    "band": band_json(band_for(model, cluster, plan), est.step_time),
                    **({"layer_separation": sep.as_dict()} if sep else {})})
        return
    typer.echo(render(est, model, cluster, plan, stack, width=term_width()))
    if sep:
        from meshplan.cost.layer_separation import compare

        typer.echo(compare(sep, est) + ("" if sep.fits else f" (DOES NOT FIT: peaks {gib(sep.light_peak)} / "
                                        f"{gib(sep.dense_peak)} GiB)"))


def _load_schedule(path: str, plan: Plan):
    """A custom schedule CSV, checked against the plan's pipeline degree."""
    from meshplan.sim import load_schedule_csv

    if not Path(path).is_file():
        raise SpecError("--schedule-file", path, "is not a file (a schedule CSV in torch's compute_only layout)")
    return load_schedule_csv(path)


def _write_trace(path: str, est, plan: Plan, sched_obj) -> None:
    from meshplan.export.trace import write_chrome_trace
    from meshplan.sim import simulate

    tl = simulate(sched_obj or plan.schedule_name, est.stage_times, pp=plan.pp, vpp=plan.vpp,
                  n_micro=plan.n_micro)
    write_chrome_trace(tl, path)

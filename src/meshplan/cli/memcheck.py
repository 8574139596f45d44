"""``meshplan memcheck``: run one rank of the real runtime for a training step on fake tensors under a fake
process group, record its peak memory with PyTorch's MemTracker, and compare it with the cost model's
prediction. No GPU and no real allocation; torch is imported inside the command.

The comparison is by what the tracker can tell apart. The cost model books memory the way Megatron's mixed
precision holds it: a 16-bit working copy of the weights (``params``, 2 bytes each below ZeRO-3) and an fp32
master inside the optimizer states (4 + 8 bytes), gradients in their own buffer. The runtime (FSDP2 with
fp32 sharded parameters) holds the fp32 master as its parameters and the AdamW moments as optimizer states;
its 16-bit copies exist only inside the step (gathered per FSDP unit), and the tracker sees a gradient as a
temporary until it lands in ``.grad``, which is after the peak. Compared component by component, the two
disagreed by +/-50 % while the totals agreed to 1 %. So the rows are: the fp32 weights and the AdamW moments,
each taken from the predicted optimizer states in the proportion ``bytes_per_param`` gives them, everything
the step makes (gradients, activations, 16-bit copies, gathered units, logits), and the total.
"""

from __future__ import annotations

from typing import Optional

import typer

from meshplan.errors import SpecError

GiB = 2**30
DEFAULT_MODEL, DEFAULT_GPUS = "llama3.1-8b", "8xh100-sxm"
"""What memcheck measures when neither a flag nor the plan file names a model or GPUs."""
ROWS = ("fp32 weights", "AdamW moments", "step tensors", "all tensors")
"""The compared rows (see the module docstring)."""


def predicted(spec, cluster, plan, stage: int) -> dict:
    """The cost model's memory of pipeline rank ``stage``: its components, activations and buffers joined
    (the tracker cannot tell logits or FSDP units from activations), ``tensors`` = all but reserved."""
    from meshplan import catalog
    from meshplan.cost.estimate import estimate

    # What is measured is this runtime: the meshplan stack, whatever stack the plan names.
    est = estimate(spec, cluster, plan.with_(framework="meshplan"), stack=catalog.framework("meshplan"))
    m = est.memory_per_stage[stage]
    return {"params": m.params, "grads": m.grads, "optimizer": m.optimizer,
            "activations": m.activations + m.buffers, "tensors": m.total() - m.reserved,
            "reserved": m.reserved, "capacity": est.capacity}


def comparable_rows(plan, measured: dict, pred: dict) -> list[dict]:
    """The ROWS, measured and predicted bytes each (see the module docstring): the predicted optimizer states
    split into the fp32 master and the moments in the proportion of their bytes per parameter."""
    from meshplan import catalog
    from meshplan.cost.memory import bytes_per_param

    stack = catalog.framework("meshplan")
    master, _, moments = bytes_per_param(plan.with_(precision="fp32"), stack)  # fp32: weights are the master
    _, _, opt = bytes_per_param(plan, stack)
    weights, adam = pred["optimizer"] * master / opt, pred["optimizer"] * moments / opt
    pairs = ((measured["params"], weights), (measured["optimizer"], adam),
             (measured["tensors"] - measured["params"] - measured["optimizer"], pred["tensors"] - weights - adam),
             (measured["tensors"], pred["tensors"]))
    return [{"row": name, "measured": a, "predicted": b} for name, (a, b) in zip(ROWS, pairs)]


def compare(spec, cluster, plan, *, stage: int, model_ref: str) -> dict:
    """Measured vs predicted bytes of one pipeline rank: the raw components of each side, the comparable rows,
    and the relative error of the peak."""
    from meshplan.runtime.launch import progress
    from meshplan.runtime.memcheck import measure_rank, rank_of_stage

    pred = predicted(spec, cluster, plan, stage)
    rank = rank_of_stage(plan, stage)
    progress(f"memcheck: tracing one training step of rank {rank} (pipeline rank {stage}) on fake tensors")
    m = measure_rank(spec, plan, rank=rank, model_ref=model_ref)
    meas = {"params": m.params, "grads": m.grads, "optimizer": m.optimizer, "activations": m.activations,
            "tensors": m.peak}
    peak_meas = m.peak + pred["reserved"]
    return {"stage": stage, "rank": m.rank, "measured": meas, "predicted": pred,
            "rows": comparable_rows(plan, meas, pred),
            "peak_measured": peak_meas, "peak_predicted": pred["tensors"] + pred["reserved"],
            "peak_error_pct": 100.0 * (pred["tensors"] - m.peak) / m.peak,
            "fits_predicted": pred["tensors"] + pred["reserved"] <= pred["capacity"],
            "fits_measured": peak_meas <= pred["capacity"]}


def print_rows(rows: list[dict], title: str) -> None:
    """One table per compared rank: row, measured GiB, predicted GiB, error (fits 80 columns)."""
    from rich.console import Console
    from rich.table import Table

    c = Console()
    for r in rows:
        c.print(f"{title}: pipeline rank {r['stage']} (rank {r['rank']})")
        t = Table()
        for col in ("tensors at the peak", "measured GiB", "predicted GiB", "error %"):
            t.add_column(col, justify="left" if col.startswith("tensors") else "right")
        for row in r["rows"]:
            a, b = row["measured"], row["predicted"]
            t.add_row(row["row"], f"{a / GiB:.2f}", f"{b / GiB:.2f}", f"{100 * (b - a) / a:+.1f}" if a else "-")
        c.print(t)
        reserve, cap = r["predicted"]["reserved"] / GiB, r["predicted"]["capacity"] / GiB
        c.print(f"peak with the {reserve:.1f} GiB reserve: measured {r['peak_measured'] / GiB:.2f}, predicted "
                f"{r['peak_predicted'] / GiB:.2f} GiB ({r['peak_error_pct']:+.1f} %)")
        verdict = {True: "fits", False: "does not fit"}
        c.print(f"capacity {cap:.1f} GiB: {verdict[r['fits_measured']]} as measured, "
                f"{verdict[r['fits_predicted']]} as predicted")


def parse_stages(text: str, pp: int) -> list[int]:
    """Pipeline ranks of ``--stages``: ``first``, ``last`` or indices, comma-separated, each in 0..pp-1."""
    valid = f"first, last or pipeline ranks 0..{pp - 1} of the plan's pp={pp}, comma-separated"
    out = set()
    for item in (s.strip() for s in text.split(",")):
        if item in ("first", "last"):
            out.add(0 if item == "first" else pp - 1)
        elif item.isdigit() and int(item) < pp:
            out.add(int(item))
        else:
            raise SpecError("--stages", text, valid)
    return sorted(out)


def _flag(key: str, value) -> str:
    """The command-line flag of a layout field as the user gave it."""
    return ("--sp" if value else "--no-sp") if key == "sp" else "--" + key.replace("_", "-")


def plan_of_file(plan_file: str, model: str | None, gpus: str | None, layout: dict) -> tuple:
    """(plan, model reference, cluster reference, the field that named it) of ``--plan``: the file's model and
    GPUs unless ``--model`` or ``--gpus`` is given; a layout flag given with it is refused (the file holds the
    layout)."""
    from meshplan.spec.plan_file import read_plan_file

    key = next((k for k, v in layout.items() if v is not None), None)
    if key:
        raise SpecError(_flag(key, layout[key]), layout[key], f"the layout comes from --plan {plan_file}; edit "
                        "the file, or leave --plan out to build the plan from flags")
    plan, refs = read_plan_file(plan_file)
    plan = plan.with_(framework="meshplan")  # what is measured is this runtime, whatever the plan names
    ref = next((k for k in ("gpus", "cluster") if refs.get(k)), None)
    if gpus is not None or ref is None:
        gpus, where = DEFAULT_GPUS if gpus is None else gpus, "--gpus"
    else:
        gpus, where = refs[ref], f"{plan_file}.{ref}"
    return plan, (refs.get("model") or DEFAULT_MODEL) if model is None else model, gpus, where


def plan_of_flags(n: int, gpus: str, layout: dict):
    """The Plan the layout flags give on ``n`` GPUs (None = the flag's default; dp 0 = what the GPUs leave)."""
    from meshplan.spec.plan import Plan

    lay = {k: v for k, v in layout.items() if v is not None}
    tp, pp, dp, ep = lay.get("tp", 1), lay.get("pp", 1), lay.get("dp", 0), lay.get("ep", 1)
    for flag, value, least in (("--tp", tp, 1), ("--pp", pp, 1), ("--ep", ep, 1), ("--dp", dp, 0)):
        if value < least:
            raise SpecError(flag, value, f"must be >= {least}" + (" (0 = what the GPU count leaves)" if least == 0
                                                                    else ""))
    if dp == 0:
        if n % (tp * pp):
            flag, value = ("--tp", tp) if n % tp else ("--pp", pp) if tp == 1 else ("--tp x --pp", tp * pp)
            raise SpecError(flag, value, f"tp x pp = {tp * pp} does not divide the {n} GPUs of {gpus}, so dp "
                            "cannot be derived; give a degree that divides them, or --dp")
        dp = n // (tp * pp)
    if lay.get("sp") and tp == 1:
        raise SpecError("--sp", True, "splits the sequence over the TP group: give --tp 2 or more with it")
    zero = lay.get("zero")
    if zero and dp == 1:
        raise SpecError("--zero", zero, "shards state over data parallelism, and this layout has dp = 1; give "
                        "--zero 0 or leave it out")
    return Plan(global_batch=lay.get("global_batch", 8), seq_len=lay.get("seq_len", 8192),
                micro_batch=lay.get("micro_batch", 1), tp=tp, sp=lay.get("sp", False), pp=pp, dp=dp, ep=ep,
                zero=(3 if dp > 1 else 0) if zero is None else zero, recompute=lay.get("recompute", "none"),
                schedule=lay.get("schedule", ""), precision="bf16",
                framework="meshplan")  # the runtime's own stack


def register(app: typer.Typer) -> None:
    """Add the ``memcheck`` command."""

    @app.command("memcheck")
    def memcheck_cmd(
        model: Optional[str] = typer.Option(None, "--model", help="Catalog model or model file (default: the "
                                            f"plan file's, else {DEFAULT_MODEL})."),
        gpus: Optional[str] = typer.Option(None, "--gpus", help="Cluster the prediction is for (its GPU count is "
                                           "the world the fake process group simulates; default: the plan "
                                           f"file's, else {DEFAULT_GPUS})."),
        plan_file: Optional[str] = typer.Option(None, "--plan", help="Plan file; the layout flags below otherwise "
                                                "(not both)."),
        tp: Optional[int] = typer.Option(None, "--tp", help="Default 1."),
        pp: Optional[int] = typer.Option(None, "--pp", help="Default 1."),
        dp: Optional[int] = typer.Option(None, "--dp", help="Default 0 = what the GPU count leaves."),
        ep: Optional[int] = typer.Option(None, "--ep", help="Default 1."),
        zero: Optional[int] = typer.Option(None, "--zero", help="Default 3, or 0 where dp = 1."),
        sp: Optional[bool] = typer.Option(None, "--sp/--no-sp", help="Default --no-sp."),
        recompute: Optional[str] = typer.Option(None, "--recompute", help="Default none."),
        global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Default 8."),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Default 8192."),
        micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="Default 1."),
        schedule: Optional[str] = typer.Option(None, "--schedule", help="Default: the plan's own."),
        stages: str = typer.Option("first,last", "--stages", help="Pipeline ranks to measure: first,last or "
                                   "indices."),
        layers: int = typer.Option(0, "--layers", help="Use this many layers (0 = the model's); per-layer "
                                   "physics is the same, tracing is faster."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON rows."),
    ) -> None:
        """Fake-tensor peak memory of the real runtime vs the cost model, per component."""
        from meshplan import catalog
        from meshplan.cli.common import cluster_named

        layout = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "zero": zero, "sp": sp, "recompute": recompute,
                  "global_batch": global_batch, "seq_len": seq_len, "micro_batch": micro_batch, "schedule": schedule}
        if layers < 0:
            raise SpecError("--layers", layers, "must be >= 0 (0 = the model's)")
        gpus_field = "--gpus"
        if plan_file is not None:
            if not plan_file.strip():
                raise SpecError("--plan", plan_file, "must name a plan file (leave --plan out to use the flags)")
            plan, model, gpus, gpus_field = plan_of_file(plan_file, model, gpus, layout)
            cluster = cluster_named(gpus_field, gpus)
        else:
            model, gpus = DEFAULT_MODEL if model is None else model, DEFAULT_GPUS if gpus is None else gpus
            cluster = catalog.cluster(gpus)
            plan = plan_of_flags(cluster.n_gpus, gpus, layout)
        if cluster.n_gpus != plan.n_gpus:
            raise SpecError(gpus_field, gpus, f"has {cluster.n_gpus} GPUs, the plan needs {plan.n_gpus}")
        idx = parse_stages(stages, plan.pp)
        spec = catalog.model(model)
        most = max(b.n_layers for b in spec.blocks)
        if layers > most:
            raise SpecError("--layers", layers, f"exceeds {spec.name}'s {most} layers per block (it measures fewer "
                            "layers than the model has; 0 = all of them)")
        if layers and layers * len(spec.blocks) < plan.n_stages:
            raise SpecError("--layers", layers, f"a {plan.n_stages}-stage pipeline needs at least "
                            f"{-(-plan.n_stages // len(spec.blocks))} layers per block")
        from meshplan.runtime.host import require_torch

        require_torch("meshplan memcheck")
        from meshplan.runtime.config import RunConfig
        from meshplan.runtime.launch import validate
        from meshplan.runtime.memcheck import pipeline_order, with_layers

        validate(RunConfig(plan=plan, model=model), plan.n_gpus)
        if plan.pp > 1:
            try:
                pipeline_order(plan, 0)
            except ValueError as exc:
                raise SpecError("--schedule", plan.schedule_name, str(exc)) from None
        spec = with_layers(spec, layers)
        from meshplan.cli.run import stops_cleanly

        with stops_cleanly():  # Ctrl-C while tracing: one line, exit 130
            rows = [compare(spec, cluster, plan, stage=s, model_ref=model) for s in idx]
        if as_json:
            from meshplan.cli.common import print_json

            print_json({"model": model, "layers": spec.n_layers, "plan": plan.to_dict(), "ranks": rows})
        else:
            print_rows(rows, f"{model} ({spec.n_layers} layers) on {gpus}")

"""``meshplan memcheck``: run one rank of the real runtime for a training step on fake tensors under a fake
process group, record its peak memory with PyTorch's MemTracker, and compare it with the cost model's
prediction component by component. No GPU and no real allocation; torch is imported inside the command.
"""

from __future__ import annotations

from typing import Optional

import typer

from meshplan.errors import SpecError

GiB = 2**30
COMPONENTS = ("params", "grads", "optimizer", "activations", "tensors")


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


def compare(spec, cluster, plan, *, stage: int, model_ref: str) -> dict:
    """Measured vs predicted bytes of one pipeline rank, per component, with the relative error of the peak."""
    from meshplan.runtime.memcheck import measure_rank, rank_of_stage

    pred = predicted(spec, cluster, plan, stage)
    m = measure_rank(spec, plan, rank=rank_of_stage(plan, stage), model_ref=model_ref)
    meas = {"params": m.params, "grads": m.grads, "optimizer": m.optimizer, "activations": m.activations,
            "tensors": m.peak}
    peak_meas = m.peak + pred["reserved"]
    return {"stage": stage, "rank": m.rank, "measured": meas, "predicted": pred,
            "peak_measured": peak_meas, "peak_predicted": pred["tensors"] + pred["reserved"],
            "peak_error_pct": 100.0 * (pred["tensors"] - m.peak) / m.peak,
            "fits_predicted": pred["tensors"] + pred["reserved"] <= pred["capacity"],
            "fits_measured": peak_meas <= pred["capacity"]}


def print_rows(rows: list[dict], title: str) -> None:
    """One table per compared rank: component, measured GiB, predicted GiB, error."""
    from rich.console import Console
    from rich.table import Table

    c = Console()
    for r in rows:
        t = Table(title=f"{title}, pipeline rank {r['stage']} (global rank {r['rank']})")
        for col in ("component", "measured GiB", "predicted GiB", "error %"):
            t.add_column(col, justify="left" if col == "component" else "right")
        for k in COMPONENTS:
            a, b = r["measured"][k], r["predicted"][k]
            t.add_row(k, f"{a / GiB:.2f}", f"{b / GiB:.2f}", f"{100 * (b - a) / a:+.1f}" if a else "-")
        c.print(t)
        c.print(f"peak per GPU (reserved {r['predicted']['reserved'] / GiB:.1f} GiB added to both): measured "
                f"{r['peak_measured'] / GiB:.2f}, predicted {r['peak_predicted'] / GiB:.2f} GiB of "
                f"{r['predicted']['capacity'] / GiB:.1f}; fits predicted={r['fits_predicted']} "
                f"measured={r['fits_measured']}")


def register(app: typer.Typer) -> None:
    """Add the ``memcheck`` command."""

    @app.command("memcheck")
    def memcheck_cmd(
        model: str = typer.Option("llama3.1-8b", "--model", help="Catalog model or model file."),
        gpus: str = typer.Option("8xh100-sxm", "--gpus", help="Cluster the prediction is for (its GPU count is "
                                 "the world the fake process group simulates)."),
        plan_file: Optional[str] = typer.Option(None, "--plan", help="Plan file; flags below otherwise."),
        tp: int = typer.Option(1, "--tp"), pp: int = typer.Option(1, "--pp"),
        dp: int = typer.Option(0, "--dp", help="0 = what the GPU count leaves."),
        ep: int = typer.Option(1, "--ep"), zero: int = typer.Option(3, "--zero"),
        sp: bool = typer.Option(False, "--sp/--no-sp"),
        recompute: str = typer.Option("none", "--recompute"),
        global_batch: int = typer.Option(8, "--global-batch"), seq_len: int = typer.Option(8192, "--seq-len"),
        micro_batch: int = typer.Option(1, "--micro-batch"),
        schedule: str = typer.Option("", "--schedule"),
        stages: str = typer.Option("first,last", "--stages", help="Pipeline ranks to measure: first,last or "
                                   "indices."),
        layers: int = typer.Option(0, "--layers", help="Use this many layers (0 = the model's); per-layer "
                                   "physics is the same, tracing is faster."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON rows."),
    ) -> None:
        """Fake-tensor peak memory of the real runtime vs the cost model, per component."""
        from meshplan import catalog
        from meshplan.spec.plan import Plan

        if plan_file:
            from meshplan.spec.io import read_plan_file

            plan, _ = read_plan_file(plan_file)
            plan = plan.with_(framework="meshplan")  # what is measured is this runtime, whatever the plan names
        else:
            if dp == 0:
                n = catalog.cluster(gpus).n_gpus
                if n % (tp * pp):
                    raise SpecError("--dp", dp, f"cannot be derived: tp*pp={tp * pp} does not divide {n} GPUs")
                dp = n // (tp * pp)
            plan = Plan(global_batch=global_batch, seq_len=seq_len, micro_batch=micro_batch, tp=tp, sp=sp, pp=pp,
                        dp=dp, ep=ep, zero=zero if dp > 1 else 0, recompute=recompute, schedule=schedule,
                        precision="bf16", framework="meshplan")  # the runtime's own stack
        cluster = catalog.cluster(gpus)
        if cluster.n_gpus != plan.n_gpus:
            raise SpecError("--gpus", gpus, f"has {cluster.n_gpus} GPUs, the plan needs {plan.n_gpus}")
        from meshplan.runtime.config import RunConfig
        from meshplan.runtime.launch import validate
        from meshplan.runtime.memcheck import with_layers

        validate(RunConfig(plan=plan, model=model), plan.n_gpus)
        spec = with_layers(catalog.model(model), layers)
        idx = sorted({0 if s == "first" else plan.pp - 1 if s == "last" else int(s) for s in stages.split(",")})
        rows = [compare(spec, cluster, plan, stage=s, model_ref=model) for s in idx if s < plan.pp]
        if as_json:
            from meshplan.cli.common import print_json

            print_json({"model": model, "layers": spec.n_layers, "plan": plan.to_dict(), "ranks": rows})
        else:
            print_rows(rows, f"{model} ({spec.n_layers} layers) on {gpus}")

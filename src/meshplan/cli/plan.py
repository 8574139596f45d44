"""``meshplan plan``: search the parallel layouts of a model on a cluster and print the best ones.

Exit status: 0 when a plan fits, 4 when nothing fits (the leanest plan's breakdown and the GPUs needed are
printed), 2 for user errors.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

NOTHING_FITS_EXIT = 4


def _check_objective(objective: str, prices: dict) -> None:
    from meshplan.errors import SpecError

    if objective and objective not in ("time", "cost", "robust"):
        raise SpecError("--objective", objective, "must be time, cost or robust")
    if objective == "cost" and not prices:
        raise SpecError("--objective", objective, "cost needs --price (dollars per GPU-hour)")
    if objective in ("time", "robust") and prices:
        raise SpecError("--objective", objective, "--price ranks by cost; drop one of them")


def _prices(text: str) -> dict:
    """``a100-80gb=1.5,h100-sxm=2.9`` or a single number for every GPU type."""
    from meshplan.errors import SpecError

    if not text:
        return {}
    out = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        key = name.strip() if sep else "*"
        if key in out:
            raise SpecError("--price", text, f"prices {key} twice: give each GPU type one price")
        try:
            if sep:
                out[name.strip()] = float(value)
            else:
                out["*"] = float(name)
        except ValueError:
            raise SpecError("--price", text, "expected NUMBER or GPU=NUMBER[,GPU=NUMBER]") from None
    return out


PS_STACK = "byteps"
"""The stack a parameter-server comparison plans under (the catalog's one with ``dp_syncs = ["ps"]``)."""


def ps_alternative(model, cluster, request, result) -> dict | None:
    """When the cluster declares CPU servers and the request's stack cannot push to them: the best layout of the
    parameter-server stack on the same GPUs, and whether it beats the winner (the model saying when a parameter
    server would win); None otherwise, or when that stack runs nothing the request allows."""
    from dataclasses import replace

    from meshplan import catalog
    from meshplan.errors import MeshplanError
    from meshplan.search import search

    if not cluster.servers or "ps" in request.framework.dp_syncs or result.best is None:
        return None
    # A pinned memory limit holds for the comparison too; the stack's own limit is re-derived for its stack.
    pinned = request.memory_limit_why == "pinned"
    limit = {} if pinned else {"max_memory_fraction": None, "memory_limit_why": ""}
    try:
        alt = search(model, cluster, replace(request, framework=catalog.framework(PS_STACK), **limit))
    except MeshplanError:
        return None
    if alt.best is None:
        return {"framework": PS_STACK, "plan": None, "step_time_s": None, "winner_step_time_s": result.best.step_time,
                "text": f"parameter server ({cluster.servers} CPU servers, {PS_STACK}): no layout fits "
                        f"({PS_STACK} runs data parallelism only, without ZeRO)"}
    from meshplan.report.layout import layout_short

    ps, win = alt.best.step_time, result.best.step_time
    verdict = (f"{win / ps:.2f}x faster than the winner: the servers pay on this network" if ps < win else
               f"no faster than the winner's {win:.3f} s")
    return {"framework": PS_STACK, "plan": alt.best.plan.to_dict(), "step_time_s": ps, "winner_step_time_s": win,
            "text": f"parameter server ({cluster.servers} CPU servers, {PS_STACK}): {layout_short(alt.best.plan)} "
                    f"steps {ps:.3f} s, {verdict}"}


def separation_alternative(model, cluster, request, result) -> dict | None:
    """Layer separation (Stanza, ``cost.layer_separation``: a few GPUs hold the vocabulary layers, the rest the
    blocks) of a data-parallel layout, the search's fastest fitting one or else the winner's settings with every
    GPU a data-parallel rank, under the request's memory limit; None when no separation fits, nothing fits at all,
    or the cluster mixes GPU types."""
    from meshplan.cost.estimate import estimate
    from meshplan.cost.layer_separation import best_separation, compare
    from meshplan.errors import MeshplanError

    if result.best is None or len(cluster.pools) != 1:
        return None
    data_parallel = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero": 0, "dp": cluster.n_gpus}
    if any(request.pinned(k, v) != v for k, v in data_parallel.items()):
        return None  # the user pinned a layout that is not a plain data-parallel job
    pure = [r for r in result.fitting if (r.plan.tp, r.plan.pp, r.plan.cp, r.plan.ep, r.plan.zero) == (1, 1, 1, 1, 0)]
    try:
        if pure:  # the search's own fastest data-parallel layout
            base_plan = min(pure, key=lambda r: r.step_time).plan
        else:  # pruned by its bound: the winner's settings with every GPU a data-parallel rank
            base_plan = result.best.plan.with_(tp=1, sp=False, pp=1, vpp=1, schedule="", layer_split=(), cp=1, ep=1,
                                               etp=1, zero=0, dp_shard=0, dp=cluster.n_gpus,
                                               micro_batch=request.pinned("micro_batch", 1),
                                               dp_sync="")
        sep = best_separation(model, cluster, base_plan, stack=request.framework,
                              limit=request.max_memory_fraction)
        whole = estimate(model, cluster, base_plan, stack=request.framework)
    except MeshplanError:
        return None
    if sep is None:
        return None
    win = result.best.step_time
    verdict = (f"{win / sep.step_time:.2f}x faster than the winner" if sep.step_time < win else
               f"no faster than the winner's {win:.3f} s")
    return {**sep.as_dict(), "winner_step_time_s": win, "base_step_time_s": whole.step_time,
            "text": compare(sep, whole) + f"; {verdict}"}


def run_plan(*, model_ref: str, gpus: str, cluster_file: str, request, as_json: bool, out: str) -> int:
    """Search, print, optionally write the winner; returns the exit status."""
    from rich.progress import Progress

    from meshplan.cli.common import (
        output_path,
        print_json,
        resolve_cluster,
        resolve_model,
        stack_changes,
        term_width,
        wrote,
    )
    from meshplan.report.search import render_text, result_json
    from meshplan.search import search
    from meshplan.spec.plan_file import plan_file_text

    model = resolve_model(model_ref)
    cluster = resolve_cluster(gpus or None, cluster_file or None)
    domains = max(cluster.n_gpus // cluster.pools[0].network()[0].span, 1)
    if request.state_copies >= domains:
        from meshplan.errors import SpecError

        raise SpecError("--state-copies", request.state_copies, f"needs {request.state_copies + 1} scale-up domains "
                        f"(nodes) so that each copy lives off its shard's node; {cluster.describe()} has {domains}")
    if out is not None:
        output_path("--out", out)
    if "*" in request.prices:
        from dataclasses import replace

        flat = request.prices["*"]
        request = replace(request, prices={p.gpu.name: flat for p in cluster.pools})
    show = not as_json and sys.stderr.isatty()
    with Progress(transient=True, disable=not show) as bar:
        task = bar.add_task("searching", total=None)
        result = search(model, cluster, request,
                        progress=lambda done, total: bar.update(task, completed=done, total=total))
    ps = ps_alternative(model, cluster, request, result)
    sep = separation_alternative(model, cluster, request, result)
    if as_json:
        print_json({**result_json(result), **({"parameter_server": ps} if ps else {}),
                    **({"layer_separation": sep} if sep else {})})
    else:
        sys.stdout.write(render_text(result, width=term_width()))
        if ps:
            sys.stdout.write(ps["text"] + "\n")
        if sep and sep["step_time"] < result.best.step_time:  # said only where it would win; --json always
            sys.stdout.write(sep["text"] + "\n")
    if result.best is None:
        return NOTHING_FITS_EXIT
    if out is not None:
        win = result.best
        source = cluster_file or (gpus if gpus and Path(gpus).is_file() else "")
        whole = source and win.cluster.n_gpus == cluster.n_gpus and len(win.cluster.pools) == len(cluster.pools)
        Path(out).write_text(plan_file_text(win.plan, model=model_ref, gpus=win.cluster.describe(),
                                            cluster=str(Path(source).resolve()) if whole else "",
                                            framework=stack_changes(request.framework),
                                            predicted={"step_time_s": win.step_time,
                                                       "peak_memory_gib": win.best.peak_memory / 2**30,
                                                       "max_memory_fraction": request.max_memory_fraction}))
        wrote(out, f"the winner, {win.step_time:.3f} s per step")
    return 0


@dataclass(frozen=True, kw_only=True)
class PlanArgs:
    """The options of ``meshplan plan`` as given (``plan``'s parameters, which document each)."""

    model: str
    gpus: str
    cluster: str
    global_batch: int
    seq_len: int
    precision: str
    max_memory_fraction: Optional[float]
    price: str
    top: int
    no_sim: bool
    tp: int
    sp: Optional[bool]
    cp: int
    cp_kind: str
    pp: int
    vpp: int
    schedule: str
    dp: int
    zero: Optional[int]
    dp_shard: Optional[int]
    ep: int
    etp: int
    micro_batch: int
    recompute: str
    recompute_layers: Optional[int]
    framework: str
    grad_dtype: Optional[str]
    optimizer_dtype: Optional[str]
    tp_comm_overlap: Optional[bool]
    objective: str
    state_copies: int
    as_json: bool
    out: str | None

    def pins(self) -> dict:
        """The layout knobs the user pinned (a degree of 0, an empty name or an unset switch leaves it free)."""
        pins = {k: v for k, v in dict(tp=self.tp, cp=self.cp, pp=self.pp, vpp=self.vpp, dp=self.dp, ep=self.ep,
                                      etp=self.etp, micro_batch=self.micro_batch).items() if v}
        pins.update({k: v for k, v in dict(cp_kind=self.cp_kind, schedule=self.schedule,
                                           recompute=self.recompute).items() if v})
        pins.update({k: v for k, v in dict(sp=self.sp, zero=self.zero, dp_shard=self.dp_shard,
                                           recompute_layers=self.recompute_layers).items() if v is not None})
        return pins

    def request(self):
        """The search request these options describe."""
        from meshplan.cli.common import resolve_framework
        from meshplan.search import SearchRequest

        prices = _prices(self.price)
        stack = resolve_framework(self.framework, flags=dict(grad_dtype=self.grad_dtype,
                                                             optimizer_dtype=self.optimizer_dtype,
                                                             tp_comm_overlap=self.tp_comm_overlap))
        _check_objective(self.objective, prices)
        return SearchRequest(global_batch=self.global_batch, seq_len=self.seq_len, precision=self.precision,
                             framework=stack, max_memory_fraction=self.max_memory_fraction,
                             objective=self.objective or ("cost" if prices else "time"), prices=prices,
                             pins=self.pins(), top=self.top, simulate=not self.no_sim,
                             state_copies=self.state_copies)


def register(app: typer.Typer) -> None:
    """Add the ``plan`` command."""
    app.command("plan")(plan)


def plan(
    model: str = typer.Option(..., "--model", help="Model: catalog name, model file or HF config.json."),
    gpus: str = typer.Option("", "--gpus", help="GPUs, e.g. 1024xa100-80gb or 32xa100-80gb+32xh100-sxm"
                             "; +8xserver[@GB/s] adds CPU parameter servers."),
    cluster: str = typer.Option("", "--cluster", help="Cluster file (pools of GPUs and their network)."),
    global_batch: int = typer.Option(..., "--global-batch", help="Sequences per optimizer step."),
    seq_len: int = typer.Option(..., "--seq-len", help="Tokens per sequence."),
    precision: str = typer.Option("bf16", "--precision", help="bf16, fp16, fp32 or fp8."),
    max_memory_fraction: Optional[float] = typer.Option(
        None, "--max-memory-fraction",
        help="Largest predicted peak as a share of device memory (default: the stack's limit, the largest "
             "predicted peak of its published runs, at least 80 %)."),
    price: str = typer.Option("", "--price", help="Price per GPU-hour: NUMBER or GPU=NUMBER,...; "
                                                  "switches the objective to tokens per dollar."),
    top: int = typer.Option(5, "--top", help="Plans in the table."),
    no_sim: bool = typer.Option(False, "--no-sim", help="Rank with the closed-form pipeline only."),
    tp: int = typer.Option(0, "--tp", min=0, help="Pin the tensor-parallel degree (0 = the search chooses)."),
    sp: Optional[bool] = typer.Option(None, "--sp/--no-sp", help="Pin sequence parallelism (default: on "
                                      "wherever tp > 1 divides the tokens)."),
    cp: int = typer.Option(0, "--cp", min=0, help="Pin the context-parallel degree (0 = the search chooses)."),
    cp_kind: str = typer.Option("", "--cp-kind", help="Pin ring or a2a."),
    pp: int = typer.Option(0, "--pp", min=0, help="Pin the pipeline degree (0 = the search chooses)."),
    vpp: int = typer.Option(0, "--vpp", min=0,
                            help="Pin the virtual stages per rank (0 = the search chooses)."),
    schedule: str = typer.Option("", "--schedule", help="Pin the pipeline schedule (implies pp > 1): 1f1b, "
                                 "interleaved_1f1b, gpipe, looped_bfs, zb_h1, zbv, dualpipev (those the "
                                 "--framework runs)."),
    dp: int = typer.Option(0, "--dp", min=0, help="Pin the data-parallel degree (0 = the search chooses)."),
    zero: Optional[int] = typer.Option(None, "--zero", help="Pin the ZeRO stage: 0, 1, 2 or 3 (3 = FSDP)."),
    dp_shard: Optional[int] = typer.Option(None, "--dp-shard", help="Pin the HSDP shard group (with zero 3; "
                                           "0 = all of dp)."),
    ep: int = typer.Option(0, "--ep", min=0, help="Pin the expert-parallel degree (0 = the search chooses)."),
    etp: int = typer.Option(0, "--etp", min=0, help="Pin the experts' tensor-parallel degree (1 or tp; "
                            "0 = the search chooses)."),
    micro_batch: int = typer.Option(0, "--micro-batch", min=0, help="Pin the micro-batch size (0 = the search "
                                    "chooses)."),
    recompute: str = typer.Option("", "--recompute", help="Pin none, selective or full (default: the least "
                                  "that fits)."),
    recompute_layers: Optional[int] = typer.Option(None, "--recompute-layers", help="Pin the fully recomputed "
                                                   "layers per pipeline rank (0 = all of them)."),
    framework: str = typer.Option("megatron-core", "--framework",
                                  help="Software stack the plans run under (catalog/frameworks): its kernels, "
                                       "FSDP flavour, overlap, and the layouts it can run."),
    grad_dtype: Optional[str] = typer.Option(None, "--grad-dtype",
                                             help="Gradient buffers: fp32, or bf16 (Megatron's precision-aware "
                                                  "optimizer); default: the framework's."),
    optimizer_dtype: Optional[str] = typer.Option(None, "--optimizer-dtype",
                                                  help="Adam moments: fp32 or bf16; default: the framework's."),
    tp_comm_overlap: Optional[bool] = typer.Option(None, "--tp-comm-overlap/--no-tp-comm-overlap",
                                                   help="Overlap TP communication with GEMMs (Megatron/TE "
                                                        "userbuffers); default: the framework's."),
    objective: str = typer.Option("", "--objective", help="time (default), cost (with --price) or robust: rank "
                                  "by the slow end of each plan's 80 % error band."),
    state_copies: int = typer.Option(0, "--state-copies", min=0, help="Keep this many copies of every "
                                     "optimizer-state shard off its node, so losing that many nodes needs no "
                                     "checkpoint (priced in memory and per-step traffic)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    out: Optional[str] = typer.Option(None, "--out", help="Write the winner as a plan file (TOML)."),
) -> None:
    """Find the fastest (or cheapest) parallel layout that fits."""
    a = PlanArgs(**locals())  # exactly the parameters above
    code = run_plan(model_ref=a.model, gpus=a.gpus, cluster_file=a.cluster, request=a.request(),
                    as_json=a.as_json, out=a.out)
    if code:
        raise typer.Exit(code)

"""``meshplan replan``: the cluster or the job changed; search the new best layouts, price the switch to each
(bytes per rank by link class, peak memory, seconds live and through a checkpoint, under the rank map that keeps
the most state in place) and say whether to switch.

Exit status: 0 with a decision (switch or stay), 4 when no layout fits the new conditions, 2 for user errors.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

NOTHING_FITS_EXIT = 4


def parse_ranks(text: str, *, flag: str, world: int) -> tuple[int, ...]:
    """``8-15,40`` -> (8, ..., 15, 40), each a rank of the old ``world``; a rank named twice is refused."""
    from meshplan.errors import SpecError

    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise SpecError(flag, text, "expected ranks such as 8-15,40 (ascending ranges of integers >= 0)")
        if int(m.group(2) or m.group(1)) >= world:
            raise SpecError(flag, text, f"rank {max(int(m.group(1)), world)} is not in the old world, "
                            f"0..{world - 1}")
        out += range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1)
    if not out:
        raise SpecError(flag, text, "names no rank: give ranks such as 8-15,40")
    ranks = sorted(out)
    twice = next((r for r, nxt in zip(ranks, ranks[1:]) if r == nxt), None)
    if twice is not None:
        raise SpecError(flag, text, f"names rank {twice} more than once; name each lost rank once")
    return tuple(ranks)


def parse_derating(slow_gpu: list[str], slow_link: list[str]):
    """``--slow-gpu ID:FRACTION`` and ``--slow-link NODE:FRACTION`` (repeatable) as a Derating."""
    from meshplan.errors import SpecError
    from meshplan.spec.cluster import Derating

    parts = {"--slow-gpu": [], "--slow-link": []}
    for flag, texts in (("--slow-gpu", slow_gpu), ("--slow-link", slow_link)):
        for text in texts:
            m = re.fullmatch(r"(\d+):([0-9.]+)", text.strip())
            what = "GPU id" if flag == "--slow-gpu" else "scale-up domain (node) index"
            if not m or not 0 < float(m.group(2)) <= 1:
                raise SpecError(flag, text, f"expected {what}:FRACTION of its rating in (0, 1], e.g. 17:0.6")
            if int(m.group(1)) in {i for i, _ in parts[flag]}:
                raise SpecError(flag, text, f"{what} {int(m.group(1))} is given more than once; give each one "
                                "fraction")
            parts[flag].append((int(m.group(1)), float(m.group(2))))
    return Derating(gpus=tuple(parts["--slow-gpu"]), links=tuple(parts["--slow-link"]))


def change_of(cluster, *, lose: int, lose_ranks: str, add: str, gpus: str, slow=None):
    """The ClusterChange the flags describe: ``--gpus`` the new cluster as a whole (GPUs come and go at the end),
    or ``--lose``, ``--lose-ranks`` and ``--add`` (not both ways at once)."""
    from meshplan.errors import SpecError
    from meshplan.search.replan import ClusterChange

    n = cluster.n_gpus
    if gpus:
        other = next((f for f, v in (("--lose", lose), ("--lose-ranks", lose_ranks), ("--add", add)) if v), None)
        if other:
            raise SpecError("--gpus", gpus, f"gives the new cluster as a whole and cannot be combined with {other}; "
                            "give either --gpus or --lose/--lose-ranks/--add")
        new = _same_gpus(cluster, "--gpus", gpus)
        lost, added = tuple(range(min(new.n_gpus, n), n)), max(new.n_gpus - n, 0)
    else:
        lost, added = _lost(n, lose, lose_ranks), _same_gpus(cluster, "--add", add).n_gpus if add else 0
    if slow is not None:
        domains = -(-n // cluster.pools[0].network()[0].span)
        bad = [d for d, _ in slow.links if d >= domains]
        if bad:
            raise SpecError("--slow-link", bad[0], f"must name a scale-up domain (node) of the old world, "
                            f"0..{domains - 1}")
    return ClusterChange(lost=lost, added=added, **({"slow": slow} if slow is not None else {}))


def _lost(n: int, lose: int, lose_ranks: str) -> tuple[int, ...]:
    """Old ranks ``--lose`` (the last N) and ``--lose-ranks`` take away; each rank once, some GPU left."""
    from meshplan.errors import SpecError

    if lose >= n:
        raise SpecError("--lose", lose, f"must leave some of the {n} GPUs")
    ranks = parse_ranks(lose_ranks, flag="--lose-ranks", world=n) if lose_ranks else ()
    twice = [r for r in ranks if r >= n - lose]
    if twice:
        raise SpecError("--lose-ranks", lose_ranks, f"rank {twice[0]} is also one of the last {lose} that --lose "
                        f"{lose} takes; name each lost rank once")
    lost = tuple(sorted(set(ranks) | set(range(n - lose, n))))
    if len(lost) >= n:
        raise SpecError("--lose-ranks" if ranks else "--lose", lose_ranks or lose, f"leaves none of the {n} GPUs")
    return lost


def _same_gpus(cluster, flag: str, text: str):
    """The cluster ``text`` names (``--gpus``, ``--add``): GPUs of the running cluster's type."""
    from meshplan.cli.common import cluster_named
    from meshplan.errors import SpecError

    new = cluster_named(flag, text)
    if not new.homogeneous or new.gpu.name != cluster.gpu.name:
        raise SpecError(flag, text, f"must be {cluster.gpu.name} GPUs like the running cluster (mixed replanning "
                        "is not supported yet)")
    return new


@dataclass(frozen=True, kw_only=True)
class ReplanArgs:
    """The options of ``meshplan replan`` as given (``replan_cmd``'s parameters, which document each)."""

    from_plan: str
    model: str
    old_gpus: str
    gpus: str
    lose: int
    lose_ranks: str
    add: str
    slow_gpu: list[str]
    slow_link: list[str]
    seq_len: int
    global_batch: int
    remaining_steps: int
    min_gain: float
    options: int
    storage_gbs: float
    prebuilt_groups: bool
    max_memory_fraction: Optional[float]
    phase: str
    engine: str
    input_len: int
    output_len: int
    rollouts: int
    as_json: bool
    out: str

    def switch_only(self) -> dict[str, object]:
        """The switch-pricing flags and the value of each given (off its default; None = not given)."""
        return _given({"--remaining-steps": (self.remaining_steps, 1000), "--min-gain": (self.min_gain, 0.03),
                       "--storage-gbs": (self.storage_gbs, 0.0), "--prebuilt-groups": (self.prebuilt_groups, False),
                       "--max-memory-fraction": (self.max_memory_fraction, None)})

    def phase_only(self) -> dict[str, object]:
        """The ``--phase generate`` flags and the value of each given (off its default; None = not given)."""
        return _given({"--engine": (self.engine, "vllm"), "--input-len": (self.input_len, 1024),
                       "--output-len": (self.output_len, 1024), "--rollouts": (self.rollouts, 0)})

    def changes_job(self) -> bool:
        """Whether any cluster or workload change was given."""
        return bool(self.lose or self.lose_ranks or self.add or self.gpus or self.seq_len or self.global_batch
                    or self.slow_gpu or self.slow_link)


def _given(flags: dict[str, tuple]) -> dict[str, object]:
    """flag -> its value where it is off its default (a NaN is off every default), else None."""
    return {f: (None if v == d else v) for f, (v, d) in flags.items()}


def register(app: typer.Typer) -> None:
    """Add the ``replan`` command."""
    app.command("replan")(replan_cmd)


def replan_cmd(
    from_plan: str = typer.Option(..., "--from", help="The running plan (a plan file from meshplan plan --out)."),
    model: str = typer.Option("", "--model", help="Model, when the plan file names none."),
    old_gpus: str = typer.Option("", "--old-gpus", help="The cluster the plan runs on, when the file names none."),
    gpus: str = typer.Option("", "--gpus", help="The new cluster, e.g. 16376xh100-sxm (GPUs leave or join at "
                                                "the end of the rank order; not with --lose, --lose-ranks or "
                                                "--add)."),
    lose: int = typer.Option(0, "--lose", min=0, help="GPUs lost: the last N ranks of the old world."),
    lose_ranks: str = typer.Option("", "--lose-ranks", help="Ranks lost, e.g. 8-15,40."),
    add: str = typer.Option("", "--add", help="GPUs added, e.g. 16xh100-sxm."),
    slow_gpu: list[str] = typer.Option([], "--slow-gpu", help="A straggler: GPU id of the old world and the "
                                       "fraction of its rated compute it delivers, e.g. 17:0.6 (repeatable)."),
    slow_link: list[str] = typer.Option([], "--slow-link", help="A degraded link: scale-up domain (node) index "
                                        "and the fraction of its rated scale-out bandwidth, e.g. 3:0.25 "
                                        "(repeatable)."),
    seq_len: int = typer.Option(0, "--seq-len", min=0, help="New tokens per sequence (0 = unchanged)."),
    global_batch: int = typer.Option(0, "--global-batch", min=0, help="New sequences per step (0 = unchanged)."),
    remaining_steps: int = typer.Option(1000, "--remaining-steps", min=0, help="Optimizer steps left."),
    min_gain: float = typer.Option(0.03, "--min-gain", help="Smallest step-time gain worth a switch when the "
                                                            "current layout can still run (0.03 = 3 %)."),
    options: int = typer.Option(3, "--options", min=1, help="Candidate layouts whose switch is priced."),
    storage_gbs: float = typer.Option(0.0, "--storage-gbs", help="Checkpoint storage bandwidth of the whole "
                                      "cluster in GB/s (default: Llama 3's 0.122 GB/s per GPU)."),
    prebuilt_groups: bool = typer.Option(False, "--prebuilt-groups", help="The new layout's communicators "
                                         "exist already (no set-up on the switch's path)."),
    max_memory_fraction: Optional[float] = typer.Option(None, "--max-memory-fraction", help="Largest predicted "
                                                        "peak as a share of device memory (default: the "
                                                        "stack's limit from its published runs)."),
    phase: str = typer.Option("", "--phase", help="generate: the RL generation layout for these GPUs (serving "
                              "planner) and the weights-only refit into it, instead of a cluster change."),
    engine: str = typer.Option("vllm", "--engine", help="--phase generate: the serving engine profile."),
    input_len: int = typer.Option(1024, "--input-len", min=1, help="--phase generate: prompt tokens."),
    output_len: int = typer.Option(1024, "--output-len", min=1, help="--phase generate: generated tokens."),
    rollouts: int = typer.Option(0, "--rollouts", min=0, help="--phase generate: prompts per phase (0 = the "
                                 "plan's global batch)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    out: str = typer.Option("", "--out", help="Write the chosen layout as a plan file (TOML)."),
) -> None:
    """Re-plan after the cluster or the job changed, weighing the switch against the gain."""
    _replan(ReplanArgs(**locals()))  # exactly the parameters above


def _replan(a: ReplanArgs) -> None:
    """``meshplan replan``: the running plan's job, then either the generation phase or the cluster change."""
    from meshplan.cli.common import output_path, resolve_framework, resolve_model
    from meshplan.errors import SpecError
    from meshplan.spec.plan_file import read_plan_file

    plan, refs = read_plan_file(a.from_plan)
    from meshplan import catalog

    same = a.model == refs.get("model") or catalog.resolve("models", a.model) == refs.get("model")
    if a.model and refs.get("model") and not same:  # a name the plan's catalog model answers to is the same
        raise SpecError("--model", a.model, f"differs from the model the plan in {a.from_plan} was made for "
                        f"({refs['model']}): replan re-plans the job that runs, give its plan file")
    spec = resolve_model(a.model or None, refs.get("model"))
    cluster = _old_cluster(a, refs)
    stack = resolve_framework(plan.framework, file_settings=refs.get("framework"))
    _pinned_elsewhere(a.phase, a.switch_only() if a.phase else a.phase_only())
    if a.phase:
        _check_phase(a.phase, out=a.out, changed=a.changes_job())
        _generate(spec, cluster, plan, stack=stack, engine=a.engine, work=(a.input_len, a.output_len,
                  a.rollouts or plan.global_batch), options=a.options, as_json=a.as_json)
        return
    if a.out:
        output_path("--out", a.out)
    result = _after_change(a, spec, cluster, plan, stack)
    _emit(result, spec, cluster, as_json=a.as_json, out=a.out, refs=refs, stack=stack)
    if not result.options:
        raise typer.Exit(NOTHING_FITS_EXIT)


def _old_cluster(a: ReplanArgs, refs: dict):
    """The cluster the plan runs on: ``--old-gpus``, else the plan file's; one GPU type."""
    from meshplan.cli.common import cluster_named
    from meshplan.errors import SpecError

    key = next((k for k in ("gpus", "cluster") if refs.get(k)), None)
    if not a.old_gpus and key is None:
        raise SpecError("--old-gpus", None, f"is required: {a.from_plan} names no gpus or cluster; give the "
                        "cluster the plan runs on, e.g. --old-gpus 8xh100-sxm")
    field = "--old-gpus" if a.old_gpus else f"{a.from_plan}.{key}"
    cluster = cluster_named(field, a.old_gpus or refs[key])
    if not cluster.homogeneous:
        raise SpecError(field, a.old_gpus or refs[key], "replan supports a cluster of one GPU type so far")
    return cluster


def _after_change(a: ReplanArgs, spec, cluster, plan, stack):
    """The re-plan of the cluster or job change ``a`` gives, each option's switch priced."""
    from meshplan.cost.transition_time import SwitchCosts
    from meshplan.errors import SpecError
    from meshplan.search import SearchRequest
    from meshplan.search.replan import ReplanRequest, replan

    change = change_of(cluster, lose=a.lose, lose_ranks=a.lose_ranks, add=a.add, gpus=a.gpus,
                       slow=parse_derating(a.slow_gpu, a.slow_link))
    costs = SwitchCosts(groups_prebuilt=a.prebuilt_groups)
    if a.storage_gbs:
        if not 0 < a.storage_gbs < math.inf:
            raise SpecError("--storage-gbs", a.storage_gbs, "must be a finite bandwidth in GB/s > 0 (0 = the "
                            "default, Llama 3's 0.122 GB/s per GPU)")
        n_new = cluster.n_gpus - len(change.lost) + change.added
        costs = SwitchCosts(groups_prebuilt=a.prebuilt_groups, storage_gbs_per_gpu=a.storage_gbs / n_new)
    request = SearchRequest(global_batch=a.global_batch or plan.global_batch, seq_len=a.seq_len or plan.seq_len,
                            precision=plan.precision, framework=stack, max_memory_fraction=a.max_memory_fraction,
                            state_copies=plan.state_copies)  # the job keeps its redundancy policy
    rq = ReplanRequest(remaining_steps=a.remaining_steps, min_gain=a.min_gain, options=a.options, costs=costs)
    return replan(spec, cluster, plan, change=change, request=request, rq=rq)


def _pinned_elsewhere(phase: str, given: dict[str, object]) -> None:
    """Refuse a flag the chosen mode does not read, so nothing the user gave is silently ignored."""
    from meshplan.errors import SpecError

    flag = next((f for f, v in given.items() if v is not None), None)
    if flag:
        raise SpecError(flag, given[flag], "applies only with --phase generate" if not phase else
                        "prices a cluster change's switch; --phase generate does not read it (the refit's "
                        "communicators persist)")


def _check_phase(phase: str, *, out: str, changed: bool) -> None:
    from meshplan.errors import SpecError

    if phase != "generate":
        raise SpecError("--phase", phase, "must be 'generate' (the way back to training moves nothing)")
    if changed:
        raise SpecError("--phase", phase, "plans the generation layout of the same GPUs and job; give cluster or "
                        "workload changes in a separate replan")
    if out:
        raise SpecError("--out", out, "is not written for --phase generate (the engine's launch comes from meshplan "
                        "serve --export with the chosen layout pinned)")


def _generate(spec, cluster, plan, *, stack, engine: str, work: tuple, options: int, as_json: bool) -> None:
    from meshplan import catalog
    from meshplan.calibrate.serve_constants import load_constants
    from meshplan.cli.common import print_json, term_width
    from meshplan.cost.transition_time import SwitchCosts
    from meshplan.report.phase import phase_json, render_phase
    from meshplan.search.phase import plan_generation
    from meshplan.search.serve_request import ServeRequest
    from meshplan.spec.serving import Workload

    inp, outp, n = work
    w = Workload(input_len=inp, output_len=outp, concurrency=n)
    req = ServeRequest(model=spec, cluster=cluster, engine=catalog.engine(engine), disagg="off", work=w,
                       constants=load_constants())
    # The engine and its communicators persist across RL iterations (built once), so a refit pays none.
    result = plan_generation(spec, cluster, plan, serve=req, stack=stack, options=options,
                             costs=SwitchCosts(groups_prebuilt=True))
    if as_json:
        print_json(phase_json(result, spec, cluster))
    else:
        sys.stdout.write(render_phase(result, spec, cluster, width=term_width()))
    if result.choice is None:
        raise typer.Exit(NOTHING_FITS_EXIT)


def _emit(result, spec, cluster, *, as_json: bool, out: str, refs: dict, stack) -> None:
    from meshplan.cli.common import print_json, stack_changes, term_width, wrote
    from meshplan.report.replan import render_replan, replan_json
    from meshplan.spec.plan_file import plan_file_text

    if as_json:
        print_json(replan_json(result, spec, cluster))
    else:
        sys.stdout.write(render_replan(result, spec, cluster, width=term_width()))
    if out and result.choice is not None:
        opt = result.options[result.choice]
        Path(out).write_text(plan_file_text(opt.ranked.plan, model=refs.get("model", spec.name),
                                            gpus=opt.ranked.cluster.describe(), framework=stack_changes(stack),
                                            predicted={"step_time_s": opt.ranked.step_time,
                                                       "switch_s": opt.time.total_s}))
        wrote(out, f"the chosen layout, {opt.ranked.step_time:.3f} s per step")
    elif out:
        print(f"{out} not written: the decision is to keep the current layout", file=sys.stderr)

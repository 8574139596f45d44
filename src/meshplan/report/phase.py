"""The RL phase preview: the training layout, each engine layout with its refit and generation time, the choice."""

from __future__ import annotations

from io import StringIO

from meshplan.report.layout import layout_short
from meshplan.search.phase import GenerationOption, PhaseResult

GiB = 2**30


def option_json(i: int, o: GenerationOption) -> dict:
    """JSON view of one engine layout and its refit."""
    c, x, t = o.candidate, o.bytes, o.time
    return {"option": i + 1, "layout": c.label(), "tp": c.plan.tp, "pp": c.plan.pp, "ep": c.plan.ep,
            "replicas": c.plan.replicas, "gpus": c.gpus, "output_tokens_per_s": c.pred.output_tokens_per_s,
            "refit_s": t.total_s, "refit_bound_s": t.bound_s, "refit_transfer_s": t.transfer_s,
            "moved_bytes": x.moved, "max_in_bytes": float((x.in_local + x.in_fabric).max()),
            "messages_max": t.messages, "generate_s": o.generate_s, "total_s": o.total_s,
            "rank_map": {"gpu_of_rank": o.rank_map.phys.tolist()}}


def phase_json(result: PhaseResult, model, cluster) -> dict:
    """The ``--phase generate --json`` document."""
    return {"model": model.name, "gpus": cluster.describe(), "phase": "generate",
            "training": {"plan": result.training.to_dict(), "layout": layout_short(result.training)},
            "rollouts": result.rollouts, "options": [option_json(i, o) for i, o in enumerate(result.options)],
            "choice": None if result.choice is None else result.choice + 1, "reason": result.reason,
            "back_to_training_s": 0.0}


def render_phase(result: PhaseResult, model, cluster, *, width: int = 100) -> str:
    """The preview as text."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = [f"{model.name} on {cluster.describe()}: training {layout_short(result.training)} -> generation of "
           f"{result.rollouts} rollouts"]
    if not result.options:
        return "\n".join(out + [f"decision: {result.reason}"]) + "\n"
    buf = StringIO()
    con = Console(file=buf, width=width, force_terminal=False, no_color=True, highlight=False)
    tab = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), caption_justify="left",
                caption="tok/s: output tokens per s; refit, generate, total: seconds; in: GiB of weights received "
                "by the busiest rank; * = chosen")
    for head in ("#", "engine layout", "GPUs", "tok/s", "refit", "in", "generate", "total"):
        tab.add_column(head, justify="left" if head == "engine layout" else "right", no_wrap=True)
    for i, o in enumerate(result.options):
        x = o.bytes
        tab.add_row(f"{'*' if i == result.choice else ''}{i + 1}", o.candidate.label(), str(o.candidate.gpus),
                    f"{o.candidate.pred.output_tokens_per_s:,.0f}", f"{o.time.total_s:.2f}",
                    f"{(x.in_local + x.in_fabric).max() / GiB:.2f}", f"{o.generate_s:.1f}", f"{o.total_s:.1f}")
    con.print(tab)
    out.append(buf.getvalue().rstrip("\n"))
    out.append(f"decision: {result.reason}")
    out.append("back to training: nothing moves (the refit copies 16-bit weights; the training state stays where it "
               "was; parking it in host memory during generation is not priced)")
    return "\n".join(out) + "\n"

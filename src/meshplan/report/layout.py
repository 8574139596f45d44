"""A plan in words: the one place that spells a layout, for every table and report."""

from __future__ import annotations

from meshplan.spec.plan import Plan


def layout_text(plan: Plan) -> str:
    """The plan's degrees and workload in one line, e.g. ``tp=2+sp cp=1 pp=4 dp=2 zero=1 ... schedule=1f1b``."""
    sched = plan.schedule_name if plan.pp > 1 else "-"
    parts = [f"tp={plan.tp}{'+sp' if plan.sp else ''}", f"cp={plan.cp}", f"pp={plan.pp}"]
    if plan.vpp > 1:
        parts.append(f"vpp={plan.vpp}")
    parts += [f"dp={plan.dp}", f"zero={plan.zero}" + (f" dp_shard={plan.dp_shard}" if plan.dp_shard else "")
              + (" dp_sync=ps" if plan.dp_sync == "ps" else ""),
              f"ep={plan.ep}" + (f" etp={plan.etp}" if plan.etp > 1 else ""), f"mb={plan.micro_batch}",
              f"gbs={plan.global_batch}", f"seq={plan.seq_len}", f"recompute={recompute_text(plan)}", plan.precision,
              f"schedule={sched}"]
    if plan.layer_split and len(set(plan.layer_split)) > 1:
        parts.append("split=" + "/".join(str(n) for n in plan.layer_split))
    return " ".join(parts)


def layout_short(plan: Plan) -> str:
    """Degrees in one short string for tables, e.g. ``tp8+sp cp2 pp8x3 dp16 z1``; an uneven layer split shows
    as ``split 3/4/4/2`` (two plans that differ only in it must not look the same)."""
    parts = [f"tp{plan.tp}{'+sp' if plan.sp else ''}"]
    if plan.cp > 1:
        parts.append(f"cp{plan.cp}{'(a2a)' if plan.cp_kind == 'a2a' else ''}")
    parts.append(f"pp{plan.pp}" + (f"x{plan.vpp}" if plan.vpp > 1 else ""))
    parts.append(f"dp{plan.dp}")
    if plan.ep > 1:
        parts.append(f"ep{plan.ep}" + (f"/etp{plan.etp}" if plan.etp > 1 else ""))
    parts.append(f"z{plan.zero}" + (f"/{plan.dp_shard}" if plan.dp_shard else ""))
    if plan.dp_sync == "ps":
        parts.append("ps")
    if plan.batch_shares:
        parts.append("shares " + ":".join(str(s) for s in plan.batch_shares))
    if plan.layer_split and len(set(plan.layer_split)) > 1:
        parts.append("split " + "/".join(str(n) for n in plan.layer_split))
    return " ".join(parts)


def recompute_text(plan: Plan) -> str:
    """Recompute mode, with the layers per rank for partial full recompute (``full:60``)."""
    if plan.recompute == "full" and plan.recompute_layers:
        return f"full:{plan.recompute_layers}"
    return plan.recompute

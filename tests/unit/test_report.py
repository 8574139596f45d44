"""The report's numbers: Pareto front, comparisons, variants, Gantt bars, and the HTML page's content.

The headless-browser check of the page is in test_report_browser.py; the text version in test_explain.py.
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from sim_helpers import uniform

from meshplan import catalog
from meshplan.cost.estimate import estimate
from meshplan.errors import MeshplanError
from meshplan.report import build_report, evaluate_variants, pareto_front, plan_variants
from meshplan.report.analysis import GIB, compare, limiters, time_shares
from meshplan.report.gantt import gantt_data
from meshplan.report.layout import layout_text
from meshplan.sim import simulate
from meshplan.spec.plan import Plan

PLAN = Plan(global_batch=32, seq_len=4096, tp=2, sp=True, pp=4, dp=2, zero=1, framework="meshplan")
"""llama3-8b on 16 H100: small enough to estimate in milliseconds, with a real pipeline, on meshplan's runtime
(which runs every registered schedule)."""
STACK = catalog.framework("meshplan")


def sim_pipeline():
    """The simulator-backed pipeline function the CLI uses."""
    from meshplan.sim.adapter import simulated_pipeline

    return simulated_pipeline()


def small_report(plan: Plan = PLAN, *, variants: bool = True, memory_limit: float | None = None):
    """A report of ``plan`` for llama3-8b on 16xh100-sxm, with its evaluated variants."""
    model, cluster = catalog.model("llama3-8b"), catalog.cluster("16xh100-sxm")
    est = estimate(model, cluster, plan, pipeline=sim_pipeline())
    tl = simulate(plan.schedule_name, est.stage_times, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro)
    alts, skipped = evaluate_variants(model, cluster, plan, pipeline=sim_pipeline()) if variants else ([], [])
    return build_report(model, cluster, plan, est, tl, alternatives=alts, skipped=skipped,
                        memory_limit=memory_limit)


@pytest.fixture(scope="module")
def rep():
    return small_report()


# ---------------------------------------------------------------- Pareto front and comparisons

@pytest.mark.parametrize("points, front", [
    ([(1, 5), (2, 3), (3, 4), (2, 3)], [0, 1]),
    ([(3, 1), (1, 3), (2, 2)], [1, 2, 0]),
    ([(1, 1), (2, 2), (3, 3)], [0]),
    ([(2, 1), (1, 2)], [1, 0]),
    ([], []),
])
def test_pareto_front_by_hand(points, front):
    assert pareto_front(points) == front


def _shifted(est, *, time: float, extra_gib: float):
    """``est`` with step time scaled by ``time`` and ``extra_gib`` GiB more activations."""
    mem = replace(est.memory, activations=est.memory.activations + extra_gib * GIB)
    return replace(est, step_time=est.step_time * time, memory=mem)


@pytest.mark.parametrize("time, extra, status, text", [
    (1.10, 10.0, "loses", "slower by 10.0 %; needs 10.0 GiB more"),
    (1.10, 0.0, "loses", "slower by 10.0 %; same memory"),
    (0.80, -2.0, "better", "faster by 20.0 %; needs 2.0 GiB less"),
    (0.95, 3.0, "trade-off", "faster by 5.0 %; needs 3.0 GiB more"),
    (1.002, 0.01, "same", "same step time; same memory"),
])
def test_compare_states_why_an_alternative_loses(rep, time, extra, status, text):
    alt = _shifted(rep.estimate, time=time, extra_gib=extra)
    r = build_report(rep.model, rep.cluster, rep.plan, rep.estimate, rep.timeline,
                     alternatives=[("alt", rep.plan, alt)])
    c = compare(r, 0)
    assert (c.status, c.text) == (status, text)
    assert c.time_delta == pytest.approx(time - 1.0)
    assert c.memory_delta == pytest.approx(extra * GIB)


def test_alternative_over_the_limit_does_not_fit_and_leaves_the_front(rep):
    base = rep.estimate
    limit = base.peak_memory + 1 * GIB
    fast_big = _shifted(base, time=0.5, extra_gib=2.0)
    slow_small = _shifted(base, time=1.2, extra_gib=-1.0)
    r = build_report(rep.model, rep.cluster, rep.plan, base, rep.timeline, memory_limit=limit,
                     alternatives=[("big", rep.plan, fast_big), ("small", rep.plan, slow_small)])
    c = compare(r, 0)
    assert c.status == "does not fit"
    assert c.text.startswith(f"needs {fast_big.peak_memory / GIB:.1f} GiB, over the {limit / GIB:.1f} GiB limit")
    assert r.pareto == (0, 2)   # this plan (fastest that fits), then the leaner slow one
    assert r.limit == limit


def test_an_alternative_that_fits_beats_a_plan_that_does_not(rep):
    base = rep.estimate
    lean = _shifted(base, time=1.2, extra_gib=-4.0)
    r = build_report(rep.model, rep.cluster, rep.plan, base, rep.timeline, memory_limit=base.peak_memory - 1 * GIB,
                     alternatives=[("lean", rep.plan, lean)])
    c = compare(r, 0)
    assert (c.status, c.text) == ("better", "fits where this plan does not; slower by 20.0 %; needs 4.0 GiB less")
    assert r.pareto == (1,)
    assert limiters(r)[-1].startswith(f"DOES NOT FIT: needs {base.peak_memory / GIB:.1f} GiB, 1.0 GiB over the "
                                      "planner's limit")


# ---------------------------------------------------------------- analysis

def test_time_shares_sorted_and_sum_to_the_step(rep):
    rows = time_shares(rep.estimate)
    assert [v for _, v, _ in rows] == sorted((v for _, v, _ in rows), reverse=True)
    assert rows[0][0] == "compute"
    total = sum(v for k, v, _ in rows if k != "recompute")
    assert total == pytest.approx(rep.estimate.step_time, rel=1e-12)
    assert sum(s for k, _, s in rows if k != "recompute") == pytest.approx(1.0)


def test_limiters_name_the_bubble_and_headroom(rep):
    est = rep.estimate
    lines = limiters(rep)
    assert lines[0] == f"compute is {100 * est.time.compute / est.step_time:.1f} % of the step (MFU " \
                       f"{100 * est.mfu:.1f} %)"
    bubble = (f"pipeline bubble: {est.time.bubble:.3f} s ({100 * est.bubble_fraction:.1f} % of the step) with 16 "
              "micro-batches over 4 stages (1f1b); more micro-batches per step or an interleaved / zero-bubble "
              "schedule would shrink it")
    assert est.bubble_fraction > 0.05 and bubble in lines
    free = (est.capacity - est.peak_memory) / GIB
    assert lines[-1].startswith(f"memory headroom: {free:.1f} GiB free of {est.capacity / GIB:.1f} GiB")


def test_layout_text():
    assert layout_text(PLAN) == ("tp=2+sp cp=1 pp=4 dp=2 zero=1 ep=1 mb=1 gbs=32 seq=4096 recompute=none bf16 "
                                 "schedule=1f1b")


# ---------------------------------------------------------------- variants

def test_plan_variants_keep_the_degrees():
    labels = [label for label, _ in plan_variants(PLAN, STACK)]
    assert labels == ["recompute=selective", "recompute=full", "micro_batch=2", "zero=0", "zero=2", "zero=3",
                      "schedule=dualpipev vpp=2", "schedule=gpipe", "schedule=interleaved_1f1b vpp=2",
                      "schedule=looped_bfs vpp=2", "schedule=zb_h1", "schedule=zbv vpp=2"]
    for _, p in plan_variants(PLAN, STACK):
        assert (p.tp, p.cp, p.pp, p.dp, p.ep) == (2, 1, 4, 2, 1)


def test_variants_carry_real_estimates(rep):
    model, cluster = rep.model, rep.cluster
    assert len(rep.alternatives) == 12 and rep.skipped == ()
    for alt in rep.alternatives:
        again = estimate(model, cluster, alt.plan, pipeline=sim_pipeline())
        assert alt.estimate.step_time == pytest.approx(again.step_time, rel=1e-12)
        assert alt.estimate.peak_memory == pytest.approx(again.peak_memory, rel=1e-12)
    full = next(a for a in rep.alternatives if a.label == "recompute=full")
    assert full.estimate.step_time > rep.estimate.step_time
    assert full.estimate.memory.activations < rep.estimate.memory.activations


def test_micro_batch_variants_must_divide_the_batch():
    odd = Plan(global_batch=6, seq_len=1024, micro_batch=3, dp=2)   # 3 sequences per replica: 1 divides, 6 not
    assert [label for label, _ in plan_variants(odd, STACK) if label.startswith("micro")] == ["micro_batch=1"]


# ---------------------------------------------------------------- Gantt bars

def test_gantt_bars_are_the_spans_when_few():
    tl = simulate("1f1b", uniform(2, dp_tail=(0.5, 0.5)), pp=2, vpp=1, n_micro=2)
    g = gantt_data(tl)
    assert g.lanes == ("r0", "r0 send→r1", "r0 dp", "r1", "r1 send→r0", "r1 dp")
    assert g.n_spans == len(g.bars) == 14 and g.detail_micro == -1 and g.note == ""
    r0 = [(b.kind, b.start, b.end) for b in g.bars if b.lane == "r0"]
    assert r0 == [("F", 0.0, 1.0), ("F", 1.0, 2.0), ("B", 4.0, 6.0), ("B", 7.0, 9.0)]


def test_gantt_aggregates_the_steady_state_of_long_schedules():
    tl = simulate("1f1b", uniform(2, dp_tail=(0.5, 0.5)), pp=2, vpp=1, n_micro=20)
    spans = [s for r in range(2) for s in tl.spans(r)]
    assert len(spans) == 122
    g = gantt_data(tl, max_bars=40)
    assert len(g.bars) <= 40 and g.detail_micro == 1
    assert g.note.startswith("122 simulated actions: micro-batches 0 and 19 are drawn in detail, the 108 actions")
    detail = [b for b in g.bars if b.kind != "AGG"]
    assert sorted({b.microbatch for b in detail}) == [-1, 0, 19]
    agg = [b for b in g.bars if b.kind == "AGG"]
    for s in spans:
        if 1 <= s.microbatch <= 18:
            lane = "r%d" % s.rank if s.lane == "compute" else None
            covered = [b for b in agg if (lane is None or b.lane == lane) and b.start <= s.start and s.end <= b.end]
            assert covered, s


# ---------------------------------------------------------------- HTML page

@pytest.fixture(scope="module")
def page(rep):
    pytest.importorskip("plotly")
    from meshplan.report import render_html

    return render_html(rep)


def test_html_shows_the_plan_and_its_numbers(rep, page):
    est = rep.estimate
    for text in (f"{est.step_time:.3f} s", f"{est.tokens_per_s:,.0f}", f"{100 * est.mfu:.1f} %",
                 f"{est.peak_memory / GIB:.1f} GiB of {est.capacity / GIB:.1f} GiB", layout_text(rep.plan),
                 "llama3-8b", "recompute=full", "What limits this plan"):
        assert text in page, text


def test_html_has_one_figure_per_section(page):
    for div in ("fig-gantt", "fig-memory", "fig-time", "fig-pareto"):
        assert page.count(f'id="{div}"') == 1, div
    assert page.count("<script type=application/json data-figure=") == 4
    for section in ("Timeline of one step", "Memory per GPU", "Time breakdown", "Alternatives: variants of this plan"):
        assert section in page


def test_html_is_self_contained(page):
    """plotly.js is inlined once, gzip-compressed (the page is well under the 4.8 MB of the plain bundle);
    outside it nothing refers to another file or host (the browser test blocks DNS)."""
    import base64
    import gzip

    from plotly.offline import get_plotlyjs

    from meshplan.report.html import plotly_gzip_b64

    packed = plotly_gzip_b64()
    assert page.count(packed) == 1
    assert gzip.decompress(base64.b64decode(packed)).decode() == get_plotlyjs()
    assert len(page.encode()) < 0.5 * len(get_plotlyjs().encode())
    rest = page.replace(packed, "")
    for pattern in (r"<script[^>]+src=", r"<link\b", r"<img\b", r"<iframe\b", r"@import", r"url\(",
                    r"https?://", r"cdn\."):
        assert not re.search(pattern, rest, flags=re.I), pattern


def test_html_without_alternatives_has_no_pareto_chart():
    pytest.importorskip("plotly")
    from meshplan.report import render_html

    page = render_html(small_report(variants=False))
    assert 'id="fig-pareto"' not in page and "None given." in page
    assert page.count("<script type=application/json data-figure=") == 3


def test_missing_plotly_is_one_clear_error(monkeypatch, rep):
    from meshplan.report import render_html

    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    with pytest.raises(MeshplanError, match=r"^the HTML report needs plotly: pip install 'meshplan\[report\]'$"):
        render_html(rep)


# ---------------------------------------------------------------- plan-search results and published plans

def test_from_search_uses_the_runners_up_and_the_memory_limit(rep):
    from types import SimpleNamespace

    from meshplan.report import SEARCH_KIND, from_search

    full = next(a for a in rep.alternatives if a.label == "recompute=full")
    ranked = [SimpleNamespace(plan=rep.plan, best=rep.estimate, cluster=rep.cluster),
              SimpleNamespace(plan=full.plan, best=full.estimate, cluster=rep.cluster)]
    result = SimpleNamespace(model=rep.model, plans=ranked, request=SimpleNamespace(max_memory_fraction=0.8))
    r = from_search(result, timeline=rep.timeline)
    assert r.alternatives_kind == SEARCH_KIND
    assert [(a.label, a.plan) for a in r.alternatives] == [("#2", full.plan)]
    assert r.memory_limit == pytest.approx(0.8 * rep.estimate.capacity)
    assert r.pareto == (0, 1) and compare(r, 0).status == "trade-off"


GOLDEN = sorted((Path(__file__).resolve().parent.parent / "golden" / "plans").glob("*.toml"))


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_published_plans_make_bounded_reports(path):
    """Up to 32k simulated actions: the Gantt stays under MAX_BARS and the page near plotly.js's own size."""
    pytest.importorskip("plotly")
    from meshplan.cli.report import load_report
    from meshplan.report import render_html, render_text
    from meshplan.report.gantt import MAX_BARS

    r = load_report(str(path), variants=False)
    g = gantt_data(r.timeline)
    assert len(g.bars) <= MAX_BARS
    assert (g.note == "") == (g.n_spans <= MAX_BARS)
    assert len(render_html(r).encode()) < 6 * 2**20
    assert f"{r.estimate.step_time:.3f} s" in render_text(r)

"""One self-contained HTML page of a Report: plotly.js inline once (gzip-compressed, unpacked by the browser's
DecompressionStream), no external resource, system fonts."""

from __future__ import annotations

import base64
import gzip
import json
from functools import lru_cache
from html import escape
from pathlib import Path

from meshplan.report.analysis import (
    comparisons,
    component_name,
    gib,
    headline,
    limiters,
    time_shares,
)
from meshplan.report.data import Report
from meshplan.report.figures import (
    gantt_figure,
    memory_figure,
    pareto_figure,
    plotly_go,
    time_figure,
)
from meshplan.report.gantt import MAX_BARS, gantt_data
from meshplan.report.layout import layout_text

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1200px;color:#222;
padding:0 16px}
h1{font-size:1.5em;margin-bottom:4px} h2{font-size:1.2em;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0} td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums} .bad{color:#b00020;font-weight:600}
.note{color:#555;font-size:.9em} code{background:#f4f4f4;padding:1px 4px}
"""
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


def _table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """An HTML table; cells are escaped here, columns in ``numeric`` are right-aligned."""
    def cells(tag: str, vals: list[str]) -> str:
        return "".join(f"<{tag}{' class=num' if i in numeric else ''}>{escape(str(v))}</{tag}>"
                       for i, v in enumerate(vals))
    head = f"<tr>{cells('th', header)}</tr>" if header else ""
    body = "".join("<tr>" + cells("td", r) + "</tr>" for r in rows)
    return f"<table>{head}{body}</table>"


def _figure_html(fig, div_id: str) -> str:
    """The figure's container and its spec as inert JSON; ``LOADER`` draws it once plotly.js is unpacked."""
    spec = fig.to_json().replace("</", "<\\/")
    return (f'<div id="{div_id}" class=fig></div>'
            f'<script type=application/json data-figure="{div_id}">{spec}</script>')


@lru_cache(maxsize=1)
def plotly_gzip_b64() -> str:
    """plotly.min.js from the installed plotly package, gzip-compressed and base64-encoded (4.8 MB -> ~1.9 MB;
    plotly's Python package ships only the full bundle, so a partial bundle is not available offline)."""
    import plotly

    js = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()
    return base64.b64encode(gzip.compress(js, compresslevel=9, mtime=0)).decode("ascii")


# Unpack plotly.js (DecompressionStream: Chrome 80, Firefox 113, Safari 16.4), run it as a script, then draw
# every figure from its JSON spec.
LOADER = """(async () => {
  const figs = document.querySelectorAll('script[data-figure]');
  if (!('DecompressionStream' in window)) {
    figs.forEach(s => { document.getElementById(s.dataset.figure).textContent =
      'This browser cannot unpack the embedded plotly.js (needs DecompressionStream).'; });
    return;
  }
  const raw = Uint8Array.from(atob(document.getElementById('plotly-gz').textContent), c => c.charCodeAt(0));
  const js = await new Response(new Blob([raw]).stream().pipeThrough(new DecompressionStream('gzip'))).text();
  const tag = document.createElement('script');
  tag.textContent = js;
  document.head.appendChild(tag);
  for (const s of figs) {
    const spec = JSON.parse(s.textContent);
    Plotly.newPlot(s.dataset.figure, spec.data, spec.layout, CONFIG);
  }
})();"""


def _summary(rep: Report) -> str:
    rows = [["model", rep.model.name], ["GPUs", rep.cluster.describe()], ["layout", layout_text(rep.plan)]]
    rows += [[k, v] for k, v in headline(rep.estimate)]
    items = "".join(f"<li{' class=bad' if s.startswith('DOES NOT FIT') else ''}>{escape(s)}</li>"
                    for s in limiters(rep))
    return f"{_table([], rows)}<h2>What limits this plan</h2><ul>{items}</ul>"


def _memory_table(rep: Report) -> str:
    per = rep.estimate.memory_per_stage or (rep.estimate.memory,)
    comps = list(per[0].as_dict())
    rows = [[f"r{r}"] + [gib(v) for v in m.as_dict().values()] + [gib(m.total()),
            f"{100 * m.total() / rep.estimate.capacity:.0f} %"] for r, m in enumerate(per)]
    return _table(["rank"] + comps + ["total", "of capacity"], rows, set(range(1, len(comps) + 3)))


def _time_table(rep: Report) -> str:
    rows = [[component_name(k), f"{v:.4f}",
             f"{100 * s:.1f}"] for k, v, s in time_shares(rep.estimate)]
    return _table(["component", "s", "% of step"], rows, {1, 2})


def _alternatives_table(rep: Report) -> str:
    rows = [["this plan", f"{rep.estimate.step_time:.3f}", gib(rep.estimate.peak_memory),
             "Pareto" if 0 in rep.pareto else "", "", layout_text(rep.plan)]]
    for i, c in enumerate(comparisons(rep), start=1):
        est = rep.alternatives[i - 1].estimate
        rows.append([c.label, f"{est.step_time:.3f}", gib(est.peak_memory), "Pareto" if i in rep.pareto else "",
                     f"{c.status}: {c.text}", layout_text(rep.alternatives[i - 1].plan)])
    skipped = "".join(f"<li>{escape(s)}</li>" for s in rep.skipped)
    skipped = f"<p class=note>Not evaluated:</p><ul class=note>{skipped}</ul>" if skipped else ""
    return _table(["plan", "step s", "peak GiB", "front", "versus this plan", "layout"], rows, {1, 2}) + skipped


def render_html(rep: Report, *, max_bars: int = MAX_BARS) -> str:
    """The whole page as one string (works offline: plotly.js is embedded once)."""
    plotly_go()
    gd = gantt_data(rep.timeline, max_bars=max_bars)
    tl = rep.timeline
    gantt_title = (f"Simulated pipeline {tl.pipeline_time:.3f} s, with the gradient reduction tail "
                   f"{tl.step_time:.3f} s (optimizer and overhead follow)")
    figs = [("gantt", gantt_figure(gd, title=gantt_title)), ("memory", memory_figure(rep)),
            ("time", time_figure(rep))]
    if rep.alternatives:
        figs.append(("pareto", pareto_figure(rep)))
    divs = {name: _figure_html(fig, f"fig-{name}") for name, fig in figs}
    note = f"<p class=note>{escape(gd.note)}</p>" if gd.note else ""
    if rep.alternatives:
        alts = (f"<h2>Alternatives: {escape(rep.alternatives_kind)}</h2>{divs['pareto']}"
                f"{_alternatives_table(rep)}")
    else:
        alts = "<h2>Alternatives</h2><p class=note>None given.</p>"
    title = f"meshplan report: {rep.model.name} on {rep.cluster.describe()}"
    body = (f"<h1>{escape(title)}</h1>{_summary(rep)}"
            f"<h2>Timeline of one step</h2><p class=note>Per pipeline rank: compute (forward, backward), sends to "
            f"the neighbouring ranks and the data-parallel gradient reduction after the last backward.</p>"
            f"{note}{divs['gantt']}"
            f"<h2>Memory per GPU</h2>{divs['memory']}{_memory_table(rep)}"
            f"<h2>Time breakdown</h2>{divs['time']}{_time_table(rep)}{alts}")
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'><style>{CSS}</style></head>"
            f"<body>{body}<script type=application/octet-stream id=plotly-gz>{plotly_gzip_b64()}</script>"
            f"<script>{LOADER.replace('CONFIG', json.dumps(PLOTLY_CONFIG))}</script></body></html>\n")

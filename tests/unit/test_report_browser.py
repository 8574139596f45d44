"""The HTML report in a real headless browser: every chart renders all its marks, the page logs nothing to
the console and requests nothing from the network (DNS is blocked and the browser's net log is read).

Needs Chromium or Chrome; skipped with a message saying how to install one where none is found.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = ("no headless browser found (looked for $MESHPLAN_BROWSER, " + ", ".join(BROWSERS) +
                "); install one to run this check, e.g. `apt-get install -y chromium` on Debian/Ubuntu")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--virtual-time-budget=10000", "--window-size=1280,2000")
TIMEOUT_S = 120
FIGURES = ("fig-gantt", "fig-memory", "fig-time", "fig-pareto")


def find_browser() -> str | None:
    """``$MESHPLAN_BROWSER`` or the first Chromium/Chrome binary on PATH."""
    env = os.environ.get("MESHPLAN_BROWSER")
    if env:
        return shutil.which(env)
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


@dataclass(frozen=True)
class BrowserRun:
    dom: str
    """The DOM after the page's scripts ran."""
    console: list[str]
    """Console messages of the page (errors, warnings and logs alike)."""
    requests: list[str]
    """Network URLs the page asked for (file:, data: and blob: excluded)."""


def page_requests(net_log: Path) -> list[str]:
    """URLs requested on behalf of a file:// page, from a Chromium net log (the browser's own background
    requests carry another network isolation key)."""
    events = json.loads(net_log.read_text()).get("events", [])
    urls = {e["params"]["url"] for e in events
            if "url" in e.get("params", {}) and "file://" in str(e["params"].get("network_isolation_key", ""))}
    return sorted(u for u in urls if not u.startswith(("file:", "data:", "blob:", "about:")))


def open_headless(browser: str, page: Path, tmp_path: Path) -> BrowserRun:
    """Load ``page`` in the headless browser and return its DOM, console lines and network requests."""
    profile, net_log = tmp_path / "profile", tmp_path / "net.json"
    cmd = [browser, *FLAGS, f"--user-data-dir={profile}", f"--log-net-log={net_log}", "--dump-dom",
           page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if re.search(r":CONSOLE[:(]|Uncaught", line)]
    return BrowserRun(dom=proc.stdout, console=console, requests=page_requests(net_log))


@pytest.fixture(scope="module")
def browser() -> str:
    found = find_browser()
    if not found:
        pytest.skip(INSTALL_HINT)
    return found


def figure_dom(dom: str, div_id: str) -> str:
    """The DOM of one figure: from its div to the next figure's."""
    start = dom.index(f'id="{div_id}"')
    nxt = [dom.find(f'id="{f}"', start + 1) for f in FIGURES]
    ends = [i for i in nxt if i > start]
    return dom[start:min(ends) if ends else len(dom)]


def test_the_check_sees_errors_and_requests(browser, tmp_path):
    """Canary: a page that throws and loads a remote script is caught, so a clean run means something."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><script src="https://cdn.example.com/x.js"></script></head>'
                   '<body><script>throw new Error("canary-error")</script></body></html>')
    run = open_headless(browser, bad, tmp_path)
    assert any("Uncaught Error: canary-error" in line for line in run.console), run.console
    assert run.requests == ["https://cdn.example.com/x.js"]


def test_report_renders_every_chart_offline_without_errors(browser, tmp_path):
    from test_report import small_report

    from meshplan.report import render_html
    from meshplan.report.gantt import gantt_data

    pytest.importorskip("plotly")
    rep = small_report()
    max_bars = 120   # below the step's span count, so the aggregated Gantt is what renders
    bars = gantt_data(rep.timeline, max_bars=max_bars)
    assert bars.detail_micro > 0
    page = tmp_path / "report.html"
    page.write_text(render_html(rep, max_bars=max_bars), encoding="utf-8")
    run = open_headless(browser, page, tmp_path)
    assert run.console == [] and run.requests == []
    marks = {f: len(re.findall(r'class="point[ "]', figure_dom(run.dom, f))) for f in FIGURES}   # drawn marks
    pp, n_components, n_time = rep.plan.pp, 6, sum(1 for v in rep.estimate.time.as_dict().values() if v > 0)
    assert marks == {"fig-gantt": len(bars.bars), "fig-memory": n_components * pp, "fig-time": n_time,
                     "fig-pareto": 1 + len(rep.alternatives)}
    for f in FIGURES:
        assert 'class="main-svg"' in figure_dom(run.dom, f), f
    assert bars.note in run.dom

"""The --trace output is valid Chrome trace JSON with one lane set per rank."""

from __future__ import annotations

import json

from sim_helpers import uniform

from meshplan.export.trace import chrome_trace, write_chrome_trace
from meshplan.sim import simulate

X_KEYS = {"ph": str, "name": str, "cat": str, "pid": int, "tid": int, "ts": float, "dur": float, "args": dict}


def test_trace_schema_and_lanes(tmp_path):
    tl = simulate("interleaved_1f1b", uniform(8, f=1e-3, i=1e-3, w=1e-3, t=1e-4, dp_tail=(2e-3,) * 4),
                  pp=4, vpp=2, n_micro=8)
    path = tmp_path / "trace.json"
    write_chrome_trace(tl, path)
    doc = json.loads(path.read_text())
    assert set(doc) >= {"traceEvents", "displayTimeUnit"}
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert {e["ph"] for e in events} == {"X", "M"}
    for e in spans:
        for key, typ in X_KEYS.items():
            assert isinstance(e[key], typ), (key, e)
        assert e["ts"] >= 0.0 and e["dur"] >= 0.0
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {r: f"pp rank {r}" for r in range(4)}
    for r in range(4):
        lanes = {e["args"]["name"] for e in meta if e["name"] == "thread_name" and e["pid"] == r}
        assert lanes == {"compute", f"send->r{(r + 1) % 4}", f"send->r{(r - 1) % 4}", "dp"}
        tids = {e["tid"] for e in meta if e["name"] == "thread_name" and e["pid"] == r}
        assert {e["tid"] for e in spans if e["pid"] == r} <= tids
    compute = [e for e in spans if e["cat"] == "compute"]
    assert len(compute) == 4 * 2 * 8 * 2  # ranks x chunks x micro-batches x (F, B)
    assert "F s4 mb7 c1" in {e["name"] for e in compute if e["pid"] == 0}
    last = max(e["ts"] + e["dur"] for e in spans)
    assert abs(last - tl.step_time * 1e6) < 1e-6


def test_trace_metadata_names_schedule():
    doc = chrome_trace(simulate("1f1b", uniform(2), pp=2, vpp=1, n_micro=2))
    assert doc["otherData"]["schedule"] == "1f1b" and doc["otherData"]["pp"] == 2

"""Custom schedules in torch's CSV layout: round trip, and broken files rejected with rank, step and action."""

from __future__ import annotations

import pytest
from sim_helpers import uniform

from meshplan.errors import MeshplanError
from meshplan.sim import (
    ScheduleError,
    get_schedule,
    load_schedule_csv,
    schedule_names,
    simulate,
    write_schedule_csv,
)

ARGS = {"gpipe": (4, 1, 8), "looped_bfs": (4, 2, 8), "1f1b": (4, 1, 8), "interleaved_1f1b": (4, 2, 8),
        "zb_h1": (4, 1, 8),
        "zbv": (4, 2, 8), "dualpipev": (4, 2, 8)}


def _write(tmp_path, text: str):
    path = tmp_path / "sched.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", schedule_names())
def test_round_trip_read_simulate_write(tmp_path, name):
    p, v, m = ARGS[name]
    sched = get_schedule(name, pp=p, vpp=v, n_micro=m)
    path = tmp_path / f"{name}.csv"
    write_schedule_csv(sched, path)
    back = load_schedule_csv(path)
    assert back.actions == sched.actions and back.placement == sched.placement
    assert (back.pp, back.n_stages, back.n_micro) == (p, p * v, m)
    times = uniform(p * v, f=0.5, i=0.7, w=0.3, t=0.01)
    assert simulate(back, times).pipeline_time == simulate(sched, times).pipeline_time
    again = tmp_path / "again.csv"
    write_schedule_csv(back, again)
    assert again.read_text() == path.read_text()


def test_file_layout_is_torch_compute_only(tmp_path):
    path = tmp_path / "zb.csv"
    write_schedule_csv(get_schedule("zb_h1", pp=2, vpp=1, n_micro=2), path)
    assert path.read_text().splitlines() == ["0F0,0F1,0I0,0W0,0I1,0W1", "1F0,1I0,1F1,1I1,1W0,1W1"]


def test_reads_torch_lowered_cells_and_idle_steps(tmp_path):
    text = ("0F0,0SEND_F0,0F1,0SEND_F1,,0RECV_B0,0B0,0RECV_B1,0B1\n"
            ",1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,(1F1;1B1)OVERLAP_F_B,1SEND_B1,1REDUCE_GRAD\n")
    sched = load_schedule_csv(_write(tmp_path, text))
    assert [str(a) for a in sched.actions[1]] == ["1F0", "1B0", "1F1", "1B1"]
    assert simulate(sched, uniform(2)).pipeline_time == 9.0


@pytest.mark.parametrize("text,rank,step,action,reason", [
    ("0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n", 1, None, "1B1", "missing"),
    ("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1,1F1\n", 1, 4, "1F1", "appears twice"),
    ("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", 0, 1, "0B0", "waits for 1B0 on rank 1"),
    ("0F0,0F1,0B0,0X1\n1F0,1B0,1F1,1B1\n", 0, 3, "0X1", "bad action token"),
    ("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1,0F2\n", 1, 4, "0F2", "already on rank 0"),
    ("0F0,,0W0,0I0\n1F0,1B0\n", 0, 2, "0W0", "comes later on the same rank"),
    ("0F0,0F1,0B0,0B1,0I1\n1F0,1B0,1F1,1B1\n", 0, None, "0B1", "both present"),
    ("0F,0B0\n", 0, 0, "0F", "no micro-batch index"),
])
def test_broken_files_name_rank_step_action(tmp_path, text, rank, step, action, reason):
    path = _write(tmp_path, text)
    with pytest.raises(ScheduleError) as info:
        load_schedule_csv(path)
    err = info.value
    assert isinstance(err, MeshplanError)
    assert (err.rank, err.step, err.action) == (rank, step, action)
    assert reason in str(err) and str(path) in str(err)
    assert f"rank {rank}" in str(err) and f"action {action}" in str(err)
    if step is not None:
        assert f"step {step}" in str(err)


def test_torch_accepts_written_file(tmp_path):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    sched = get_schedule("dualpipev", pp=4, vpp=2, n_micro=8)
    path = tmp_path / "dpv.csv"
    write_schedule_csv(sched, path)
    import csv

    with open(path, newline="") as fh:
        rows = {r: [schedules._Action.from_str(c) for c in row] for r, row in enumerate(csv.reader(fh))}
    mapping = schedules._validate_schedule(rows, 4, 8, 8)
    assert [mapping[s] for s in range(8)] == list(sched.placement)

"""Every registered schedule is valid (each action once, dependencies satisfiable, no deadlock) over a grid."""

from __future__ import annotations

from collections import Counter

import pytest

from meshplan.errors import SpecError
from meshplan.sim import get_schedule, schedule_names, validate
from meshplan.spec import schedules as registry

GRID = [(p, v, m) for p in (1, 2, 3, 4, 8) for v in (1, 2, 3) for m in (1, 2, 3, 4, 5, 8, 12, 16, 17)]


def _buildable(name, p, v, m):
    try:
        return get_schedule(name, pp=p, vpp=v, n_micro=m)
    except SpecError:
        return None


def test_one_registry_of_schedule_names():
    # The simulator registers a generator for exactly the names the schedule registry (below cost/) holds.
    assert schedule_names() == registry.schedule_names() == [
        "1f1b", "dualpipev", "gpipe", "interleaved_1f1b", "looped_bfs", "zb_h1", "zbv"]
    assert registry.schedule_spec("zbv").placement == "v"
    assert registry.schedule_spec("interleaved_1f1b").torch_class == "ScheduleInterleaved1F1B"
    # Every name a software-stack profile lists is registered.
    from meshplan import catalog

    for name in catalog.framework_names():
        assert set(catalog.framework(name).schedules) <= set(registry.schedule_names()), name


def test_generated_placement_is_the_registry_placement():
    for name in registry.schedule_names():
        spec = registry.schedule_spec(name)
        vpp = spec.chunks[0]
        sched = get_schedule(name, pp=4, vpp=vpp, n_micro=8)
        assert sched.placement == tuple(spec.stage_rank(stage=s, pp=4) for s in range(4 * vpp)), name


def test_unknown_schedule_is_refused_by_the_python_api():
    from meshplan.spec.plan import Plan

    with pytest.raises(SpecError, match="did you mean: zbv"):
        Plan(global_batch=8, seq_len=128, pp=2, schedule="zbvv")


def test_unknown_name_suggests_close_match():
    with pytest.raises(SpecError, match="did you mean: 1f1b"):
        get_schedule("1f1", pp=2, vpp=1, n_micro=4)


@pytest.mark.parametrize("name", registry.schedule_names())
def test_every_schedule_valid_over_grid(name):
    built = 0
    for p, v, m in GRID:
        sched = _buildable(name, p, v, m)
        if sched is None:
            continue
        built += 1
        validate(sched)
        counts = Counter((a.kind, a.stage, a.microbatch) for row in sched.actions for a in row)
        assert max(counts.values()) == 1
        fwd = {(s, mb) for (k, s, mb) in counts if k == "F"}
        assert len(fwd) == p * v * m
        for r, row in enumerate(sched.actions):
            assert all(sched.placement[a.stage] == r for a in row)
    assert built >= 20


@pytest.mark.parametrize("name,vpp,message", [("1f1b", 2, "use interleaved_1f1b"), ("zb_h1", 2, "use zbv"),
                                              ("zbv", 1, "exactly 2 chunk"), ("dualpipev", 3, "exactly 2 chunk"),
                                              ("gpipe", 2, "use looped_bfs")])
def test_wrong_chunk_count_is_a_spec_error(name, vpp, message):
    with pytest.raises(SpecError, match=message):
        get_schedule(name, pp=4, vpp=vpp, n_micro=8)


def test_dualpipev_needs_2pp_microbatches():
    with pytest.raises(SpecError, match="at least 2\\*pp = 8"):
        get_schedule("dualpipev", pp=4, vpp=2, n_micro=7)


def test_interleaved_rounds_rule_matches_torch():
    with pytest.raises(SpecError, match="divisible by"):
        get_schedule("interleaved_1f1b", pp=4, vpp=2, n_micro=9)  # 2 rounds do not divide 9
    assert get_schedule("interleaved_1f1b", pp=4, vpp=2, n_micro=10).n_micro == 10


def test_v_placement_puts_first_and_last_stage_on_rank0():
    sched = get_schedule("zbv", pp=4, vpp=2, n_micro=8)
    assert sched.placement == (0, 1, 2, 3, 3, 2, 1, 0)
    assert sched.stages_of(0) == (0, 7)
    assert get_schedule("interleaved_1f1b", pp=4, vpp=2, n_micro=8).placement == (0, 1, 2, 3, 0, 1, 2, 3)


def test_1f1b_rank_order_by_hand():
    sched = get_schedule("1f1b", pp=3, vpp=1, n_micro=4)
    assert [str(a) for a in sched.actions[0]] == ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"]
    assert [str(a) for a in sched.actions[2]] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]


def test_zb_h1_defers_rank_many_weight_passes():
    sched = get_schedule("zb_h1", pp=3, vpp=1, n_micro=4)
    assert [str(a) for a in sched.actions[0]] == ["0F0", "0F1", "0F2", "0I0", "0W0", "0F3", "0I1", "0W1",
                                                  "0I2", "0W2", "0I3", "0W3"]
    assert [str(a) for a in sched.actions[2]][:6] == ["2F0", "2I0", "2F1", "2I1", "2F2", "2I2"]

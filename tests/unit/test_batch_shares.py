"""Uneven data-parallel batch shares on mixed clusters: hand-computed replica times and cross-pool all-reduce,
validation messages, invariants, and the shares the planner proposes."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import catalog
from meshplan.cost.calib import calibration_for
from meshplan.cost.estimate import cross_pool_time, estimate, replica_estimates
from meshplan.errors import PlanError, SpecError
from meshplan.search.shares import proportional_shares, shares_floor, shares_template
from meshplan.spec.cluster import ClusterSpec, Pool
from meshplan.spec.plan import Plan

MODEL = catalog.model("llama2-7b")
A100 = catalog.gpu("a100-80gb")


def _gpu(name: str, speed: float):
    """An A100 with every rate (FLOP/s, HBM, NVLink, NIC) times ``speed``, latencies divided by it."""
    g = A100
    peak = dataclasses.replace(g.peak, **{f.name: getattr(g.peak, f.name) * speed
                                          for f in dataclasses.fields(g.peak)})
    return dataclasses.replace(g, name=name, peak=peak, hbm_bandwidth=g.hbm_bandwidth * speed,
                               intra_bandwidth=g.intra_bandwidth * speed, nic_bandwidth=g.nic_bandwidth * speed,
                               intra_latency=g.intra_latency / speed, nic_latency=g.nic_latency / speed)


SLOW, FAST = _gpu("slow", 1.0), _gpu("fast", 2.0)
TWO = ClusterSpec(pools=(Pool(gpu=SLOW, n_gpus=16), Pool(gpu=FAST, n_gpus=16)))
# tp=4 x dp=8, dp outermost (pp=1): replicas 0-3 on the slow pool, 4-7 on the fast one.
BASE = Plan(global_batch=48, seq_len=4096, tp=4, sp=True, dp=8, zero=1, dp_shard=4)


def test_twice_as_fast_pool_with_two_to_one_shares_has_equal_replica_time():
    # 4 slow replicas x 4 + 4 fast replicas x 8 = 48 micro-batches of 1 sequence.
    slow, fast = replica_estimates(MODEL, TWO, BASE.with_(batch_shares=(4, 8)))
    # Every per-micro-batch term halves on the fast pool, so 8 of them take what 4 take on the slow one.
    assert fast.time.compute == pytest.approx(slow.time.compute, rel=1e-9)
    assert fast.time.tp_comm == pytest.approx(slow.time.tp_comm, rel=1e-9)
    # ... and per micro-batch the fast pool is exactly twice as fast.
    one = replica_estimates(MODEL, TWO, BASE.with_(global_batch=32, batch_shares=(4, 4)))
    assert one[0].time.compute == pytest.approx(2 * one[1].time.compute, rel=1e-9)


def test_cross_pool_all_reduce_by_hand():
    plan = BASE.with_(batch_shares=(4, 8))
    # Llama-2-7B: 32 x (4 h^2 + 3 h f) + 2 V h parameters (norms are < 1e-4 of it), tp=4 shards them.
    h, f, v = 4096, 11008, 32000
    params = 32 * (4 * h * h + 3 * h * f) + 2 * v * h
    shard = 4.0 * params / 4 / 4          # fp32 grads of one tp rank, reduce-scattered over a pool's 4 replicas
    cal = calibration_for("slow", "ampere")
    # Two pools: ring all-reduce bus factor 2 (k-1) / k = 1, 2 (k-1) = 2 latency steps, the slower NIC.
    want = 2 * SLOW.nic_latency + shard / (SLOW.nic_bandwidth * cal.inter_eff)
    assert cross_pool_time(MODEL, TWO, plan) == pytest.approx(want, rel=1e-4)
    # An explicit inter-pool bandwidth replaces the NIC.
    fat = dataclasses.replace(TWO, inter_pool_bandwidth=100e9)
    assert cross_pool_time(MODEL, fat, plan) == pytest.approx(2 * SLOW.nic_latency + shard / (100e9 * cal.inter_eff),
                                                              rel=1e-4)


def test_step_is_slowest_replica_plus_cross_pool_and_beats_even_split():
    shared = BASE.with_(batch_shares=(4, 8))
    subs = replica_estimates(MODEL, TWO, shared)
    est = estimate(MODEL, TWO, shared)
    assert est.step_time == pytest.approx(max(s.step_time for s in subs) + cross_pool_time(MODEL, TWO, shared),
                                          rel=1e-12)
    even = estimate(MODEL, TWO, BASE.with_(batch_shares=(6, 6)))
    plain = estimate(MODEL, TWO, BASE.with_(dp_shard=0))     # no shares: everyone at the slow pool's pace
    assert est.step_time < 0.8 * even.step_time
    assert est.step_time < 0.8 * plain.step_time
    assert est.tokens_per_s == pytest.approx(48 * 4096 / est.step_time)


@pytest.mark.parametrize("change,message", [
    (dict(batch_shares=(4, 8, 1)), "has 3 entries, the cluster has 2 pools"),
    (dict(batch_shares=(4, 9)), "(4*4 + 4*9) * 1 = 52 sequences, global_batch is 48"),
    (dict(batch_shares=(4, 8), dp_shard=0), "ZeRO shards over 8 replicas must stay inside one pool"),
    (dict(batch_shares=(4, 8), rank_order="tp-dp-cp-ep-pp", cp=2, dp=4, global_batch=24),
     "put dp outermost"),
    (dict(batch_shares=(4, 8), pp=8, dp=1, zero=0, dp_shard=0), "not a whole number of replicas of tp*cp*pp=32"),
])
def test_validation_messages(change, message):
    with pytest.raises(PlanError) as err:
        estimate(MODEL, TWO, BASE.with_(**change))
    assert message in str(err.value)


def test_shares_must_be_positive_integers():
    with pytest.raises(SpecError, match="leave a pool out"):
        BASE.with_(batch_shares=(0, 12))


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=1, max_value=11))
def test_shares_invariants(slow_share):
    # Any shares that sum to the batch: the step is the slowest replica plus the cross-pool phase, never less
    # than either pool's replica step, and the throughput counts the whole batch.
    plan = BASE.with_(batch_shares=(slow_share, 12 - slow_share))
    subs = replica_estimates(MODEL, TWO, plan)
    assert sum(4 * s for s in plan.batch_shares) * plan.micro_batch == plan.global_batch
    est = estimate(MODEL, TWO, plan)
    assert all(est.step_time >= s.step_time for s in subs)
    assert est.tokens_per_s * est.step_time == pytest.approx(plan.global_batch * plan.seq_len)


def test_one_pool_share_is_the_plain_plan():
    one = ClusterSpec(pools=(Pool(gpu=A100, n_gpus=32),))
    plan = BASE
    assert estimate(MODEL, one, plan.with_(batch_shares=(6,))).step_time == \
        pytest.approx(estimate(MODEL, one, plan.with_(dp_shard=4)).step_time, rel=1e-12)


def test_proportional_shares_by_hand():
    # Pool 1 twice as fast: 4 + 8 micro-batches per replica, both finish at 8 s.
    assert proportional_shares((4, 4), lambda i, s: s * (2.0, 1.0)[i], 48) == (4, 8)
    # Three pools of 2, 2, 1 replicas at 2, 1 and 8 s per micro-batch, 64 micro-batches: 2 s1 + 2 s2 + s3 = 64
    # makes s3 even; s3 = 2 (16 s) leaves s1 + s2 = 31, best (10, 21) -> 20 and 21 s; s3 = 4 takes 32 s.
    assert proportional_shares((2, 2, 1), lambda i, s: s * (2.0, 1.0, 8.0)[i], 64) == (10, 21, 2)
    # A fill term (pipeline bubble) moves work to the pool it costs least.
    assert proportional_shares((1, 1), lambda i, s: (s + 3) * 1.0, 10) == (5, 5)
    # 3 and 2 replicas, 11 micro-batches: the greedy reaches (2, 2) with one left over; the exact search
    # finds 3*1 + 2*4 (4 s) and 3*3 + 2*1 (3 s) and keeps the latter.
    assert proportional_shares((3, 2), lambda i, s: float(s), 11) == (3, 1)
    # No exact total: 3 replicas on each pool cannot make 10.
    assert proportional_shares((3, 3), lambda i, s: float(s), 10) is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=6), min_size=2, max_size=4),
       st.lists(st.floats(min_value=0.1, max_value=10.0), min_size=4, max_size=4),
       st.integers(min_value=0, max_value=80))
def test_proportional_shares_sum_and_bound(reps, works, extra):
    reps = tuple(reps)
    total = sum(reps) + extra * reps[0]
    got = proportional_shares(reps, lambda i, s: s * works[i], total)
    assert got is not None and min(got) >= 1
    assert sum(r * s for r, s in zip(reps, got)) == total
    # The continuous bound never exceeds the rounded shares' slowest pool.
    worst = max(s * works[i] for i, s in enumerate(got))
    assert shares_floor(reps, tuple(works[:len(reps)]), total=total, pp=1) <= worst * (1 + 1e-12)


def test_template_puts_dp_outermost_and_shards_inside_pools():
    plan = Plan(global_batch=64, seq_len=4096, tp=2, pp=2, dp=8, zero=1)
    tpl, reps = shares_template(MODEL, TWO, plan)
    assert reps == (4, 4) and tpl.rank_order == "tp-cp-ep-pp-dp" and tpl.dp_shard == 4
    assert shares_template(MODEL, ClusterSpec(pools=(Pool(gpu=A100, n_gpus=32),)), plan) is None
    assert shares_template(MODEL, TWO, plan.with_(tp=4, pp=8, dp=1)) is None   # a replica spans both pools

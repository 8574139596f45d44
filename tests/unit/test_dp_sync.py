"""Data-parallel synchronisation as a registry: the collectives price as before, the parameter server follows
BytePS's Theorem 1 (all-reduce at no servers, M / B once the servers match the workers), plans, clusters and stacks
refuse what they cannot run, and the planner proposes a parameter-server layout only under a stack that has one."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan import catalog
from meshplan.cost.comm import collective_time
from meshplan.cost.dp_sync import SYNCS, SyncContext, ps_over_allreduce, ps_share, sync_method
from meshplan.cost.estimate import estimate
from meshplan.errors import MeshplanError, SpecError
from meshplan.search import SearchRequest, search
from meshplan.spec.checks import stack_violations
from meshplan.spec.cluster import GroupLink
from meshplan.spec.plan import DP_SYNCS, Plan

WEAK = {"name": "weak-cloud", "pools": [{"gpu": "a100-40gb", "n_gpus": 64, "gpus_per_node": 8, "levels": [
    {"name": "nvlink", "span": 8, "bandwidth_gb_s": 300, "latency_us": 3},
    {"name": "ethernet", "span": 64, "bandwidth_gb_s": 1.5625, "latency_us": 20}]}],
    "servers": {"count": 16, "bandwidth_gb_s": 12.5}}
"""Eight 8-GPU machines on 100 Gb/s Ethernet each (12.5 GB/s per machine) and 16 CPU servers of 100 Gb/s."""


def weak_cluster(servers: int = 16):
    from meshplan.spec.io import cluster_from_dict

    return replace(cluster_from_dict(WEAK, catalog.gpu), servers=servers)


def test_registry_names_are_the_plan_vocabulary():
    assert tuple(SYNCS) == DP_SYNCS
    with pytest.raises(SpecError, match="did you mean"):
        sync_method("allreduc")


@given(n=st.integers(2, 64), k=st.integers(0, 128))
def test_ps_matches_byteps_theorem_1(n, k):
    # Theorem 1 (servers as fast as a GPU machine): t_opt = 2n(n-1)M / ((n^2 + kn - 2k) B); all-reduce 2(n-1)M/(nB).
    rho = float(k)
    expected = n * n / (n * n + k * n - 2 * k) if k <= n else n / (2 * (n - 1))
    assert ps_over_allreduce(n, rho) == pytest.approx(expected, rel=1e-12)
    assert 0.0 <= ps_share(n, rho) <= 1.0 / n


def test_ps_bounds():
    assert ps_over_allreduce(8, 0.0) == pytest.approx(1.0)  # colocated summation moves what a ring moves
    assert ps_over_allreduce(8, 8.0) == pytest.approx(8 / 14)  # non-colocated PS: M / B
    assert ps_over_allreduce(8, 1e9) == pytest.approx(8 / 14)  # more servers cannot beat the workers' NICs
    assert ps_over_allreduce(2, 5.0) == pytest.approx(1.0)  # two machines: all-reduce is already M / B
    assert ps_over_allreduce(1, 5.0) == 1.0


def test_collective_entries_price_as_the_collectives():
    link = GroupLink(bandwidth=25e9, latency=5e-6, level="fabric")
    cal = catalog.gpu("a100-40gb")
    from meshplan.cost.calib import gpu_calibration

    calib = gpu_calibration(cal)
    for name, kind in (("allreduce", "all_reduce"), ("reduce_scatter", "reduce_scatter")):
        got = SYNCS[name].reduce(1e9, size=64, link=link, calib=calib, ctx=SyncContext(machines=8))
        assert got == collective_time(kind, 1e9, size=64, link=link, calib=calib)


def test_ps_layout_on_a_weak_network_with_servers():
    model = catalog.model("llama3.2-1b")
    base = Plan(global_batch=64, seq_len=2048, dp=64)
    ring = estimate(model, weak_cluster(), base.with_(framework="meshplan"))
    ps = estimate(model, weak_cluster(), base.with_(framework="byteps", dp_sync="ps"))
    alone = estimate(model, weak_cluster(servers=0), base.with_(framework="byteps", dp_sync="ps"))
    assert ps.step_time < 0.7 * ring.step_time
    assert alone.step_time == pytest.approx(ring.step_time, rel=0.01)
    # The traffic before overlap: 8 machines, 200 GB/s of servers for 12.5 GB/s machines, rho = 16 >= n, so
    # n / (2 (n - 1)) of the ring's bandwidth term (the ring's latency is 2 x 63 hops of 20 us, the PS's one push
    # and one pull); without servers the summation shares the GPU machines' NICs: a ring's volume.
    traffic = {k: _traffic(model, weak_cluster(k), base) for k in (0, 16)}
    ring_bw = traffic[0]["allreduce"] - 2 * 63 * 20e-6
    assert traffic[16]["ps"] - 2 * 20e-6 == pytest.approx(ring_bw * 8 / 14, rel=1e-9)
    assert traffic[0]["ps"] - 2 * 20e-6 == pytest.approx(ring_bw, rel=1e-9)
    assert traffic[16]["allreduce"] == traffic[0]["allreduce"]  # servers do not change a ring


def _traffic(model, cluster, plan: Plan) -> dict[str, float]:
    """Gradient synchronisation time of the plan's one rank before any overlap, by method."""
    from meshplan.cost.calib import gpu_calibration
    from meshplan.cost.comm import plan_links
    from meshplan.cost.dp import dp_cost
    from meshplan.cost.memory import layer_params

    dense = sum(b.n_layers * layer_params(b.layer)[0] for b in model.blocks)
    pool = cluster.pools[0]
    out = {}
    for sync, stack in (("allreduce", "meshplan"), ("ps", "byteps")):
        p = plan.with_(framework=stack, dp_sync=sync)
        links = plan_links(p, pool, servers=cluster.server_capacity)
        out[sync] = dp_cost(dense, 0.0, plan=p, stack=catalog.framework(stack), links=links,
                            calib=gpu_calibration(pool.gpu), fwd=0.0, bwd=0.0, n_units=1).total_traffic
    return out


def test_what_cannot_run_is_refused():
    with pytest.raises(SpecError, match="zero 0"):
        Plan(global_batch=64, seq_len=2048, dp=64, zero=1, dp_sync="ps")
    with pytest.raises(SpecError, match="reduce-scatter"):
        Plan(global_batch=64, seq_len=2048, dp=64, zero=1, dp_sync="allreduce")
    ps = Plan(global_batch=64, seq_len=2048, dp=64, dp_sync="ps")
    assert any("dp_sync=ps" in v for v in stack_violations(ps, catalog.framework("megatron-core")))
    assert not stack_violations(ps.with_(framework="byteps"), catalog.framework("byteps"))
    assert stack_violations(Plan(global_batch=64, seq_len=2048, dp=64, framework="byteps"),
                            catalog.framework("byteps"))  # BytePS always pushes and pulls


def test_export_refuses_a_parameter_server_plan():
    from meshplan.export.base import get_exporter, render_export

    plan = Plan(global_batch=64, seq_len=2048, dp=64, dp_sync="ps", framework="byteps")
    with pytest.raises(MeshplanError, match="parameter-server plan runs under BytePS"):
        render_export(get_exporter("megatron"), catalog.model("llama3.2-1b"), plan, catalog.framework("byteps"))


def test_cluster_servers_in_the_shorthand():
    c = catalog.cluster("64xa100-40gb+8xserver@12.5")
    assert (c.n_gpus, c.servers, c.server_capacity) == (64, 8, 100e9)
    assert catalog.cluster(c.describe()) == replace(c, name=c.describe())
    assert catalog.cluster("64xa100-40gb+8xserver").server_capacity == 8 * catalog.gpu("a100-40gb").nic_bandwidth
    for bad in ("8xserver", "64xa100-40gb+8xserver@x", "64xa100-40gb+8xserver@0"):
        with pytest.raises(SpecError):
            catalog.cluster(bad)


def test_planner_proposes_ps_only_under_a_stack_that_has_it():
    model = catalog.model("llama3.2-1b")
    req = SearchRequest(global_batch=64, seq_len=2048, framework=catalog.framework("byteps"))
    best = search(model, weak_cluster(), req).plans[0]
    assert best.plan.dp_sync == "ps" and best.plan.dp == 64
    other = search(model, weak_cluster(), replace(req, framework=catalog.framework("torchtitan")))
    assert all(rp.plan.sync != "ps" for rp in other.plans)


def test_plan_file_keeps_the_cluster_file(tmp_path, capsys):
    """A plan made on a cluster file (custom levels, servers) names that file, so estimate --plan prices the same
    network (the shorthand would fall back to the catalog GPU's links)."""
    import tomli_w

    from meshplan.cli import main
    from meshplan.spec.plan_file import read_plan_file

    cfile = tmp_path / "weak.toml"
    cfile.write_text(tomli_w.dumps(WEAK))
    out = tmp_path / "ps.toml"
    assert main(["plan", "--model", "llama3.2-1b", "--gpus", str(cfile), "--global-batch", "64", "--seq-len", "2048",
                 "--framework", "byteps", "--out", str(out)]) == 0
    plan, refs = read_plan_file(out)
    assert refs["cluster"] == str(cfile.resolve()) and plan.dp_sync == "ps"
    capsys.readouterr()
    assert main(["estimate", "--plan", str(out), "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["step_time_s"] == pytest.approx(estimate(catalog.model("llama3.2-1b"), weak_cluster(), plan).step_time)


def test_plan_says_whether_a_parameter_server_would_win():
    from meshplan.cli.plan import ps_alternative

    model = catalog.model("llama3.2-1b")
    req = SearchRequest(global_batch=64, seq_len=2048, framework=catalog.framework("torchtitan"))
    result = search(model, weak_cluster(), req)
    alt = ps_alternative(model, weak_cluster(), req, result)
    # torchtitan's winner avoids the slow network (context and pipeline parallelism, FSDP inside nodes); the
    # parameter server needs data parallelism over every GPU, 0.62 s against about 0.16 s.
    assert alt["plan"]["dp_sync"] == "ps" and alt["step_time_s"] > result.best.step_time
    assert "no faster" in alt["text"]
    assert ps_alternative(model, weak_cluster(servers=0), req, result) is None
    byteps = replace(req, framework=catalog.framework("byteps"))
    assert ps_alternative(model, weak_cluster(), byteps, search(model, weak_cluster(), byteps)) is None


def test_bad_dp_sync_and_server_flags_get_one_line(capsys):
    from meshplan.cli import main

    base = ["estimate", "--model", "llama3.2-1b", "--global-batch", "64", "--seq-len", "2048", "--dp", "64"]
    assert main(base + ["--gpus", "64xa100-40gb", "--dp-sync", "pss"]) == 2
    assert "dp_sync" in capsys.readouterr().err
    assert main(base + ["--gpus", "64xa100-40gb+8xserver@fast"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "server" in err


def test_a_pinned_memory_limit_holds_for_the_parameter_server_comparison():
    from meshplan.cli.plan import ps_alternative

    model = catalog.model("llama3.2-1b")
    req = SearchRequest(global_batch=64, seq_len=2048, framework=catalog.framework("torchtitan"),
                        max_memory_fraction=0.1)
    result = search(model, weak_cluster(), replace(req, max_memory_fraction=0.8))
    alt = ps_alternative(model, weak_cluster(), req, result)
    assert alt["plan"] is None  # dp64 z0 needs ~25 GiB, over 10 % of 40 GB: the pin is kept, nothing fits


def test_a_cluster_file_servers_table_is_checked():
    from meshplan.spec.io import cluster_from_dict

    for bad in ({"count": -1}, {"count": 2.5}, {"count": 4, "bandwidth_gb_s": -1}, {"count": 4, "nics": 2}, 8):
        with pytest.raises(SpecError, match="servers"):
            cluster_from_dict({**WEAK, "servers": bad}, catalog.gpu)

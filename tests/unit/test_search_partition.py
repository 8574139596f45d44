"""The layer-partition kernel against hand-computed splits."""

from meshplan.search.partition import PartitionProblem, min_max_partition


def _prob(times, slow, *, cap=(1e18, 1e18), mem=None, fixed=(0.0, 0.0), scale=(1.0, 1.0), min_items=1):
    n = len(times)
    return PartitionProblem(item_time=tuple(times), item_mem=tuple(mem or [1.0] * n), stage_slowdown=tuple(slow),
                            stage_time=tuple(fixed), stage_mem_scale=tuple(scale), stage_mem=(0.0,) * len(slow),
                            stage_capacity=tuple(cap), min_items=min_items)


def test_equal_stages_split_evenly():
    assert min_max_partition(_prob([1.0] * 8, [1.0, 1.0])) == (4, 4)


def test_slower_stage_gets_fewer_layers():
    # (2, 2) costs max(2, 4) = 4 s; (3, 1) costs max(3, 2) = 3 s.
    assert min_max_partition(_prob([1.0] * 4, [1.0, 2.0])) == (3, 1)


def test_fixed_head_time_moves_layers_forward():
    # Last stage carries a 2 s head: (5, 3) -> max(5, 3 + 2) = 5 s beats (4, 4) -> 6 s.
    assert min_max_partition(_prob([1.0] * 8, [1.0, 1.0], fixed=(0.0, 2.0))) == (5, 3)


def test_memory_cap_binds_before_time():
    # Stage 0 holds at most 2 layers of 10 bytes; the rest go to stage 1.
    assert min_max_partition(_prob([1.0] * 6, [1.0, 1.0], cap=(25.0, 1e18), mem=[10.0] * 6)) == (2, 4)


def test_infeasible_memory_returns_none():
    assert min_max_partition(_prob([1.0] * 4, [1.0, 1.0], cap=(15.0, 15.0), mem=[10.0] * 4)) is None


def test_min_items_per_stage():
    # Stage 1 is 100x slower but must hold two layers (two virtual stages).
    assert min_max_partition(_prob([1.0] * 6, [1.0, 100.0], min_items=2)) == (4, 2)

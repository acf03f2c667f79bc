"""collect.memory.peak_live_bytes: the running sum of allocator events, with the frees gloo's worker threads make
unreported put back."""
from collect.memory import Allocation, affected_by_unreported_frees, peak_live_bytes
from collect.schema import Plan

MB = 10**6


def test_reported_events_sum_to_the_exact_peak():
    events = [Allocation(0, 1, 4 * MB), Allocation(1, 2, 2 * MB), Allocation(2, 1, -4 * MB), Allocation(3, 3, 3 * MB)]
    assert peak_live_bytes(events, []) == 6 * MB


def test_a_collective_copy_without_a_reported_free_ends_with_its_work():
    """Two reduce-scatters, each copying 5 MB inside the c10d call; no free of either copy is reported. Each
    copy's work runs on a worker thread from just after the copy; the second starts after the first ended,
    so only one copy is ever live: 1 MB resident + 5 MB."""
    events = [Allocation(0, 100, 1 * MB),
              Allocation(10, 200, 5 * MB, in_collective=True),
              Allocation(30, 300, 5 * MB, in_collective=True)]
    works = [(12, 20), (31, 40)]
    assert peak_live_bytes(events, works) == 6 * MB
    # the old sum kept both copies live to the end
    assert sum(e.nbytes for e in events) == 11 * MB


def test_an_address_handed_out_again_was_freed_by_then():
    """A block outside any collective whose free is missing: freed by the time its address is reused, or when
    the first worker op after it ends, whichever comes first."""
    events = [Allocation(0, 7, 3 * MB), Allocation(10, 9, 5 * MB), Allocation(20, 9, -5 * MB),
              Allocation(50, 7, 3 * MB)]
    assert peak_live_bytes(events, []) == 8 * MB  # the first 3 MB live until t=50
    assert peak_live_bytes(events, [(1, 6)]) == 5 * MB  # ... or only until its work ended at t=6


def test_blocks_live_at_the_end_stay_live_unless_made_inside_a_collective():
    """Parameters and optimizer state are live when the window closes: they keep counting. A collective's copy
    still 'live' at the end is one whose free went unreported."""
    params = Allocation(0, 1, 8 * MB)
    copy = Allocation(10, 2, 2 * MB, in_collective=True)
    later = Allocation(30, 3, 1 * MB)
    assert peak_live_bytes([params, copy, later], [(11, 20)]) == 10 * MB
    assert peak_live_bytes([params, later], []) == 9 * MB


def test_frees_of_blocks_from_before_the_window_count_as_reported():
    events = [Allocation(0, 1, 2 * MB), Allocation(1, 99, -1 * MB), Allocation(2, 2, 2 * MB)]
    assert peak_live_bytes(events, []) == 3 * MB


def test_plans_measured_again_are_fsdp_over_dp_and_tensor_parallel():
    assert affected_by_unreported_frees(Plan(dp=2, sharding="fsdp_full"))
    assert affected_by_unreported_frees(Plan(dp=2, sharding="fsdp_grad_op"))
    assert affected_by_unreported_frees(Plan(tp=2))
    assert not affected_by_unreported_frees(Plan(dp=2))
    assert not affected_by_unreported_frees(Plan(dp=1, sharding="fsdp_full"))
    assert not affected_by_unreported_frees(Plan(pp=2, num_microbatches=2))

"""The CPU peak-memory measure against cases with known sizes."""

import subprocess
import sys
import threading

import pytest
import torch

from collect.launch.pool import LocalPool
from collect.measure.memory import PeakMemory
from collect.measure.plan import MeasureSettings
from tests.conftest import tiny_spec

MiB = 2**20


def test_peak_is_exact_for_known_allocations():
    with PeakMemory(torch.device("cpu")) as mem:
        a = torch.empty(4 * MiB, dtype=torch.uint8)
        b = torch.empty(2 * MiB, dtype=torch.uint8)
        del a
        c = torch.empty(3 * MiB, dtype=torch.uint8)  # live: b + c = 5 MiB < the earlier 6 MiB
        del b, c
    assert mem.peak_bytes == 6 * MiB
    assert mem.rss_hwm_bytes is None or mem.rss_hwm_bytes > 0


def test_frees_on_another_thread_are_counted():
    """gloo frees on its worker threads; the profiler never saw those frees, the counting allocator does."""
    held = []
    with PeakMemory(torch.device("cpu")) as mem:
        held.append(torch.empty(4 * MiB, dtype=torch.uint8))
        worker = threading.Thread(target=held.clear)
        worker.start()
        worker.join()
        after = torch.empty(3 * MiB, dtype=torch.uint8)
        del after
    assert mem.peak_bytes == 4 * MiB  # not 7: the first block was freed before the second was allocated


def test_peak_counts_parameters_gradients_and_adam_state():
    """Linear 1024x1024 without bias: P = 4 MiB of weights. Training holds weight,
    gradient and AdamW's two moments (4P); AdamW's single-tensor step builds its
    denominator from two live P-sized temporaries (sqrt, then the division by the
    bias correction), so the exact peak is 6P plus a few bytes of scalars."""
    P = 1024 * 1024 * 4
    x = torch.randn(1, 1024)
    with PeakMemory(torch.device("cpu")) as mem:
        model = torch.nn.Linear(1024, 1024, bias=False)
        opt = torch.optim.AdamW(model.parameters(), foreach=False)
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert 6 * P <= mem.peak_bytes <= 6 * P + 16 * 1024


@pytest.mark.distributed
def test_plan_peak_covers_model_state_on_one_rank():
    """On the real measurement path (pool, one rank): weights, grads and two Adam moments."""
    spec = tiny_spec(dp=1, workload={"hidden": 128, "seq_len": 8, "micro_batch_size": 1})
    with LocalPool(1, MeasureSettings(warmup_iters=0, timed_iters=1)) as pool:
        result = pool.run(spec)
    state = 4 * 4 * spec.workload.num_params
    assert result.status == "ok"
    assert state <= result.peak_mem_bytes <= 1.6 * state


def _fsdp_peak(steps: int) -> int:
    spec = tiny_spec(dp=2, sharding="fsdp_full", num_microbatches=4, workload={"hidden": 128, "seq_len": 16})
    settings = MeasureSettings(warmup_iters=0, timed_iters=1, memory_window_iters=steps)
    with LocalPool(2, settings) as pool:
        result = pool.run(spec)
    assert result.status == "ok", result.error
    return result.peak_mem_bytes


@pytest.mark.distributed
def test_fsdp_peak_stays_put_as_the_window_grows():
    """FSDP over dp = 2 reduce-scatters gradients through gloo, whose worker threads free what they held.
    Every step after the first holds the same state, so 8 steps peak where 2 do, give or take the steps of one
    block's buffers that FSDP2's overlap moves the peak by (up to 7.3% seen, see the hog test below); the old
    profiler reading grew 42% here (10.8 to 15.3 MB), which 15% still fails."""
    assert _fsdp_peak(8) == pytest.approx(_fsdp_peak(2), rel=0.15)


@pytest.mark.distributed
def test_fsdp_peak_is_the_same_under_a_cpu_hog():
    """The peak counts bytes, not time: two processes spinning on both cores change it by no more than FSDP2's
    own scheduling does. How many gathered blocks overlap moves the peak in steps of one block's buffers (263 KB
    here: 10.81, 11.07, 11.34 or 11.60 MB, quiet or busy alike, with or without gloo_settle); before gloo_settle
    stopped stalling every collective 50 ms, the stalls serialised FSDP and hid those steps."""
    quiet = _fsdp_peak(2)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        busy = _fsdp_peak(2)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert busy == pytest.approx(quiet, rel=0.15)

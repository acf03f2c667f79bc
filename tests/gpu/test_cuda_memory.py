"""The CUDA branch of the memory measure; skipped on machines without CUDA."""

import pytest
import torch

from collect.measure.memory import PeakMemory

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_cuda_peak_is_max_memory_allocated():
    device = torch.device("cuda", 0)
    with PeakMemory(device) as mem:
        a = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
        del a
    assert mem.peak_bytes >= 64 * 2**20

"""The block profile's CUDA branch (synchronised timing, the GPU grid); skipped on machines without CUDA."""

import os

import pytest
import torch
import torch.distributed as dist

from collect.measure.blocks import measure_block_profile

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_block_profile_on_one_gpu():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        points = measure_block_profile(torch.device("cuda", 0), torch.bfloat16, repeats=2, grid=[(1024, 512, 1)])
    finally:
        dist.destroy_process_group()
    assert all(p["forward_s"] > 0 for p in points if p["kind"] == "block")
    assert {p["dtype"] for p in points} == {"bfloat16"}

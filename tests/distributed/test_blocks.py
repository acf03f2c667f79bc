"""The block profile on real gloo ranks: every block and wrapper the cost model reads, and the concurrency points."""

import pytest

from collect.launch.pool import LocalPool
from collect.measure.blocks import LAYER_VARIANTS, OPTIMIZER_VARIANTS
from gnn.costs.blocks import BlockModel

pytestmark = pytest.mark.distributed
GRID = [(64, 32, 1), (128, 32, 2)]  # two sizes: seconds, not the default grid's 40


def test_one_rank_profile_has_every_block_and_wrapper_and_fits():
    with LocalPool(1, deadline_s=300) as pool:
        points = pool.fingerprint(max_bytes=1024, repeats=3, block_grid=GRID)
    blocks = [p for p in points if p["kind"] == "block"]
    assert {(p["block"], p["variant"]) for p in blocks} == (
        {(b, "plain") for b in ("attn", "mlp", "embed", "head")} | {("layer", v) for v in LAYER_VARIANTS}
    )
    assert len(blocks) == len(GRID) * (4 + len(LAYER_VARIANTS))
    assert all(p["forward_s"] > 0 and p["backward_s"] >= 0 for p in blocks)
    optimizer = [p for p in points if p["kind"] == "optimizer"]
    assert {(p["variant"], p["part"]) for p in optimizer} == {
        (v, part) for v in OPTIMIZER_VARIANTS for part in ("layer", "ends")
    }
    # a layer: two norms, four attention and two MLP linears, each a weight and a bias
    assert {p["tensors"] for p in optimizer if p["part"] == "layer"} == {16}
    model = BlockModel(points)
    # wider blocks cost more, and DTensor's dispatch makes a tensor-parallel layer dearer than a plain one
    small, wide = (0.0, 1e5, 1e4), (1e8, 1e7, 1e6)
    assert model.seconds("mlp", "plain", "forward", wide) > model.seconds("mlp", "plain", "forward", small)
    assert model.wrapper_seconds("tp", "forward", small) > 0


def test_every_pool_times_layers_with_all_ranks_computing():
    with LocalPool(2, deadline_s=300) as pool:
        points = pool.fingerprint(max_bytes=1024, repeats=3, block_grid=GRID)
    concurrency = [p for p in points if p["kind"] == "concurrency"]
    assert concurrency and all(p["ranks"] == 2 and p["time_s"] > 0 for p in concurrency)
    assert {p["kind"] for p in points} == {"collective", "concurrency", "block"}
    # a layer tensor-parallel over the pool's two ranks, with and without sequence parallelism, at every size
    tp = [p for p in points if p["kind"] == "block"]
    assert {(p["variant"], p["hidden"]) for p in tp} == {(v, h) for v in ("tp", "tp_sp") for h, _, _ in GRID}
    assert all(p["ranks"] == 2 and p["forward_s"] > 0 for p in tp)

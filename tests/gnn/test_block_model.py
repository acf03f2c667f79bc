"""The fitted block costs (gnn.costs.blocks), borrowed profiles, and cores shared in the simulator."""

import json
from pathlib import Path

import numpy as np
import pytest

from collect.hardware.records import load_hardware
from gnn.costs.blocks import BlockModel, point_features
from gnn.costs.hardware import HardwareModel
from gnn.graph.build import ExecGraph
from gnn.graph.table import Node
from gnn.sim.simulate import simulate

HARDWARE = Path(__file__).resolve().parents[2] / "data" / "hardware"
SIZES = [(64, 32, 1), (128, 32, 4), (256, 128, 1), (512, 128, 4)]


def _point(block, variant, hidden, seq, batch, forward, backward):
    return {
        "kind": "block",
        "block": block,
        "variant": variant,
        "hidden": hidden,
        "heads": hidden // 32,
        "seq_len": seq,
        "batch": batch,
        "vocab": 512,
        "dtype": "float32",
        "forward_s": forward,
        "backward_s": backward,
    }


def _synthetic(fixed_us=200.0, flops_per_s=1e11, wrapper_us=1000.0):
    """Points of a made-up machine with known costs: a fixed cost per block plus FLOPs at a known rate."""
    points = []
    for hidden, seq, batch in SIZES:
        for block in ("attn", "mlp", "embed", "head", "layer"):
            flops = point_features(_point(block, "plain", hidden, seq, batch, 0, 0))[1]
            t = fixed_us * 1e-6 + flops / flops_per_s
            points.append(_point(block, "plain", hidden, seq, batch, t, 2 * t))
            if block == "layer":
                points.append(_point("layer", "tp", hidden, seq, batch, t + wrapper_us * 1e-6, 2 * t))
    return points


def test_fit_recovers_the_fixed_cost_and_throughput():
    model = BlockModel(_synthetic())
    coef = model.coef[("attn", "plain", "forward")]
    assert coef[0] == pytest.approx(200e-6, rel=1e-3)
    assert 1 / coef[1] == pytest.approx(1e11, rel=1e-3)
    assert model.coef[("mlp", "plain", "backward")][0] == pytest.approx(400e-6, rel=1e-3)


def test_a_wrapper_costs_what_it_adds_to_a_plain_layer():
    model = BlockModel(_synthetic(wrapper_us=1000.0))
    features = point_features(_point("layer", "plain", 192, 64, 2, 0, 0))[1:]
    assert model.wrapper_seconds("tp", "forward", features) == pytest.approx(1e-3, rel=1e-3)
    assert model.wrapper_seconds("tp", "backward", features) == pytest.approx(0.0, abs=1e-9)
    assert model.wrapper_seconds("fsdp_full", "forward", features) == 0.0  # not profiled: adds nothing


def test_cores_from_concurrency_points():
    points = _synthetic() + [
        {"kind": "concurrency", "ranks": r, "hidden": 128, "seq_len": 32, "batch": 2, "time_s": t}
        for r, t in ((1, 1.0), (2, 1.02), (4, 2.2))
    ]
    assert BlockModel(points).cores == pytest.approx(4 / 2.2)
    assert BlockModel(_synthetic()).cores == float("inf")  # no concurrency measured: a device per rank


def test_borrowed_profile_is_named_and_rescaled_by_matmul_throughput(tmp_path):
    source = {
        "id": "src",
        "source": "measured",
        "blocks": _synthetic(),
        "compute": [{"kind": "matmul", "dtype": "float32", "n": 512, "flops_per_s": 1e11}],
    }
    borrower = {
        "id": "old",
        "source": "measured",
        "blocks_from": "src",
        "compute": [{"kind": "matmul", "dtype": "float32", "n": 512, "flops_per_s": 2e11}],
    }
    for record in (source, borrower):
        (tmp_path / f"{record['id']}.json").write_text(json.dumps(record))
    loaded = load_hardware("old", tmp_path)
    assert loaded["blocks"] == source["blocks"] and loaded["blocks_from"] == "src"
    own, borrowed = HardwareModel(load_hardware("src", tmp_path)), HardwareModel(loaded)
    key = ("attn", "plain", "forward")
    # twice the matmul throughput: half the cost per FLOP, the same fixed cost
    assert borrowed.blocks.coef[key][1] == pytest.approx(own.blocks.coef[key][1] / 2)
    assert borrowed.blocks.coef[key][0] == pytest.approx(own.blocks.coef[key][0])


def test_recorded_profile_fits_its_own_points():
    records = [json.loads(p.read_text()) for p in sorted(HARDWARE.glob("*.json"))]
    record = next((r for r in records if r.get("blocks")), None)
    if record is None:
        pytest.skip("no fingerprint with a block profile in data/hardware")
    model = BlockModel(record["blocks"])
    errors = []
    for p in record["blocks"]:
        if p["kind"] == "block":
            block = p["block"] if p["variant"] == "plain" else "layer"
            for phase in ("forward", "backward"):
                predicted = model.seconds(block, p["variant"], phase, point_features(p)[1:])
                errors.append(abs(predicted / p[f"{phase}_s"] - 1))
    # measured on a noisy 2-core machine: the fit follows the bulk, single points may be off by a third
    assert np.median(errors) < 0.1 and np.mean(errors) < 0.15


def _two_ranks_computing(slots):
    nodes = [Node("attn", "forward", rank, 0, 0, est_time=1.0) for rank in (0, 1)]
    g = ExecGraph.from_nodes(nodes, [], [0.0, 0.0])
    g.globals["compute_slots"] = slots
    return simulate(g)


def test_ranks_sharing_cores_share_their_speed():
    assert _two_ranks_computing(float("inf")).iter_time_s == pytest.approx(1.0)
    assert _two_ranks_computing(2.0).iter_time_s == pytest.approx(1.0)
    assert _two_ranks_computing(1.0).iter_time_s == pytest.approx(2.0)  # one core for two ranks
    shared = _two_ranks_computing(1.0)
    assert shared.compute_s == pytest.approx(2.0)  # the busy time the rank really computed


def _group_points(ranks, fixed_ms, slowdown=1.0):
    """A tensor-parallel layer timed on a pool of ``ranks``, taking a fixed ``fixed_ms`` beyond its FLOPs,
    while the pool's ranks shared cores ``slowdown`` times over."""
    points = []
    for hidden, seq, batch in SIZES:
        p = _point("layer", "tp", hidden, seq, batch, 0, 0)
        p["ranks"] = ranks
        flops = point_features(p)[1]
        p["forward_s"] = p["backward_s"] = slowdown * (fixed_ms * 1e-3 + flops / 1e11)
        points.append(p)
    return points


def test_a_pool_layer_is_fitted_per_rank_with_a_core_each():
    concurrency = [
        {"kind": "concurrency", "ranks": r, "hidden": 128, "seq_len": 32, "batch": 2, "time_s": t}
        for r, t in ((1, 1.0), (4, 2.0))
    ]
    model = BlockModel(_synthetic() + _group_points(4, 5.0, slowdown=2.0) + concurrency)
    assert model.group_coef[("tp", 4, "forward")][0] == pytest.approx(5e-3, rel=1e-3)  # the sharing taken out
    assert model.group_seconds("tp", 2, "forward", (0.0, 0.0, 0.0)) is None  # no pool of 2 measured


def test_tensor_parallel_layers_cost_what_the_pool_measured():
    from collect.schema import RunSpec
    from gnn.graph.passes import PassCompiler

    spec = RunSpec.model_validate(
        {
            "workload": {
                "layers": 2,
                "hidden": 128,
                "heads": 4,
                "seq_len": 32,
                "vocab": 512,
                "micro_batch_size": 1,
                "global_batch_size": 1,
            },
            "plan": {"tp": 2},
            "cluster": {"devices_per_node": 2, "memory_bytes": 2**30},
        }
    )
    base = {
        "id": "x",
        "source": "measured",
        "compute": [{"kind": "matmul", "dtype": "float32", "flops_per_s": 1e11}],
        "links": {"intra_node": {"bandwidth_bytes_per_s": 1e9}},
    }

    def attention_forward(points):
        hw = HardwareModel({**base, "blocks": points})
        compiler = PassCompiler(spec.workload, spec.plan, spec.cluster, hw)
        calls = 2 * hw.comm_time("all_reduce", compiler.c.boundary_bytes, 2)  # the layer's two tp_comm calls
        return compiler.pricing._block_seconds("attn", "forward"), calls

    one_rank, _ = attention_forward(_synthetic())
    pool, calls = attention_forward(_synthetic() + _group_points(2, 20.0))
    # one rank: the one-rank wrapper's 1 ms a layer. A pool: its 20 ms beyond FLOPs, less the plain attention and MLP
    # blocks' 0.2 ms fixed costs each and the collectives the graph charges. Half of each goes to the attention block.
    assert pool - one_rank == pytest.approx(0.5 * (20e-3 - 0.4e-3 - calls) - 0.5 * 1e-3, rel=1e-3)

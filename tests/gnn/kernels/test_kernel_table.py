"""Pricing from a kernel table: exact at its points, geometric between them, the edge's efficiency beyond, the
datasheet where it has nothing, and a preset that names one it cannot find refused by field."""

import copy
import json
import math

import numpy as np
import pytest

from collect.hardware.records import load_hardware
from collect.kernels.table import TABLE_DIR, LogGrid, load_table
from collect.schema import RunSpec
from gnn.costs.gpu import Rate, forward_seconds
from gnn.costs.hardware import HardwareModel
from gnn.graph.build import build_graph
from gnn.sim.simulate import simulate

TABLE = load_table("h100-sxm-20261127")
TABLE_RECORD = json.loads((TABLE_DIR / "h100-sxm-20261127.json").read_text())
BF16 = Rate(989.4e12, "bfloat16")


def _h100(table: str | None) -> HardwareModel:
    record = copy.deepcopy(load_hardware("h100-80gb"))
    record["kernels"].pop("table")
    if table:
        record["kernels"]["table"] = table
    return HardwareModel(record)


def _row(m, k, n):
    return next(r for r in TABLE_RECORD["gemm"]["bfloat16"] if r[:3] == [m, k, n])


def test_at_a_measured_shape_the_table_gives_the_measured_times():
    m, k, n, forward, dgrad, wgrad = _row(4096, 4096, 16384)
    assert TABLE.gemm_seconds("bfloat16", m, k, n, backward=False) == pytest.approx(forward)
    assert TABLE.gemm_seconds("bfloat16", m, k, n, backward=True) == pytest.approx(dgrad + wgrad)


def test_between_shapes_the_efficiency_is_geometric_and_beyond_them_it_holds():
    lo, hi = _row(4096, 4096, 8192), _row(4096, 4096, 16384)
    eff = [2 * r[0] * r[1] * r[2] / r[3] for r in (lo, hi)]
    n = math.sqrt(8192 * 16384)  # halfway in log space
    seconds = TABLE.gemm_seconds("bfloat16", 4096, 4096, n, backward=False)
    assert 2 * 4096 * 4096 * n / seconds == pytest.approx(math.sqrt(eff[0] * eff[1]))
    edge = _row(32768, 32768, 32768)
    twice = TABLE.gemm_seconds("bfloat16", 65536, 32768, 32768, backward=False)
    assert twice == pytest.approx(2 * edge[3])


def test_a_grid_with_holes_is_refused():
    with pytest.raises(ValueError, match="holes"):
        LogGrid({(1, 1): 0.0, (2, 2): 0.0})


def test_without_a_table_a_backward_is_twice_its_forward_and_with_one_it_is_measured():
    spec = _llama8b()
    w, plan = spec.workload, spec.plan
    for table in (None, "h100-sxm-20261127"):
        k = _h100(table).kernels
        fwd = forward_seconds(k, w, plan, "mlp", (BF16, BF16), 2)
        bwd = forward_seconds(k.for_phase("backward"), w, plan, "mlp", (BF16, BF16), 2)
        if table is None:
            assert bwd == pytest.approx(2 * fwd)
        else:
            assert 1.5 * fwd < bwd < 3 * fwd and bwd != pytest.approx(2 * fwd)


def test_the_table_prices_a_llama_8b_step_and_the_datasheet_only_what_it_lacks():
    spec = _llama8b()
    hw = _h100("h100-sxm-20261127")
    timed = simulate(build_graph(spec.workload, spec.plan, spec.cluster, hw)).iter_time_s
    datasheet = simulate(build_graph(spec.workload, spec.plan, spec.cluster, _h100(None))).iter_time_s
    assert 0 < timed < float("inf") and timed != pytest.approx(datasheet)
    assert hw.kernels.fallbacks == set()
    mla = _h100("h100-sxm-20261127").kernels
    deepseek = spec.workload.model_copy(update={"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                                "qk_nope_head_dim": 128, "v_head_dim": 128})  # fmt: skip
    assert forward_seconds(mla, deepseek, spec.plan, "attn", (BF16, BF16), 2) > 0
    assert mla.fallbacks == {"attention with uneven head dims (MLA)"}


def test_a_preset_naming_a_missing_table_is_refused_by_field():
    with pytest.raises(ValueError, match=r"kernels.table 'no-such-table'"):
        _h100("no-such-table")


def test_attention_at_a_measured_shape_is_the_measured_time():
    s, h, d, forward, backward = next(r for r in TABLE_RECORD["attention"]["sdpa"] if r[:3] == [8192, 32, 128])
    causal = 2.0 * s * s * h * d
    assert TABLE.attention_seconds(causal, s, h, d, backward=False) == pytest.approx(forward)
    assert TABLE.attention_seconds(causal, s, h, d, backward=True) == pytest.approx(backward)
    assert np.isfinite(TABLE.optimizer_seconds(8e9)) and TABLE.optimizer_seconds(8e9) > 0


def _llama8b() -> RunSpec:
    w = {"family": "llama", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336}
    w |= {"seq_len": 4096, "vocab": 128256, "micro_batch_size": 1, "global_batch_size": 16, "dtype": "bfloat16"}
    return RunSpec.model_validate(
        {
            "workload": w,
            "plan": {"dp": 8, "num_microbatches": 2},
            "cluster": {"devices_per_node": 8, "memory_bytes": 80 * 2**30, "device": "cuda", "backend": "nccl"},
        }
    )

"""Megatron-Bridge's published MoE table in the row schema: every configuration whose model has a public HF config
and a printed precision is expressed, the rest only for a stated reason; FP8-MX is MXFP8, not per-tensor FP8; the
held-out model and precision splits hold out what they name."""

from collections import Counter

import pandas as pd
import pytest

from collect import REPO
from collect.published import moe, nemo
from gnn.dataset.rows import row_to_spec
from gnn.dataset.splits import workload_splits

TABLE = REPO / "data" / "external" / "published" / "megatron_bridge_perf_summary_moe.csv"


@pytest.fixture(scope="module")
def converted():
    return moe.convert(TABLE)


def test_every_configuration_with_a_config_and_a_precision_is_expressed(converted):
    rows, reasons = converted
    assert len(rows) == 124
    assert reasons == Counter(
        {
            "hybrid Mamba-Transformer layers (Nemotron-3) are not in the llama/moe families": 53,
            "precision not printed (release 25.09's tables have no precision column)": 15,
            "model DeepSeekV4 Flash is not in the families (DeepSeek-V4's attention (compressed and indexed sparse "
            "attention, grouped output projections) and hyper-connections are not in the llama/moe families)": 2,
        }
    )
    assert set(rows["model"]) == {"deepseek-v3", "kimi-k2", "gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b"}
    assert set(rows["float8"]) == {"none", "tensorwise", "mxfp8"}  # the MoE table's NVFP4 rows are Nemotron's
    for r in rows.to_dict("records"):  # each row reads back as the plan it was written from
        assert row_to_spec(r)[0].run_id == r["run_id"]


def test_deepseek_v3_on_gb200_runs_megatron_bridges_recipe(converted):
    rows, _ = converted
    r = rows[(rows["model"] == "deepseek-v3") & (rows["device_kind"] == "gb200") & rows["source"].str.contains("26.08")]
    r = r.iloc[0]
    spec = row_to_spec(r.to_dict())[0]
    w, p, c = spec.workload, spec.plan, spec.cluster
    assert (w.kv_lora_rank, w.experts, w.float8) == (512, 256, "mxfp8")
    assert (p.dp, p.pp, p.ep, p.etp, p.virtual_stages, p.sharding) == (64, 4, 64, 1, 4, "zero1")
    assert p.optimizer_state_dtype == "bfloat16" and not p.fp32_grads and p.grad_reduce_overlap
    assert (c.nodes, c.devices_per_node, c.device_kind) == (4, 64, "gb200")
    assert r["iter_time_s"] == pytest.approx(4096 * 4096 / (4912 * 256), rel=1e-4)  # GBS x seq / (tokens/s x GPUs)


def test_expert_parallelism_wider_than_dp_spans_the_tensor_parallel_ranks(converted):
    rows, _ = converted
    h100 = rows[(rows["model"] == "qwen3-235b-a22b") & (rows["device_kind"] == "h100")].iloc[0]
    assert (h100["tp"], h100["dp"], h100["ep"], h100["etp"]) == (2, 16, 32, 1)


def test_fp8_mx_reads_as_mxfp8():
    assert nemo.FLOAT8[nemo._precision("release 25.11; precision FP8-MX; EP n/a")] == "mxfp8"
    assert nemo.FLOAT8[nemo._precision("release 25.11; precision FP8-CS; EP n/a")] == "tensorwise"


def test_held_out_models_and_precisions_train_on_the_rest():
    meta = pd.DataFrame(
        {
            "domain": ["gb200"] * 6 + ["cpu"],
            "sweep_id": ["published-moe"] * 3 + ["published-blackwell"] * 3 + ["cpu-v4"],
            "model": ["deepseek-v3", "deepseek-v3", "qwen3-30b-a3b", None, None, None, None],
            "float8": ["mxfp8", "none", "mxfp8", "nvfp4", "mxfp8", "tensorwise", "none"],
            "run_id": [f"r{i}" for i in range(7)],
        }
    )
    splits = workload_splits(meta)

    def seen(name):
        return set(splits[name]["train"]) | set(splits[name]["val"])

    assert set(splits["moe/held_out_model-deepseek-v3"]["test"]) == {0, 1}
    assert seen("moe/held_out_model-deepseek-v3") == {2, 3, 4, 5}  # never a CPU row
    assert set(splits["precision/held_out_nvfp4"]["test"]) == {3} and 3 not in seen("precision/held_out_nvfp4")
    assert set(splits["precision/held_out_mxfp8"]["test"]) == {0, 2, 4}
    assert seen("precision/held_out_mxfp8") == {1, 5}  # NVFP4, block-scaled too, is not trained on

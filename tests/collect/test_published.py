"""Published GPU measurements into the row schema: a few rows of each source, copied from ../shared/data."""

import pandas as pd
import pytest

from collect.published import playbook
from gnn.dataset.rows import load_runs, row_to_spec

# five rows of ../shared/data/playbook/h100_nanotron.csv, unchanged
PLAYBOOK = """\
model,params_b,layers,hidden,heads,kv_heads,ffn_hidden,vocab,tied_embeddings,seq_len,dtype,nodes,devices_per_node,gpus,dp,tp,pp,zero_stage,micro_batch_size,grad_acc,global_batch_size,global_batch_size_printed,status,tokens_per_s_per_gpu,mfu_pct,gpu_memory_gb,iter_time_s
1B,1.34,16,2048,32,32,8192,128256,True,4096,bfloat16,1,8,8,8,1,1,0,2,16,256,256,ok,40150.0,39.2,50.2,3.264557907845579
1B,1.34,16,2048,32,32,8192,128256,True,4096,bfloat16,1,8,8,4,1,2,1,64,1,256,256,failed,,,,
3B,3.57,28,3072,24,24,8192,128256,True,4096,bfloat16,2,8,16,1,16,1,0,16,16,256,256,ok,6308.0,16.4,45.1,10.389346861128725
80B,80.0,80,8192,64,64,28672,128256,False,4096,bfloat16,16,8,128,1,1,128,0,256,1,256,256,failed,,,,
80B,80.0,80,8192,64,64,28672,128256,False,4096,bfloat16,8,8,64,4,8,2,1,1,64,256,256,ok,298.0,15.4,65.6,54.97986577181208
"""  # noqa: E501


@pytest.fixture
def converted(tmp_path):
    src = tmp_path / "h100_nanotron.csv"
    src.write_text(PLAYBOOK)
    return playbook.convert(str(src))


def test_playbook_rows_keep_what_the_source_measured(converted):
    rows, reasons = converted
    assert list(rows["status"]) == ["ok", "failed", "ok", "ok"]
    first = rows.iloc[0]
    assert first["iter_time_s"] == pytest.approx(256 * 4096 / (40150 * 8))  # the batch's tokens at its tok/s
    assert first["peak_mem_bytes"] == pytest.approx(50.2e9)
    assert first["num_params"] == pytest.approx(1.34e9, rel=0.003)  # the source's printed count
    assert (first["dp"], first["num_microbatches"], first["sharding"]) == (8, 16, "none")
    big = rows.iloc[3]  # Megatron-style plans the collector cannot run: ZeRO-1 with tp and pp
    assert (big["tp"], big["pp"], big["sharding"], big["pp_schedule"]) == (8, 2, "zero1", "1f1b")
    assert big["num_params"] == pytest.approx(80e9, rel=0.003)
    assert big["loss_parallel"] and not big["pipeline_keeps_outputs"]  # Nanotron's conventions
    assert pd.isna(rows.iloc[1]["iter_time_s"]) and "no result" in rows.iloc[1]["error"]
    # 80 layers cannot fill 128 stages: left out, with the schema's reason
    assert reasons == {
        "workload.layers (80) leaves a pipeline stage empty over plan.pp (128) * plan.virtual_stages (1) = "
        "128 stages": 1
    }


def test_the_3b_model_has_heads_that_its_tp_16_run_divides(converted):
    rows, _ = converted
    assert rows.iloc[2]["heads"] == rows.iloc[2]["kv_heads"] == 32 and rows.iloc[2]["tp"] == 16


def test_playbook_rows_enter_the_dataset_as_their_own_gpu_domain(converted, tmp_path):
    rows, _ = converted
    path = tmp_path / "playbook-h100.parquet"
    rows.to_parquet(path, index=False)
    runs = load_runs([path])
    assert list(runs["domain"].unique()) == ["h100"] and len(runs) == 3  # failed runs are not training rows
    spec, hardware, _ = row_to_spec(pd.Series(runs.iloc[2]).to_dict())
    assert hardware == "h100-80gb" and spec.plan.pp_schedule == "1f1b" and spec.workload.family == "llama"

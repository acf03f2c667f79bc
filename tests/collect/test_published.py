"""Published GPU measurements into the row schema: a few rows of each source, copied from ../shared/data."""

from collections import Counter

import pandas as pd
import pytest

from collect import REPO
from collect.hardware.records import load_hardware
from collect.published import dlperf, moe, nemo, playbook
from collect.report import noise_floor, render, twin_groups
from gnn.dataset.rows import load_runs, row_to_spec
from gnn.dataset.splits import workload_splits

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
    assert list(rows["status"]) == ["ok", "failed", "ok", "failed", "ok"]
    first = rows.iloc[0]
    assert first["iter_time_s"] == pytest.approx(256 * 4096 / (40150 * 8))  # the batch's tokens at its tok/s
    assert first["peak_mem_bytes"] == pytest.approx(50.2 * 2**30)  # Nanotron's logger: "GB" of 1024**3 bytes
    assert first["num_params"] == pytest.approx(1.34e9, rel=0.003)  # the source's printed count
    assert first["vocab"] == 131072 and (rows["peak_mem_pp_rank"] == 0).all()  # rank 0 logs its own peak
    assert (first["dp"], first["num_microbatches"], first["sharding"]) == (8, 16, "none")
    big = rows.iloc[4]  # Megatron-style plans the collector cannot run: ZeRO-1 with tp and pp
    assert (big["tp"], big["pp"], big["sharding"], big["pp_schedule"]) == (8, 2, "zero1", "1f1b")
    assert big["num_params"] == pytest.approx(80e9, rel=0.003)
    # Nanotron's conventions, and what its benchmark config sets: sequence parallelism, fp32 gradients, no recompute
    assert big["loss_parallel"] and not big["pipeline_keeps_outputs"] and not big["pipeline_holds_buffers"]
    assert big["sequence_parallel"] and big["sequence_parallel_regather"] and big["recompute"] == "none"
    assert big["fp32_master_weights"] and big["fp32_grads"] and big["pipeline_split"] == "weights"
    assert big["attention_keeps_packed_qkv"] and big["kv_heads"] == big["heads"]  # the script's multi-head attention
    assert big["tp_layer_latency"]
    assert not first["sequence_parallel"] and not first["sequence_parallel_regather"]  # tp 1
    assert pd.isna(rows.iloc[1]["iter_time_s"]) and "no result" in rows.iloc[1]["error"]
    # 80 layers on 128 stages: Nanotron's split by weights gives the first 80 one each and leaves the rest empty
    assert rows.iloc[3]["pp"] == 128 and not reasons


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


# rows of ../shared/data/published's NeMo 24.07 and Megatron-Bridge tables, unchanged (one line per metric)
NEMO = """\
source,model,n_params,layers,hidden,heads,seq_len,vocab,global_batch,micro_batch,gpus,gpu_type,interconnect,tp,pp,dp,cp,zero_stage,recompute,schedule,measured_metric_name,measured_value,unit,notes
NVIDIA/NeMo docs/source/performance/performance_summary.md (commit 4c73f77670624bc1fd97ce444dea4e22ef5eb9c5; initial 24.07 perf (2024-08-14)),Nemotron-8B,,32,4096,32,4096,,256,4,64,H100 (DGX-H100),,2,1,32,1,,,,tokens_per_sec_per_gpu,12701,tokens/s/GPU,"pretraining; FP8; NeMo 24.07 container; dp derived = gpus/(tp*pp*cp); arch from NeMo 2.0 Nemotron3Config8B at commit 8cfedd7203462cb251a914e700e5605444277561 (not in table; 24.07 used NeMo-1 launcher configs); printed est. days/mins column (9) is derived, not extracted"
NVIDIA/NeMo docs/source/performance/performance_summary.md (commit 4c73f77670624bc1fd97ce444dea4e22ef5eb9c5; initial 24.07 perf (2024-08-14)),Nemotron-8B,,32,4096,32,4096,,256,4,64,H100 (DGX-H100),,2,1,32,1,,,,model_tflops_per_gpu,653,TFLOP/s/GPU,"pretraining; FP8; NeMo 24.07 container; dp derived = gpus/(tp*pp*cp); arch from NeMo 2.0 Nemotron3Config8B at commit 8cfedd7203462cb251a914e700e5605444277561 (not in table; 24.07 used NeMo-1 launcher configs); printed est. days/mins column (9) is derived, not extracted"
NVIDIA/NeMo docs/source/performance/performance_summary.md (commit 4c73f77670624bc1fd97ce444dea4e22ef5eb9c5; initial 24.07 perf (2024-08-14)),LLAMA3-70B,,80,8192,64,8192,,128,1,64,H100 (DGX-H100),,4,4,2,2,,,"interleaved, VP=5",tokens_per_sec_per_gpu,1533,tokens/s/GPU,"pretraining; FP8; NeMo 24.07 container; dp derived = gpus/(tp*pp*cp); arch from NeMo 2.0 Llama3Config70B; GQA 8 groups at commit 8cfedd7203462cb251a914e700e5605444277561 (not in table; 24.07 used NeMo-1 launcher configs); printed est. days/mins column (74) is derived, not extracted"
NVIDIA/NeMo docs/source/performance/performance_summary.md (commit 4c73f77670624bc1fd97ce444dea4e22ef5eb9c5; initial 24.07 perf (2024-08-14)),LLAMA3-70B,,80,8192,64,8192,,128,1,64,H100 (DGX-H100),,4,4,2,2,,,"interleaved, VP=5",model_tflops_per_gpu,738,TFLOP/s/GPU,"pretraining; FP8; NeMo 24.07 container; dp derived = gpus/(tp*pp*cp); arch from NeMo 2.0 Llama3Config70B; GQA 8 groups at commit 8cfedd7203462cb251a914e700e5605444277561 (not in table; 24.07 used NeMo-1 launcher configs); printed est. days/mins column (74) is derived, not extracted"
NVIDIA/NeMo docs/source/performance/performance_summary.md (commit 4c73f77670624bc1fd97ce444dea4e22ef5eb9c5; initial 24.07 perf (2024-08-14)),LLAMA2-7B,,32,4096,32,4096,,32,1,8,H100 (DGX-H100),,1,1,8,1,,,,tokens_per_sec_per_gpu,17120,tokens/s/GPU,"SFT; FP8; NeMo 24.07 container; dp derived = gpus/(tp*pp*cp); arch from NeMo 2.0 Llama2Config7B at commit 8cfedd7203462cb251a914e700e5605444277561 (not in table; 24.07 used NeMo-1 launcher configs); printed est. days/mins column (1.2) is derived, not extracted; packed sequences (SQuAD)"
"""  # noqa: E501
BRIDGE = """\
source,model,n_params,layers,hidden,heads,seq_len,vocab,global_batch,micro_batch,gpus,gpu_type,interconnect,tp,pp,dp,cp,zero_stage,recompute,schedule,measured_metric_name,measured_value,unit,notes
NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md (commit 067f987df03b8355b03192d88d70f1709fedf51a),LLAMA3_8B,,32,4096,32,8192,,128,1,8,DGX-H100,,1,1,8,1,Megatron-FSDP (FSDP=8),,,tokens_per_sec_per_gpu,14451,tokens/s/GPU,"release 25.11 NeMo Container; section 'Pre-Training Performance'; precision FP8-CS; EP 1; GA 16; FSDP column 8; dp derived = gpus/(tp*pp*cp); arch from Llama 3/3.1 configs (not in table), GQA 8 groups"
NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md (commit 067f987df03b8355b03192d88d70f1709fedf51a),LLAMA3_8B,,32,4096,32,8192,,128,1,8,DGX-H100,,1,1,8,1,Megatron-FSDP (FSDP=8),,,model_tflops_per_gpu,744,TFLOP/s/GPU,"release 25.11 NeMo Container; section 'Pre-Training Performance'; precision FP8-CS; EP 1; GA 16; FSDP column 8; dp derived = gpus/(tp*pp*cp); arch from Llama 3/3.1 configs (not in table), GQA 8 groups"
NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md (commit 067f987df03b8355b03192d88d70f1709fedf51a),LLAMA3.1_405B,,126,16384,128,8192,,1536,1,256,DGX-GB200,,4,16,4,1,,,"interleaved, VP=4",tokens_per_sec_per_gpu,843,tokens/s/GPU,"release 26.06 NeMo Container; section 'Pre-Training Performance'; precision FP8; EP n/a; GA ; FSDP column absent; dp derived = gpus/(tp*pp*cp); arch from Llama 3/3.1 configs (not in table), GQA 8 groups"
"""  # noqa: E501


@pytest.fixture
def published(tmp_path):
    (tmp_path / nemo.TABLES[0]).write_text(NEMO)
    (tmp_path / nemo.TABLES[1]).write_text(BRIDGE)
    return nemo.convert(tmp_path)


def test_published_configurations_take_megatrons_conventions(published):
    rows, reasons = published
    assert len(rows) == 3  # NeMo's Llama 3 70B, Bridge's Megatron-FSDP Llama 3 8B and its GB200 Llama 3.1 405B
    llama70 = rows.iloc[0]
    assert llama70["iter_time_s"] == pytest.approx(128 * 8192 / (1533 * 64))  # the batch at its tokens/s per GPU
    assert (llama70["tp"], llama70["pp"], llama70["dp"], llama70["cp"]) == (4, 4, 2, 2)
    assert (llama70["pp_schedule"], llama70["virtual_stages"], llama70["num_microbatches"]) == (
        "interleaved_1f1b",
        5,
        64,
    )
    assert (llama70["sharding"], llama70["float8"], llama70["sequence_parallel"]) == ("zero1", "tensorwise", True)
    assert llama70["num_params"] == pytest.approx(70.55e9, rel=0.002)  # Llama 3 70B
    assert llama70["loss_parallel"] and not llama70["pipeline_keeps_outputs"] and not llama70["pipeline_holds_buffers"]
    assert llama70["sequence_parallel_regather"] and llama70["fp32_master_weights"] and llama70["fp32_grads"]
    assert pd.isna(llama70["peak_mem_bytes"])  # not printed
    fsdp = rows.iloc[1]
    assert (fsdp["sharding"], fsdp["dp"], fsdp["tp"]) == ("fsdp_full", 8, 1)
    assert reasons == {"model Nemotron-8B fits no family": 1, "fine-tuning (SFT or LoRA), not pre-training": 1}


def test_blackwell_configurations_run_on_their_presets_with_a_rack_as_the_nvlink_domain(published):
    rows, _ = published
    gb200 = rows.iloc[2]
    assert (gb200["device_kind"], gb200["fingerprint_id"], gb200["sweep_id"]) == (
        "gb200",
        "gb200-nvl72",
        "published-blackwell",
    )
    # 256 GPUs: four racks' 64-GPU NVLink domains; the capacity is the preset's
    assert (gb200["nodes"], gb200["devices_per_node"], gb200["world_size"]) == (4, 64, 256)
    assert gb200["memory_bytes"] == load_hardware("gb200-nvl72")["memory_bytes"]
    assert gb200["iter_time_s"] == pytest.approx(1536 * 8192 / (843 * 256))
    assert (gb200["tp"], gb200["pp"], gb200["dp"], gb200["virtual_stages"]) == (4, 16, 4, 4)
    h100 = rows.iloc[0]
    assert (h100["nodes"], h100["devices_per_node"], h100["fingerprint_id"]) == (8, 8, "h100-80gb")
    with pytest.raises(ValueError, match="GPU V100-SXM2-16GB has no preset"):
        nemo.spec_of({"gpu_type": "V100-SXM2-16GB", "notes": "pretraining; FP8"})


# rows of ../shared/data/published's DLPerf table, unchanged: a one-GPU case (time and memory), a pipelined case
# on 32 GPUs, and a DeepSpeed row
DLPERF = """\
source,model,n_params,layers,hidden,heads,seq_len,vocab,global_batch,micro_batch,gpus,gpu_type,interconnect,tp,pp,dp,cp,zero_stage,recompute,schedule,measured_metric_name,measured_value,unit,notes
Oneflow-Inc/DLPerf Megatron-LM/README.md (commit 01e43de400ab91475437b181f220777615c24253),GPT 1536x16,0.498e9,16,1536,16,2048,51200,2,2,1,V100-SXM2-16GB,"NVLink (hybrid cube mesh, NV1/NV2) intra-node; InfiniBand 100 Gb/s EDR (1 HCA/node)",1,1,1,,,,,iteration_time,464.12,ms,"case DP_1x1x1_2_1536x16; Megatron-LM commit 8aa4619f; NGC PyTorch 20.12; memory is nvidia-smi reading (PyTorch caching allocator, over-states live usage); recompute flag not stated in table"
Oneflow-Inc/DLPerf Megatron-LM/README.md (commit 01e43de400ab91475437b181f220777615c24253),GPT 1536x16,0.498e9,16,1536,16,2048,51200,2,2,1,V100-SXM2-16GB,"NVLink (hybrid cube mesh, NV1/NV2) intra-node; InfiniBand 100 Gb/s EDR (1 HCA/node)",1,1,1,,,,,gpu_memory_nvidia_smi,14362,MiB,"case DP_1x1x1_2_1536x16; Megatron-LM commit 8aa4619f; NGC PyTorch 20.12; memory is nvidia-smi reading (PyTorch caching allocator, over-states live usage); recompute flag not stated in table"
Oneflow-Inc/DLPerf Megatron-LM/README.md (commit 01e43de400ab91475437b181f220777615c24253),GPT 1536x16,0.498e9,16,1536,16,2048,51200,512,2,32,V100-SXM2-16GB,"NVLink (hybrid cube mesh, NV1/NV2) intra-node; InfiniBand 100 Gb/s EDR (1 HCA/node)",1,4,8,,,,,iteration_time,4893.55,ms,"case DP_PP_8x1x4_512_1536x16; Megatron-LM commit 8aa4619f; NGC PyTorch 20.12; memory is nvidia-smi reading (PyTorch caching allocator, over-states live usage); recompute flag not stated in table"
Oneflow-Inc/DLPerf DeepSpeed/Megatron-LM/README.md (commit 017d9b1aef062b14239b2e0a68cf6a6cb47ce43e),GPT-2 small (script default),,12,768,12,,,32,4,8,V100-SXM2-16GB,InfiniBand 100 Gb/s (same 4-node cluster),1,1,8,,0,off (script default),,gpu_memory_nvidia_smi,15387,MB,"DeepSpeedExamples Megatron-LM GPT-2 (deepspeed 0.3.0+7d4d742, torch 1.6); test date 20201205; model = script default gpt2-small (not restated in result table); seq len not stated (script default); memory = nvidia-smi; global batch derived = 4 x gpus"
"""  # noqa: E501


def test_dlperf_cases_run_2021_megatron_on_the_v100_preset(tmp_path):
    src = tmp_path / "dlperf.csv"
    src.write_text(DLPERF)
    rows, reasons = dlperf.convert(str(src))
    assert len(rows) == 2 and (rows["fingerprint_id"] == "v100-16gb").all() and rows["peak_mem_bytes"].isna().all()
    one, piped = rows.iloc[0], rows.iloc[1]
    assert one["iter_time_s"] == pytest.approx(0.46412) and one["world_size"] == 1
    assert (piped["tp"], piped["pp"], piped["dp"], piped["nodes"], piped["num_microbatches"]) == (1, 4, 8, 4, 32)
    # the benchmark script's --fp16 and --checkpoint-activations; Megatron's fused softmax writes the scores out
    assert (piped["dtype"], piped["recompute"], piped["attention"], piped["pp_schedule"]) == (
        "float16",
        "full",
        "eager",
        "1f1b",
    )
    assert piped["fp32_master_weights"] and not piped["fp32_grads"] and not piped["pipeline_holds_buffers"]
    assert reasons == {"DeepSpeed's GPT-2 small at its script's defaults: no sequence or iteration time": 1}


# rows of ../shared/data/playbook/h100_nanotron.csv, unchanged: one 80B plan with ZeRO-1 and without, the same
# plan at another micro-batch size, and a failed run of it at a third
TWINS = """\
model,params_b,layers,hidden,heads,kv_heads,ffn_hidden,vocab,tied_embeddings,seq_len,dtype,nodes,devices_per_node,gpus,dp,tp,pp,zero_stage,micro_batch_size,grad_acc,global_batch_size,global_batch_size_printed,status,tokens_per_s_per_gpu,mfu_pct,gpu_memory_gb,iter_time_s
80B,80.0,80,8192,64,64,28672,128256,False,4096,bfloat16,32,8,256,8,8,4,1,1,32,256,256,ok,268.0,13.9,48.6,15.283582089552239
80B,80.0,80,8192,64,64,28672,128256,False,4096,bfloat16,32,8,256,8,8,4,0,1,32,256,256,ok,223.0,10.3,62.7,18.367713004484305
80B,80.0,80,8192,64,64,28672,128256,False,4096,bfloat16,32,8,256,8,8,4,1,2,16,256,256,ok,155.0,8.0,60.6,26.425806451612903
80B,80.0,80,8192,64,64,28672,128256,False,4096,bfloat16,32,8,256,8,8,4,1,4,8,256,256,failed,,,,
"""  # noqa: E501


def test_twins_are_one_plan_with_and_without_zero1_and_their_spread_is_the_twin_floor(tmp_path):
    src = tmp_path / "h100_nanotron.csv"
    src.write_text(TWINS)
    rows, _ = playbook.convert(str(src))
    groups = twin_groups(rows)
    assert groups.iloc[0] == groups.iloc[1] and groups.iloc[2:].isna().all()
    floor = noise_floor(rows.assign(twin_group=groups), "iter_time_s", "twin_group").iloc[0]
    a, b = rows["iter_time_s"].iloc[:2]
    # each twin's deviation from the pair's median (their mean) is |a - b| / (a + b)
    assert (floor["groups"], floor["measurements"]) == (1, 2)
    assert floor["mean_rel_dev"] == pytest.approx(abs(a - b) / (a + b)) == pytest.approx(0.0916, abs=1e-4)
    assert twin_groups(rows.assign(device="cpu")).isna().all()  # a CPU's optimizer step is no small part
    assert "twin floor" in render(rows, markdown=False)  # published rows carry no collection times


# --- Megatron-Bridge's MoE table (collect.published.moe) -------------------------------------------------------

MOE_TABLE = REPO / "data" / "external" / "published" / "megatron_bridge_perf_summary_moe.csv"


@pytest.fixture(scope="module")
def moe_converted():
    return moe.convert(MOE_TABLE)


def test_every_configuration_with_a_config_and_a_precision_is_expressed(moe_converted):
    rows, reasons = moe_converted
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


def test_deepseek_v3_on_gb200_runs_megatron_bridges_recipe(moe_converted):
    rows, _ = moe_converted
    r = rows[(rows["model"] == "deepseek-v3") & (rows["device_kind"] == "gb200") & rows["source"].str.contains("26.08")]
    r = r.iloc[0]
    spec = row_to_spec(r.to_dict())[0]
    w, p, c = spec.workload, spec.plan, spec.cluster
    assert (w.kv_lora_rank, w.experts, w.float8) == (512, 256, "mxfp8")
    assert (p.dp, p.pp, p.ep, p.etp, p.virtual_stages, p.sharding) == (64, 4, 64, 1, 4, "zero1")
    assert p.optimizer_state_dtype == "bfloat16" and not p.fp32_grads and p.grad_reduce_overlap
    assert (c.nodes, c.devices_per_node, c.device_kind) == (4, 64, "gb200")
    assert r["iter_time_s"] == pytest.approx(4096 * 4096 / (4912 * 256), rel=1e-4)  # GBS x seq / (tokens/s x GPUs)


def test_expert_parallelism_wider_than_dp_spans_the_tensor_parallel_ranks(moe_converted):
    rows, _ = moe_converted
    h100 = rows[(rows["model"] == "qwen3-235b-a22b") & (rows["device_kind"] == "h100")].iloc[0]
    assert (h100["tp"], h100["dp"], h100["ep"], h100["etp"]) == (2, 16, 32, 1)


def test_fp8_mx_reads_as_mxfp8():
    assert nemo.FLOAT8[nemo._precision("release 25.11; precision FP8-MX; EP n/a")] == "mxfp8"
    assert nemo.FLOAT8[nemo._precision("release 25.11; precision FP8-CS; EP n/a")] == "tensorwise"


def test_held_out_models_and_precisions_train_on_the_rest():
    meta = pd.DataFrame(
        {
            "domain": ["gb200"] * 6 + ["cpu", "h100"],
            "sweep_id": ["published-moe"] * 3 + ["published-blackwell"] * 3 + ["cpu-v4", "playbook-h100"],
            "model": ["deepseek-v3", "deepseek-v3", "qwen3-30b-a3b", None, None, None, None, None],
            "float8": ["mxfp8", "none", "mxfp8", "nvfp4", "mxfp8", "tensorwise", "none", "none"],
            "run_id": [f"r{i}" for i in range(8)],
        }
    )
    splits = workload_splits(meta)

    def seen(name):
        return set(splits[name]["train"]) | set(splits[name]["val"])

    assert set(splits["moe/held_out_model-deepseek-v3"]["test"]) == {0, 1}
    assert seen("moe/held_out_model-deepseek-v3") == {2, 3, 4, 5}  # NVIDIA's runs only: no CPU or playbook row
    assert set(splits["precision/held_out_nvfp4"]["test"]) == {3} and 3 not in seen("precision/held_out_nvfp4")
    assert set(splits["precision/held_out_mxfp8"]["test"]) == {0, 2, 4}
    assert seen("precision/held_out_mxfp8") == {1, 5}  # NVFP4, block-scaled too, is not trained on

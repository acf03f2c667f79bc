"""How a framework runs a plan (Plan's conventions) against memory computed by hand, on small cases."""

import math

import pytest

from collect.schema import Cluster, Plan, RunSpec, Workload, collect_problems, framework_conventions
from collect.schema.choices import FLOAT8_SCALINGS
from gnn.costs.analytic import block_costs, state_bytes
from gnn.costs.gpu import ASSUMED_KERNEL_GAP_S, GpuKernels, Rate, _core_seconds
from gnn.costs.hardware import hardware_model
from gnn.sim.plan import simulate_plan

LLAMA = dict(family="llama", layers=4, hidden=64, heads=4, kv_heads=4, ffn_hidden=128, vocab=256, seq_len=32)
MIXED = dict(fp32_master_weights=True, fp32_grads=True)
REGATHER = dict(sequence_parallel_regather=True)


def _llama(**kw) -> Workload:
    return Workload(**(LLAMA | dict(dtype="bfloat16", micro_batch_size=1, global_batch_size=4) | kw))


def test_mixed_precision_state_per_parameter_by_hand():
    """bf16 weights 2 bytes, fp32 gradients 4 (whole under ZeRO-1), fp32 master and two Adam moments 12 over dp,
    DDP's bf16 buckets 2: Megatron's 6 + 12/dp per parameter with a distributed optimizer, plus Nanotron's DDP."""
    w, n = _llama(), 1000.0
    state = state_bytes(w, Plan(dp=4, sharding="zero1", num_microbatches=1, **MIXED), n)
    assert state == {"param": 2 * n, "grad": 4 * n, "optimizer": 12 * n / 4, "ddp_buckets": 2 * n}
    # the collector's convention: the optimizer steps the bf16 weights, gradients in bf16, and torch's AdamW keeps
    # its moments in its parameters' dtype (the fake traces and the H200 rows of data/runs say so)
    assert state_bytes(w, Plan(dp=4, sharding="zero1", num_microbatches=1), n) == {
        "param": 2 * n,
        "grad": 2 * n,
        "optimizer": 4 * n / 4,
        "ddp_buckets": 2 * n,
    }
    # FSDP2's mixed precision: the fp32 shard is the parameter, no bf16 shard is kept; gradients sharded in fp32
    fsdp = state_bytes(w, Plan(dp=4, sharding="fsdp_full", num_microbatches=1, **MIXED), n)
    assert fsdp == {"param": 0.0, "grad": 4 * n / 4, "optimizer": 12 * n / 4, "ddp_buckets": 0.0}
    # bf16 moments (plan.optimizer_state_dtype) halve them: fp32 master 4 + 2 x 2 over dp
    half = state_bytes(w, Plan(dp=4, sharding="zero1", optimizer_state_dtype="bfloat16", **MIXED), n)
    assert half["optimizer"] == 8 * n / 4


def test_block_scaled_weights_are_kept_quantised_row_and_column_wise():
    """MXFP8: a byte and a 32nd per element, twice; NVFP4: half a byte and a 16th, twice."""
    n, plan = 1000.0, Plan(**MIXED)
    for f8, per in (("mxfp8", 2 * (1 + 1 / 32)), ("nvfp4", 2 * (0.5 + 1 / 16))):
        w = _llama().model_copy(update={"float8": f8})
        assert state_bytes(w, plan, n)["quantised_weights"] == pytest.approx(per * n)


def test_megatron_s_fp8_parameters_keep_no_2_byte_copy():
    """fp8_param_gather: the FP8 weights (and their transpose) are the parameters; the fp32 master the optimizer's."""
    n, plan = 1000.0, Plan(dp=4, sharding="zero1", **MIXED)
    w = _llama().model_copy(update={"float8": "tensorwise"})
    cached, fp8 = state_bytes(w, plan, n), state_bytes(w, plan.model_copy(update={"float8_params": True}), n)
    assert cached["param"] == 2 * n and fp8["param"] == 0.0
    assert fp8["quantised_weights"] == cached["quantised_weights"] == 2 * n
    assert {k: v for k, v in fp8.items() if k != "param"} == {k: v for k, v in cached.items() if k != "param"}
    # NeMo's recipes: FP8 with delayed or current scaling and MXFP8 hold the weights in FP8 only, NVFP4 does not
    held = {f: framework_conventions("nemo", 1, False, "bfloat16", f)["float8_params"] for f in FLOAT8_SCALINGS}
    assert held == {"none": False, "tensorwise": True, "rowwise": False, "mxfp8": True, "nvfp4": False}
    assert not framework_conventions("torchtitan", 1, False, "bfloat16", "tensorwise")["float8_params"]


def test_sequence_parallel_norms_by_hand():
    """The two norms' inputs and outputs, 8d bytes per token at bf16: replicated without sequence parallelism; with
    it the inputs sharded and the outputs kept gathered, as torch's DTensor saves them (4d / tp + 4d: the
    fake traces of a Llama 3.1 8B block at tp 2 and 8 to the MiB); all sharded where Megatron gathers again."""
    w, d, tokens = _llama(), 64, 32

    def act(**plan) -> float:
        return block_costs(w, Plan(tp=4, **plan)).activation_bytes_per_layer

    none, torch_sp, regather = act(), act(sequence_parallel=True), act(sequence_parallel=True, **REGATHER)
    assert none - torch_sp == pytest.approx(tokens * (8 * d - (4 * d / 4 + 4 * d)))
    assert torch_sp - regather == pytest.approx(tokens * (4 * d - 4 * d / 4))


def test_nanotron_keeps_k_and_v_twice_under_multi_head_attention_by_hand():
    """Nanotron saves q as a view of the packed q, k, v copy, beside k and v's own copy: 2 x 2 kv / tp more bytes
    per token at bf16 (kv = kv_heads x head_dim = 64 here); grouped-query attention copies q out alone, adding
    nothing."""
    tokens, packed = 32, dict(attention_keeps_packed_qkv=True)

    def extra(**workload) -> float:
        w = _llama(**workload)
        kept = [block_costs(w, Plan(tp=2, **flag)).activation_bytes_per_layer for flag in ({}, packed)]
        return kept[1] - kept[0]

    assert extra() == pytest.approx(tokens * 2 * 2 * 64 / 2)
    assert extra(kv_heads=2) == 0.0


def _pipeline_peak(microbatches: int, holds: bool) -> list[float]:
    w = _llama(global_batch_size=microbatches)
    plan = Plan(pp=2, num_microbatches=microbatches, pipeline_keeps_outputs=False, pipeline_holds_buffers=holds)
    cluster = Cluster(devices_per_node=2, device="cuda", device_kind="h100", backend="nccl", memory_bytes=2**36)
    _, sim = simulate_plan(w, plan, cluster, hardware_model("h100-80gb"), None)
    return sim.peak_mem_per_rank


def test_pipeline_buffers_grow_with_micro_batches_only_where_the_framework_holds_them():
    """torch's pipelining keeps a receive buffer per micro-batch for the input and the output's gradient (1F1B frees
    what it sends back at the next send's wait); Megatron's and Nanotron's free them all: the peak stops growing."""
    boundary = block_costs(_llama(), Plan()).boundary_bytes  # one micro-batch's hidden state
    held = [_pipeline_peak(n, True) for n in (4, 16)]
    freed = [_pipeline_peak(n, False) for n in (4, 16)]
    assert held[1][0] - held[0][0] == pytest.approx(12 * boundary)  # the gradient received per micro-batch
    assert held[1][1] - held[0][1] == pytest.approx(12 * boundary)  # the receive buffer
    assert freed[1] == pytest.approx(freed[0])


def test_a_batch_of_plans_that_differ_only_in_a_convention_is_priced_per_plan():
    """Plans of a batch share pass compilers; a convention must be part of what they share on."""
    w = _llama()
    cluster = Cluster(devices_per_node=4, device="cuda", device_kind="h100", backend="nccl", memory_bytes=2**36)
    hw, cache = hardware_model("h100-80gb"), {}
    plans = [Plan(pp=2, num_microbatches=4, pipeline_holds_buffers=h, **MIXED, dp=2) for h in (True, False)]
    shared = [simulate_plan(w, p, cluster, hw, cache)[1].peak_mem_bytes for p in plans]
    alone = [simulate_plan(w, p, cluster, hw, None)[1].peak_mem_bytes for p in plans]
    assert shared == alone and shared[0] > shared[1]


def test_framework_conventions_and_what_the_collector_refuses():
    megatron = framework_conventions("megatron", 4, True, "bfloat16")
    assert megatron == {
        "loss_parallel": True,
        "pipeline_keeps_outputs": False,
        "pipeline_holds_buffers": False,
        "sequence_parallel_regather": True,
        "fp32_master_weights": True,
        "fp32_grads": True,
        "pipeline_split": "layers",
        "attention_keeps_packed_qkv": False,
        "tp_layer_latency": False,
        "grad_reduce_overlap": True,
        "param_gather_overlap": True,
        "tp_comm_overlap": False,
        "float8_params": False,  # bf16 GEMMs
        "attention_kernel": "cudnn",
        "grad_accumulation_pass": False,  # fused into the weight-gradient GEMM
    }
    assert framework_conventions("nemo", 4, True, "bfloat16") == megatron | {"tp_comm_overlap": True}
    assert not framework_conventions("nemo", 4, False, "bfloat16")["tp_comm_overlap"]  # it overlaps SP's collectives
    nanotron = framework_conventions("nanotron", 4, True, "bfloat16")
    assert nanotron["pipeline_split"] == "weights" and nanotron["attention_keeps_packed_qkv"]
    assert nanotron["tp_layer_latency"] and nanotron["grad_accumulation_pass"] and not nanotron["grad_reduce_overlap"]
    assert nanotron["attention_kernel"] == "flash2"
    assert not framework_conventions("megatron", 4, True, "float32")["fp32_master_weights"]  # fp32 is its own master
    fp16 = framework_conventions("megatron", 4, True, "float16")  # fp32 master weights, fp16 gradients
    assert fp16["fp32_master_weights"] and not fp16["fp32_grads"]
    torch = framework_conventions("torch", 4, True, "bfloat16")
    assert not any(torch[k] for k in ("loss_parallel", "sequence_parallel_regather", "fp32_grads"))
    assert torch["pipeline_holds_buffers"] and torch["pipeline_keeps_outputs"]
    cluster = Cluster(devices_per_node=2, memory_bytes=2**34)
    problems = collect_problems(_llama(global_batch_size=2), Plan(dp=2, **MIXED), cluster)
    assert any("plan.fp32_master_weights, plan.fp32_grads: predicted only" in p for p in problems)
    split = collect_problems(
        _llama(global_batch_size=2), Plan(pp=2, num_microbatches=2, pipeline_split="weights"), cluster
    )
    assert any("plan.pipeline_split 'weights'" in p for p in split)
    packed = collect_problems(_llama(global_batch_size=1), Plan(attention_keeps_packed_qkv=True), cluster)
    assert any("plan.attention_keeps_packed_qkv: predicted only" in p for p in packed)
    latency = collect_problems(_llama(global_batch_size=1), Plan(tp_layer_latency=True), cluster)
    assert any("plan.tp_layer_latency: predicted only" in p for p in latency)
    overlap = collect_problems(_llama(global_batch_size=2), Plan(dp=2, grad_reduce_overlap=True), cluster)
    assert any("plan.grad_reduce_overlap: predicted only" in p for p in overlap)


@pytest.mark.parametrize(
    "workload, plan, message",
    [
        (
            dict(dtype="float32"),
            MIXED,
            "plan.fp32_master_weights and plan.fp32_grads need a 2-byte workload.dtype (bfloat16 or float16), "
            "not 'float32'",
        ),
        ({}, dict(tp=2, **REGATHER), "plan.sequence_parallel_regather needs plan.sequence_parallel"),
        ({}, dict(tp=2, tp_comm_overlap=True), "plan.tp_comm_overlap needs plan.tp > 1 with plan.sequence_parallel"),
        ({}, dict(float8_params=True), "plan.float8_params needs a workload.float8 format and plan.fp32_master"),
    ],
)
def test_conventions_a_plan_cannot_take_name_the_rule(workload, plan, message):
    w = LLAMA | dict(dtype="bfloat16", micro_batch_size=1, global_batch_size=1) | workload
    body = {"workload": w, "plan": plan, "cluster": {"devices_per_node": plan.get("tp", 1), "memory_bytes": 2**34}}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunSpec.model_validate(body)


# the playbook's Nanotron models (scaling_benchmarks.py): layers, hidden, heads (of hidden / heads), ffn; vocab 131,072
NANOTRON_1B = dict(family="llama", layers=16, hidden=2048, heads=32, ffn_hidden=8192, vocab=131072, seq_len=4096)
NANOTRON_3B = NANOTRON_1B | dict(layers=28, hidden=3072)


@pytest.mark.parametrize(
    "model, pp, expected",
    [
        # a 3B layer weighs 113,246,208 (4 d^2 + 3 d ffn), the head 402,653,184: 28 + 3.56 layers, 3.95 a stage
        (NANOTRON_3B, 8, (4, 4, 4, 4, 4, 4, 4, 0)),
        (NANOTRON_3B, 16, (2,) * 14 + (0, 0)),
        # a 1B layer weighs 2^26, the head 2^28: 20 units. Over 4 stages the 5th layer ends exactly at the first
        # share (5), which it must pass to move on: the first stage takes 6
        (NANOTRON_1B, 4, (6, 5, 5, 0)),
        (NANOTRON_1B, 8, (3, 3, 2, 3, 2, 3, 0, 0)),
    ],
)
def test_nanotron_splits_a_pipeline_by_weights_by_hand(model, pp, expected):
    w = Workload(**(model | dict(dtype="bfloat16", micro_batch_size=1, global_batch_size=pp)))
    plan = Plan(pp=pp, num_microbatches=pp, pipeline_split="weights")
    assert plan.stage_layers(w.layers, w.pipeline_costs) == expected
    # Nanotron runs stages past the layers (the 1B model on 8 stages ran in the playbook): not refused
    cluster = Cluster(devices_per_node=pp, device="cuda", device_kind="h100", backend="nccl", memory_bytes=2**36)
    RunSpec(workload=w, plan=plan, cluster=cluster)
    # split by layers, the same plan is even where it divides
    assert Plan(pp=pp, num_microbatches=pp).stage_layers(w.layers, w.pipeline_costs)[0] <= expected[0]


def test_the_first_stage_holds_what_the_split_by_weights_gives_it():
    """3B over 16 stages: by layers the first stage holds 1 layer (the embedding counts as one), by weights 2; its
    1F1B peak holds 16 micro-batches of them, so the first rank's peak grows by about 16 layers' activations."""
    w = Workload(**(NANOTRON_3B | dict(dtype="bfloat16", micro_batch_size=1, global_batch_size=16)))
    cluster = Cluster(
        devices_per_node=8, nodes=2, device="cuda", device_kind="h100", backend="nccl", memory_bytes=2**37
    )
    hw = hardware_model("h100-80gb")
    first = [
        simulate_plan(w, Plan(pp=16, num_microbatches=16, pipeline_split=s), cluster, hw)[1].peak_mem_per_rank[0]
        for s in ("layers", "weights")
    ]
    layer = block_costs(w, Plan(pp=16, num_microbatches=16)).activation_bytes_per_layer
    assert first[1] - first[0] == pytest.approx(16 * layer, rel=0.25)


def test_a_row_compares_with_the_pipeline_rank_its_source_measured():
    """The playbook logs global rank 0's peak (the first stage); the collector the largest over ranks."""
    from gnn.dataset.features import sim_features
    from gnn.dataset.rows import measured_pp_rank

    w = Workload(**(NANOTRON_1B | dict(dtype="bfloat16", micro_batch_size=4, global_batch_size=8)))
    cluster = Cluster(devices_per_node=8, device="cuda", device_kind="h100", backend="nccl", memory_bytes=2**37)
    sim = simulate_plan(w, Plan(pp=2, num_microbatches=2), cluster, hardware_model("h100-80gb"))[1]
    ranks = sim.peak_mem_per_rank
    assert ranks[1] > ranks[0]  # the last stage holds the logits of 4 x 4,096 tokens over 131,072 words
    assert measured_pp_rank({"peak_mem_pp_rank": 0.0}) == 0 and measured_pp_rank({"peak_mem_pp_rank": None}) is None
    assert sim_features(sim, 0)["log_sim_mem"] == pytest.approx(math.log(ranks[0]))
    assert sim_features(sim)["log_sim_mem"] == pytest.approx(math.log(max(ranks)))


def test_extrapolated_times_stay_positive_when_the_busiest_rank_changes():
    """A 1B model over 4 stages split by weights with a 128,256-word head puts one layer on the last stage
    (5, 5, 5, 1): its two sampled runs disagree on the busiest rank's communication, and the line through them
    went below zero at 128 micro-batches."""
    w = Workload(**(NANOTRON_1B | dict(vocab=128256, dtype="bfloat16", micro_batch_size=1, global_batch_size=256)))
    nanotron = framework_conventions("nanotron", 1, False, "bfloat16")
    plan = Plan(dp=2, pp=4, num_microbatches=128, **nanotron)  # DDP
    assert plan.stage_layers(w.layers, w.pipeline_costs) == (5, 5, 5, 1)
    cluster = Cluster(devices_per_node=8, device="cuda", device_kind="h100", backend="nccl", memory_bytes=2**37)
    sim = simulate_plan(w, plan, cluster, hardware_model("h100-80gb"))[1]
    assert min(sim.compute_s, sim.comm_s, sim.exposed_comm_s, sim.iter_time_s) >= 0


def test_eager_attention_keeps_the_scores_by_hand_and_only_the_collector_refuses_it():
    """Eager attention keeps each layer's softmax output: s scores per query token and head, over tp, in bf16
    (Korthikanti et al. 2022's 2as^2b); fused (flash) attention keeps none. Checked against the simulated peak of
    a one-stage plan, which holds every layer's activations once the forward ends."""
    w, s, heads, t = _llama(seq_len=256), 256, 4, 2
    flash, eager = Plan(tp=t), Plan(tp=t, attention="eager")
    scores = s * s * heads / t * 2
    assert block_costs(w, eager).activation_bytes_per_layer - block_costs(w, flash).activation_bytes_per_layer == (
        pytest.approx(scores)
    )
    cluster = Cluster(devices_per_node=2, device="cuda", device_kind="h100", backend="nccl", memory_bytes=2**36)
    hw = hardware_model("h100-80gb")
    peaks = [simulate_plan(w, p, cluster, hw, None)[1].peak_mem_per_rank[0] for p in (flash, eager)]
    assert peaks[1] - peaks[0] == pytest.approx(4 * scores)  # 4 layers
    # recompute drops them with the rest of the attention core (selective) or the whole block (full)
    for recompute in ("selective", "full"):
        plans = [Plan(tp=t, recompute=recompute, attention=a) for a in ("flash", "eager")]
        peaks = [simulate_plan(w, p, cluster, hw, None)[1].peak_mem_per_rank[0] for p in plans]
        assert peaks[1] == pytest.approx(peaks[0], rel=1e-9, abs=scores / 2)
    assert any("plan.attention 'eager'" in p for p in collect_problems(w, eager, cluster))
    assert not any("attention" in p for p in collect_problems(w, flash, cluster))
    with pytest.raises(ValueError, match="attention"):
        Plan(attention="sdpa")


def test_eager_attention_runs_every_score_at_gemm_rate_and_moves_them_through_memory():
    """On an H100 preset: the fused core runs the causal half of 4 s q FLOPs per token at attention_efficiency;
    eager runs all of them at gemm_efficiency and writes, softmaxes (reads and writes) and reads the scores."""
    w, m = _llama(seq_len=4096), 4096.0
    k = GpuKernels(sms=132, gemm_efficiency=0.8, attention_efficiency=0.35, memory_bandwidth=3.35e12)
    rate, flops, scores = 989.4e12, 4 * 4096 * 64 * 4096.0, 4096 * 4096 * 4.0  # 4 heads of 16
    fused = _core_seconds(k, w, Plan(), m, Rate(rate, "bfloat16"), 2)
    eager = _core_seconds(k, w, Plan(attention="eager"), m, Rate(rate, "bfloat16"), 2)
    assert fused == pytest.approx(0.5 * flops / (rate * 0.35) + ASSUMED_KERNEL_GAP_S)
    assert eager == pytest.approx(flops / (rate * 0.8) + 4 * scores * 2 / 3.35e12 + 3 * ASSUMED_KERNEL_GAP_S)

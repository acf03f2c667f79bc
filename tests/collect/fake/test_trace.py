"""The fake-tensor tracer (collect.fake): its counter reads what the counting allocator reads, a traced plan's peak is
what the collector measured for it (rows of data/runs, measured here), and at full size it runs in seconds and
moves as the physics says. Each trace runs in a process of its own (it joins a fake process group)."""

import json
import subprocess
import sys
import textwrap

import pytest

from collect import REPO
from collect.launch.pool import LocalPool
from collect.measure.plan import MeasureSettings
from collect.store import ResultStore
from tests.conftest import tiny_spec

# stored plans measured with the counting allocator, one per strategy (experiments/results/fake_vs_real.json holds
# 240 such plans of every family and strategy)
MEASURED = {
    "ddp dp 2": ("cpu-v3", {"sharding": "none", "dp": 2, "tp": 1, "pp": 1}),
    "fsdp_full dp 2": ("cpu-v3", {"sharding": "fsdp_full", "dp": 2, "tp": 1, "pp": 1}),
    "tp 2 with fsdp_grad_op": ("cpu-v3", {"sharding": "fsdp_grad_op", "dp": 1, "tp": 2, "pp": 1}),
    "zero1 dp 2": ("cpu-v3", {"sharding": "zero1", "dp": 2, "tp": 1, "pp": 1}),
    "pp 2 1f1b": ("cpu-v3", {"sharding": "none", "dp": 1, "tp": 1, "pp": 2, "pp_schedule": "1f1b"}),
    # sends waited only at the step's end: what they sent stays alive until then
    "interleaved pp 2, 16 micro-batches": (
        "cpu-v4",
        {"family": "gpt", "pp": 2, "pp_schedule": "interleaved_1f1b", "num_microbatches": 16},
    ),
}


def _trace(spec_json: str, rank: int = 0) -> dict:
    command = [sys.executable, "-m", "collect.fake.trace", spec_json, "--rank", str(rank)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_counter_reads_what_the_counting_allocator_reads():
    """On real tensors, one real run counted both ways at once: the same bytes."""
    code = """
        import json, os, torch, torch.distributed as dist
        from collect.fake.counter import LiveBytes
        from collect.measure.memory import PeakMemory
        from collect.measure.trainer import PlanTrainer
        from tests.conftest import tiny_spec
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
        dist.init_process_group("gloo", rank=0, world_size=1)
        spec = tiny_spec(sharding="fsdp_full", num_microbatches=2, recompute="selective")
        with PeakMemory(torch.device("cpu")) as mem, LiveBytes() as live:
            trainer = PlanTrainer(spec, torch.device("cpu"))
            for _ in range(2):
                trainer.step()
        print(json.dumps({"method": mem.method, "allocator": mem.peak_bytes, "counter": live.peak}))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    if read["method"] != "counting-allocator":
        pytest.skip("no counting allocator here (no compiler): nothing to compare the counter with")
    assert read["counter"] == read["allocator"] > 0


def test_tensors_on_the_meta_device_hold_no_memory():
    """The model is built and parallelised on meta before it is materialised: those tensors cost a real run nothing
    (at Llama-70B's size, tensor parallelism's shards made there, freed only by the garbage collector, had counted a
    whole unsharded copy of the weights: 66.8 GiB traced at tp 2 where 23.3 GiB is the peak)."""
    import torch

    from collect.fake.counter import LiveBytes

    with LiveBytes() as live:
        on_meta = torch.empty(1 << 20, device="meta") * 2
        real = torch.ones(1 << 10) * 2
    assert on_meta.shape == (1 << 20,) and live.peak == 2 * real.nbytes


@pytest.mark.parametrize("name", MEASURED)
def test_a_traced_peak_is_the_measured_one(name):
    from gnn.dataset.rows import row_to_spec

    sweep, fields = MEASURED[name]
    rows = ResultStore(REPO / "data" / "runs" / f"{sweep}.parquet").load()
    rows = rows[(rows["status"] == "ok") & (rows["peak_mem_method"] == "counting-allocator")]
    for key, value in {"family": "llama", **fields}.items():
        rows = rows[rows[key] == value]
    assert len(rows), f"no stored {name} plan to trace"
    row = rows.sort_values("peak_mem_bytes").iloc[len(rows) // 2]  # a middle-sized one of them
    spec, _, _ = row_to_spec(row)
    measured = list(row["peak_mem_bytes_per_rank"])
    stride = len(measured) // int(row["pp"])
    for pp_rank in range(int(row["pp"])):
        traced = _trace(spec.model_dump_json(), pp_rank * stride)["peak_mem_bytes"]
        assert traced == pytest.approx(measured[pp_rank * stride], rel=0.02), (name, pp_rank)


@pytest.mark.distributed
def test_a_mixture_of_experts_routed_evenly_is_traced_at_its_measured_peak():
    """A trace routes every expert the same number of tokens, a real router as its data says (MoE ranks 1.5% apart
    at the median in experiments/results/fake_vs_real.json while they did). Forced even, both run the same counts:
    each expert-parallel rank measures the same peak, and the trace reads it."""
    moe = dict(family="moe", kv_heads=2, experts=4, top_k=2, expert_ffn_hidden=96, force_balanced_routing=True)
    spec = tiny_spec(workload=moe, dp=2, ep=2, sharding="fsdp_full")
    measured = _lowest_of_two_runs(spec)  # routed by the router, the ranks read 2.3% apart
    assert measured[0] == pytest.approx(measured[1], rel=0.01)
    for rank in (0, 1):
        assert _trace(spec.model_dump_json(), rank)["peak_mem_bytes"] == pytest.approx(measured[rank], rel=0.01)


@pytest.mark.distributed
def test_experts_alone_in_their_fsdp_group_are_traced_as_their_backend_reduces_them():
    """With ep = dp the experts' FSDP group is one rank, and FSDP then divides their gradient into a temporary of
    its own size where a divide factor is set: on NCCL, not on gloo. A trace follows the plan's backend, not its fake
    group's (it was 2.5% over this plan, the size of one layer's expert gradients)."""
    moe = dict(
        family="moe", layers=4, hidden=128, heads=4, kv_heads=1, seq_len=64, vocab=512, ffn_hidden=352,
        experts=4, top_k=1, expert_ffn_hidden=256, first_dense_layers=1, force_balanced_routing=True,
    )  # fmt: skip
    spec = tiny_spec(workload=moe, dp=2, ep=2, sharding="fsdp_grad_op", num_microbatches=4)
    measured = _lowest_of_two_runs(spec)[0]
    assert _trace(spec.model_dump_json(), 0)["peak_mem_bytes"] == pytest.approx(measured, rel=0.002)


def _lowest_of_two_runs(spec) -> list[int]:
    """Each of ``spec``'s two ranks' lower peak of two runs: FSDP over gloo holds its collectives' buffers a little
    longer in some runs (42 KB, 1% of a small MoE plan, on one rank in one of six runs seen; gloo's staging copies)."""
    with LocalPool(2, MeasureSettings(warmup_iters=0, timed_iters=1)) as pool:
        results = [pool.run(spec) for _ in range(2)]
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    return [min(r.peak_mem_bytes_per_rank[rank] for r in results) for rank in (0, 1)]


LLAMA_70B_BLOCKS = {  # four blocks of Llama 3.1 70B at full width and sequence
    "family": "llama", "layers": 4, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672,
    "seq_len": 8192, "vocab": 128256, "micro_batch_size": 1, "dtype": "bfloat16",
}  # fmt: skip


def _full_size(world: int, **plan) -> str:
    dp = world // plan.get("tp", 1)
    spec = {
        "workload": {**LLAMA_70B_BLOCKS, "global_batch_size": dp},
        "plan": {"dp": dp, "num_microbatches": 1, **plan},
        "cluster": {"nodes": world // 8, "devices_per_node": 8, "device": "cuda", "device_kind": "h100",
                    "memory_bytes": 80 * 2**30, "backend": "nccl"},
    }  # fmt: skip
    return json.dumps(spec)


def test_full_size_traces_move_as_the_physics_says():
    """FSDP over twice the ranks holds less; full recompute less than none; sequence parallelism less than tp alone,
    and tp 8 with it less than FSDP alone over as many ranks (the weights the model was split into on the meta device
    hold no memory).
    Each at Llama-70B's width and a sequence of 8,192, on a world of 64 or 128 ranks."""
    fsdp = {"sharding": "fsdp_full", "recompute": "full"}
    on_64, on_128 = (_trace(_full_size(w, **fsdp))["peak_mem_bytes"] for w in (64, 128))
    assert on_128 < on_64
    none = _trace(_full_size(64, sharding="fsdp_full", recompute="none"))["peak_mem_bytes"]
    assert on_64 < none
    tp, sp = (_trace(_full_size(64, tp=8, sequence_parallel=s, **fsdp))["peak_mem_bytes"] for s in (False, True))
    assert sp < tp
    assert sp < on_64  # the same weights per rank as FSDP over all 64, and an eighth of the activations


H100_ROWS = REPO / "data" / "memory" / "h100-single-gpu.jsonl"


@pytest.mark.parametrize(
    "key", ['["llama3.2-1b", 4096, 1, "none", {}, ""]', '["llama3.1-8b", 2048, 1, "full", {}, ""]']
)
def test_a_gpu_plan_traced_on_the_cpu_has_its_gpu_peak(key):
    """The H100's torch.cuda.max_memory_allocated for the same plan, read on a lent GPU: one held at the end of the
    forward (the GPU's fused RMSNorm keeps less than the CPU's), one at the optimizer step (the GPU's foreach AdamW
    keeps more)."""
    row = {r["key"]: r for r in map(json.loads, H100_ROWS.read_text().splitlines())}[key]
    traced = _trace(json.dumps(row["spec"]))["peak_mem_bytes"]
    assert traced == pytest.approx(row["max_allocated"], rel=0.01)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_gpu_plan_whose_tp_leaves_plain_tensors_steps_them_one_by_one_at_the_simulated_peak(sequence_parallel):
    """tp without FSDP leaves a gpt's learned positions (and, without sequence parallelism, its norms) plain beside
    the DTensors, which CUDA's default foreach AdamW refuses ('got mixed torch.Tensor and DTensor'): the trainer steps
    them one by one (collect.parallel.dp.build_optimizer), and the simulator prices that step's temporaries so."""
    from gnn.costs.analytic import steps_one_by_one
    from gnn.costs.hardware import hardware_model
    from gnn.sim.plan import simulate_plan

    spec = tiny_spec(tp=2, sequence_parallel=sequence_parallel, workload={"family": "gpt"})
    spec = spec.model_copy(
        update={"cluster": spec.cluster.model_copy(update={"device": "cuda", "device_kind": "h100"})}
    )
    assert steps_one_by_one(spec.workload, spec.plan)
    traced = _trace(spec.model_dump_json())["peak_mem_bytes"]
    _, sim = simulate_plan(spec.workload, spec.plan, spec.cluster, hardware_model("h100-80gb"), {})
    assert sim.peak_mem_bytes == pytest.approx(traced, rel=0.02)

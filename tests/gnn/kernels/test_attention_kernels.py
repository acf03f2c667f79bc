"""Nanotron's kernels against Megatron's and the collector's: attention kernels by framework (a table's own rows
where it timed the kernel, another table of the same GPU die's ratio to torch's own choice where it did not, and
torch's own choice, named as a fallback, where neither did), and Nanotron's fp32 gradient pass."""

import copy
import json

import pytest

from collect.hardware.records import load_hardware
from collect.kernels.table import TABLE_DIR, load_table
from collect.schema import RunSpec, collect_problems, framework_conventions
from gnn.costs.analytic import block_costs
from gnn.costs.gpu import GpuKernels, Rate
from gnn.costs.hardware import HardwareModel
from gnn.graph.build import build_graph
from gnn.sim.simulate import simulate

H100, H200 = load_table("h100-sxm-20261127"), load_table("h200-sxm-20261128")
BF16 = Rate(989.4e12, "bfloat16")
SHAPE = (4096.0, 32.0, 128.0)  # sequence, heads, head dim: a point both tables timed
CAUSAL = 2.0 * SHAPE[0] ** 2 * SHAPE[1] * SHAPE[2]


def _h100_kernels(ratios: bool) -> GpuKernels:
    record = copy.deepcopy(load_hardware("h100-80gb"))
    if not ratios:
        record["kernels"].pop("ratios_from")
    return GpuKernels.of(record, record["memory_bandwidth_bytes_per_s"])


def test_a_table_that_timed_a_kernel_prices_it_from_its_rows():
    for kernel in ("sdpa", "flash2", "cudnn"):
        for backward in (False, True):
            seconds = H200.attention_seconds(CAUSAL, *SHAPE, backward, kernel)
            row = next(r for r in _rows(kernel) if r[:3] == [4096, 32, 128])
            assert seconds == pytest.approx(row[4 if backward else 3])
    # FlashAttention-2 is the slow one on Hopper: about 1.6x torch's own choice (cuDNN's) in the H200's table
    assert H200.attention_ratio("flash2", *SHAPE, False) > 1.3
    assert H200.attention_ratio("cudnn", *SHAPE, False) == pytest.approx(1.0, abs=0.2)


def test_a_table_without_the_kernel_takes_the_ratio_of_a_table_of_the_same_die():
    for backward, phase in ((False, "forward"), (True, "backward")):
        k = _h100_kernels(ratios=True).for_phase(phase)
        flash2 = k.attention_seconds(2 * CAUSAL, BF16, SHAPE, "flash2")
        own = H100.attention_seconds(CAUSAL, *SHAPE, backward)
        assert flash2 == pytest.approx(own * H200.attention_ratio("flash2", *SHAPE, backward))
        assert k.fallbacks == set()


def test_with_no_ratio_at_hand_a_kernel_is_priced_as_torchs_own_choice_and_named():
    k = _h100_kernels(ratios=False)
    assert k.attention_seconds(2 * CAUSAL, BF16, SHAPE, "flash2") == pytest.approx(
        H100.attention_seconds(CAUSAL, *SHAPE, False)
    )
    assert k.fallbacks == {"attention kernel flash2 (priced as torch's own choice)"}


def test_each_framework_runs_its_own_attention_kernel():
    kernels = {f: framework_conventions(f, tp=1)["attention_kernel"] for f in ("torch", "torchtitan", "megatron")}
    kernels |= {
        f: framework_conventions(f, tp=2, sequence_parallel=True)["attention_kernel"] for f in ("nemo", "nanotron")
    }
    assert kernels == {
        "torch": "sdpa",
        "torchtitan": "sdpa",
        "megatron": "cudnn",
        "nemo": "cudnn",
        "nanotron": "flash2",
    }
    # the collector runs torch's own choice alone, and accumulates gradients where they are computed
    spec = _llama1b(num_microbatches=1)
    for kernel, passes in (("flash2", False), ("sdpa", True)):
        plan = spec.plan.model_copy(update={"attention_kernel": kernel, "grad_accumulation_pass": passes})
        refused = " ".join(collect_problems(spec.workload, plan, spec.cluster))
        named = f"plan.attention_kernel {kernel!r}" if kernel != "sdpa" else "plan.grad_accumulation_pass"
        assert named in refused and "predicted only" in refused


def _rows(kernel: str) -> list:
    return json.loads((TABLE_DIR / "h200-sxm-20261128.json").read_text())["attention"][kernel]


def test_nanotrons_gradient_pass_adds_a_read_and_write_of_every_weight_per_micro_batch():
    spec = _llama1b(num_microbatches=4)
    hw = HardwareModel(load_hardware("h100-80gb"))
    step = {}
    for passes in (False, True):
        plan = spec.plan.model_copy(update={"fp32_grads": True, "grad_accumulation_pass": passes})
        step[passes] = simulate(build_graph(spec.workload, plan, spec.cluster, hw)).iter_time_s
    c = block_costs(spec.workload, spec.plan)
    # each block's weights: bf16 gradient and fp32 buffer read, buffer written (10 bytes), at the table's bf16 add
    # (6 bytes an element); the embedding's backward is not a node of its own
    attn, mlp = c.layer_params * c.attn_share, c.layer_params * (1 - c.attn_share)
    add = [H100.elementwise_seconds("add", n * 10 / 6, backward=False) for n in (attn, mlp, c.head_params)]
    assert step[True] - step[False] == pytest.approx(4 * (spec.workload.layers * (add[0] + add[1]) + add[2]), rel=0.01)


def _llama1b(num_microbatches: int):
    w = {"family": "llama", "layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 32, "ffn_hidden": 8192}
    w |= {"seq_len": 4096, "vocab": 131072, "micro_batch_size": 1, "global_batch_size": num_microbatches}
    w |= {"dtype": "bfloat16", "tied_embeddings": True}
    cluster = {"devices_per_node": 1, "memory_bytes": 80 * 2**30, "device": "cuda", "backend": "nccl"}
    plan = {"num_microbatches": num_microbatches}
    return RunSpec.model_validate({"workload": w, "plan": plan, "cluster": cluster})

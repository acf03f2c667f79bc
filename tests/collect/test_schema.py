import random
import threading

import pytest
from pydantic import ValidationError

from collect.schema import Cluster, Plan, RunSpec, Workload, collect_problems
from collect.schema.stages import split_by_weights
from tests.conftest import TINY, tiny_spec


def _raw(plan: dict, world_size: int = 2, **workload) -> dict:
    w = {**TINY, "global_batch_size": 2, **workload}
    return {"workload": w, "plan": plan, "cluster": {"devices_per_node": world_size, "memory_bytes": 2**30}}


def _error(data: dict) -> str:
    with pytest.raises(ValidationError) as info:
        RunSpec.model_validate(data)
    return str(info.value)


def test_valid_spec_and_derived_properties():
    spec = tiny_spec(dp=2, tp=2, pp=2, num_microbatches=2, sharding="fsdp_full")
    assert spec.plan.world_size == 8 == spec.cluster.world_size
    assert spec.plan.tp_enabled and spec.plan.pp_enabled and spec.plan.dp_enabled
    assert spec.plan.pp_schedule == "1f1b"  # the default when pp > 1


@pytest.mark.parametrize(
    "plan, world_size, workload, expected",
    [
        (
            {"dp": 2, "tp": 2},
            2,
            {"global_batch_size": 4},
            "plan.dp (2) * plan.cp (1) * plan.tp (2) * plan.pp (1) = 4 != cluster world size",
        ),
        ({"tp": 3}, 3, {}, "workload.heads (4) must be divisible by plan.tp (3): 4 % 3 = 1"),
        ({"tp": 2}, 2, {"vocab": 129}, "workload.vocab (129) must be divisible by plan.tp (2)"),
        (
            {"pp": 4, "num_microbatches": 4},
            4,
            {"layers": 1, "global_batch_size": 8},
            "workload.layers (1) leaves a pipeline stage empty over plan.pp (4) * plan.virtual_stages (1) = 4 "
            "stages: [0, 1, 1, -1]",
        ),
        (
            {"pp": 2, "pp_schedule": "interleaved_1f1b", "virtual_stages": 4, "num_microbatches": 2},
            2,
            {"layers": 5, "global_batch_size": 4},
            "workload.layers (5) leaves a pipeline stage empty over plan.pp (2) * plan.virtual_stages (4) = 8 "
            "stages: [0, 1, 1, 1, 1, 1, 1, -1]",
        ),
        (
            {"dp": 2},
            2,
            {"global_batch_size": 6},
            "workload.global_batch_size (6) != plan.dp (2) * workload.micro_batch_size (2) * "
            "plan.num_microbatches (1) = 4",
        ),
        (
            {"pp": 2, "pp_schedule": "interleaved_1f1b", "virtual_stages": 1, "num_microbatches": 2},
            2,
            {"global_batch_size": 4},
            "needs plan.virtual_stages >= 2",
        ),
        (
            {"pp": 2, "pp_schedule": "interleaved_1f1b", "virtual_stages": 2, "num_microbatches": 3},
            2,
            {"layers": 4, "global_batch_size": 6},
            "num_microbatches (3) divisible by plan.pp (2)",
        ),
        (
            {"dp": 2, "pp_schedule": "gpipe"},
            2,
            {"global_batch_size": 4},
            "plan.pp_schedule ('gpipe') needs plan.pp > 1",
        ),
        ({"dp": 2, "virtual_stages": 2}, 2, {"global_batch_size": 4}, "plan.virtual_stages (2) needs plan.pp > 1"),
        (
            {"tp": 2, "sequence_parallel": True},
            2,
            {"seq_len": 31},
            "workload.seq_len (31) must be divisible by plan.tp (2)",
        ),
        ({"dp": 2, "sequence_parallel": True}, 2, {"global_batch_size": 4}, "plan.sequence_parallel needs plan.tp > 1"),
    ],
)
def test_impossible_combinations_name_fields_and_arithmetic(plan, world_size, workload, expected):
    assert expected in _error(_raw(plan, world_size, **workload))


@pytest.mark.parametrize(
    "plan, world_size, workload, reason",
    [
        ({"dp": 2, "tp": 2}, 4, {"global_batch_size": 4}, "DistributedDataParallel cannot hold DTensor parameters"),
        ({"tp": 2, "sharding": "zero1"}, 2, {}, "ZeroRedundancyOptimizer cannot hold DTensor parameters"),
        ({"pp": 2}, 2, {}, "plan.num_microbatches (1) < plan.pp (2) is predicted only"),
        (
            {"tp": 2, "pp": 2, "num_microbatches": 2, "loss_parallel": True},
            4,
            {"global_batch_size": 4},
            "plan.loss_parallel with plan.tp (2) and plan.pp (2) is predicted only",
        ),
    ],
)
def test_megatron_plans_torch_cannot_run_are_predicted_but_not_collected(plan, world_size, workload, reason):
    """Megatron's DDP and distributed optimizer with TP, a 1F1B pipeline that never fills, and its vocab-parallel
    loss in a pipeline: valid plans."""
    spec = RunSpec.model_validate(_raw(plan, world_size, **workload))
    (problem,) = collect_problems(spec.workload, spec.plan, spec.cluster)
    assert reason in problem


@pytest.mark.parametrize(
    "layers, pp, virtual, expected",
    [
        (8, 4, 1, (2, 2, 2, 2)),  # even: Megatron's default and what the collector ran
        (126, 16, 1, (7,) + (8,) * 14 + (7,)),  # Llama 3 405B: embedding and loss count as a layer each
        (30, 4, 1, (7, 8, 8, 7)),  # 32 slots, 8 each
        (29, 4, 1, (7, 8, 8, 6)),  # 31 slots: the leftover 3 go to the earliest stages
        (6, 2, 2, (1, 2, 2, 1)),  # virtual stages count as stages
        (28, 16, 1, (1,) + (2,) * 13 + (1, 0)),  # the last stage holds only the head and the loss
    ],
)
def test_uneven_layers_are_assigned_to_stages_as_megatron_and_torchtitan_do(layers, pp, virtual, expected):
    plan = Plan(pp=pp, virtual_stages=virtual, pp_schedule="interleaved_1f1b" if virtual > 1 else "1f1b")
    counts = plan.stage_layers(layers)
    assert counts == expected and sum(counts) == layers


def test_every_problem_is_reported_at_once():
    msg = _error(_raw({"tp": 3}, 2, global_batch_size=6))
    assert "world size" in msg and "heads (4)" in msg and "global_batch_size (6)" in msg


@pytest.mark.parametrize(
    "model, data, field",
    [
        (
            Workload,
            {**TINY, "global_batch_size": 2, "hidden": 66},
            "hidden (66) must be divisible by workload.heads (4)",
        ),
        (Workload, {**TINY, "global_batch_size": 2, "layers": 0}, "layers"),
        (Workload, {**TINY, "global_batch_size": 2, "dtype": "float8"}, "dtype"),
        (Plan, {"dp": 1, "sharding": "zero3"}, "sharding"),
        (Plan, {"dp": 1, "recompute": "some"}, "recompute"),
        (Plan, {"dp": 1, "dpp": 2}, "dpp"),  # typo: extra fields are rejected by name
        (Cluster, {"devices_per_node": 1, "memory_bytes": 1, "backend": "nccl"}, "backend 'nccl' needs device 'cuda'"),
        (Cluster, {"devices_per_node": 1, "memory_bytes": 0}, "memory_bytes"),
    ],
)
def test_field_rules(model, data, field):
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    assert field in str(info.value)


def test_float16_on_cpu_is_rejected():
    assert "float16" in _error(_raw({"dp": 2}, 2, dtype="float16", global_batch_size=4))


def test_run_id_is_stable_and_content_addressed():
    a, b = tiny_spec(dp=2), tiny_spec(dp=2)
    assert a.run_id == b.run_id and len(a.run_id) == 16
    assert tiny_spec(dp=2, sharding="fsdp_full").run_id != a.run_id
    assert tiny_spec(dp=2, memory_bytes=2**20).run_id != a.run_id
    # survives a JSON round trip (what crosses process boundaries and files)
    assert RunSpec.model_validate_json(a.model_dump_json()).run_id == a.run_id


def test_num_params_matches_the_model():
    import torch

    from collect.workloads.gpt import GPT

    w = tiny_spec(dp=1).workload
    with torch.device("meta"):
        model = GPT(w)
    assert sum(p.numel() for p in model.parameters()) == w.num_params


# --- Nanotron's split by weights, computed stage by stage, gives what its layer-by-layer loop gives ---


def _nanotron_loop(layers: int, layer_cost: int, head_cost: int, stages: int) -> tuple[int, ...]:
    """Nanotron's build_model as it is written: one layer at a time."""
    total = layers * layer_cost + head_cost
    counts, stage, running = [0] * stages, 0, 0
    for _ in range(layers):
        counts[stage] += 1
        running += layer_cost
        if running > total * ((stage + 1) / stages):
            stage += 1
    return tuple(counts)


def test_the_closed_form_matches_the_loop_on_random_and_tied_shapes():
    rng = random.Random(0)
    cases = [(16, 100, 0, 4), (16, 100, 400, 4), (32, 7, 7, 8), (1, 5, 5, 1), (3, 10, 10**6, 8)]
    for _ in range(3000):
        cases.append(
            (
                rng.randint(1, 300),
                rng.choice([1, 3, 7, 10**6, rng.randint(1, 10**9)]),
                rng.randint(0, 10**10),
                rng.randint(1, 64),
            )
        )
    for case in cases:
        assert split_by_weights(*case) == _nanotron_loop(*case), case


def test_a_huge_layer_count_is_split_without_walking_its_layers():
    # 10^15 layers: a walk over them would not end in this test's lifetime, whatever the machine
    plan, result = Plan(pp=8, pipeline_split="weights"), []
    worker = threading.Thread(target=lambda: result.append(plan.stage_layers(10**15, (1000, 5000))), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert result, "the split walked the layers"
    assert sum(result[0]) == 10**15 and len(result[0]) == 8


def test_the_convention_table_has_a_column_per_framework_and_a_row_per_convention_a_framework_sets():
    from collect.schema import CONVENTIONS, FRAMEWORKS, Plan, framework_conventions
    from collect.schema.choices import CONVENTION_TABLE, TABLE_FRAMEWORKS

    assert sorted(TABLE_FRAMEWORKS) == sorted(FRAMEWORKS)
    assert all(len(values) == len(TABLE_FRAMEWORKS) for _, values in CONVENTION_TABLE.values())
    # the rest are the workload's or the plan's own choice, not a framework's default
    assert set(CONVENTIONS) - set(CONVENTION_TABLE) == {"attention", "optimizer_state_dtype", "moe_dispatcher"}
    # the collector's column: every default of the Plan's fields
    torch = framework_conventions("torch", 8, True, "bfloat16", "tensorwise")
    assert torch == {name: Plan.model_fields[name].default for name in CONVENTION_TABLE}

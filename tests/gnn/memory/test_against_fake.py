"""The simulator against every full-size fake trace in data/fake (collect.fake: the collector's own code at 8B-671B
on up to 16,384 ranks), before any learning: issue 53 asks a median within 3% and a p90 within 8% per family."""

import numpy as np
import pytest

from collect import REPO
from experiments.memory.simulator_vs_fake import rank_errors, simulated_ranks
from gnn.dataset.rows import load_fake

ROWS = load_fake(REPO / "data" / "fake")


@pytest.fixture(scope="module")
def per_rank():
    assert len(ROWS) >= 50, "data/fake holds the full-size traces (collect/sweeps/fake-*.yaml)"
    return simulated_ranks(ROWS, "h100-80gb")


@pytest.fixture(scope="module")
def errors(per_rank):
    return (per_rank.map(max) / ROWS["peak_mem_bytes"] - 1).abs()


@pytest.mark.parametrize("family", ["llama", "gpt", "moe"])
def test_the_median_plan_of_each_family_is_within_3_percent(errors, family):
    assert np.median(errors[ROWS["family"] == family]) <= 0.03


@pytest.mark.parametrize("family", ["llama", "gpt", "moe"])
def test_nine_plans_in_ten_are_within_8_percent(errors, family):
    assert np.quantile(errors[ROWS["family"] == family], 0.9) <= 0.08


def test_nine_pipelined_plans_in_ten_are_within_8_percent(errors):
    """A pipelined FSDP stage keeps its gradients unsharded (its ep rank's experts, not every data rank's shard of
    them: Qwen3-235B's stages were 19-70% over) and its units gathered as its activations are freed."""
    pipelined = ROWS["pp"] > 1
    assert pipelined.sum() >= 20
    assert np.quantile(errors[pipelined], 0.9) <= 0.08


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b"])
@pytest.mark.parametrize("role", ["first", "middle", "last"])
def test_nine_traced_ranks_in_ten_of_each_schedule_and_role_are_within_10_percent(per_rank, schedule, role):
    """Every traced rank, not only a plan's largest: 1F1B's middle ranks were 40% over at the p90 while their plans'
    largest ranks matched (the sequence shard a stage sends, input gradients held by 1F1B to the step's end)."""
    ranks = rank_errors(ROWS, per_rank)
    ranks = ranks[(ranks["schedule"] == schedule) & (ranks["role"] == role)]
    assert len(ranks) >= 20
    assert np.quantile(ranks["error"].abs(), 0.9) <= 0.10

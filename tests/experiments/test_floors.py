"""The floors under each split's error in the evaluation's records: twins on GPU splits."""

import numpy as np
import pytest

from collect.published import playbook
from experiments import evaluate
from tests.collect.test_published import TWINS


@pytest.fixture
def meta(tmp_path):
    src = tmp_path / "h100_nanotron.csv"
    src.write_text(TWINS)
    rows, _ = playbook.convert(str(src))
    return rows.assign(domain="h100")


def test_a_gpu_split_reports_its_twin_floor_once_it_holds_enough_twins(meta, monkeypatch):
    splits = {"h100/held_out_scale": {"train": np.array([], int), "test": meta.index.to_numpy()}}
    assert evaluate.noise_records(meta, splits) == []  # one pair is below MIN_TWINS
    monkeypatch.setattr(evaluate, "MIN_TWINS", 2)
    (record,) = evaluate.noise_records(meta, splits)
    a, b = meta["iter_time_s"].iloc[:2]
    assert (record["predictor"], record["split"], record["target"], record["n"]) == (
        "twin_floor",
        "held_out_scale",
        "time",
        2,
    )
    assert record["mape"] == pytest.approx(abs(a - b) / (a + b))

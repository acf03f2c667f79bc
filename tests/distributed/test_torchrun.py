"""The cluster path: the same `python -m collect sweep` under torchrun (gloo here, NCCL on GPUs)."""

import subprocess
import sys

import pytest
import yaml

from collect.store import ResultStore

pytestmark = pytest.mark.distributed

SWEEP = {
    "name": "torchrun-test",
    "shapes": [{"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}],
    "world_sizes": [1, 2],
    "micro_batch_sizes": [1],
    "num_microbatches": [1, 2],
    "num_points": 6,
    "repeat_fraction": 0,
    "measure": {"warmup_iters": 0, "timed_iters": 2},
}


def _torchrun(tmp_path, extra=(), command=("collect", "sweep")):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "-m",
        *command,
        str(tmp_path / "sweep.yaml"),
        "--out",
        str(tmp_path / "runs"),
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_sweep_under_torchrun_measures_its_world_size_and_resumes(tmp_path):
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    store = ResultStore(tmp_path / "runs" / "torchrun-test.parquet")
    first = _torchrun(tmp_path, ["--limit", "2"])
    assert first.returncode == 0, first.stderr[-2000:]
    assert len(store.load()) == 2
    # a plan that killed the job last time is recorded as an error, not retried forever
    store.parquet_path.with_suffix(".inflight").write_text("deadbeef-r0")
    second = _torchrun(tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    df = store.load()
    plans = df[df.measurement_id != "deadbeef-r0"]
    assert len(plans) == 3 and (plans.world_size == 2).all() and (plans.status == "ok").all()
    assert df.set_index("measurement_id").loc["deadbeef-r0", "status"] == "error"
    assert "torchrun-test: {'ok': 1" in second.stdout


def test_active_sweep_under_torchrun_rank0_chooses_every_rank_measures(tmp_path):
    active = {**SWEEP, "name": "torchrun-active", "sampler": "active", "budget_runs": 4, "check_runs": 2,
              "seed_runs": 2, "batch_size": 2, "num_microbatches": [1, 2, 4], "micro_batch_sizes": [1, 2]}  # fmt: skip
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(active))
    # no fingerprint under torchrun: plans are priced on a preset (on a GPU cluster, the sweep's device_kind)
    run = _torchrun(tmp_path, ["--hardware-name", "a100-80gb"], command=("gnn.acquire",))
    assert run.returncode == 0, run.stderr[-2000:]
    df = ResultStore(tmp_path / "runs" / "torchrun-active.parquet").load()
    assert df.run_id.is_unique and (df.world_size == 2).all() and (df.status == "ok").all()
    assert df.active_role.value_counts().to_dict() == {"check": 2, "seed": 2, "acquired": 2}
    assert (df.wall_s > 0).all() and "the budget is spent" in run.stdout

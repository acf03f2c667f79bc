"""The fit check: a lower bound of the largest rank's peak refuses what cannot fit, with the arithmetic, and stays
below every peak the collector measured, so no plan it ran, nor any sweep's plan, is refused."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from collect import REPO
from collect.launch.run import SweepRunner
from collect.measure.fits import GiB, WontFit, fit_problems, peak_lower_bound, refuse_unfit
from collect.schema import RunSpec
from collect.sweep import SweepSpec, all_points, sample_points

# 75.5M parameters whose fp32 logits alone are 64 GiB on their one rank: 64 x 4096 x 65536 x 4 B = 2^36 B
HUGE_LOGITS = {
    "workload": {"layers": 2, "hidden": 512, "heads": 8, "seq_len": 4096, "vocab": 65536, "micro_batch_size": 64,
                 "global_batch_size": 64},
    "plan": {},
    "cluster": {"devices_per_node": 1, "memory_bytes": 80 * GiB},
}  # fmt: skip


def test_logits_alone_outgrow_the_machine():
    spec = RunSpec.model_validate(HUGE_LOGITS)
    bound = peak_lower_bound(spec)
    assert bound.logits_bytes == 2**36 and bound.bytes > 2**36
    lines = fit_problems(spec, available_bytes=16 * GiB, ranks_here=1)
    assert "a lower bound" in lines[0]
    assert "micro_batch_size 64 x seq_len 4096 x vocab 65536 x 4 B = 64.00 GiB" in "\n".join(lines)
    assert lines[-1] == "  > this machine's MemAvailable 16.00 GiB / 1 rank here = 16.00 GiB each"
    assert fit_problems(spec, available_bytes=128 * GiB, ranks_here=1) == []  # under its 80 GiB cluster too


def test_the_machine_is_shared_by_the_ranks_that_run_on_it():
    spec = RunSpec.model_validate({**HUGE_LOGITS, "cluster": {"devices_per_node": 1, "memory_bytes": 2**40}})
    assert fit_problems(spec, available_bytes=200 * GiB, ranks_here=1) == []
    assert "/ 4 ranks here = 50.00 GiB each" in fit_problems(spec, available_bytes=200 * GiB, ranks_here=4)[-1]


def test_collect_measure_refuses_before_any_rank_starts(tmp_path):
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({**HUGE_LOGITS, "cluster": {"devices_per_node": 1, "memory_bytes": GiB}}))
    proc = subprocess.run([sys.executable, "-m", "collect", "measure", str(path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: {path}: plan" in proc.stderr and "cannot fit, so nothing is run" in proc.stderr
    assert "> cluster.memory_bytes 1,073,741,824 B (1.00 GiB)" in proc.stderr and "--allow-oom" in proc.stderr


def _measured_rows() -> list[dict]:
    frames = [pd.read_parquet(p) for p in sorted((REPO / "data" / "runs").glob("*.parquet"))]
    rows = pd.concat(frames, ignore_index=True)
    method = rows.get("peak_mem_method", pd.Series(index=rows.index, dtype=object))
    known = method.isin(["counting-allocator", "cuda-max-allocated"]) | (rows["device"] != "cpu")
    return rows[known & rows["peak_mem_bytes"].notna() & (rows["peak_mem_bytes"] > 0)].to_dict("records")


def test_the_bound_is_below_every_measured_peak():
    # lazy: the rows' specs are rebuilt by the dataset's reader, in gnn (the test may import it; collect may not)
    from gnn.dataset.rows import row_to_spec

    rows = _measured_rows()
    assert len(rows) > 1000
    over = [(r["run_id"], peak_lower_bound(row_to_spec(r)[0]).bytes / r["peak_mem_bytes"]) for r in rows]
    assert [(run_id, ratio) for run_id, ratio in over if ratio > 1] == []


@pytest.mark.parametrize("path", sorted((REPO / "collect" / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_no_sweep_plan_is_refused_on_a_4_gib_machine(path: Path):
    spec = SweepSpec.from_yaml(path)
    if spec.device != "cpu":
        pytest.skip("measured on GPUs under torchrun: the machine check is the local pool's")
    points = all_points(spec) if spec.sampler == "active" else sample_points(spec)  # active: every candidate
    if all(p.cluster.device != "cpu" for p in points):
        pytest.skip("explicit GPU plans: measured under torchrun or traced under fake tensors (collect.fake.sweep)")
    assert all(fit_problems(p, 4 * GiB, p.cluster.world_size, cluster=False) == [] for p in points)


def test_refuse_unfit_counts_the_plans_it_refuses():
    spec = RunSpec.model_validate({**HUGE_LOGITS, "cluster": {"devices_per_node": 1, "memory_bytes": GiB}})
    with pytest.raises(WontFit, match=r"cannot fit \(and 1 more of its plans\)"):
        refuse_unfit([spec, spec], "two.json")


def test_a_sweep_refuses_a_plan_no_machine_holds_before_any_rank_starts(tmp_path):
    """A sweep checks this machine only (its small cluster.memory_bytes are the oom labels it measures)."""
    workload = {**HUGE_LOGITS["workload"], "micro_batch_size": 2**16, "global_batch_size": 2**16}  # 64 TiB logits
    huge = RunSpec.model_validate({**HUGE_LOGITS, "workload": workload})
    sweep = SweepSpec(name="huge", points=[huge], repeat_fraction=0)
    with pytest.raises(WontFit, match=f"huge: plan {huge.run_id} cannot fit"):
        SweepRunner(sweep, out_dir=tmp_path, hardware_dir=tmp_path).run()
    assert not list(tmp_path.glob("*.parquet"))

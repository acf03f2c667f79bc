"""A fake-tensor sweep (collect.fake.sweep): rows labelled fake with a peak per pipeline stage and no time, resumable,
and a plan that is not traced in time is a row saying so."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from collect.fake.sweep import FAKE_METHOD, _trace_rank, run_sweep, sampled_counts, stage_ranks, trace_point
from collect.store import ResultStore
from collect.sweep import SweepSpec
from gnn.dataset.rows import load_fake
from tests.conftest import tiny_spec

REPO = Path(__file__).resolve().parents[3]


def _sweep(name: str, *points) -> SweepSpec:
    return SweepSpec(name=name, points=list(points), repeat_fraction=0)


def test_rows_are_fake_peaks_per_stage_and_a_resume_traces_nothing_again(tmp_path):
    pipelined = tiny_spec(pp=2, num_microbatches=2, pp_schedule="1f1b")
    sharded = tiny_spec(dp=2, sharding="fsdp_full", recompute="full")
    spec = _sweep("fake-test", pipelined, sharded)
    first = run_sweep(spec, tmp_path, limit=None, workers=2, timeout_s=600)
    assert first["ok"] == 2
    rows = ResultStore(tmp_path / "fake-test.parquet").load().set_index("run_id")
    assert set(rows["peak_mem_method"]) == {FAKE_METHOD}
    assert rows["iter_time_s"].isna().all()
    stages = rows.loc[pipelined.run_id]
    assert list(stages["traced_ranks"]) == stage_ranks(pipelined) == [0, 1]
    assert stages["peak_mem_bytes"] == max(stages["peak_mem_bytes_per_rank"]) > 0
    assert rows.loc[sharded.run_id, "trace_cpu_s"] > 0
    assert json.loads((tmp_path / "fake-test.sweep.json").read_text())["name"] == "fake-test"
    again = run_sweep(spec, tmp_path, limit=None, workers=1, timeout_s=600)
    assert again["traced"] == 0 and again["skipped_done"] == 2
    second_draw = _sweep("fake-test-2", sharded).model_copy(update={"skip_traced_by": ["fake-test"]})
    skipped = run_sweep(second_draw, tmp_path, limit=None, workers=1, timeout_s=600)
    assert skipped["traced"] == 0 and skipped["traced_elsewhere"] == 2
    unknown = _sweep("fake-test-3", sharded).model_copy(update={"skip_traced_by": ["fake-nothing"]})
    with pytest.raises(SystemExit, match="skip_traced_by names fake-nothing"):
        run_sweep(unknown, tmp_path, limit=None, workers=1, timeout_s=60)


def test_a_row_whose_merging_last_stage_was_read_off_a_line_is_left_out_and_traced_again_first(tmp_path):
    many = tiny_spec(pp=2, num_microbatches=8, pp_schedule="1f1b")
    others = [tiny_spec(dp=2, sharding=sharding) for sharding in ("none", "zero1", "fsdp_full")]
    run_sweep(_sweep("fake-old", many), tmp_path, limit=None, workers=1, timeout_s=600)
    store = ResultStore(tmp_path / "fake-old.parquet")
    store.load().drop(columns="microbatch_line_ranks").to_parquet(store.parquet_path)  # as traced before the fix
    assert load_fake(tmp_path).empty
    # the sweep's seeded order would trace the plan third
    again = run_sweep(_sweep("fake-old", many, *others), tmp_path, limit=1, workers=1, timeout_s=600)
    assert again["traced"] == 1 and list(load_fake(tmp_path)["run_id"]) == [many.run_id]


def test_a_plan_the_collector_does_not_run_as_written_is_an_error_row_not_a_trace(tmp_path):
    point = tiny_spec(dp=2, sharding="fsdp_full", fp32_master_weights=True, workload={"dtype": "bfloat16"})
    summary = run_sweep(_sweep("fake-unrun", point), tmp_path, limit=None, workers=1, timeout_s=600)
    row = ResultStore(tmp_path / "fake-unrun.parquet").load().iloc[0]
    assert summary["error"] == 1 and row["status"] == "error"
    assert "plan.fp32_master_weights: predicted only" in row["error"]


def test_a_plan_not_traced_in_time_is_a_timeout_row(tmp_path):
    point = tiny_spec(dp=2)
    summary = run_sweep(_sweep("fake-slow", point), tmp_path, limit=None, workers=1, timeout_s=0.5)
    assert summary["timeout"] == 1
    row = ResultStore(tmp_path / "fake-slow.parquet").load().iloc[0]
    assert row["status"] == "timeout" and "rank 0: not traced within the plan's time" in row["error"]


MANY_MICROBATCHES = {
    "accumulation": dict(dp=2, num_microbatches=6, sharding="fsdp_full"),
    "gpipe": dict(pp=2, num_microbatches=8, pp_schedule="gpipe"),
    "1f1b": dict(pp=2, num_microbatches=8, pp_schedule="1f1b", recompute="full"),
    "interleaved": dict(pp=2, num_microbatches=12, pp_schedule="interleaved_1f1b", virtual_stages=2),
}


@pytest.mark.parametrize("name", MANY_MICROBATCHES)
def test_peaks_extrapolated_over_microbatches_are_the_whole_traces(name):
    spec = tiny_spec(**MANY_MICROBATCHES[name])
    assert sampled_counts(spec) is not None
    result, extra = trace_point(spec, timeout_s=600)
    whole = [_trace_rank(spec, rank, 600)[0]["peak_mem_bytes"] for rank in extra["traced_ranks"]]
    assert result.peak_mem_bytes_per_rank == pytest.approx(whole, rel=1e-6, abs=64)


def test_a_last_stage_that_merges_its_kept_outputs_is_traced_whole():
    """Its peak moves from the optimizer to the merge (torch.cat of every kept output, beside them) past the sampled
    counts: the line through 3 and 5 micro-batches reads 300.8 MB at 16, the whole trace 303.9 MB."""
    spec = tiny_spec(pp=2, num_microbatches=16, pp_schedule="1f1b", workload={"vocab": 32768})
    result, extra = trace_point(spec, timeout_s=600)
    first, last = extra["traced_ranks"]
    assert extra["traced_microbatches"] == [3, 5] and extra["microbatch_line_ranks"] == [first]
    assert result.peak_mem_bytes_per_rank[1] == _trace_rank(spec, last, 600)[0]["peak_mem_bytes"]


def test_a_deep_pipeline_of_many_microbatches_is_extrapolated_both_ways_to_its_whole_traces():
    spec = tiny_spec(pp=2, num_microbatches=8, pp_schedule="1f1b", workload={"layers": 12})
    result, extra = trace_point(spec, timeout_s=600)
    assert extra["traced_depths"] == [3, 4, 5] and extra["traced_microbatches"] == [3, 5]
    whole = [_trace_rank(spec, rank, 600)[0]["peak_mem_bytes"] for rank in extra["traced_ranks"]]
    assert result.peak_mem_bytes_per_rank == pytest.approx(whole, rel=1e-6, abs=64)


def test_a_trace_told_to_stop_is_killed_and_says_so():
    result, extra = trace_point(tiny_spec(dp=2), timeout_s=600, should_stop=lambda: True)
    assert result.status == "error" and "rank 0: stopped before it was traced" in result.error and extra == {}


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while read
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_a_sweep_killed_mid_trace_kills_its_traces_and_keeps_no_row_for_them(tmp_path):
    point = tiny_spec(dp=2, sharding="fsdp_full")
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(_sweep("fake-killed", point).model_dump(mode="json")))
    command = [sys.executable, "-m", "collect.fake.sweep", str(tmp_path / "sweep.yaml"), "--out", str(tmp_path)]
    sweep = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (traces := _children(sweep.pid)) and time.monotonic() < deadline and sweep.poll() is None:
        time.sleep(0.05)
    assert traces, "the sweep started no trace"
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=60) == 130
    said = sweep.stderr.read()  # the progress bar, then one line: no traceback
    assert "interrupted: every finished plan is stored" in said and "Traceback" not in said
    assert not any(Path(f"/proc/{pid}").exists() for pid in traces)
    assert ResultStore(tmp_path / "fake-killed.parquet").load().empty

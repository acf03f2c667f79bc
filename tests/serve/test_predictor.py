"""The batched predictor: featurisation workers (with the caller featurising chunks itself whenever the worker
is behind) give exactly what featurising inline gives, in plan order."""

import numpy as np
import pytest
import torch

from gnn.costs.hardware import hardware_model
from gnn.dataset.graphs import featurize_spec
from gnn.inference.coverage import RANGED, outside, spec_values, training_range
from gnn.inference.predictor import BatchPredictor
from gnn.inference.workers import CHUNK, KNOWN
from serve.schemas import SearchRequest
from serve.search.space import space_of
from tests.serve.conftest import CLUSTER, REPO, WORKLOAD


def _specs(n: int) -> list:
    request = SearchRequest.model_validate({"workload": WORKLOAD, "cluster": CLUSTER, "micro_batch_sizes": [1, 2]})
    specs = space_of(request).enumerate()
    order = np.random.default_rng(0).permutation(len(specs) * (n // len(specs) + 1)) % len(specs)
    return [specs[i] for i in order[:n]]  # shuffled, so chunks mix pipeline shapes


def test_workers_give_what_inline_gives_in_plan_order(predictor):
    specs = _specs(3 * CHUNK + 7)  # four chunks, the last one short
    inline = predictor.predict_columns(specs, "a100-80gb", workers=0)
    pooled = predictor.predict_columns(specs, "a100-80gb", workers=1)
    assert set(inline) == set(pooled)
    for name in inline:
        if name == "extrapolation":  # a list of lists of phrases
            assert pooled[name] == inline[name]
        else:
            np.testing.assert_array_equal(pooled[name], inline[name], err_msg=name)


def test_featurize_returns_each_plans_own_graph_in_order(predictor):
    specs = _specs(CHUNK + 3)
    hw = hardware_model("a100-80gb", REPO / "data" / "hardware")
    for (graph, flat), spec in zip(predictor.featurize(specs, "a100-80gb", workers=1), specs, strict=True):
        alone, alone_flat = featurize_spec(spec, hw, KNOWN)
        for key in ("x", "edge_index", "edge_attr", "u"):
            assert torch.equal(graph[key], alone[key]), key
        assert flat == alone_flat


def test_chunks_are_handed_out_from_both_ends_each_exactly_once():
    import threading

    from gnn.inference.workers import _Ends

    ends, taken = _Ends(1000), {"front": [], "back": []}

    def take(side):
        while (index := getattr(ends, f"take_{side}")()) is not None:
            taken[side].append(index)

    threads = [threading.Thread(target=take, args=(side,)) for side in ("front", "back")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken["front"] + taken["back"]) == list(range(1000))
    assert taken["front"] == sorted(taken["front"]) and taken["back"] == sorted(taken["back"], reverse=True)
    assert ends.take_front() is None and ends.take_back() is None


def test_a_failing_chunk_raises_in_the_caller_and_the_workers_stay_usable(predictor):
    import pytest

    specs = _specs(2 * CHUNK + 1)
    broken = specs[CHUNK + 3].model_copy(update={"workload": specs[0].workload.model_copy(update={"vocab": 0})})
    with pytest.raises(ValueError, match="math domain error"):  # vocab 0, which no schema passes, in chunk 2
        predictor.predict_columns(specs[: CHUNK + 3] + [broken] + specs[CHUNK + 4 :], "a100-80gb", workers=1)
    again = predictor.predict_columns(specs, "a100-80gb", workers=1)
    assert np.isfinite(again["iter_time_s"]).all()


def test_an_unknown_hardware_name_fails_in_the_caller_naming_where_it_looked(predictor):
    import pytest

    with pytest.raises(ValueError, match="no fingerprint no-such-hardware.json in data/hardware"):
        predictor.predict_columns(_specs(3), "no-such-hardware", workers=1)


def test_workers_end_when_the_process_that_started_them_is_killed(predictor_path):
    """A service killed without running its exit handlers (SIGKILL, a crash; uvicorn re-raises SIGTERM too)
    must not leave its featurisation workers running."""
    import os
    import subprocess
    import sys
    import time

    script = (
        "import os, signal\n"
        "from gnn.inference.predictor import BatchPredictor\n"
        "if __name__ == '__main__':  # forkserver workers import this file again\n"
        f"    p = BatchPredictor.load({str(predictor_path)!r})\n"
        "    p.start_workers(1)\n"
        "    print(*p.pool._pool._processes, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    path = predictor_path.parent / "start_and_die.py"
    path.write_text(script)
    out = subprocess.run([sys.executable, str(path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in out.stdout.split()]
    assert pids, out.stderr

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # an exited child of a dead parent may linger as a zombie until init reaps it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"

    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids), f"workers {pids} outlived their parent"


RANGES = {
    "a100": {
        "runs": 10,
        **{k: [1.0, 8.0] for k in ("micro_batch_size", "world_size", "dp", "tp", "pp")},
        "num_params": [2.5e8, 1.4e9],
        "layers": [12.0, 24.0],
        "hidden": [1024.0, 2048.0],
        "seq_len": [1024.0, 1024.0],
        "family": ["gpt"],
    }
}


def test_extrapolation_names_each_quantity_outside_the_trained_range_and_an_unseen_gpu():
    inside = {"num_params": 3e8, "layers": 12, "hidden": 1024, "seq_len": 1024, "family": "gpt"}
    inside |= {k: 2 for k in ("micro_batch_size", "world_size", "dp", "tp", "pp")}
    assert outside(inside, "a100", RANGES) == []
    assert outside(inside | {"hidden": 8192, "seq_len": 512, "family": "llama"}, "a100", RANGES) == [
        "hidden 8.19e+03 above the largest trained on a100, 2.05e+03",
        "seq_len 512 below the smallest trained on a100, 1.02e+03",
        "family llama never trained on a100 (trained: gpt)",
    ]
    assert outside(inside, "h100", RANGES) == ["hardware h100: no training runs on it (trained on a100)"]


def test_training_range_is_taken_per_domain_from_the_rows_and_their_parameter_count(vtrain_dataset):
    rows = vtrain_dataset.meta
    ranges = training_range(rows)
    assert set(ranges) == {"a100"} and ranges["a100"]["runs"] == len(rows)
    assert ranges["a100"]["hidden"] == [rows["hidden"].min(), rows["hidden"].max()]
    # vTrain's rows leave num_params out: it comes from the graph feature, which every row has
    lo, hi = ranges["a100"]["num_params"]
    assert 1e8 < lo < hi < 1e10 and all(np.isfinite(ranges["a100"][k]).all() for k in RANGED)


def test_memory_has_its_own_range_over_the_rows_that_measured_a_peak(vtrain_dataset):
    rows = vtrain_dataset.meta.assign(peak_mem_bytes=np.nan)  # vTrain's rows measure time alone
    assert training_range(rows)["a100"]["memory"] == {"runs": 0}
    narrow = rows["hidden"] <= rows["hidden"].median()
    rows.loc[narrow, "peak_mem_bytes"] = 1e9
    memory = training_range(rows)["a100"]["memory"]
    assert memory["runs"] == narrow.sum() < len(rows)
    assert memory["hidden"] == [rows["hidden"].min(), rows.loc[narrow, "hidden"].max()]


def test_memory_phrases_name_what_lies_outside_only_the_rows_with_a_measured_peak():
    inside = {"num_params": 3e8, "layers": 12, "hidden": 2048, "seq_len": 1024, "family": "gpt"}
    inside |= {k: 2 for k in ("micro_batch_size", "world_size", "dp", "tp", "pp")}
    memory = RANGES["a100"] | {"runs": 4, "hidden": [1024.0, 1024.0]}
    ranges = {"a100": RANGES["a100"] | {"memory": memory}}
    assert outside(inside, "a100", ranges) == [
        "peak memory: hidden 2.05e+03 above the largest with a measured peak on a100, 1.02e+03"
    ]
    # a quantity outside every training row is named once, for time and memory alike
    assert outside(inside | {"hidden": 8192}, "a100", ranges) == [
        "hidden 8.19e+03 above the largest trained on a100, 2.05e+03"
    ]
    ranges = {"a100": RANGES["a100"] | {"memory": {"runs": 0}}, "h100": RANGES["a100"] | {"memory": memory}}
    assert outside(inside, "a100", ranges) == ["peak memory: no training run on a100 measured it (learned on h100)"]


def test_predictions_flag_a_model_larger_than_any_trained_and_a_gpu_never_trained_on(predictor):
    spec = _specs(1)[0]
    assert predictor.predict_columns([spec], "a100-80gb", workers=0)["extrapolation"] == [
        outside_of(predictor, spec, "a100")
    ]
    big = spec.model_copy(update={"workload": spec.workload.model_copy(update={"layers": 96, "hidden": 8192})})
    flagged = predictor.predict_columns([big], "a100-80gb", workers=0)["extrapolation"][0]
    assert [f.split(" ")[0] for f in flagged][:3] == ["num_params", "layers", "hidden"]
    other = predictor.predict_columns([spec], "h100-80gb", workers=0)["extrapolation"][0]
    assert other == ["hardware h100: no training runs on it (trained on a100)"]


def outside_of(predictor, spec, domain: str) -> list[str]:
    return outside(spec_values(spec), domain, predictor.info["trained_range"])


def test_a_model_saved_without_its_training_range_claims_nothing(predictor):
    bare = BatchPredictor(predictor.ensemble, predictor.hardware_dir, {"name": "old"})
    assert bare.predict_columns(_specs(2), "a100-80gb", workers=0)["extrapolation"] == [None, None]


def test_oom_risk_reads_the_memory_interval_as_a_log_normal_error():
    from gnn.inference.predictor import oom_risk

    point, cap = np.array([50.0, 80.0, 50.0, 90.0, 70.0]), np.full(5, 80.0)
    hi = np.array([80.0, 100.0, 50.0, 90.0, 79.0])
    risk = oom_risk(point, hi, cap)
    assert risk[0] == pytest.approx(0.1)  # the interval's upper end (its 90th percentile) at capacity
    assert risk[1] == pytest.approx(0.5)  # the point at capacity
    assert risk[2] == 0.0 and risk[3] == 1.0  # no spread: fits or not
    assert risk[4] < 0.1


def test_fits_sets_the_allocated_peak_and_what_a_gpu_adds_beside_the_device_memory(predictor):
    from collect.fake.device import allocatable
    from gnn.inference.predictor import FITS_MAX_RISK, oom_risk

    specs = _specs(4)
    out = predictor.predict_columns(specs, "a100-80gb", workers=0)
    usable = np.array([allocatable(s.cluster.memory_bytes, "cuda") for s in specs])
    assert (usable < out["memory_bytes"]).all()
    assert np.allclose(out["oom_risk"], oom_risk(out["peak_mem_bytes"], out["peak_mem_hi_bytes"], usable))
    assert (out["fits"] == (out["oom_risk"] <= FITS_MAX_RISK)).all()

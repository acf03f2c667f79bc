"""Malformed files handed to the command line: one line naming the file, field and rule, exit status 2."""

import json
import subprocess
import sys

import pytest

from collect.inputs import InputError, load_model, local_problems
from collect.schema import RunSpec

SPEC = {
    "workload": {
        "layers": 2,
        "hidden": 64,
        "heads": 4,
        "seq_len": 16,
        "vocab": 128,
        "micro_batch_size": 2,
        "global_batch_size": 4,
    },
    "plan": {"dp": 2},
    "cluster": {"devices_per_node": 2, "memory_bytes": 2**30},
}
GiB = 2**30


def _with(section: str, **fields) -> dict:
    return {**SPEC, section: {**SPEC[section], **fields}}


@pytest.mark.parametrize(
    "content, says",
    [
        (b"\xff\xfe\x00\x01binary", "is not UTF-8 text (byte 0xff at offset 0)"),
        (json.dumps(SPEC).encode("utf-16"), "is not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"workload": ' + b"1" * 5_000 + b"}", "is not valid JSON"),
        (b'{"workload": ', "is not valid JSON: Expecting value at line 1"),
        (json.dumps(_with("plan", dp="two")).encode(), "plan.dp: Input should be a valid integer"),
        (json.dumps(_with("plan", pp=None)).encode(), "plan.pp: Input should be a valid integer"),
        (json.dumps(_with("plan", tp=[2])).encode(), "plan.tp: Input should be a valid integer"),
        (json.dumps(_with("plan", dp={"x": 1})).encode(), "plan.dp: Input should be a valid integer"),
        (json.dumps(_with("workload", layers=1.5)).encode(), "workload.layers: Input should be a valid integer"),
        (json.dumps([SPEC]).encode(), "is not a valid RunSpec"),
    ],
)
def test_a_malformed_file_is_one_clear_input_error(tmp_path, content, says):
    path = tmp_path / "spec.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as e:
        load_model(path, RunSpec)
    assert str(path) in str(e.value) and says in str(e.value)


def test_what_the_local_pool_cannot_honour_is_named():
    gpu = RunSpec.model_validate(_with("cluster", device="cuda", backend="nccl"))
    assert "the local pool runs CPU ranks over gloo" in local_problems(gpu, memory_bytes=24 * GiB)[0]
    many = RunSpec.model_validate(
        {
            **_with("cluster", devices_per_node=100_000),
            "plan": {"dp": 100_000},
            "workload": {**SPEC["workload"], "global_batch_size": 200_000},
        }
    )
    assert "100000 is over the local pool's limit of 64 ranks" in local_problems(many, memory_bytes=24 * GiB)[0]
    huge = RunSpec.model_validate(_with("workload", layers=10**6, hidden=4096, heads=32))
    assert "over half of this machine's 24.0 GiB" in local_problems(huge, memory_bytes=24 * GiB)[0]
    assert local_problems(RunSpec.model_validate(SPEC), memory_bytes=24 * GiB) == []


@pytest.mark.parametrize("command", [["collect", "measure"], ["serve", "predict"]])
def test_the_commands_exit_2_with_no_traceback(tmp_path, command):
    path = tmp_path / "bad.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    proc = subprocess.run([sys.executable, "-m", *command, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{path} is not UTF-8 text" in proc.stderr


def test_collect_measure_refuses_a_gpu_spec_before_any_rank_starts(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(_with("cluster", device="cuda", backend="nccl")))
    proc = subprocess.run(
        [sys.executable, "-m", "collect", "measure", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "cannot be measured here" in proc.stderr and "Traceback" not in proc.stderr

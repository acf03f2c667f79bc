"""Malformed files handed to the command line: one line naming the file, field and rule, exit status 2."""

import codecs
import json
import subprocess
import sys

import pytest

from collect import REPO
from collect.inputs import InputError, load_model, local_problems
from collect.schema import RunSpec
from collect.sweep import SweepSpec

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
        (b"\x80\xfe\x00\x01binary", "is not UTF-8 text (byte 0x80 at offset 0)"),
        (codecs.BOM_UTF8 + b'{"a": "\xff"}', "is not UTF-8 text (byte 0xff at offset 10)"),
        (codecs.BOM_UTF16_LE + b"{\x00}", "is not UTF-16 text (byte 0x7d at offset 4)"),
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


@pytest.mark.parametrize(
    "encode",
    [
        lambda text: codecs.BOM_UTF8 + text.encode(),  # what Windows editors save as "UTF-8"
        lambda text: text.encode("utf-16"),  # PowerShell's `>`: UTF-16 with its BOM
        lambda text: text.encode("utf-16-be"),
        lambda text: text.encode("utf-32"),
    ],
)
def test_a_spec_file_is_read_in_every_encoding_the_http_service_reads(tmp_path, encode):
    spec, sweep = tmp_path / "spec.json", tmp_path / "sweep.yaml"
    spec.write_bytes(encode(json.dumps(SPEC)))
    assert load_model(spec, RunSpec) == RunSpec.model_validate(SPEC)
    shipped = REPO / "collect" / "sweeps" / "default.yaml"
    sweep.write_bytes(encode(shipped.read_text()))
    assert SweepSpec.from_yaml(sweep) == SweepSpec.from_yaml(shipped)


def test_a_malformed_sweep_file_is_one_clear_input_error(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("name: [\n")
    with pytest.raises(InputError, match=rf"{path} is not valid YAML: expected the node content.* at line 2"):
        SweepSpec.from_yaml(path)
    with pytest.raises(InputError, match="cannot read .*missing.yaml: No such file"):
        SweepSpec.from_yaml(tmp_path / "missing.yaml")


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
    huge = RunSpec.model_validate(_with("workload", layers=10_000, hidden=16384, heads=128))
    assert "over half of this machine's 24.0 GiB" in local_problems(huge, memory_bytes=24 * GiB)[0]
    assert local_problems(RunSpec.model_validate(SPEC), memory_bytes=24 * GiB) == []


@pytest.mark.parametrize("command", [["collect", "measure"], ["serve", "predict"]])
def test_the_commands_exit_2_with_no_traceback(tmp_path, command):
    path = tmp_path / "bad.json"
    path.write_bytes(b"\x80\xfe\x00binary")
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

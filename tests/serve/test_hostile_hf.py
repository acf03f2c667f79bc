"""A workload named by a hostile config.json, over real HTTP and through the command lines: every field
collect.schema.hf reads, given huge, negative, zero, boolean, string, megabyte, list, object and null values
inside an otherwise valid config (tests/collect/test_hf_config.py), is answered, or refused with a short 422
naming it; never a 5xx, a traceback or an answer that echoes megabytes."""

import json
import subprocess
import sys

import pytest

from tests.collect.test_hf_config import CASES, FUZZ_BATCH
from tests.serve.conftest import CLUSTER, REPO
from tests.serve.test_hostile import PLAN, _post_raw

MAX_ERROR_BYTES = 4096
CLI_CASES = ("head_dim=object", "moe_width=0,shared=0", "hidden_act=7 MB string")


def _request(config: dict) -> dict:
    return {"workload": {"hf_config": config, **FUZZ_BATCH}, "cluster": CLUSTER, "plans": [PLAN]}


def test_every_hostile_field_of_a_config_is_answered_or_a_short_422_never_a_5xx(server):
    statuses = {}
    for case, field, config in CASES:
        status, payload = _post_raw(server, "/predict", json.dumps(_request(config)).encode())
        assert status in (200, 422), (case, status, payload[:500])
        assert status == 200 or len(payload) < MAX_ERROR_BYTES, (case, len(payload), payload[:500])
        if case.endswith("=string"):  # no field the module reads takes "x": each refusal names its field
            assert status == 422 and field.encode() in payload, (case, payload[:500])
        statuses[status] = statuses.get(status, 0) + 1
    assert statuses.get(422, 0) > len(CASES) // 2, statuses
    assert server.health()["status"] == "ok"


def _cli(command: list[str], tmp_path, name: str, content: dict) -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(json.dumps(content))
    args = [sys.executable, "-m", *command, str(path)]
    return subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=300)


@pytest.mark.parametrize("case", CLI_CASES)
def test_the_command_lines_refuse_a_hostile_config_in_one_line_and_exit_2(tmp_path, case):
    ((field, config),) = [(f, c) for name, f, c in CASES if name == case]
    workload = ["collect", "workload", "--seq-len", "1024", "--global-batch-size", "16", "--hf-config"]
    for proc in (
        _cli(["serve", "predict"], tmp_path, "spec.json", _request(config)),
        _cli(workload, tmp_path, "config.json", config),
    ):
        header, *problems = proc.stderr.splitlines()
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr[:2000]
        assert header.startswith("error: ") and len(problems) == 1 and field in problems[0], proc.stderr[:2000]
        assert len(proc.stderr) < MAX_ERROR_BYTES

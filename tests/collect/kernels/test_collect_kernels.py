"""`python -m collect kernels` times every section on this machine's CPU (the GPU's code path, a quick grid) and
keeps what it timed when its budget runs out."""

import json
import subprocess
import sys

import pytest
import torch

from collect import REPO
from collect.kernels import ops
from collect.kernels.__main__ import run
from collect.kernels.grid import GRIDS


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernels") / "cpu-quick.json"
    run(out, torch.device("cpu"), "quick", budget_s=120.0)
    return json.loads(out.read_text())


def test_every_section_is_timed_at_every_point_of_the_quick_grid(table):
    g = GRIDS["quick"]
    assert table["id"] == "cpu-quick" and table["source"]["device"] == "cpu"
    assert table["skipped"] == {
        f"attention/{k}": f"torch runs its {k} attention kernel on CUDA only" for k in ("flash2", "cudnn")
    }
    for fmt in ("bfloat16", "float8_tensorwise", "float8_rowwise"):
        assert len(table["gemm"][fmt]) == len(g.gemm_m) * len(g.gemm_kn) ** 2
    assert len(table["attention"]["sdpa"]) == len(g.attention_seq) * len(g.attention_heads) * len(g.head_dims)
    ew = table["elementwise"]["bfloat16"]
    assert {r[0] for r in ew} == {"rms_norm", "swiglu", "add", "rotary", "cross_entropy"}
    for key, by_format in table.items():
        if key in ops.COLUMNS:
            for rows in by_format.values():
                width = len(ops.COLUMNS[key])
                assert rows and all(len(r) == width and all(t > 0 for t in r[-2:]) for r in rows), key


def test_a_gemm_row_is_the_linear_forward_and_its_two_backward_gemms(table):
    m, k, n, forward, dgrad, wgrad = table["gemm"]["bfloat16"][-1]
    assert (m, k, n) == (128, 128, 128) and min(forward, dgrad, wgrad) > 0


def test_a_budget_cut_keeps_what_was_timed_and_says_where_it_stopped(tmp_path):
    out = tmp_path / "cut.json"
    run(out, torch.device("cpu"), "quick", budget_s=1e-3)
    cut = json.loads(out.read_text())
    assert len(cut["gemm"]["bfloat16"]) == 1
    assert cut["skipped"]["gemm/bfloat16"] == "cut at its time share after 1 points"


def test_the_command_line_refuses_a_gpu_it_does_not_have():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = _command_line("--device", "cuda")
    assert done.returncode != 0 and "--device cuda: torch sees no CUDA device here" in done.stderr


def test_sections_retime_only_those_into_the_table_and_keep_the_rest(table, tmp_path):
    out = tmp_path / "cpu-quick.json"
    out.write_text(json.dumps(table))
    run(out, torch.device("cpu"), "quick", budget_s=120.0, only=["attention/sdpa"])
    again = json.loads(out.read_text())
    assert again["gemm"] == table["gemm"] and again["source"] == table["source"]
    assert [r[:3] for r in again["attention"]["sdpa"]] == [r[:3] for r in table["attention"]["sdpa"]]
    assert list(again["section_sources"]) == ["attention/sdpa"]
    assert again["section_sources"]["attention/sdpa"]["device"] == "cpu"


def test_an_unknown_section_is_refused_by_flag():
    done = _command_line("--sections", "attention/fa9")
    assert done.returncode != 0 and "--sections: attention/fa9: not a section" in done.stderr


def _command_line(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "collect", "kernels", "--out", "/tmp/never.json", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO)

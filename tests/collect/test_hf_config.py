"""A model named by its Hugging Face config.json: the public configs in experiments/requests/hf give their published
parameter counts, what the families do not cover is refused by field, and the CLI prints the Workload."""

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from collect import REPO
from collect.schema import Workload

HF = REPO / "experiments" / "requests" / "hf"
BATCH = {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 64}


def _config(name: str) -> dict:
    return json.loads((HF / f"{name}.config.json").read_text())


@pytest.mark.parametrize(
    "name, family, billions, active",
    [
        ("llama-3.1-8b", "llama", 8.03, 8.03),
        ("llama-3.1-70b", "llama", 70.55, 70.55),
        ("mixtral-8x7b", "moe", 46.70, 12.88),
        ("qwen3-30b-a3b", "moe", 30.53, 3.35),  # model card: 30.5B total, 3.3B activated
    ],
)
def test_public_configs_give_their_published_sizes(name, family, billions, active):
    w = Workload.from_hf_config(_config(name), **BATCH)
    assert w.family == family and w.dtype == "bfloat16"
    assert round(w.num_params / 1e9, 2) == billions
    assert round(w.active_params / 1e9, 2) == active


def test_a_request_may_name_its_workload_by_config():
    w = Workload.model_validate({"hf_config": _config("mixtral-8x7b"), **BATCH, "layers": 4})
    assert w.experts == 8 and w.top_k == 2 and w.layers == 4  # a field given beside the config wins


@pytest.mark.parametrize(
    "change, field",
    [
        ({"architectures": ["GPTNeoXForCausalLM"]}, "architectures"),
        ({"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 512}, "kv_lora_rank"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"architectures": ["MistralForCausalLM"], "sliding_window": 2048}, "sliding_window (2048)"),
        ({"num_hidden_layers": "32"}, "'num_hidden_layers' must be a non-negative integer"),
    ],
)
def test_what_the_families_do_not_cover_is_refused_by_field(change, field):
    with pytest.raises(ValidationError, match=field.replace("(", r"\(").replace(")", r"\)")):
        Workload.from_hf_config({**_config("llama-3.1-8b"), **change}, **BATCH)


def _workload_cli(config, seq_len: int, global_batch: int) -> subprocess.CompletedProcess:
    args = ["--hf-config", str(config), "--seq-len", str(seq_len), "--global-batch-size", str(global_batch)]
    return subprocess.run(
        [sys.executable, "-m", "collect", "workload", *args], capture_output=True, text=True, cwd=REPO
    )


def test_the_cli_prints_the_workload_and_its_notes():
    out = _workload_cli(HF / "qwen3-30b-a3b.config.json", 4096, 256)
    printed = json.loads(out.stdout)
    assert printed["family"] == "moe" and printed["experts"] == 128 and printed["head_dim"] == 128
    assert Workload(**printed).num_params == Workload.from_hf_config(_config("qwen3-30b-a3b"), **BATCH).num_params
    assert "q/k RMSNorms are not counted" in out.stderr


def test_the_cli_names_the_field_it_cannot_read(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**_config("llama-3.1-8b"), "num_attention_heads": 30}))
    out = _workload_cli(bad, 64, 8)
    assert out.returncode == 2
    assert "workload.heads (30) must be divisible by workload.kv_heads (8)" in out.stderr

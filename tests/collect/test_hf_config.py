"""A model named by its Hugging Face config.json: the public configs in experiments/requests/hf give their published
parameter counts, what the families do not cover is refused by field, and the CLI prints the Workload. Every field
the module reads, given hostile values inside an otherwise valid config, is read or refused by name in a short
message before any arithmetic on it, never another exception (tests/serve/test_hostile_hf.py sends the same hostile
configs over HTTP and through the command lines)."""

import json
import subprocess
import sys
import tracemalloc

import pytest
from pydantic import ValidationError

from collect import REPO
from collect.hardware.records import UnknownHardware, load_hardware
from collect.schema import Workload
from collect.schema.hf import HFConfigError, hf_fields
from collect.schema.shown import shown

HF = REPO / "experiments" / "requests" / "hf"
BATCH = {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 64}
FUZZ_BATCH = {"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 16}


def _config(name: str) -> dict:
    return json.loads((HF / f"{name}.config.json").read_text())


@pytest.mark.parametrize(
    "name, family, billions, active",
    [
        ("llama-3.1-8b", "llama", 8.03, 8.03),
        ("llama-3.1-70b", "llama", 70.55, 70.55),
        ("mixtral-8x7b", "moe", 46.70, 12.88),
        ("qwen3-30b-a3b", "moe", 30.53, 3.35),  # model card: 30.5B total, 3.3B activated
        ("qwen3-235b-a22b", "moe", 235.09, 22.19),  # model card: 235B total, 22B activated
        ("deepseek-v3", "moe", 671.03, 37.55),  # technical report: 671B total, 37B activated (MTP left out)
        ("kimi-k2", "moe", 1026.41, 32.86),  # model card: 1T total, 32B activated
        # model card: 116.83B total, 5.13B active: its count leaves out the input embedding (201,088 x 2,880 =
        # 0.58B) and counts the biases and sinks this family does not (0.04B)
        ("gpt-oss-120b", "moe", 116.79, 5.71),
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
        ({"architectures": ["DeepseekV4ForCausalLM"]}, "compressed and indexed sparse attention"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"architectures": ["MistralForCausalLM"], "sliding_window": 2048}, "sliding_window (2048)"),
        ({"num_hidden_layers": "32"}, "'num_hidden_layers' must be an integer from 1 to 2\\*\\*31"),
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


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2"])
def test_the_cli_reads_latent_attention_configs(name):
    out = _workload_cli(HF / f"{name}.config.json", 4096, 4096)
    printed = json.loads(out.stdout)
    assert printed["kv_lora_rank"] == 512 and printed["q_lora_rank"] == 1536 and "kv_heads" not in printed
    assert Workload(**printed).num_params == Workload.from_hf_config(_config(name), **BATCH).num_params


def test_the_cli_names_the_field_it_cannot_read(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**_config("llama-3.1-8b"), "num_attention_heads": 30}))
    out = _workload_cli(bad, 64, 8)
    assert out.returncode == 2
    assert "workload.heads (30) must be divisible by workload.kv_heads (8)" in out.stderr


# --- hostile fields ----------------------------------------------------------------------------------------------

HUGE = "x" * (7 * 2**20)  # a field of megabytes: every error quoting it must stay short


QWEN_MOE = _config("qwen3-30b-a3b")
BASES = {
    # windowed attention on, and a window longer than any seq_len here: sliding_window is read and compared
    "llama": {**_config("llama-3.1-8b"), "use_sliding_window": True, "sliding_window": 131072},
    "mixtral": _config("mixtral-8x7b"),
    "qwen_moe": {**QWEN_MOE, "shared_expert_intermediate_size": 1536},  # two shared experts: the division runs
    "deepseek": {  # DeepSeek-V3's layout and latent attention at Qwen3-30B-A3B's widths
        **QWEN_MOE,
        "architectures": ["DeepseekV3ForCausalLM"],
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "num_nextn_predict_layers": 1,
    },
    "gpt_oss": _config("gpt-oss-120b"),
}
# each field the module reads, and the config in which it is read
FIELD_BASES = {
    **dict.fromkeys(
        (
            "architectures",
            "hidden_act",
            "sliding_window",
            "use_sliding_window",
            "num_attention_heads",
            "hidden_size",
            "num_hidden_layers",
            "num_key_value_heads",
            "vocab_size",
            "tie_word_embeddings",
            "head_dim",
            "attention_bias",
            "intermediate_size",
        ),
        "llama",
    ),
    **dict.fromkeys(("num_local_experts", "num_experts_per_tok"), "mixtral"),
    **dict.fromkeys(
        ("num_experts", "moe_intermediate_size", "decoder_sparse_step", "shared_expert_intermediate_size"), "qwen_moe"
    ),
    "mlp_only_layers": "qwen_moe",
    **dict.fromkeys(("n_routed_experts", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq"), "deepseek"),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"), "deepseek"),
    "num_nextn_predict_layers": "deepseek",
    "layer_types": "gpt_oss",
}
HOSTILE = {
    "10**30": 10**30,
    "3e8 float": 3e8,
    "3e8 int": 300_000_000,
    "negative": -1,
    "zero": 0,
    "bool": True,
    "string": "x",
    "7 MB string": HUGE,
    "list": [0],
    "object": {"a": {"b": []}},
    "null": None,
}


def hostile_configs():
    """(case id, field, config.json content) for every field and hostile value, and the combinations of two."""
    for field, base in FIELD_BASES.items():
        for name, value in HOSTILE.items():
            yield f"{field}={name}", field, {**BASES[base], field: value}
    yield "heads=3e8,head_dim=[0]", "head_dim", {**BASES["llama"], "num_attention_heads": 300_000_000, "head_dim": [0]}
    yield "moe_width=0,shared=0", "moe_intermediate_size", {**BASES["qwen_moe"], "moe_intermediate_size": 0}


CASES = list(hostile_configs())


class _Recording(dict):
    """A config.json that remembers which fields were read."""

    def __init__(self, content: dict):
        super().__init__(content)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def test_the_fuzzer_covers_every_field_the_module_reads_where_it_reads_it():
    read = {}
    for name, base in BASES.items():
        config = _Recording(base)
        hf_fields(config, FUZZ_BATCH["seq_len"])
        read[name] = config.read
    assert set().union(*read.values()) == set(FIELD_BASES)
    assert [f for f, base in FIELD_BASES.items() if f not in read[base]] == []


def test_every_base_config_is_valid():
    for config in BASES.values():
        Workload.from_hf_config(config, **FUZZ_BATCH)


@pytest.mark.parametrize("case, field, config", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_field_is_read_or_refused_by_name_in_a_short_message(case, field, config):
    try:
        fields, _notes = hf_fields(config, FUZZ_BATCH["seq_len"])
    except HFConfigError as e:
        assert field in str(e) and len(str(e)) < 1000, str(e)[:2000]
        return
    # read: only integers of bounded size, booleans and the family's name reach the Workload
    assert all(isinstance(v, str) or (isinstance(v, int) and v <= 2**31) for v in fields.values()), fields


@pytest.mark.parametrize(
    "change, says",
    [
        ({"tie_word_embeddings": "no"}, "field 'tie_word_embeddings' must be true or false, got 'no'"),
        ({"use_sliding_window": 1}, "field 'use_sliding_window' must be true or false, got 1"),
        ({"head_dim": {"a": 1}}, "field 'head_dim' must be an integer from 1 to 2**31, got {'a': 1}"),
        ({"num_attention_heads": 10**30}, "field 'num_attention_heads' must be an integer from 1 to 2**31"),
        ({"num_hidden_layers": 0}, "field 'num_hidden_layers' must be an integer from 1 to 2**31, got 0"),
        ({"num_hidden_layers": None}, "field 'num_hidden_layers' must be an integer from 1 to 2**31, got nothing"),
        ({"hidden_act": ["silu"]}, "field 'hidden_act' must be a string, got ['silu']"),
        ({"architectures": "LlamaForCausalLM"}, "field 'architectures' must be a list of strings"),
        ({"architectures": [{"name": 1}]}, "field 'architectures' must be a list of strings"),
        ({"sliding_window": "4096"}, "field 'sliding_window' must be an integer from 0 to 2**31, got '4096'"),
        ({"hidden_act": HUGE}, f"hidden_act 'xxxxxxxxxx{'x' * 49}... ({len(HUGE) + 2} chars)"),
    ],
)
def test_each_rule_is_one_line_naming_field_rule_and_a_short_value(change, says):
    with pytest.raises(HFConfigError) as e:
        hf_fields({**BASES["llama"], **change}, 1024)
    assert says in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 400


def test_a_zero_expert_width_is_refused_before_the_shared_experts_are_divided_by_it():
    with pytest.raises(ValidationError, match="'moe_intermediate_size' must be an integer from 1"):
        Workload.from_hf_config({**BASES["qwen_moe"], "moe_intermediate_size": 0}, **FUZZ_BATCH)


def test_head_dim_is_checked_before_it_is_multiplied():
    """A list times the head count is a list that long: 30 M heads would be 240 MB before the refusal."""
    config = {**BASES["llama"], "num_attention_heads": 30_000_000, "head_dim": [0]}
    tracemalloc.start()
    try:
        with pytest.raises(HFConfigError, match="'head_dim' must be an integer"):
            hf_fields(config, 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_strict_booleans_still_read_their_values():
    assert Workload.from_hf_config({**BASES["llama"], "tie_word_embeddings": True}, **FUZZ_BATCH).tied_embeddings
    assert not Workload.from_hf_config({**BASES["llama"], "tie_word_embeddings": None}, **FUZZ_BATCH).tied_embeddings
    with pytest.raises(ValidationError, match=r"sliding_window \(2048\) is shorter than seq_len \(4096\)"):
        Workload.from_hf_config({**BASES["llama"], "sliding_window": 2048}, **{**FUZZ_BATCH, "seq_len": 4096})


def test_shown_cuts_a_long_value_and_says_how_long_it_was():
    assert shown("abc") == "'abc'" and shown([1, 2]) == "[1, 2]"
    assert shown("x" * 1000) == "'" + "x" * 59 + "... (1002 chars)"
    assert shown(10**5000).startswith("<an integer of ")  # past str()'s digit limit: no ValueError
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    assert "nested too deeply" in shown(nested)


def test_an_unknown_hardware_name_of_megabytes_is_a_short_error():
    with pytest.raises(UnknownHardware) as e:
        load_hardware(HUGE)
    assert len(str(e.value)) < 1000 and f"({len(HUGE) + 2} chars)" in str(e.value)

"""A Hugging Face ``config.json`` as Workload fields: name a model the way its users do.

Each covered architecture maps its config's fields onto the llama or moe
family. What the family does not describe is refused with the config field
that says so (a non-SwiGLU MLP, sliding windows shorter than the sequence
outside GPT-OSS's per-layer ones, DeepSeek-V4's compressed sparse attention);
what it describes up to a few parameters is accepted and named in the returned
notes (Qwen2's q/k/v biases, Qwen3's q/k norms, GPT-OSS's biases and attention
sinks: under 0.1% of the parameters; DeepSeek-V3's multi-token prediction
layer, which its published 671B leaves out too). DeepSeek-V3's and Kimi-K2's
multi-head latent attention is read into the MLA fields.
"""

from __future__ import annotations

from collect.schema.shown import shown

LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
MOE_ARCHITECTURES = (
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV3ForCausalLM",
    "GptOssForCausalLM",
)
# what no family describes, by the architecture that has it: refused with the reason
NOT_COVERED = {
    "DeepseekV4ForCausalLM": "DeepSeek-V4's attention (compressed and indexed sparse attention, grouped output "
    "projections) and hyper-connections are not in the llama/moe families"
}
# No real model's size comes near 2**31; checked with the type before any arithmetic, since a list or a string
# times a head count is a multi-gigabyte list, and a 10**30 an OverflowError, not a refusal naming the field.
MAX_SIZE = 2**31


class HFConfigError(ValueError):
    """A config.json the families cannot express; the message names the field."""


def hf_fields(config: dict, seq_len: int | None) -> tuple[dict, list[str]]:
    """(Workload fields without the batch, notes on what was approximated) for a config.json's content.

    Every field read is checked for its type and range before it is used: a wrong one is an HFConfigError
    naming it, never another exception."""
    if not isinstance(config, dict):
        raise HFConfigError(f"config.json must hold a JSON object, got a {type(config).__name__}")
    arch = _architecture(config)
    notes: list[str] = []
    _refuse_what_no_family_covers(config, arch, seq_len)
    fields = _attention(config, arch, notes)
    if arch in LLAMA_ARCHITECTURES:
        fields |= {"family": "llama", "ffn_hidden": _int(config, "intermediate_size")}
    else:
        fields |= {"family": "moe", **_experts(config, arch)}
    return fields, notes


def _architecture(config: dict) -> str:
    names = config.get("architectures")
    covered = LLAMA_ARCHITECTURES + MOE_ARCHITECTURES
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        raise HFConfigError(f"config.json field 'architectures' must be a list of strings, got {shown(names)}")
    for name in names or []:
        if name in covered:
            return name
        if name in NOT_COVERED:
            raise HFConfigError(f"config.json architectures {shown(names)}: {NOT_COVERED[name]}")
    raise HFConfigError(
        f"config.json architectures {shown(names or [])} are not covered; plansight reads {', '.join(covered)}"
    )


def _int(config: dict, field: str, default: int | None = None, minimum: int = 1) -> int:
    """An integer field from ``minimum`` to MAX_SIZE; null or absent reads ``default`` (None: required)."""
    value = config.get(field)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_SIZE:
        got = "nothing (the field is required)" if value is None else shown(value)
        raise HFConfigError(f"config.json field {field!r} must be an integer from {minimum} to 2**31, got {got}")
    return value


def _optional_int(config: dict, field: str, minimum: int = 1) -> int | None:
    return None if config.get(field) is None else _int(config, field, minimum=minimum)


def _bool(config: dict, field: str, default: bool) -> bool:
    """Strictly true or false: "no" or 0 would read as whatever truthiness makes of them."""
    value = config.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise HFConfigError(f"config.json field {field!r} must be true or false, got {shown(value)}")
    return value


def _refuse_what_no_family_covers(config: dict, arch: str, seq_len: int | None) -> None:
    act = config.get("hidden_act", "silu")
    if not isinstance(act, str):
        raise HFConfigError(f"config.json field 'hidden_act' must be a string, got {shown(act)}")
    if act != "silu":
        raise HFConfigError(f"config.json hidden_act {shown(act)}: the llama and moe families use SwiGLU (silu)")
    if arch == "GptOssForCausalLM":
        return  # its windows are per layer (_windows)
    window = _optional_int(config, "sliding_window", minimum=0)
    windowed = _bool(config, "use_sliding_window", arch == "MistralForCausalLM")
    if window and seq_len and windowed and window < seq_len:
        raise HFConfigError(
            f"config.json sliding_window ({window}) is shorter than seq_len ({seq_len}): windowed attention is not "
            "in the llama family"
        )


def _attention(config: dict, arch: str, notes: list[str]) -> dict:
    heads = _int(config, "num_attention_heads")
    hidden = _int(config, "hidden_size")
    fields = {
        "layers": _int(config, "num_hidden_layers"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": _int(config, "num_key_value_heads", heads),
        "vocab": _int(config, "vocab_size"),
        "tied_embeddings": _bool(config, "tie_word_embeddings", False),
    }
    if arch == "DeepseekV3ForCausalLM":
        fields |= _latent_attention(config, notes)
        del fields["kv_heads"]  # every head has its own key and value
        return fields
    head_dim = _optional_int(config, "head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        fields["head_dim"] = head_dim
    if arch == "GptOssForCausalLM":
        fields |= _windows(config, fields["layers"])
        notes.append("GPT-OSS's biases, attention sinks and clamped SwiGLU are priced as the moe family's")
    biased = _bool(config, "attention_bias", True)
    if arch.startswith("Qwen2") and biased:
        notes.append("Qwen2's q/k/v biases are not counted (under 0.1% of the parameters)")
    if arch.startswith("Qwen3"):
        notes.append("Qwen3's q/k RMSNorms are not counted (2 x head_dim parameters per layer)")
    return fields


def _latent_attention(config: dict, notes: list[str]) -> dict:
    """Multi-head latent attention's ranks and head widths (DeepSeek-V2/V3, Kimi-K2)."""
    fields = {
        "kv_lora_rank": _int(config, "kv_lora_rank"),
        "qk_rope_head_dim": _int(config, "qk_rope_head_dim"),
        "qk_nope_head_dim": _int(config, "qk_nope_head_dim"),
        "v_head_dim": _int(config, "v_head_dim"),
    }
    q_rank = _optional_int(config, "q_lora_rank")
    if q_rank is not None:
        fields["q_lora_rank"] = q_rank
    if _int(config, "num_nextn_predict_layers", 0, minimum=0):
        notes.append("multi-token prediction layers (num_nextn_predict_layers) are not counted: the main model only")
    return fields


def _windows(config: dict, layers: int) -> dict:
    """GPT-OSS's per-layer attention: layer_types lists each layer's, "sliding_attention" through sliding_window."""
    types = config.get("layer_types")
    if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, str) for t in types):
        raise HFConfigError(
            f"config.json field 'layer_types' must be a list of num_hidden_layers ({layers}) strings, "
            f"got {shown(types)}"
        )
    windowed = sum(t == "sliding_attention" for t in types)
    return {"sliding_window": _int(config, "sliding_window"), "sliding_layers": windowed} if windowed else {}


def _experts(config: dict, arch: str) -> dict:
    if arch in ("MixtralForCausalLM", "GptOssForCausalLM"):
        return {
            "experts": _int(config, "num_local_experts"),
            "top_k": _int(config, "num_experts_per_tok"),
            "expert_ffn_hidden": _int(config, "intermediate_size"),
        }
    if arch == "DeepseekV3ForCausalLM":
        return {
            "experts": _int(config, "n_routed_experts"),
            "top_k": _int(config, "num_experts_per_tok"),
            "expert_ffn_hidden": _int(config, "moe_intermediate_size"),
            "shared_experts": _int(config, "n_shared_experts", 0, minimum=0),
            "first_dense_layers": _int(config, "first_k_dense_replace", 0, minimum=0),
            "moe_every": _int(config, "moe_layer_freq", 1),
            "ffn_hidden": _int(config, "intermediate_size"),
        }
    return _qwen_experts(config)


def _qwen_experts(config: dict) -> dict:
    dense = config.get("mlp_only_layers")
    if dense is not None and not isinstance(dense, list):
        raise HFConfigError(f"config.json field 'mlp_only_layers' must be a list of layer indices, got {shown(dense)}")
    if dense:
        raise HFConfigError(
            f"config.json mlp_only_layers {shown(dense)}: dense layers picked by index are not "
            "expressible; the moe family has leading dense layers and a MoE period (moe_every)"
        )
    width = _int(config, "moe_intermediate_size")
    fields = {
        "experts": _int(config, "num_experts"),
        "top_k": _int(config, "num_experts_per_tok"),
        "expert_ffn_hidden": width,
        "moe_every": _int(config, "decoder_sparse_step", 1),
    }
    if fields["moe_every"] > 1:
        fields["ffn_hidden"] = _int(config, "intermediate_size")
    shared = _int(config, "shared_expert_intermediate_size", 0, minimum=0)
    if shared % width:
        raise HFConfigError(
            f"config.json shared_expert_intermediate_size ({shared}) is not a whole number of experts of "
            f"moe_intermediate_size ({width}): {shared} % {width} = {shared % width}"
        )
    if shared:
        fields["shared_experts"] = shared // width
    return fields

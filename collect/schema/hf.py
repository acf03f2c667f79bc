"""A Hugging Face ``config.json`` as Workload fields: name a model the way its users do.

Each covered architecture maps its config's fields onto the llama or moe
family. What the family does not describe is refused with the config field
that says so (multi-head latent attention, a non-SwiGLU MLP, sliding windows
shorter than the sequence); what it describes up to a few parameters is
accepted and named in the returned notes (Qwen2's q/k/v biases, Qwen3's q/k
norms: under 0.1% of the parameters).
"""

from __future__ import annotations

LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM")


class HFConfigError(ValueError):
    """A config.json the families cannot express; the message names the field."""


def hf_fields(config: dict, seq_len: int | None) -> tuple[dict, list[str]]:
    """(Workload fields without the batch, notes on what was approximated) for a config.json's content."""
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
    names = config.get("architectures") or []
    covered = LLAMA_ARCHITECTURES + MOE_ARCHITECTURES
    for name in names if isinstance(names, list) else []:
        if name in covered:
            return name
    raise HFConfigError(f"config.json architectures {names!r} are not covered; plansight reads {', '.join(covered)}")


def _int(config: dict, field: str, default: int | None = None) -> int:
    value = config.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HFConfigError(f"config.json field {field!r} must be a non-negative integer, got {value!r}")
    return value


def _refuse_what_no_family_covers(config: dict, arch: str, seq_len: int | None) -> None:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise HFConfigError(f"config.json hidden_act {act!r}: the llama and moe families use SwiGLU (silu)")
    if config.get("kv_lora_rank") or config.get("q_lora_rank"):
        raise HFConfigError(
            "config.json kv_lora_rank: multi-head latent attention (DeepSeek-V3) is not in the llama/moe family; "
            "its attention would be priced as grouped-query attention, which it is not"
        )
    window = config.get("sliding_window")
    if window and seq_len and config.get("use_sliding_window", arch == "MistralForCausalLM") and window < seq_len:
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
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        fields["head_dim"] = _int(config, "head_dim")
    if arch.startswith("Qwen2") and config.get("attention_bias", True):
        notes.append("Qwen2's q/k/v biases are not counted (under 0.1% of the parameters)")
    if arch.startswith("Qwen3"):
        notes.append("Qwen3's q/k RMSNorms are not counted (2 x head_dim parameters per layer)")
    return fields


def _experts(config: dict, arch: str) -> dict:
    if arch == "MixtralForCausalLM":
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
            "shared_experts": _int(config, "n_shared_experts", 0),
            "first_dense_layers": _int(config, "first_k_dense_replace", 0),
            "moe_every": _int(config, "moe_layer_freq", 1),
            "ffn_hidden": _int(config, "intermediate_size"),
        }
    return _qwen_experts(config)


def _qwen_experts(config: dict) -> dict:
    if config.get("mlp_only_layers"):
        raise HFConfigError(
            f"config.json mlp_only_layers {config['mlp_only_layers']!r}: dense layers picked by index are not "
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
    shared = _int(config, "shared_expert_intermediate_size", 0)
    if shared % width:
        raise HFConfigError(
            f"config.json shared_expert_intermediate_size ({shared}) is not a whole number of experts of "
            f"moe_intermediate_size ({width}): {shared} % {width} = {shared % width}"
        )
    if shared:
        fields["shared_experts"] = shared // width
    return fields

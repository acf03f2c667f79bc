"""What is trained: a model of one family and its batch.

Three families. ``gpt``: GPT-2 style (multi-head attention, 4h GELU MLP with
biases, LayerNorm, learned positions, untied head), collect.workloads.gpt.
``llama``: grouped-query attention, SwiGLU MLP of its own width, RMSNorm,
rotary positions, no biases, tied or untied embeddings (Llama 3, Mistral,
Qwen). ``moe``: a llama block whose MLP is a mixture of experts on some or all
layers (Mixtral, Qwen3-MoE, DeepSeek-V3 shaped): a linear router picks top_k of
``experts`` SwiGLU experts per token, plus ``shared_experts`` every token goes
through. Routing drops no token; how evenly tokens spread over the experts is
``expert_imbalance`` (1.0: perfectly even, the assumption unless stated).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from collect.schema.attention import AttentionShape, attention_shape, mla_problems, window_problems
from collect.schema.choices import DType, Family, Float8, Strict
from collect.schema.hf import hf_fields

_ATTENTION_FIELDS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "sliding_window",
    "sliding_layers",
)

# Fields that belong to one family only: any other family must leave them unset.
_LLAMA_FIELDS = ("kv_heads", "head_dim", "ffn_hidden", "tied_embeddings", *_ATTENTION_FIELDS)
_MOE_FIELDS = ("experts", "top_k", "expert_ffn_hidden", "shared_experts", "first_dense_layers", "moe_every")
# What a workload may be, far past any model trained today (Llama 3.1 405B: 126 layers, width 16,384, 128 heads,
# 128k tokens of context and vocabulary; DeepSeek-V3: 256 experts), so that no size reaches the arithmetic of a
# check or a graph unbounded: every count a validator or the graph derives from them stays small.
MAX_LAYERS = 10_000
MAX_WIDTH = 2**20
MAX_HEADS = 16_384
MAX_TOKENS = 2**24  # sequence length and vocabulary
MAX_BATCH = 2**30  # samples
MAX_EXPERTS = 65_536
# Fields that came after the GPT family's data was collected (collect.schema.checks keeps its run ids stable)
LATER_FIELDS = (*_LLAMA_FIELDS, *_MOE_FIELDS, "expert_imbalance", "float8", "force_balanced_routing")


class Workload(Strict):
    """A model and its batch."""

    family: Family = "gpt"
    """Model family: gpt, llama or moe (see the module docstring)."""
    layers: int = Field(ge=1, le=MAX_LAYERS)
    """Number of transformer blocks."""
    hidden: int = Field(ge=1, le=MAX_WIDTH)
    """Model width d."""
    heads: int = Field(ge=1, le=MAX_HEADS)
    """Query heads."""
    seq_len: int = Field(ge=1, le=MAX_TOKENS)
    """Tokens per sample."""
    vocab: int = Field(ge=2, le=MAX_TOKENS)
    """Vocabulary size."""
    micro_batch_size: int = Field(ge=1, le=MAX_BATCH)
    """Samples per micro-batch on one data-parallel replica."""
    global_batch_size: int = Field(ge=1, le=MAX_BATCH)
    """Samples per optimizer step over all replicas and micro-batches."""
    dtype: DType = "float32"
    """Parameter and activation dtype."""
    kv_heads: int | None = Field(default=None, ge=1, le=MAX_HEADS)
    """llama/moe: key/value heads (grouped-query attention); unset: as many as heads."""
    head_dim: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """llama/moe: width of one head; unset: hidden / heads."""
    ffn_hidden: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """llama/moe: SwiGLU width of a dense MLP (moe: of its dense layers, if any)."""
    tied_embeddings: bool = False
    """llama/moe: the LM head reuses the token embedding's weight."""
    q_lora_rank: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """llama/moe, multi-head latent attention: rank of the queries' down-projection (DeepSeek-V3: 1,536); unset:
    queries projected from the hidden state directly (DeepSeek-V2-Lite)."""
    kv_lora_rank: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """llama/moe: set, the attention is multi-head latent attention (collect.schema.attention) with a key/value
    latent of this rank (DeepSeek-V3: 512); unset, grouped-query attention."""
    qk_rope_head_dim: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """MLA: the rotary part of each head's query and key (DeepSeek-V3: 64), the key's shared by every head."""
    qk_nope_head_dim: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """MLA: the part of each head's query and key without positions (DeepSeek-V3: 128)."""
    v_head_dim: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """MLA: width of each head's value (DeepSeek-V3: 128)."""
    sliding_window: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """llama/moe: keys a windowed layer's query attends, itself included (GPT-OSS: 128)."""
    sliding_layers: int = Field(default=0, ge=0, le=MAX_LAYERS)
    """llama/moe: how many of the layers attend through sliding_window (GPT-OSS: every other one)."""
    experts: int | None = Field(default=None, ge=1, le=MAX_EXPERTS)
    """moe: routed experts per MoE layer."""
    top_k: int | None = Field(default=None, ge=1, le=MAX_EXPERTS)
    """moe: routed experts each token goes through."""
    expert_ffn_hidden: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """moe: SwiGLU width of one expert."""
    shared_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    """moe: experts of expert_ffn_hidden width every token goes through (DeepSeek style)."""
    first_dense_layers: int = Field(default=0, ge=0, le=MAX_LAYERS)
    """moe: leading layers with a dense MLP instead (DeepSeek-V3: 3)."""
    moe_every: int = Field(default=1, ge=1, le=MAX_LAYERS)
    """moe: after the dense ones, every moe_every-th layer is MoE (1: all; 2: every other)."""
    expert_imbalance: float = Field(default=1.0, ge=1.0, le=MAX_EXPERTS)
    """moe: tokens of the busiest expert-parallel rank over the mean (1.0: routing perfectly even)."""
    force_balanced_routing: bool = False
    """moe: every expert gets the same number of token slots whatever the router scores (Megatron's
    --moe-router-force-load-balancing, a benchmark's setting): the run's token counts do not depend on its data."""
    float8: Float8 = "none"
    """FP8 or FP4 GEMMs, bfloat16 elsewhere: tensorwise or rowwise scaled FP8 (torchao's float8, Transformer
    Engine's current scaling), or block-scaled: mxfp8 (OCP MX: 32-element blocks, E8M0 scales) and nvfp4 (FP4 E2M1
    in 16-element blocks with FP8 E4M3 scales), which only Blackwell's tensor cores run."""

    @model_validator(mode="after")
    def _family_fields(self) -> "Workload":
        problems = _family_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="before")
    @classmethod
    def _from_hf_config(cls, data):
        """``{"hf_config": {config.json's content}, "seq_len": ..., batch fields}``: the fields the config gives,
        in bfloat16 unless dtype is given; fields given beside it win over the config's."""
        if isinstance(data, dict) and "hf_config" in data:
            rest = {k: v for k, v in data.items() if k != "hf_config"}
            seq_len = rest.get("seq_len")
            fields, _notes = hf_fields(data["hf_config"], seq_len if isinstance(seq_len, int) else None)
            data = {**fields, "dtype": "bfloat16", **rest}
        return data

    @classmethod
    def from_hf_config(cls, config: dict, **fields) -> "Workload":
        """The workload of a Hugging Face config.json's content plus seq_len and the batch fields
        (collect.schema.hf says which architectures are covered)."""
        return cls(hf_config=config, **fields)

    # --- derived sizes, one definition each ------------------------------------------------------------------------

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def mlp(self) -> str:
        """The dense MLP: GPT's GELU over 4 hidden, or a SwiGLU of ffn_hidden (llama's, and moe's dense layers)."""
        return "gelu" if self.family == "gpt" else "swiglu"

    @property
    def position_params(self) -> int:
        """Learned position embeddings (GPT's, seq_len x hidden); rotary positions have none."""
        return self.seq_len * self.hidden if self.family == "gpt" else 0

    @property
    def final_norm_params(self) -> int:
        """The norm before the head: GPT's LayerNorm (weight and bias), else an RMSNorm (weight)."""
        return 2 * self.hidden if self.family == "gpt" else self.hidden

    @property
    def dense_ffn(self) -> int:
        """Width of a dense MLP: 4 hidden for GPT, ffn_hidden otherwise (0: a MoE model without dense layers)."""
        return 4 * self.hidden if self.mlp == "gelu" else self.ffn_hidden or 0

    @property
    def moe_layers(self) -> int:
        """How many of the layers are MoE."""
        return self.moe_layers_in(0, self.layers)

    def moe_layers_in(self, start: int, stop: int) -> int:
        """How many of layers start .. stop - 1 are MoE: after first_dense_layers, every moe_every-th (Qwen's
        decoder_sparse_step convention: the moe_every-th, 2 moe_every-th, ... after them)."""
        if self.family != "moe":
            return 0
        lo, hi = (max(i - self.first_dense_layers, 0) for i in (start, stop))
        return hi // self.moe_every - lo // self.moe_every

    @property
    def attention(self) -> AttentionShape:
        """The attention's widths and weights (GPT's: multi-head attention of the hidden width)."""
        return attention_shape(self)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def pipeline_costs(self) -> tuple[int, int]:
        """A layer's and the head's weight as Nanotron splits a pipeline by them (Plan.pipeline_split 'weights';
        its LlamaForTraining.get_block_compute_costs): 4 d x heads x head_size + 3 d x ffn, and vocab x d."""
        d = self.hidden
        attention = self.attention.params if self.mla else 4 * d * self.heads * self.head_size  # Nanotron has no MLA
        return attention + 3 * d * self.dense_ffn, self.vocab * d

    def layer_params(self, moe: bool) -> int:
        """Parameters of one dense (moe False) or MoE layer."""
        d = self.hidden
        if self.family == "gpt":
            return 12 * d * d + 13 * d  # qkv+proj+mlp weights and biases, two LayerNorms
        attention = self.attention.params
        if not moe:
            return attention + 3 * d * self.dense_ffn + 2 * d  # SwiGLU's three matrices, two RMSNorms
        experts = (self.experts + self.shared_experts) * 3 * d * self.expert_ffn_hidden
        return attention + d * self.experts + experts + 2 * d  # the router is one d x experts matrix

    @property
    def num_params(self) -> int:
        """Exact parameter count of the family's model in collect.workloads."""
        d, v = self.hidden, self.vocab
        moe = self.moe_layers
        blocks = (self.layers - moe) * self.layer_params(False) + (moe * self.layer_params(True) if moe else 0)
        return blocks + (1 if self.tied_embeddings else 2) * v * d + self.position_params + self.final_norm_params

    @property
    def active_params(self) -> int:
        """Parameters one token goes through: the routed experts it is not sent to left out."""
        if self.family != "moe":
            return self.num_params
        return (
            self.num_params - self.moe_layers * (self.experts - self.top_k) * 3 * self.hidden * self.expert_ffn_hidden
        )


def _family_problems(w: Workload) -> list[str]:
    problems = []
    foreign = [f for f in _LLAMA_FIELDS if w.family == "gpt" and _is_set(w, f)]
    routing = ("expert_imbalance", "force_balanced_routing")
    foreign += [f for f in _MOE_FIELDS + routing if w.family != "moe" and _is_set(w, f)]
    problems += [f"workload.{f} is not a field of family {w.family!r}" for f in foreign]
    if w.family != "gpt":
        problems += mla_problems(w) + window_problems(w)
    if w.sliding_layers > w.layers:
        problems.append(f"workload.sliding_layers ({w.sliding_layers}) must be at most workload.layers ({w.layers})")
    if w.head_dim is None and not w.mla and w.hidden % w.heads:
        problems.append(
            f"workload.hidden ({w.hidden}) must be divisible by workload.heads ({w.heads}): "
            f"{w.hidden} % {w.heads} = {w.hidden % w.heads}"
        )
    if w.heads % w.n_kv_heads:
        problems.append(
            f"workload.heads ({w.heads}) must be divisible by workload.kv_heads ({w.n_kv_heads}): "
            f"{w.heads} % {w.n_kv_heads} = {w.heads % w.n_kv_heads}"
        )
    if w.family == "llama" and w.ffn_hidden is None:
        problems.append("workload.ffn_hidden is required for family 'llama' (the SwiGLU width)")
    if w.family == "moe":
        problems += _moe_problems(w)
    if w.float8 != "none" and w.dtype != "bfloat16":
        problems.append(f"workload.float8 ({w.float8!r}) trains in bfloat16 around its FP8 GEMMs: set dtype 'bfloat16'")
    return problems


def _is_set(w: Workload, field: str) -> bool:
    return getattr(w, field) != Workload.model_fields[field].default


def _moe_problems(w: Workload) -> list[str]:
    missing = [f for f in ("experts", "top_k", "expert_ffn_hidden") if getattr(w, f) is None]
    if missing:
        return [f"workload.{f} is required for family 'moe'" for f in missing]
    problems = []
    if w.force_balanced_routing and w.expert_imbalance != 1.0:
        problems.append(
            f"workload.expert_imbalance ({w.expert_imbalance}) must be 1.0 with workload.force_balanced_routing: "
            "every expert gets the same tokens"
        )
    if w.top_k > w.experts:
        problems.append(f"workload.top_k ({w.top_k}) must be at most workload.experts ({w.experts})")
    if w.moe_layers == 0:
        problems.append(
            f"workload has no MoE layer: (layers ({w.layers}) - first_dense_layers ({w.first_dense_layers})) "
            f"// moe_every ({w.moe_every}) = 0"
        )
    if w.moe_layers < w.layers and w.ffn_hidden is None:
        problems.append(
            f"workload.ffn_hidden is required: {w.layers - w.moe_layers} of the {w.layers} layers have a dense MLP"
        )
    return problems

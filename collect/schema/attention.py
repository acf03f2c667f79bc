"""The attention of a llama or moe layer as widths and weights: grouped-query attention or multi-head latent
attention (MLA: DeepSeek-V2/V3/V4, Kimi-K2), and which layers attend through a sliding window.

MLA (DeepSeek-V2 paper, section 2.1; Hugging Face's DeepseekV3Attention) projects the hidden state down to a
query latent of q_lora_rank (or straight to the queries when that is unset) and to a key/value latent of
kv_lora_rank plus one rotary key of qk_rope_head_dim shared by every head; up-projections give each head a
query and key of qk_nope_head_dim + qk_rope_head_dim and a value of v_head_dim. The latents are normalised
(RMSNorm). Under tensor parallelism the down-projections are whole on every rank and the up-projections and the
output projection are split by heads (Megatron-Core's MLA: its down-projections are "duplicated").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionShape:
    """One layer's attention; widths are summed over heads (elements per token)."""

    q: int  # queries, after any up-projection
    k: int  # keys as the core reads them (GQA: the kv heads; MLA: every head's)
    v: int  # values as the core reads them
    out: int  # the core's output, the output projection's input (every query head's value width)
    # the tensor the core's values are a view of, which the values it saves keep whole: the values repeated to every
    # query head (out); MLA's values and unrotated keys come from one up-projection, split, so both (DeepSeek-V3: 2x)
    value_storage: int
    replicated_params: int  # weights every tensor-parallel rank holds whole (MLA's down-projections and norms)
    split_params: int  # weights tensor parallelism splits by heads
    latent: int  # MLA: the latents a token keeps for backward (q_lora_rank + kv_lora_rank + qk_rope_head_dim)
    windowed_layers: int  # layers whose queries attend only the last ``window`` keys
    window: int

    @property
    def params(self) -> int:
        return self.replicated_params + self.split_params

    def core_flops(self, seq_len: int, tp: int, layers: int) -> float:
        """Forward FLOPs of the attention core per token on one tp rank, averaged over the layers: q k^T over
        q's width, and the scores' use over v's width, against every key of the sequence (causal attention
        unhalved, gnn.costs.layers' convention), or against the window's keys where a sliding window is shorter."""
        full = 2 * seq_len * (self.q + self.out) / tp
        windowed = 2 * min(self.window, seq_len) * (self.q + self.out) / tp if self.windowed_layers else full
        share = self.windowed_layers / layers
        return (1 - share) * full + share * windowed


def attention_shape(w) -> AttentionShape:
    """``w``: a collect.schema.Workload (GPT: multi-head attention of the hidden width, as the GQA formula gives)."""
    d, h = w.hidden, w.heads
    window = (w.sliding_layers, w.sliding_window or 0)
    if w.kv_lora_rank is None:
        q, kv = h * w.head_size, w.n_kv_heads * w.head_size
        return AttentionShape(q, kv, kv, q, q, 0, 2 * d * q + 2 * d * kv, 0, *window)
    qk = h * (w.qk_nope_head_dim + w.qk_rope_head_dim)
    v = h * w.v_head_dim
    rope, kv_rank, q_rank = w.qk_rope_head_dim, w.kv_lora_rank, w.q_lora_rank
    down = d * (kv_rank + rope) + kv_rank  # the key/value latent, the shared rotary key, the latent's norm
    up = kv_rank * h * (w.qk_nope_head_dim + w.v_head_dim) + v * d  # keys and values per head, the output
    if q_rank:
        down += d * q_rank + q_rank
        up += q_rank * qk
    else:
        up += d * qk
    storage = h * (w.qk_nope_head_dim + w.v_head_dim)
    return AttentionShape(qk, qk, v, v, storage, down, up, (q_rank or 0) + kv_rank + rope, *window)


def mla_problems(w) -> list[str]:
    """What multi-head latent attention's fields need of each other and of the rest of the workload."""
    mla = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    if w.kv_lora_rank is None:
        given = [f for f in (*mla, "q_lora_rank") if getattr(w, f) is not None]
        says = "is a field of multi-head latent attention: it needs workload.kv_lora_rank"
        return [f"workload.{f} {says}" for f in given]
    problems = [f"workload.{f} is required with workload.kv_lora_rank (multi-head latent attention)" for f in mla]
    problems = [p for f, p in zip(mla, problems) if getattr(w, f) is None]
    for f in ("kv_heads", "head_dim"):
        if getattr(w, f) is not None:
            problems.append(
                f"workload.{f} is not a field of multi-head latent attention: every head has its own key and value "
                "(qk_nope_head_dim, qk_rope_head_dim, v_head_dim)"
            )
    if w.qk_rope_head_dim is not None and w.qk_rope_head_dim % 2:
        problems.append(f"workload.qk_rope_head_dim ({w.qk_rope_head_dim}) must be even: rotary pairs its channels")
    return problems


def window_problems(w) -> list[str]:
    if (w.sliding_window is None) == (w.sliding_layers == 0):
        return []
    return [
        f"workload.sliding_window ({w.sliding_window}) and workload.sliding_layers ({w.sliding_layers}) go "
        "together: a window needs the layers that use it, and windowed layers a window"
    ]

"""A small, clean Llama: grouped-query attention with rotary positions, SwiGLU, RMSNorm, no biases.

Or multi-head latent attention where the workload sets kv_lora_rank (DeepSeek-V2/V3, LatentAttention below): its
projections have names of their own (wq_a, wkv_b, ...) that collect.parallel.tp does not split, which is why
collect.schema.checks leaves MLA with tensor parallelism predicted only.

The ``llama`` family, and the ``moe`` family's model too: its MoE layers swap the SwiGLU MLP for
collect.workloads.moe's mixture of experts. Module names follow the GPT's (embeddings.tok, layers[i].attention.wq,
feed_forward.w1, ...), so the same pipeline split, tensor-parallel plan and checkpointing apply unchanged, as
torchtitan's llama3 and its MoE models share one parallelize.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from collect.schema import Workload
from collect.workloads.gpt import GPT
from collect.workloads.moe import MoE

ROPE_THETA = 500_000.0  # Llama 3's base; the value changes no cost


class Attention(nn.Module):
    def __init__(self, w: Workload):
        super().__init__()
        self.head_dim, self.n_rep = w.head_size, w.heads // w.n_kv_heads
        self.wq = nn.Linear(w.hidden, w.heads * w.head_size, bias=False)
        self.wk = nn.Linear(w.hidden, w.n_kv_heads * w.head_size, bias=False)
        self.wv = nn.Linear(w.hidden, w.n_kv_heads * w.head_size, bias=False)
        self.wo = nn.Linear(w.heads * w.head_size, w.hidden, bias=False)
        self.register_buffer("rope", torch.empty(2, w.seq_len, w.head_size // 2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        # -1, not heads: under tensor parallelism each rank holds heads / tp and kv_heads / tp of them.
        q, k, v = (w(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = _rotate(q, self.rope[:, :seq]), _rotate(k, self.rope[:, :seq])
        # each key/value head serves n_rep query heads (torchtitan's repeat_kv)
        k, v = k.repeat_interleave(self.n_rep, dim=1), v.repeat_interleave(self.n_rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))

    @torch.no_grad()
    def init_rope(self) -> None:
        _fill_rope(self.rope)


class LatentAttention(nn.Module):
    """Multi-head latent attention as Hugging Face's DeepseekV3Attention computes it (no biases): the queries come
    through a normalised latent of q_lora_rank (wq_a, q_norm, wq_b) or straight from x (wq) when that is unset;
    wkv_a gives the key/value latent and one rotary key every head shares; wkv_b gives each head's key part
    without positions and its value. Parameter names and shapes are the ones collect.schema.attention counts."""

    def __init__(self, w: Workload):
        super().__init__()
        self.nope, self.rope_dim, self.v_dim = w.qk_nope_head_dim, w.qk_rope_head_dim, w.v_head_dim
        self.rank, self.q_latent = w.kv_lora_rank, w.q_lora_rank is not None
        qk = self.nope + self.rope_dim
        self.scale = qk**-0.5  # over the whole query width, rotary part included (DeepSeek's softmax_scale)
        if self.q_latent:
            self.wq_a = nn.Linear(w.hidden, w.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(w.q_lora_rank)
            self.wq_b = nn.Linear(w.q_lora_rank, w.heads * qk, bias=False)
        else:
            self.wq = nn.Linear(w.hidden, w.heads * qk, bias=False)
        self.wkv_a = nn.Linear(w.hidden, self.rank + self.rope_dim, bias=False)
        self.kv_norm = nn.RMSNorm(self.rank)
        self.wkv_b = nn.Linear(self.rank, w.heads * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(w.heads * self.v_dim, w.hidden, bias=False)
        # rotary positions only over the qk_rope_head_dim channels
        self.register_buffer("rope", torch.empty(2, w.seq_len, self.rope_dim // 2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        rope = self.rope[:, :seq]
        q = self.wq_b(self.q_norm(self.wq_a(x))) if self.q_latent else self.wq(x)
        q_nope, q_rope = (
            q.view(bsz, seq, -1, self.nope + self.rope_dim).transpose(1, 2).split([self.nope, self.rope_dim], dim=-1)
        )
        latent, k_rope = self.wkv_a(x).split([self.rank, self.rope_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(latent)).view(bsz, seq, -1, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k_rope = _rotate(k_rope.unsqueeze(1), rope)  # one rotary key, broadcast to every head
        q = torch.cat([q_nope, _rotate(q_rope, rope)], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
        # values narrower or wider than queries and keys: SDPA allows v's last dim to differ
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))

    @torch.no_grad()
    def init_rope(self) -> None:
        _fill_rope(self.rope)


def _fill_rope(rope: torch.Tensor) -> None:
    """cos and sin of position x frequency into a (2, seq_len, half) buffer."""
    half = rope.shape[-1]
    freqs = ROPE_THETA ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(rope.shape[1], dtype=torch.float32), freqs)
    rope.copy_(torch.stack([angles.cos(), angles.sin()]))


def _rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotary positions on (batch, heads, seq, head_dim), the two halves of each head rotated as pairs."""
    cos, sin = rope[0].to(x.dtype), rope[1].to(x.dtype)
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden: int, ffn_hidden: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.w2 = nn.Linear(ffn_hidden, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, w: Workload, moe: bool):
        super().__init__()
        self.attention_norm = nn.RMSNorm(w.hidden)
        self.attention = LatentAttention(w) if w.mla else Attention(w)
        self.ffn_norm = nn.RMSNorm(w.hidden)
        self.feed_forward = MoE(w) if moe else FeedForward(w.hidden, w.dense_ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Embeddings(nn.Module):
    """Token embeddings only: positions are rotary, inside attention."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)


def is_moe_layer(w: Workload, index: int) -> bool:
    """After first_dense_layers, every moe_every-th layer (Qwen's decoder_sparse_step convention)."""
    return w.moe_layers_in(index, index + 1) == 1


class Llama(nn.Module):
    def __init__(self, w: Workload):
        super().__init__()
        self.tied = w.tied_embeddings
        self.embeddings: Embeddings | None = Embeddings(w.vocab, w.hidden)
        self.layers = nn.ModuleDict({str(i): Block(w, is_moe_layer(w, i)) for i in range(w.layers)})
        self.norm: nn.RMSNorm | None = nn.RMSNorm(w.hidden)
        self.output: nn.Linear | None = nn.Linear(w.hidden, w.vocab, bias=False)
        self.tie_weights()

    # the same stage-aware pass: embeddings, norm and head may be None on a pipeline stage
    forward = GPT.forward

    def tie_weights(self) -> None:
        """The head reuses the embedding's matrix. Called again by collect.parallel.parallelize wherever a
        parallelism or materialisation replaced the two parameters separately (TP, ``to_empty``); FSDP2 keeps a
        tie it was given."""
        if self.tied and self.embeddings is not None and self.output is not None:
            if self.output.weight is not self.embeddings.tok.weight:
                self.output.weight = self.embeddings.tok.weight

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise after ``to_empty``; works on DTensor shards too."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, (Attention, LatentAttention)):
                module.init_rope()
            elif isinstance(module, MoE):
                module.init_weights()

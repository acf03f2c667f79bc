"""A small, clean GPT: embeddings, pre-norm attention + MLP blocks, LM head.

Written so parallelism can be applied from outside without touching it
(torchtitan's principle): blocks live in a ModuleDict keyed by global index so a
pipeline stage can drop the ones it does not own, embeddings / norm / head may
be None on stages that do not hold them, and attention infers the local head
count from the tensor shape so tensor parallelism can shard heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from collect.schema import Workload


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.head_dim = hidden // heads
        self.wq = nn.Linear(hidden, hidden)
        self.wk = nn.Linear(hidden, hidden)
        self.wv = nn.Linear(hidden, hidden)
        self.wo = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        # -1, not heads: under tensor parallelism each rank holds heads / tp of them.
        q, k, v = (w(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, 4 * hidden)
        self.w2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.attention_norm = nn.LayerNorm(hidden)
        self.attention = Attention(hidden, heads)
        self.ffn_norm = nn.LayerNorm(hidden)
        self.feed_forward = FeedForward(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Embeddings(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, vocab: int, hidden: int, seq_len: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.empty(seq_len, hidden))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens) + self.pos[: tokens.shape[1]]


class GPT(nn.Module):
    def __init__(self, w: Workload):
        super().__init__()
        self.embeddings: Embeddings | None = Embeddings(w.vocab, w.hidden, w.seq_len)
        self.layers = nn.ModuleDict({str(i): Block(w.hidden, w.heads) for i in range(w.layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(w.hidden)
        self.output: nn.Linear | None = nn.Linear(w.hidden, w.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x is token ids on the first pipeline stage and hidden states elsewhere.
        h = self.embeddings(x) if self.embeddings is not None else x
        for block in self.layers.values():
            h = block(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise after ``to_empty`` (GPT-2 style); works on DTensor shards too."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, Embeddings):
                nn.init.normal_(module.pos, std=0.02)


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))

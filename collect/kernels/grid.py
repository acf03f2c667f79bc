"""The shapes a kernel table times. ``full`` spans what one rank of a Llama or MoE plan runs on a GPU (tokens of a
micro-batch x sequence / cp, widths of hidden sizes and their tp shards from 1 to 8, vocabulary shards); pricing
interpolates between its points in log space and holds the efficiency of the edge beyond it. ``quick`` is a few
small points of every kind, for a CPU and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

POW2 = [2**i for i in range(8, 16)]  # 256 .. 32768


@dataclass(frozen=True)
class Grid:
    gemm_m: list[int]  # tokens
    gemm_kn: list[int]  # input and output widths
    attention_seq: list[int]
    attention_heads: list[int]  # query heads on a rank (k and v repeated to them, as the collector's models do)
    head_dims: list[int]
    grouped_experts: list[int]  # experts on a rank
    grouped_tokens: list[int]  # tokens routed to each
    grouped_kn: list[tuple[int, int]]  # (hidden, expert ffn) of the MoE configs people run, and tp shards
    elementwise_tokens: list[int]
    elementwise_widths: list[int]
    vocab_shards: list[int]
    optimizer_params: list[int]
    max_elements: int  # a point whose largest tensor holds more is skipped


GRIDS = {
    "full": Grid(
        gemm_m=POW2,
        gemm_kn=POW2,
        attention_seq=[512, 1024, 2048, 4096, 8192, 16384, 32768],
        attention_heads=[1, 2, 4, 8, 16, 32, 64, 128],
        head_dims=[64, 96, 128],  # 96: Llama 3B-style widths (3072 over 32 heads)
        grouped_experts=[2, 8, 32, 128],
        grouped_tokens=[64, 256, 1024, 4096],
        grouped_kn=[(2048, 768), (4096, 1536), (7168, 2048), (4096, 14336), (4096, 3584), (2880, 2880)],
        elementwise_tokens=[1024, 4096, 16384, 65536],
        elementwise_widths=[1024, 4096, 16384],
        vocab_shards=[4096, 16384, 65536, 131072],
        optimizer_params=[2**20, 2**24, 2**27, 2**29],
        max_elements=2**31,
    ),
    "quick": Grid(
        gemm_m=[32, 128],
        gemm_kn=[32, 128],
        attention_seq=[64, 256],
        attention_heads=[1, 4],
        head_dims=[32],
        grouped_experts=[2, 4],
        grouped_tokens=[16, 64],
        grouped_kn=[(64, 32)],
        elementwise_tokens=[64, 512],
        elementwise_widths=[64, 256],
        vocab_shards=[256, 1024],
        optimizer_params=[2**12, 2**16],
        max_elements=2**24,
    ),
}

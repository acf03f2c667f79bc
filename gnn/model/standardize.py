"""Input standardisation shared by the training network (gnn.model.network) and inference
(gnn.model.fused, which serves its saved tensors)."""

from __future__ import annotations

import torch
from torch import nn


class Standardize(nn.Module):
    """Fixed affine normalisation with statistics from the training graphs, guarded for new inputs.

    A feature constant in training (one sequence length, one vocabulary) carries nothing the model could have
    learned, so it is zeroed rather than divided by ~0: a new value would otherwise arrive as a huge input and
    send the prediction to infinity. Standardised values are clipped for the same reason: outside the data the
    network's correction stays bounded and the physics it corrects keeps the prediction sane.
    """

    CLIP = 10.0
    CONSTANT = 1e-6

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))  # 1 / std, or 0 for a feature constant in training

    def fit(self, values: torch.Tensor) -> None:
        std = values.std(0)
        self.mean.copy_(values.mean(0))
        self.scale.copy_(torch.where(std < self.CONSTANT, torch.zeros_like(std), 1 / std.clamp_min(1e-2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) * self.scale).clamp(-self.CLIP, self.CLIP)

"""Stage 06 reference: the Transformer encoder layer, post-LN as in BERT.

Vaswani et al., "Attention Is All You Need" (2017), sections 3.1 and 3.3: each of the
layer's two sub-layers is wrapped as ``LayerNorm(x + Sublayer(x))`` (the norm after the
residual sum: "post-LN"), and the position-wise feed-forward network is

    FFN(x) = W_2 act(W_1 x + b_1) + b_2

with act = ReLU in the paper and GELU in BERT (Devlin et al., 2019, section 3; Hendrycks &
Gimpel, "Gaussian Error Linear Units", 2016):

    GELU(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))

the exact erf form, as ``torch.nn.functional.gelu(x)`` and transformers' BERT ("gelu")
compute it; the original TensorFlow BERT used the tanh approximation, which differs by up
to ~5e-4 and is not what is graded here.

The attention sub-layer is stage 02's ``MultiHeadAttention``. No dropout anywhere: the
layer is graded in eval mode, where dropout is the identity. Masks are boolean, True =
may attend, broadcastable to (B, h, L, L), e.g. a padding mask (B, 1, 1, L).
Device- and dtype-agnostic; no work at import time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

import reference

multihead = reference.load("02_multihead")


def gelu(x: Tensor) -> Tensor:
    """GELU(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), elementwise, any shape."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = linear2(gelu(linear1(x))): d_model -> d_ff -> d_model, at every position alone."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., d_model) -> (..., d_model)."""
        return self.linear2(gelu(self.linear1(x)))  # (..., d_ff) in between


class TransformerEncoderLayer(nn.Module):
    """One post-LN encoder layer: attention and FFN, each added to the residual stream, then normed."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, eps: float = 1e-12) -> None:
        super().__init__()
        self.attention = multihead.MultiHeadAttention(d_model, num_heads)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.ffn = PositionwiseFeedForward(d_model, d_ff)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x: (B, L, d_model); mask: bool, broadcastable to (B, h, L, L), True = may attend.
        Returns (B, L, d_model)."""
        x = self.norm1(x + self.attention(x, x, x, mask)[0])  # (B, L, d_model)
        x = self.norm2(x + self.ffn(x))  # (B, L, d_model)
        return x

"""Stage 01 reference: scaled dot-product attention.

Vaswani et al., "Attention Is All You Need" (2017), section 3.2.1:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Masks are boolean, True = may attend (the lectures' ``masked_fill(mask == 0, -1e9)``).
Device- and dtype-agnostic; no work at import time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Numerically stable softmax along ``dim``.

    softmax(x)_i = exp(x_i - max(x)) / sum_j exp(x_j - max(x)); subtracting the max
    changes nothing mathematically and keeps every exp() in [0, 1], so inputs of
    magnitude 1e4 stay finite.
    """
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d_k)) v.

    q: (..., Lq, d_k), k: (..., Lk, d_k), v: (..., Lk, d_v),
    mask: bool, broadcastable to (..., Lq, Lk), True = may attend.
    Returns out (..., Lq, d_v) and weights (..., Lq, Lk), each row of weights summing to 1.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., Lq, Lk)
    if mask is not None:
        # The most negative finite value rather than -1e9 (which overflows float16) or
        # -inf (which turns a fully masked row into NaN): exp() of it is exactly 0.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = softmax(scores, dim=-1)  # (..., Lq, Lk)
    return weights @ v, weights  # (..., Lq, d_v), (..., Lq, Lk)


def padding_mask(lengths: Tensor, max_len: int) -> Tensor:
    """True at real tokens, False at padding.

    lengths: (B,) integer tensor. Returns a bool tensor (B, 1, 1, max_len) that broadcasts
    against attention scores (B, h, Lq, Lk).
    """
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    mask = positions < lengths[:, None]  # (B, max_len)
    return mask[:, None, None, :]  # (B, 1, 1, max_len)


def causal_mask(L: int) -> Tensor:
    """True on and below the diagonal: position i may attend to positions j <= i. (L, L)."""
    return torch.ones(L, L, dtype=torch.bool).tril()

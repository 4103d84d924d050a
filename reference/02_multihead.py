"""Stage 02 reference: multi-head attention.

Vaswani et al., "Attention Is All You Need" (2017), section 3.2.2:

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

with d_k = d_v = d_model / h. As in torch.nn.MultiheadAttention and BERT, the h
projections W_i^Q are one d_model x d_model linear layer (``w_q``) whose output is split
into h slices of d_k features: head i reads features [i*d_k, (i+1)*d_k).

Attention itself is stage 01's ``scaled_dot_product_attention``: its leading dimensions
``...`` are (B, h) here. Masks are boolean, True = may attend, broadcastable to
(B, h, Lq, Lk). Device- and dtype-agnostic; no work at import time.
"""

from __future__ import annotations

from torch import Tensor, nn

import reference

attention = reference.load("01_attention")


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, L, d_model) -> (B, h, L, d_k), d_k = d_model // h; head i gets features [i*d_k, (i+1)*d_k)."""
    B, L, d_model = x.shape
    x = x.reshape(B, L, num_heads, d_model // num_heads)  # (B, L, h, d_k)
    return x.transpose(1, 2)  # (B, h, L, d_k)


def merge_heads(x: Tensor) -> Tensor:
    """(B, h, L, d_k) -> (B, L, h * d_k): the inverse of split_heads (Concat(head_1, ..., head_h))."""
    B, h, L, d_k = x.shape
    x = x.transpose(1, 2)  # (B, L, h, d_k): each position's heads side by side
    return x.reshape(B, L, h * d_k)  # (B, L, d_model)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, with sub-modules w_q, w_k, w_v, w_o."""

    def __init__(self, d_model: int, num_heads: int, bias: bool = True) -> None:
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """query: (B, Lq, d_model), key and value: (B, Lk, d_model),
        mask: bool, broadcastable to (B, h, Lq, Lk), True = may attend.
        Returns out (B, Lq, d_model) and the per-head weights (B, h, Lq, Lk)."""
        q = split_heads(self.w_q(query), self.num_heads)  # (B, h, Lq, d_k)
        k = split_heads(self.w_k(key), self.num_heads)  # (B, h, Lk, d_k)
        v = split_heads(self.w_v(value), self.num_heads)  # (B, h, Lk, d_k)
        heads, weights = attention.scaled_dot_product_attention(q, k, v, mask)  # (B, h, Lq, d_k)
        return self.w_o(merge_heads(heads)), weights  # (B, Lq, d_model), (B, h, Lq, Lk)

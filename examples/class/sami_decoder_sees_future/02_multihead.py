"""Assignment 02 - multi-head attention.  Ada L."""
import torch
import torch.nn as nn

from autograder.parts import load_stage

attention = load_stage("01_attention")  # my attention from assignment 01


def split_heads(x, num_heads):
    batch, length, d_model = x.size()
    d_k = d_model // num_heads
    # (B, L, d_model) -> (B, L, h, d_k) -> (B, h, L, d_k)
    return x.view(batch, length, num_heads, d_k).transpose(1, 2)


def merge_heads(x):
    batch, num_heads, length, d_k = x.size()
    # (B, h, L, d_k) -> (B, L, h, d_k) -> (B, L, h * d_k)
    return x.transpose(1, 2).contiguous().view(batch, length, num_heads * d_k)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        assert d_model % num_heads == 0
        self.d_k = d_model // num_heads
        self.h = num_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        # 1) project, then split into h heads of d_k features
        q = split_heads(self.w_q(query), self.h)
        k = split_heads(self.w_k(key), self.h)
        v = split_heads(self.w_v(value), self.h)
        # 2) attention on all heads at once: (B, h) are batch dims for attention
        x, attn = attention.scaled_dot_product_attention(q, k, v, mask)
        # 3) concat and final linear
        return self.w_o(merge_heads(x)), attn


if __name__ == "__main__":
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    out, w = mha(x, x, x)
    print(out.shape, w.shape)

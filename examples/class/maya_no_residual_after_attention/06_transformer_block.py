"""HW 06 encoder layer - Maya"""
import math

import torch
from torch import nn

from autograder.parts import load_stage

mha = load_stage("02_multihead")
MultiHeadAttention = mha.MultiHeadAttention


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        hidden = gelu(self.linear1(x))
        return self.linear2(hidden)


class TransformerEncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, eps=1e-12):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, num_heads)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.ffn = PositionwiseFeedForward(d_model, d_ff)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x, mask=None):
        attn_out, attn_weights = self.attention(x, x, x, mask)
        h = self.norm1(attn_out)  # attention output, normalised
        out = self.norm2(h + self.ffn(h))  # add & norm
        return out

"""Assignment 06 - the encoder layer (post-LN, like BERT).  Ada L."""
import math

import torch
import torch.nn as nn

from autograder.parts import load_stage

MultiHeadAttention = load_stage("02_multihead").MultiHeadAttention  # mine, from assignment 02


def gelu(x):
    # x * Phi(x), Phi = CDF of the standard normal
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(gelu(self.linear1(x)))


class TransformerEncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, eps=1e-12):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, num_heads)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.ffn = PositionwiseFeedForward(d_model, d_ff)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x, mask=None):
        # sublayer 1: self-attention, residual, then norm
        attn_out, _ = self.attention(x, x, x, mask)
        x = self.norm1(x + attn_out)
        # sublayer 2: feed-forward, residual, then norm
        x = self.norm2(x + self.ffn(x))
        return x


if __name__ == "__main__":
    layer = TransformerEncoderLayer(16, 4, 64)
    x = torch.randn(2, 5, 16)
    print(layer(x).shape)

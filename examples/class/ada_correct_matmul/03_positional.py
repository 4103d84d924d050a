"""Stage 03: positional encoding. Ada L., following the lecture (The Annotated Transformer)."""

import math

import torch
from torch import Tensor


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> Tensor:
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def relative_shift_matrix(d_model: int, k: int) -> Tensor:
    # one 2x2 rotation per (sin, cos) pair, by the angle k * w_i
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    blocks = []
    for t in k * div_term:
        c, s = torch.cos(t), torch.sin(t)
        blocks.append(torch.stack([torch.stack([c, s]), torch.stack([-s, c])]))
    return torch.block_diag(*blocks)

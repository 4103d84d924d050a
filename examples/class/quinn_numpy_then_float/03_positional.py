"""Quinn's stage 03: numpy for the table (like DistilBERT), torch for the rotation."""

import numpy as np
import torch


def sinusoidal_positional_encoding(max_len, d_model):
    j = np.arange(d_model)
    position_enc = np.arange(max_len)[:, None] / np.power(10000, 2 * (j // 2) / d_model)
    position_enc[:, 0::2] = np.sin(position_enc[:, 0::2])
    position_enc[:, 1::2] = np.cos(position_enc[:, 1::2])
    return torch.from_numpy(position_enc).float()  # always float32


def relative_shift_matrix(d_model, k):
    even = torch.arange(0, d_model, 2)
    t = k / torch.pow(10000.0, even / d_model)
    m = torch.zeros(d_model, d_model)
    m[even, even] = torch.cos(t)
    m[even, even + 1] = torch.sin(t)
    m[even + 1, even] = -torch.sin(t)
    m[even + 1, even + 1] = torch.cos(t)
    return m

import math

import torch


def sinusoidal_positional_encoding(max_len, d_model):
    # frequencies 1 / 10000^(i / d_model), one per (sin, cos) pair
    i = torch.arange(d_model // 2)
    freqs = 1.0 / (10000 ** (i / d_model))
    angles = torch.arange(max_len)[:, None] * freqs[None, :]
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe


def relative_shift_matrix(d_model, k):
    i = torch.arange(d_model // 2)
    t = k / (10000 ** (i / d_model))
    M = torch.zeros(d_model, d_model)
    M[2 * i, 2 * i] = torch.cos(t)
    M[2 * i, 2 * i + 1] = torch.sin(t)
    M[2 * i + 1, 2 * i] = -torch.sin(t)
    M[2 * i + 1, 2 * i + 1] = torch.cos(t)
    return M


if __name__ == "__main__":
    print(sinusoidal_positional_encoding(4, 8))
    print(math.pi)

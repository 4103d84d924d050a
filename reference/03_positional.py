"""Stage 03 reference: sinusoidal positional encoding.

Vaswani et al., "Attention Is All You Need" (2017), section 3.5:

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

"for any fixed offset k, PE(pos+k) can be represented as a linear function of PE(pos)":
with w_i = 10000^(-2i/d_model), the pair (sin(pos w_i), cos(pos w_i)) moves to
(sin((pos+k) w_i), cos((pos+k) w_i)) by a 2x2 rotation through the angle k w_i, the same
for every pos.

Both functions take only ints, so they return the *default dtype* (what
``torch.get_default_dtype()`` says when they are called) on the default device. bertlab's
choice: the angles and their sines are computed in float64 and cast at the end, so the
expected values are the float64 values correctly rounded; a float32 solution differs by
the rounding of its angles, which the stage's tolerance allows for (see the spec).
No work at import time.
"""

from __future__ import annotations

import torch
from torch import Tensor


def frequencies(d_model: int) -> Tensor:
    """w_i = 1 / 10000^(2i / d_model) for i = 0 .. d_model/2 - 1, in float64. (d_model // 2,).

    A geometric progression from 1 (period 2π) down to 10000^(-(d_model-2)/d_model)
    (period almost 10000·2π).
    """
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model must be even and positive, got {d_model}")
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # 0, 2, 4, ..., d_model - 2
    return 1.0 / 10000.0 ** (two_i / d_model)  # (d_model // 2,)


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos w_i), PE[pos, 2i+1] = cos(pos w_i): sines at even columns,
    cosines at odd columns, interleaved. (max_len, d_model), in the default dtype."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    angles = pos * frequencies(d_model)  # (max_len, d_model // 2)
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = angles.sin()
    pe[:, 1::2] = angles.cos()
    return pe.to(torch.get_default_dtype())  # (max_len, d_model)


def relative_shift_matrix(d_model: int, k: int) -> Tensor:
    """The matrix M with PE[pos + k] = PE[pos] @ M.T for every pos. (d_model, d_model),
    in the default dtype.

    Block diagonal: the 2x2 block of columns (2i, 2i+1) rotates the pair
    (sin a, cos a) to (sin(a + t), cos(a + t)) with t = k w_i:

        sin(a + t) =  cos t · sin a + sin t · cos a
        cos(a + t) = -sin t · sin a + cos t · cos a

    so the block is [[cos t, sin t], [-sin t, cos t]]. Any integer k, negative included:
    M(-k) = M(k).T = M(k)^-1.
    """
    t = k * frequencies(d_model)  # (d_model // 2,) angles of the rotations
    even = torch.arange(0, d_model, 2)  # the sin column of each pair; its cos column is even + 1
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    m[even, even] = t.cos()
    m[even, even + 1] = t.sin()
    m[even + 1, even] = -t.sin()
    m[even + 1, even + 1] = t.cos()
    return m.to(torch.get_default_dtype())  # (d_model, d_model)

"""The stage 01 reference against implementations nobody here wrote: torch.softmax and
torch.nn.functional.scaled_dot_product_attention."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import reference

ref = reference.load("01_attention")
pytestmark = pytest.mark.stage01

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-13)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape,dim", [((7,), -1), ((3, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -1), ((1, 1), -1)]
)
def test_softmax_matches_torch(shape, dim, dtype):
    x = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ref.softmax(x, dim=dim), torch.softmax(x, dim=dim), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1e3, 1e4, 1e6])
def test_softmax_is_stable_on_large_inputs(scale, dtype):
    x = torch.randn(4, 9, dtype=dtype, generator=torch.Generator().manual_seed(1)) * scale
    y = ref.softmax(x, dim=-1)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), **TOL[dtype])
    torch.testing.assert_close(y.sum(-1), torch.ones(4, dtype=dtype), **TOL[dtype])


@settings(max_examples=40, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    lq=st.integers(1, 6),
    lk=st.integers(1, 6),
    d_k=st.integers(1, 9),
    d_v=st.integers(1, 5),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
    masked=st.booleans(),
)
def test_attention_matches_torch_sdpa(batch, lq, lk, d_k, d_v, dtype, seed, masked):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, lq, d_k, dtype=dtype, generator=g)
    k = torch.randn(*batch, lk, d_k, dtype=dtype, generator=g)
    v = torch.randn(*batch, lk, d_v, dtype=dtype, generator=g)
    mask = None
    if masked:
        mask = torch.rand(*batch, lq, lk, generator=g) > 0.3
        mask[..., 0] = True  # every row keeps a key: torch gives NaN rows otherwise
    out, weights = ref.scaled_dot_product_attention(q, k, v, mask)
    # torch's bool attn_mask has the same convention as ours: True = takes part in attention
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, **TOL[dtype])
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(weights, torch.softmax(scores, dim=-1), **TOL[dtype])
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_with_padding_and_causal_masks(dtype):
    g = torch.Generator().manual_seed(3)
    b, h, L, d = 3, 2, 6, 8
    q, k, v = (torch.randn(b, h, L, d, dtype=dtype, generator=g) for _ in range(3))
    lengths = torch.tensor([6, 3, 1])
    for mask in (
        ref.padding_mask(lengths, L),
        ref.causal_mask(L),
        ref.padding_mask(lengths, L) & ref.causal_mask(L),
    ):
        out, w = ref.scaled_dot_product_attention(q, k, v, mask)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL[dtype])
        assert (w.masked_select(~mask.expand_as(w)) == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_large_magnitude_stays_finite(dtype):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 6, 16, dtype=dtype, generator=g) * 30 for _ in range(3))
    out, w = ref.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL[dtype])


def test_fully_masked_row_is_finite():
    q = k = v = torch.randn(1, 3, 4, dtype=torch.float64)
    mask = torch.ones(1, 3, 3, dtype=torch.bool)
    mask[0, 1] = False
    out, w = ref.scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(w[0, 1], torch.full((3,), 1 / 3, dtype=torch.float64))


def test_padding_mask_shape_values_and_device():
    m = ref.padding_mask(torch.tensor([3, 0, 5]), 5)
    assert m.shape == (3, 1, 1, 5) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True] * 3 + [False] * 2, [False] * 5, [True] * 5]


@pytest.mark.parametrize("L", [1, 2, 5])
def test_causal_mask_is_lower_triangular(L):
    m = ref.causal_mask(L)
    assert m.dtype == torch.bool and m.shape == (L, L)
    for i in range(L):
        for j in range(L):
            assert bool(m[i, j]) == (j <= i)

"""The stage 02 reference against torch.nn.MultiheadAttention, given the same weights."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from autograder.grader.plan import StagePlan
from autograder.stages import load_spec
from tests.support import verdicts

ref = reference.load("02_multihead")
masks = reference.load("01_attention")
pytestmark = pytest.mark.stage02

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-13)}


def _pair(d_model: int, h: int, bias: bool, dtype: torch.dtype, seed: int):
    """Our module with random weights, and torch's with the same weights copied in."""
    torch.manual_seed(seed)
    ours = ref.MultiHeadAttention(d_model, h, bias=bias).to(dtype).eval()
    if bias:  # nn.Linear starts with small biases; make them count
        for lin in (ours.w_q, ours.w_k, ours.w_v, ours.w_o):
            torch.nn.init.normal_(lin.bias)
    theirs = torch.nn.MultiheadAttention(d_model, h, bias=bias, batch_first=True).to(dtype).eval()
    with torch.no_grad():
        # torch packs the three input projections into one (3 d_model, d_model) matrix, q k v in order
        theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        theirs.out_proj.weight.copy_(ours.w_o.weight)
        if bias:
            theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
            theirs.out_proj.bias.copy_(ours.w_o.bias)
    return ours, theirs


def _both(ours, theirs, query, key, value, mask=None, attn_mask=None, key_padding_mask=None):
    with torch.no_grad():
        out, w = ours(query, key, value, mask=mask)
        t_out, t_w = theirs(
            query,
            key,
            value,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=True,
            average_attn_weights=False,  # per-head weights (B, h, Lq, Lk)
        )
    return (out, w), (t_out, t_w)


SHAPES = [  # (B, Lq, Lk, d_model, h)
    (2, 5, 5, 8, 2),
    (1, 4, 4, 12, 3),
    (3, 3, 7, 16, 4),  # cross-attention, Lq < Lk
    (2, 6, 2, 6, 6),  # cross-attention, Lq > Lk, d_k = 1
    (2, 4, 4, 8, 1),  # one head
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("B,Lq,Lk,d_model,h", SHAPES)
def test_matches_torch_multihead_attention(B, Lq, Lk, d_model, h, bias, dtype):
    ours, theirs = _pair(d_model, h, bias, dtype, seed=B * 100 + Lq * 10 + Lk)
    g = torch.Generator().manual_seed(7)
    query = torch.randn(B, Lq, d_model, dtype=dtype, generator=g)
    key = torch.randn(B, Lk, d_model, dtype=dtype, generator=g)
    value = torch.randn(B, Lk, d_model, dtype=dtype, generator=g)
    (out, w), (t_out, t_w) = _both(ours, theirs, query, key, value)
    assert out.shape == (B, Lq, d_model) and w.shape == (B, h, Lq, Lk)
    torch.testing.assert_close(out, t_out, **TOL[dtype])
    torch.testing.assert_close(w, t_w, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_self_attention_is_query_key_value_the_same(dtype):
    ours, theirs = _pair(16, 4, True, dtype, seed=11)
    x = torch.randn(2, 6, 16, dtype=dtype, generator=torch.Generator().manual_seed(1))
    (out, w), (t_out, t_w) = _both(ours, theirs, x, x, x)
    torch.testing.assert_close(out, t_out, **TOL[dtype])
    torch.testing.assert_close(w, t_w, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("which", ["padding", "causal", "padding & causal"])
def test_masks_match_torch(which, bias, dtype):
    """Ours: True = may attend. Torch's attn_mask and key_padding_mask: True = NOT allowed."""
    B, L, d_model, h = 3, 6, 8, 2
    ours, theirs = _pair(d_model, h, bias, dtype, seed=5)
    x = torch.randn(B, L, d_model, dtype=dtype, generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([6, 3, 1])
    pad = masks.padding_mask(lengths, L)  # (B, 1, 1, L)
    causal = masks.causal_mask(L)  # (L, L)
    mask, attn_mask, key_padding_mask = {
        "padding": (pad, None, ~pad[:, 0, 0, :]),
        "causal": (causal, ~causal, None),
        "padding & causal": (pad & causal, ~causal, ~pad[:, 0, 0, :]),
    }[which]
    (out, w), (t_out, t_w) = _both(ours, theirs, x, x, x, mask, attn_mask, key_padding_mask)
    torch.testing.assert_close(out, t_out, **TOL[dtype])
    torch.testing.assert_close(w, t_w, **TOL[dtype])
    assert (w.masked_select(~mask.expand_as(w)) == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_attention_padding_mask_matches_torch(dtype):
    B, Lq, Lk, d_model, h = 2, 3, 5, 12, 3
    ours, theirs = _pair(d_model, h, True, dtype, seed=9)
    g = torch.Generator().manual_seed(3)
    query = torch.randn(B, Lq, d_model, dtype=dtype, generator=g)
    memory = torch.randn(B, Lk, d_model, dtype=dtype, generator=g)
    pad = masks.padding_mask(torch.tensor([5, 2]), Lk)  # (B, 1, 1, Lk)
    (out, w), (t_out, t_w) = _both(ours, theirs, query, memory, memory, pad, None, ~pad[:, 0, 0, :])
    torch.testing.assert_close(out, t_out, **TOL[dtype])
    torch.testing.assert_close(w, t_w, **TOL[dtype])


def test_heads_read_contiguous_feature_slices():
    """Head i of split_heads holds features [i*d_k, (i+1)*d_k) of every position."""
    x = torch.arange(2 * 3 * 6, dtype=torch.float64).reshape(2, 3, 6)
    heads = ref.split_heads(x, 3)
    assert heads.shape == (2, 3, 3, 2)
    for i in range(3):
        torch.testing.assert_close(heads[:, i], x[:, :, 2 * i : 2 * i + 2], rtol=0, atol=0)


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 3),
    L=st.integers(1, 7),
    h=st.integers(1, 5),
    d_k=st.integers(1, 6),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_split_merge_round_trip(B, L, h, d_k, dtype, seed):
    x = torch.randn(B, L, h * d_k, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    heads = ref.split_heads(x, h)
    assert heads.shape == (B, h, L, d_k)
    assert torch.equal(ref.merge_heads(heads), x)
    assert torch.equal(ref.split_heads(ref.merge_heads(heads), h), heads)


def test_indivisible_d_model_is_refused():
    with pytest.raises(ValueError, match="divisible"):
        ref.MultiHeadAttention(10, 3)


class _NoBiasByDefault(ref.MultiHeadAttention):
    """The reference with bias=False as its default: right whenever bias is passed."""

    def __init__(self, d_model: int, num_heads: int, bias: bool = False) -> None:
        super().__init__(d_model, num_heads, bias)


def test_a_module_without_the_default_bias_fails_the_cases_that_leave_it_out():
    name = "MultiHeadAttention"
    results = verdicts(StagePlan.build(load_spec("02_multihead"), "cpu"), {name: _NoBiasByDefault}, name)
    failing = [pc.label for pc, ok in results if not ok]
    assert failing and failing == [pc.label for pc, _ in results if "bias left at its default" in pc.label]

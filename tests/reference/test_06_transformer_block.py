"""The stage 06 reference against torch: gelu against torch's exact GELU, the encoder layer
against torch.nn.TransformerEncoderLayer(norm_first=False, activation="gelu",
batch_first=True) in eval mode, given the same weights."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import reference
from autograder.grader.plan import StagePlan
from autograder.stages import load_spec
from tests.support import verdicts

ref = reference.load("06_transformer_block")
masks = reference.load("01_attention")
pytestmark = pytest.mark.stage06

DTYPES = [torch.float32, torch.float64]
# torch's eval-mode fast path (one fused kernel) orders the float32 sums differently from
# ours; the layer ends in a LayerNorm, so outputs are O(1) and an absolute bound fits.
TOL = {torch.float32: dict(rtol=1e-5, atol=2e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


# -- gelu ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 5.0, 100.0])
def test_gelu_matches_torch_exact_gelu(scale, dtype):
    x = torch.randn(4, 257, dtype=dtype, generator=torch.Generator().manual_seed(0)) * scale
    torch.testing.assert_close(ref.gelu(x), F.gelu(x, approximate="none"), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_known_values(dtype):
    x = torch.tensor([0.0, 1.0, -1.0, 40.0, -40.0], dtype=dtype)
    y = ref.gelu(x)
    torch.testing.assert_close(y, F.gelu(x), **TOL[dtype])
    # GELU(1) = Phi(1) = 0.8413447460685429, the standard normal CDF at 1; GELU(-1) = Phi(1) - 1
    expected = torch.tensor([0.0, 0.8413447460685429, -0.15865525393145707, 40.0, 0.0], dtype=dtype)
    torch.testing.assert_close(y, expected, **TOL[dtype])


def test_gelu_is_not_the_tanh_approximation():
    """The graded form is exact: the tanh approximation differs by far more than float32 rounding."""
    x = torch.linspace(-6, 6, 10001, dtype=torch.float64)
    diff = (ref.gelu(x) - F.gelu(x, approximate="tanh")).abs().max().item()
    assert 1e-4 < diff < 1e-3, diff


# -- the encoder layer ---------------------------------------------------------------------


def _pair(d_model: int, h: int, d_ff: int, eps: float, dtype: torch.dtype, seed: int):
    """Our layer with random weights (biases and LayerNorm affine included), and torch's
    with the same weights copied in."""
    torch.manual_seed(seed)
    ours = ref.TransformerEncoderLayer(d_model, h, d_ff, eps=eps).to(dtype).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
            elif name.startswith("norm"):
                p.normal_(1.0, 0.3)  # LayerNorm gamma away from 1
    theirs = torch.nn.TransformerEncoderLayer(
        d_model,
        h,
        dim_feedforward=d_ff,
        dropout=0.0,
        activation="gelu",
        layer_norm_eps=eps,
        batch_first=True,
        norm_first=False,
    )
    theirs = theirs.to(dtype).eval()
    a = ours.attention
    with torch.no_grad():
        # torch packs the three input projections into one (3 d_model, d_model) matrix, q k v in order
        theirs.self_attn.in_proj_weight.copy_(torch.cat([a.w_q.weight, a.w_k.weight, a.w_v.weight]))
        theirs.self_attn.in_proj_bias.copy_(torch.cat([a.w_q.bias, a.w_k.bias, a.w_v.bias]))
        theirs.self_attn.out_proj.weight.copy_(a.w_o.weight)
        theirs.self_attn.out_proj.bias.copy_(a.w_o.bias)
    theirs.linear1.load_state_dict(ours.ffn.linear1.state_dict())
    theirs.linear2.load_state_dict(ours.ffn.linear2.state_dict())
    theirs.norm1.load_state_dict(ours.norm1.state_dict())
    theirs.norm2.load_state_dict(ours.norm2.state_dict())
    return ours, theirs


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func._schema.name)
        return func(*args, **(kwargs or {}))


def _run_torch(theirs, x, src_mask, key_padding_mask, fast: bool):
    """``fast``: under no_grad, where torch's eval-mode fast path (one fused kernel) may run;
    otherwise with autograd on, which forces the plain Python path."""
    with torch.set_grad_enabled(not fast):
        out = theirs(x, src_mask=src_mask, src_key_padding_mask=key_padding_mask)
    return out.detach()


SHAPES = [  # (B, L, d_model, h, d_ff)
    (2, 5, 8, 2, 32),
    (1, 7, 12, 3, 48),
    (3, 6, 16, 4, 64),
    (2, 4, 8, 1, 16),  # one head
    (2, 3, 6, 6, 10),  # d_k = 1, d_ff not a multiple of d_model
    (2, 10, 64, 8, 256),  # BERT-like ratios
]


@pytest.mark.parametrize("fast", [True, False], ids=["no_grad", "grad"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding", [False, True], ids=["no_mask", "padding"])
@pytest.mark.parametrize("B,L,d_model,h,d_ff", SHAPES)
def test_matches_torch_encoder_layer(B, L, d_model, h, d_ff, padding, dtype, fast):
    ours, theirs = _pair(d_model, h, d_ff, 1e-12, dtype, seed=B * 1000 + L * 10 + d_model)
    g = torch.Generator().manual_seed(L)
    x = torch.randn(B, L, d_model, dtype=dtype, generator=g)
    mask = key_padding_mask = None
    if padding:
        lengths = torch.randint(1, L + 1, (B,), generator=g)
        lengths[0] = L  # one full sequence, the others padded
        mask = masks.padding_mask(lengths, L)  # (B, 1, 1, L), True = real token
        key_padding_mask = ~mask[:, 0, 0, :]  # (B, L), torch: True = padding, ignore
    with torch.no_grad():
        out = ours(x, mask)
    assert out.shape == (B, L, d_model) and out.dtype == dtype
    torch.testing.assert_close(out, _run_torch(theirs, x, None, key_padding_mask, fast), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["causal", "padding & causal"])
def test_attention_masks_reach_the_attention(which, dtype):
    """Any boolean mask that broadcasts against the scores is passed through unchanged."""
    B, L, d_model, h, d_ff = 3, 6, 16, 4, 32
    ours, theirs = _pair(d_model, h, d_ff, 1e-12, dtype, seed=3)
    x = torch.randn(B, L, d_model, dtype=dtype, generator=torch.Generator().manual_seed(4))
    pad = masks.padding_mask(torch.tensor([6, 3, 1]), L)  # (B, 1, 1, L)
    causal = masks.causal_mask(L)  # (L, L)
    mask = causal if which == "causal" else pad & causal
    key_padding_mask = None if which == "causal" else ~pad[:, 0, 0, :]
    with torch.no_grad():
        out = ours(x, mask)
    expected = _run_torch(theirs, x, ~causal, key_padding_mask, fast=False)
    torch.testing.assert_close(out, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_eps_reaches_both_norms(eps, dtype):
    ours, theirs = _pair(8, 2, 16, eps, dtype, seed=1)
    assert ours.norm1.eps == ours.norm2.eps == eps
    x = 0.05 * torch.randn(2, 5, 8, dtype=dtype, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = ours(x)
    torch.testing.assert_close(out, _run_torch(theirs, x, None, None, fast=False), **TOL[dtype])


def test_torch_fast_path_is_exercised_and_agrees():
    """In eval mode under no_grad torch runs its fused encoder kernel; ours agrees with it too."""
    ours, theirs = _pair(16, 4, 32, 1e-12, torch.float32, seed=2)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(6))
    ops = _Ops()
    with ops, torch.no_grad():
        fast = theirs(x)
    if "aten::_transformer_encoder_layer_fwd" not in ops.seen:
        pytest.skip("this torch build does not take the fast path here")
    with torch.no_grad():
        torch.testing.assert_close(ours(x), fast, **TOL[torch.float32])


def test_ffn_is_linear_gelu_linear_at_every_position():
    torch.manual_seed(0)
    ffn = ref.PositionwiseFeedForward(8, 24).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        expected = F.linear(F.gelu(F.linear(x, ffn.linear1.weight, ffn.linear1.bias)), ffn.linear2.weight)
        expected = expected + ffn.linear2.bias
        torch.testing.assert_close(ffn(x), expected, **TOL[torch.float64])
        # position-wise: one position's output depends on that position alone
        torch.testing.assert_close(ffn(x[:, 2:3]), ffn(x)[:, 2:3], **TOL[torch.float64])


def test_submodule_names_are_the_state_dict_keys():
    layer = ref.TransformerEncoderLayer(8, 2, 16)
    keys = set(layer.state_dict())
    expected = {f"attention.{w}.{p}" for w in ("w_q", "w_k", "w_v", "w_o") for p in ("weight", "bias")}
    expected |= {f"{n}.{p}" for n in ("norm1", "norm2") for p in ("weight", "bias")}
    expected |= {f"ffn.{n}.{p}" for n in ("linear1", "linear2") for p in ("weight", "bias")}
    assert keys == expected
    assert layer.norm1.eps == 1e-12


@settings(max_examples=30, deadline=None)
@given(
    B=st.integers(1, 3),
    L=st.integers(1, 7),
    h=st.integers(1, 4),
    d_k=st.integers(1, 5),
    ff_mult=st.integers(1, 4),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_shapes_match_torch(B, L, h, d_k, ff_mult, dtype, seed):
    d_model = h * d_k
    if d_model < 2:  # LayerNorm over one feature is constant: nothing to compare
        d_model, h = 2, 1
    ours, theirs = _pair(d_model, h, ff_mult * d_model, 1e-12, dtype, seed=seed % 10_000)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, d_model, dtype=dtype, generator=g)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    mask = masks.padding_mask(lengths, L)
    with torch.no_grad():
        out = ours(x, mask)
    expected = _run_torch(theirs, x, None, ~mask[:, 0, 0, :], fast=False)
    torch.testing.assert_close(out, expected, **TOL[dtype])
    assert math.isfinite(out.abs().max().item())


class _EpsZeroByDefault(ref.TransformerEncoderLayer):
    """The reference with eps=0 as its default: right whenever eps is passed or no row's
    variance is 0."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, eps: float = 0.0) -> None:
        super().__init__(d_model, num_heads, d_ff, eps)


def test_a_layer_without_the_default_eps_fails_only_the_zero_variance_case():
    name = "TransformerEncoderLayer"
    results = verdicts(
        StagePlan.build(load_spec("06_transformer_block"), "cpu"), {name: _EpsZeroByDefault}, name
    )
    failing = [pc.label for pc, ok in results if not ok]
    assert failing and failing == [pc.label for pc, _ in results if "variance 0" in pc.label]

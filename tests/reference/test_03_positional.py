"""The stage 03 reference against a high-precision closed form (mpmath) and the sinusoidal
table of transformers' DistilBERT; the stage's angle-scaled tolerance against ten correct
orders of computation (all pass) and every known mistake (all fail)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mpmath
import numpy as np
import pytest
import torch

import reference
from autograder.runtime.compare import compare
from autograder.runtime.drivers import positional as drivers
from autograder.stages import load_spec
from autograder.stages.spec import CaseData, Tolerance

ref = reference.load("03_positional")
SPEC = load_spec("03_positional")
ENCODING = SPEC.graded_name("sinusoidal_positional_encoding")
SHIFT = SPEC.graded_name("relative_shift_matrix")
pytestmark = pytest.mark.stage03

DTYPES = [torch.float32, torch.float64]


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def encoding_tol(max_len: int, d_model: int, dtype: torch.dtype) -> Tolerance:
    assert ENCODING.tolerance is not None
    return ENCODING.tolerance(CaseData(args=(max_len, d_model)), dtype, "cpu")


def shift_tol(d_model: int, k: int, dtype: torch.dtype) -> Tolerance:
    assert SHIFT.tolerance is not None
    return SHIFT.tolerance(CaseData(args=(d_model, k)), dtype, "cpu")


def pe(max_len: int, d_model: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    with default_dtype(dtype):
        return ref.sinusoidal_positional_encoding(max_len, d_model)


def shift(d_model: int, k: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    with default_dtype(dtype):
        return ref.relative_shift_matrix(d_model, k)


# -- the closed form ------------------------------------------------------------------------


def _exact(pos: int, column: int, d_model: int) -> mpmath.mpf:
    """PE[pos, column] with 40 significant digits."""
    with mpmath.workdps(40):
        i = column // 2
        angle = mpmath.mpf(pos) / mpmath.power(10000, mpmath.mpf(2 * i) / d_model)
        return mpmath.sin(angle) if column % 2 == 0 else mpmath.cos(angle)


@pytest.mark.parametrize("max_len,d_model", [(50, 16), (512, 768), (2048, 64), (3, 2)])
def test_closed_form_against_mpmath(max_len, d_model):
    table = pe(max_len, d_model)
    g = torch.Generator().manual_seed(max_len * 1000 + d_model)
    rows = sorted({0, 1, max_len - 1, *torch.randint(0, max_len, (6,), generator=g).tolist()})
    exact = torch.tensor(
        [[float(_exact(p, c, d_model)) for c in range(d_model)] for p in rows], dtype=torch.float64
    )
    err = (table[rows] - exact).abs().max().item()
    # float64 rounding of the angle only: far inside the stage's own float64 tolerance
    assert err <= encoding_tol(max_len, d_model, torch.float64).atol / 10, err
    # the float32 table is the float64 one correctly rounded
    err32 = (pe(max_len, d_model, torch.float32)[rows].double() - exact).abs().max().item()
    assert err32 <= torch.finfo(torch.float32).eps / 2, err32


def test_matches_transformers_distilbert_table():
    """DistilBERT builds the same interleaved table in numpy float64 and casts to float32."""
    distilbert = pytest.importorskip("transformers.models.distilbert.modeling_distilbert")
    for n_pos, dim in [(512, 768), (40, 6)]:
        out = torch.empty(n_pos, dim)
        distilbert.create_sinusoidal_embeddings(n_pos, dim, out)
        torch.testing.assert_close(pe(n_pos, dim, torch.float32), out, rtol=0, atol=1e-6)


@pytest.mark.parametrize("d_model", [2, 4, 10, 768])
def test_interleaved_layout(d_model):
    table = pe(100, d_model)
    pos = torch.arange(100, dtype=torch.float64)
    assert table[0].tolist() == [0.0, 1.0] * (d_model // 2)
    torch.testing.assert_close(table[:, 0], pos.sin())  # i = 0: w_0 = 1, period 2π
    torch.testing.assert_close(table[:, 1], pos.cos())
    # each (2i, 2i+1) pair is (sin, cos) of one angle ...
    torch.testing.assert_close(
        table[:, 0::2] ** 2 + table[:, 1::2] ** 2, torch.ones(100, d_model // 2, dtype=torch.float64)
    )
    # ... and the last pair turns slowest: w = 10000^(-(d-2)/d)
    w_last = 10000.0 ** (-(d_model - 2) / d_model)
    torch.testing.assert_close(table[:, -2], (pos * w_last).sin())
    torch.testing.assert_close(table[:, -1], (pos * w_last).cos())


def test_frequencies_are_geometric_from_one_to_almost_one_ten_thousandth():
    w = ref.frequencies(512)
    assert w[0] == 1.0 and w.shape == (256,)
    torch.testing.assert_close(w[1:] / w[:-1], torch.full((255,), 10000.0 ** (-2 / 512), dtype=torch.float64))
    assert 1e-4 < w[-1] < 1.1e-4
    with pytest.raises(ValueError):
        ref.frequencies(7)


@pytest.mark.parametrize("dtype", DTYPES)
def test_results_are_in_the_default_dtype(dtype):
    assert pe(5, 4, dtype).dtype == dtype and pe(5, 4, dtype).shape == (5, 4)
    assert shift(6, 2, dtype).dtype == dtype and shift(6, 2, dtype).shape == (6, 6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_driver_sets_and_restores_the_default_dtype(dtype):
    data = {"args": (3, 4), "kwargs": {}, "init_kwargs": {"default_dtype": str(dtype)[6:]}}
    ns = {"sinusoidal_positional_encoding": ref.sinusoidal_positional_encoding}
    assert drivers.sinusoidal_positional_encoding(ns, data, "cpu").dtype == dtype

    def rude(max_len, d_model):
        torch.set_default_dtype(torch.float64)
        raise NotImplementedError

    before = torch.get_default_dtype()
    with pytest.raises(NotImplementedError):
        drivers.sinusoidal_positional_encoding({"sinusoidal_positional_encoding": rude}, data, "cpu")
    assert torch.get_default_dtype() == before
    with pytest.raises(NameError, match="relative_shift_matrix"):
        drivers.relative_shift_matrix({}, data, "cpu")


# -- the linear-offset property ---------------------------------------------------------------

OFFSETS = [0, 1, -1, 2, -2, 3, 7, -7, 16, -31, 100, -100, 511, -511, 1000, -2047]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d_model", [2, 4, 16, 64, 512])
def test_shift_matrix_moves_every_position_by_k(d_model, dtype):
    max_len = 2048
    table = pe(max_len, d_model, dtype)
    for k in OFFSETS:
        m = shift(d_model, k, dtype)
        src = torch.arange(max(0, -k), min(max_len, max_len - k))  # pos and pos + k in range
        moved = table[src] @ m.T  # (n, d_model)
        # float32: both factors are correctly rounded and each output sums two products;
        # float64: the reference's own angles carry float64 rounding, inside the stage's tolerance
        atol = 4 * torch.finfo(dtype).eps
        if dtype == torch.float64:
            atol += encoding_tol(max_len, d_model, dtype).atol
        torch.testing.assert_close(moved, table[src + k], rtol=0, atol=atol, msg=f"k={k}")


@pytest.mark.parametrize("d_model", [2, 8, 768])
def test_shift_matrices_are_rotations_that_compose(d_model):
    eye = torch.eye(d_model, dtype=torch.float64)
    assert torch.equal(shift(d_model, 0), eye)
    for a, b in [(1, 2), (5, -5), (-300, 17), (1000, 24)]:
        ma, mb = shift(d_model, a), shift(d_model, b)
        torch.testing.assert_close(ma @ ma.T, eye)  # orthogonal
        torch.testing.assert_close(ma @ mb, shift(d_model, a + b), atol=1e-12, rtol=0)
        torch.testing.assert_close(shift(d_model, -a), ma.T)
    block = shift(d_model, 3)[:2, :2]  # i = 0, t = 3: [[cos t, sin t], [-sin t, cos t]]
    torch.testing.assert_close(
        block, torch.tensor([[math.cos(3), math.sin(3)], [-math.sin(3), math.cos(3)]], dtype=torch.float64)
    )
    off_blocks = shift(d_model, 3).clone()
    for i in range(0, d_model, 2):
        off_blocks[i : i + 2, i : i + 2] = 0
    assert not off_blocks.any()


# -- correct orders of computation all pass the tolerance ---------------------------------------


def _fill(angles: torch.Tensor) -> torch.Tensor:
    pe = torch.zeros(angles.shape[0], 2 * angles.shape[1])
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe


def annotated_transformer(max_len, d_model):
    """The Annotated Transformer's PositionalEncoding: exp(-2i ln(10000) / d)."""
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def pow_divide(max_len, d_model):
    """pos / torch.pow(10000, 2i/d): dividing by the denominator."""
    pos = torch.arange(max_len, dtype=torch.get_default_dtype())[:, None]
    return _fill(pos / torch.pow(10000.0, torch.arange(0, d_model, 2) / d_model))


def reciprocal_multiply(max_len, d_model):
    """w = 1 / 10000 ** (2i/d), then pos * w."""
    w = 1 / 10000 ** (torch.arange(0, d_model, 2) / d_model)
    return _fill(torch.arange(max_len)[:, None] * w)


def denominator_from_exp_log(max_len, d_model):
    """pos / exp(2i ln(10000) / d)."""
    denominator = torch.exp(torch.arange(0, d_model, 2) * math.log(10000) / d_model)
    return _fill(torch.arange(max_len)[:, None] / denominator)


def float64_then_cast(max_len, d_model):
    dtype = torch.get_default_dtype()
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    angles = pos / 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(max_len, d_model).to(dtype)


def geometric_ratio(max_len, d_model):
    """r = 10000^(-2/d) rounded once, then w_i = r ** i: r's rounding is raised to the power i."""
    r = torch.tensor(10000.0) ** (-2 / d_model)
    return _fill(torch.outer(torch.arange(max_len).to(r.dtype), r ** torch.arange(d_model // 2)))


def cumulative_product(max_len, d_model):
    ratios = torch.full((d_model // 2,), 10000.0 ** (-2 / d_model))
    ratios[0] = 1.0
    return _fill(torch.arange(max_len)[:, None] * torch.cumprod(ratios, 0))


def exp2_einsum(max_len, d_model):
    w = torch.exp2(-torch.arange(0, d_model, 2) / d_model * math.log2(10000))
    return _fill(torch.einsum("p,i->pi", torch.arange(max_len).to(w.dtype), w))


def numpy_float64(max_len, d_model):
    """DistilBERT's numpy form, angles per column: pos / 10000^(2 (j // 2) / d)."""
    j = np.arange(d_model)
    angles = np.arange(max_len)[:, None] / np.power(10000, 2 * (j // 2) / d_model)
    angles[:, 0::2], angles[:, 1::2] = np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])
    return torch.tensor(angles, dtype=torch.get_default_dtype())


def python_loop(max_len, d_model):
    pe = torch.zeros(max_len, d_model)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            pe[pos, 2 * i], pe[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return pe


ORDERS: list[Callable[[int, int], torch.Tensor]] = [
    annotated_transformer,
    pow_divide,
    reciprocal_multiply,
    denominator_from_exp_log,
    float64_then_cast,
    geometric_ratio,
    cumulative_product,
    exp2_einsum,
    numpy_float64,
    python_loop,
]
SIZES = [(64, 16), (512, 512), (512, 768), (2048, 128), (2048, 6), (2048, 2), (8192, 64), (1, 4)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ORDERS, ids=lambda f: f.__name__)
def test_correct_orders_pass_the_tolerance(order, dtype):
    for max_len, d_model in SIZES:
        if order is python_loop and max_len * d_model > 20_000:
            continue
        with default_dtype(dtype):
            got = order(max_len, d_model)
        assert got.dtype == dtype
        c = compare(got, pe(max_len, d_model, dtype), encoding_tol(max_len, d_model, dtype))
        assert c.ok, (max_len, d_model, c.message)


def shift_by_loop(d_model, k):
    """Grace's form: a zero matrix, one 2x2 rotation block per pair, math.cos/math.sin."""
    m = torch.zeros(d_model, d_model)
    for i in range(d_model // 2):
        t = k / 10000 ** (2 * i / d_model)
        m[2 * i, 2 * i], m[2 * i, 2 * i + 1] = math.cos(t), math.sin(t)
        m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = -math.sin(t), math.cos(t)
    return m


def shift_block_diag(d_model, k):
    w = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    c, s = torch.cos(k * w), torch.sin(k * w)
    return torch.block_diag(
        *[torch.stack([torch.stack([ci, si]), torch.stack([-si, ci])]) for ci, si in zip(c, s, strict=True)]
    )


def shift_geometric(d_model, k):
    r = torch.tensor(10000.0) ** (-2 / d_model)
    t = k * r ** torch.arange(d_model // 2)
    m = torch.diag(torch.cos(t).repeat_interleave(2))
    even = torch.arange(0, d_model, 2)
    m[even, even + 1], m[even + 1, even] = torch.sin(t), -torch.sin(t)
    return m


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "build", [shift_by_loop, shift_block_diag, shift_geometric], ids=lambda f: f.__name__
)
def test_correct_shift_matrices_pass_the_tolerance(build, dtype):
    for d_model, k in [(2, 5), (16, 7), (64, 100), (128, -511), (256, 1000), (768, -37), (768, 5000)]:
        with default_dtype(dtype):
            got = build(d_model, k)
        c = compare(got, shift(d_model, k, dtype), shift_tol(d_model, k, dtype))
        assert c.ok, (d_model, k, c.message)


def test_tolerance_grows_with_the_largest_angle_only_as_much_as_needed():
    small, bert, long = (
        encoding_tol(50, 16, torch.float32),
        encoding_tol(512, 768, torch.float32),
        encoding_tol(2048, 64, torch.float32),
    )
    assert small.atol < 5e-5 and bert.atol < 2e-3 and long.atol < 2e-3
    assert encoding_tol(1, 768, torch.float32).atol == 1e-5  # one row: no angle but 0
    assert encoding_tol(2048, 64, torch.float64).atol < 2e-11
    assert shift_tol(64, -100, torch.float32) == shift_tol(64, 100, torch.float32)


# -- every known mistake fails it ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_encoding_mistake_fails_the_tolerance_by_far(dtype):
    for max_len, d_model in [(6, 4), (50, 16), (512, 768), (2048, 64), (1000, 6)]:
        expected = pe(max_len, d_model, dtype)
        tol = encoding_tol(max_len, d_model, dtype)
        for v in ENCODING.variants:
            with default_dtype(dtype):
                got = v.fn(max_len, d_model)
            c = compare(got, expected, tol)
            assert not c.ok and c.max_abs > 100 * tol.atol, (v.misconception, max_len, d_model)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_shift_mistake_fails_the_tolerance_by_far(dtype):
    for d_model, k in [(4, 1), (16, 7), (128, -511), (768, -37)]:
        expected = shift(d_model, k, dtype)
        tol = shift_tol(d_model, k, dtype)
        for v in SHIFT.variants:
            with default_dtype(dtype):
                got = v.fn(d_model, k)
            c = compare(got, expected, tol)
            assert not c.ok and c.max_abs > 100 * tol.atol, (v.misconception, d_model, k)


def test_an_approximate_constant_fails_too():
    """The tolerance allows rounding, not a hard-coded ln(10000) = 9.21."""
    with default_dtype(torch.float32):
        w = torch.exp(torch.arange(0, 768, 2) * -(9.21 / 768))
        got = _fill(torch.arange(512)[:, None] * w)
    assert not compare(got, pe(512, 768, torch.float32), encoding_tol(512, 768, torch.float32)).ok


def test_each_mistaken_shift_matrix_is_the_one_for_its_mistaken_encoding():
    """The shift variants are the consistent ones: PE'[pos + k] = PE'[pos] @ M'.T."""
    encodings = {v.fn.__name__.removeprefix("encoding"): v.fn for v in ENCODING.variants}
    pairs = [(encodings[v.fn.__name__.removeprefix("shift")], v.fn) for v in SHIFT.variants]
    table_len, d_model = 300, 12
    for encoding, shift_matrix in pairs:
        with default_dtype(torch.float64):
            table = encoding(table_len, d_model)
            for k in (1, -4, 37):
                src = torch.arange(max(0, -k), min(table_len, table_len - k))
                torch.testing.assert_close(table[src] @ shift_matrix(d_model, k).T, table[src + k])

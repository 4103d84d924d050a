from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autograder.runtime.compare import (
    DEFAULT_TOLERANCES,
    Tolerance,
    _full,
    _region,
    compare,
    matches,
    tolerance_for,
)

TOL = Tolerance(rtol=1e-6, atol=1e-9)


def test_shape_mismatch_says_both_shapes():
    c = compare(torch.zeros(2, 3), torch.zeros(3, 2), TOL)
    assert not c.ok and c.message == "expected shape (3, 2), got (2, 3)"


def test_dtype_mismatch_says_both_dtypes():
    c = compare(torch.zeros(2, dtype=torch.float64), torch.zeros(2), TOL)
    assert not c.ok and "expected dtype torch.float32, got torch.float64" in c.message


def test_max_error_and_where():
    exp = torch.zeros(2, 3, 4, dtype=torch.float64)
    got = exp.clone()
    got[1, 2, 3] = 0.5
    got[0, 0, 0] = 0.25
    c = compare(got, exp, TOL)
    assert not c.ok and c.where == (1, 2, 3) and c.max_abs == 0.5
    assert "2 of 24 values differ" in c.message and "[1, 2, 3]" in c.message


def test_nan_is_named():
    exp = torch.ones(3)
    got = torch.tensor([1.0, float("nan"), 1.0])
    c = compare(got, exp, TOL)
    assert not c.ok and "NaN or inf" in c.message and "[1]" in c.message


def test_region_ignores_ungraded_values():
    exp = torch.zeros(2, 2)
    got = torch.tensor([[0.0, 0.0], [float("nan"), 5.0]])
    region = torch.tensor([[True], [False]])
    assert compare(got, exp, TOL, region).ok
    assert not compare(got, exp, TOL).ok


def test_bool_exact():
    c = compare(torch.tensor([True, False, True]), torch.tensor([True, True, True]), TOL)
    assert not c.ok and "1 of 3 values differ; first at [1]" in c.message


def test_matches_treats_nan_as_equal():
    a = torch.tensor([1.0, float("nan")])
    assert matches(a, a.clone(), TOL)
    assert not matches(a, torch.tensor([1.0, 2.0]), TOL)


def test_tolerances_are_documented_per_dtype_and_device():
    assert tolerance_for(torch.float64) == DEFAULT_TOLERANCES[torch.float64]
    assert tolerance_for(torch.float32, "cuda").rtol >= tolerance_for(torch.float32, "cpu").rtol


@settings(max_examples=50, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    seed=st.integers(0, 1000),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_equal_passes_and_a_perturbation_fails(shape, seed, dtype):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    tol = tolerance_for(dtype)
    assert compare(x, x.clone(), tol).ok
    y = x.clone().flatten()
    y[-1] += 1e-2 + abs(float(y[-1]))
    c = compare(y.reshape(x.shape), x, tol)
    assert not c.ok and c.where == tuple(s - 1 for s in shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rounding_differences_of_correct_programs_pass(dtype):
    """einsum vs matmul: two correct orders of operations stay within tolerance."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 64, 64, generator=g).to(dtype), torch.randn(8, 64, 64, generator=g).to(dtype)
    assert compare(torch.einsum("bij,bjk->bik", a, b), a @ b, tolerance_for(dtype)).ok


def _same(a, b) -> bool:
    def num(x, y):
        return x == y or (x != x and y != y)  # NaN == NaN here

    return (
        a.ok == b.ok
        and a.message == b.message
        and a.where == b.where
        and num(a.max_abs, b.max_abs)
        and (num(a.max_rel, b.max_rel))
    )


_VALUES = st.sampled_from([0.0, 1.0, -2.5, 1e-12, 3e5, float("nan"), float("inf"), -float("inf")])


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 6),
    seed=st.integers(0, 10_000),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    specials=st.lists(st.tuples(st.booleans(), st.integers(0, 5), _VALUES), max_size=4),
    noise=st.sampled_from([0.0, 1e-12, 1e-7, 1e-3]),
    with_region=st.booleans(),
    tol=st.sampled_from([TOL, Tolerance(rtol=0.0, atol=0.0), Tolerance(rtol=1e-3, atol=1e-5)]),
)
def test_the_fast_path_gives_the_full_comparisons_verdict(n, seed, dtype, specials, noise, with_region, tol):
    """compare() answers a finite pass without the full computation: the same Comparison,
    field by field, as the full one, whatever NaN, inf, noise and region."""
    g = torch.Generator().manual_seed(seed)
    expected = torch.randn(n, 3, generator=g).to(dtype)
    got = (expected.double() + noise * torch.randn(n, 3, generator=g, dtype=torch.float64)).to(dtype)
    for in_got, at, value in specials:
        (got if in_got else expected).view(-1)[at % got.numel()] = value
    region = (torch.rand(n, 1, generator=g) > 0.3) if with_region else None
    full = _full(got.double(), expected.double(), tol, _region(region, expected.shape))
    assert _same(compare(got, expected, tol, region), full)


@settings(max_examples=300, deadline=None)
@given(
    n=st.sampled_from([1, 6, 1500]),  # 1500 x 3 values: past the probe
    seed=st.integers(0, 10_000),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    specials=st.lists(st.tuples(st.booleans(), st.integers(0, 4499), _VALUES), max_size=4),
    noise=st.sampled_from([0.0, 1e-12, 1e-7, 1e-3]),
    with_region=st.booleans(),
    tol=st.sampled_from([TOL, Tolerance(rtol=0.0, atol=0.0), Tolerance(rtol=1e-3, atol=1e-5)]),
)
def test_matches_is_isclose_with_nan_equal_where_the_region_says(
    n, seed, dtype, specials, noise, with_region, tol
):
    """matches() takes a shortcut where every difference is finite; its verdict is still
    torch.isclose's (NaN equal to NaN, inf to the same inf), over the region."""
    g = torch.Generator().manual_seed(seed)
    candidate = torch.randn(n, 3, generator=g).to(dtype)
    got = (candidate.double() + noise * torch.randn(n, 3, generator=g, dtype=torch.float64)).to(dtype)
    for in_got, at, value in specials:
        (got if in_got else candidate).view(-1)[at % got.numel()] = value
    region = (torch.rand(n, 1, generator=g) > 0.3) if with_region else None
    close = torch.isclose(got.double(), candidate.double(), tol.rtol, tol.atol, equal_nan=True)
    if region is not None:
        close = close | ~region.expand(close.shape)
    assert matches(got, candidate, tol, region) == bool(close.all())

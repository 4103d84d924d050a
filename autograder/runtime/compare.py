"""Numeric comparison of a result with its expected value, with a message a student can use.

Shared by the grader (trusted parent) and the notebook self-check; torch only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Tolerance:
    """A value passes when |got - expected| <= atol + rtol * |expected| elementwise."""

    rtol: float
    atol: float


# Two correct programs that differ only in the order of floating-point operations (einsum
# vs matmul, max-subtraction before or after masking) differ by a few ulps times the
# length of the reductions; these bounds leave room for that and nothing more. Every
# misconception of every stage differs from the reference by far more (tests prove it).
DEFAULT_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(rtol=1e-9, atol=1e-11),
    torch.float32: Tolerance(rtol=1e-4, atol=1e-5),
    torch.float16: Tolerance(rtol=1e-2, atol=1e-3),
    torch.bfloat16: Tolerance(rtol=2e-2, atol=1e-2),
}
# CUDA reductions split work differently from the CPU's; float32 gets a little more room.
CUDA_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(rtol=2e-4, atol=2e-5),
}


def tolerance_for(dtype: torch.dtype, device: str = "cpu") -> Tolerance:
    """The documented tolerance for results of ``dtype`` computed on ``device``."""
    if device.startswith("cuda") and dtype in CUDA_TOLERANCES:
        return CUDA_TOLERANCES[dtype]
    return DEFAULT_TOLERANCES.get(dtype, Tolerance(rtol=0.0, atol=0.0))


@dataclass(frozen=True)
class Comparison:
    ok: bool
    message: str  # one line: what was expected, what was given
    max_abs: float | None = None
    max_rel: float | None = None
    where: tuple[int, ...] | None = None


def _fmt_shape(t: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for size in reversed(shape):
        idx.append(flat % size)
        flat //= size
    return tuple(reversed(idx))


def _region(region: Tensor | None, shape: torch.Size) -> Tensor:
    if region is None:
        return torch.ones(shape, dtype=torch.bool)
    return region.to("cpu").expand(shape)


def compare(got: Tensor, expected: Tensor, tol: Tolerance, region: Tensor | None = None) -> Comparison:
    """Compare shape, dtype and values (within ``tol``, only where ``region`` is True)."""
    got, expected = got.detach().cpu(), expected.detach().cpu()
    if got.shape != expected.shape:
        return Comparison(False, f"expected shape {_fmt_shape(expected)}, got {_fmt_shape(got)}")
    if got.dtype != expected.dtype:
        return Comparison(False, f"expected dtype {expected.dtype}, got {got.dtype}")
    if got.numel() == 0:
        return Comparison(True, "equal (empty)")

    if not (expected.is_floating_point() or expected.is_complex()):
        keep = _region(region, expected.shape)
        wrong = (got != expected) & keep
        n = int(wrong.sum())
        if n == 0:
            return Comparison(True, "equal")
        at = _index(int(wrong.flatten().nonzero()[0]), expected.shape)
        return Comparison(
            False,
            f"{n} of {int(keep.sum())} values differ; first at {list(at)}: "
            f"expected {expected[at].item()}, got {got[at].item()}",
            where=at,
        )

    g64, e64 = got.double(), expected.double()
    keep = None if region is None else _region(region, expected.shape)
    fast = _finite_pass(g64, e64, tol, keep)
    if fast is not None:
        return fast
    return _full(g64, e64, tol, _region(region, expected.shape) if keep is None else keep)


def _finite_pass(g64: Tensor, e64: Tensor, tol: Tolerance, keep: Tensor | None) -> Comparison | None:
    """Any finite values, in one pass per quantity: every value finite and within tolerance
    (the common case), or finite and out of it (a failing case, held against every output of
    a notebook that fails). None when a value compared is not finite: ``_full`` then names it.
    (The grader compares ~30 outputs per notebook, a few MB each.)"""
    diff = (g64 - e64).abs_().flatten()
    if keep is not None:
        diff.masked_fill_(~keep.flatten(), 0.0)
    flat = int(diff.argmax())  # a NaN counts as the largest
    max_abs = float(diff[flat])
    if not math.isfinite(max_abs):
        return None
    # every value compared is finite here, so these are ``_full``'s quantities, bit for bit
    scale = e64.abs().flatten()
    bad = diff.gt(scale.mul(tol.rtol).add_(tol.atol))
    failing = bool(bad.any())
    rel = diff.div_(scale.clamp_min_(torch.finfo(torch.float64).tiny)).masked_fill_(e64.flatten() == 0, 0.0)
    at = _index(flat, e64.shape)
    max_rel = float(rel.max())
    if not failing:
        return Comparison(True, f"max abs error {max_abs:.2e}", max_abs, max_rel, at)
    compared = e64.numel() if keep is None else int(keep.sum())
    return _differ(int(bad.sum()), compared, max_abs, max_rel, at, e64, g64, tol)


def _full(g64: Tensor, e64: Tensor, tol: Tolerance, keep: Tensor) -> Comparison:
    """The verdict and message for any values: NaN and inf named, the worst value found."""
    finite = torch.isfinite(g64)
    bad_nonfinite = ~finite & torch.isfinite(e64) & keep
    if bad_nonfinite.any():
        n = int(bad_nonfinite.sum())
        at = _index(int(bad_nonfinite.flatten().nonzero()[0]), e64.shape)
        return Comparison(
            False,
            f"{n} value(s) are NaN or inf where a finite number was expected; "
            f"first at {list(at)}: expected {e64[at].item():.6g}, got {g64[at].item()}",
            where=at,
        )
    diff = torch.where(keep & finite, (g64 - e64).abs(), torch.zeros((), dtype=torch.float64))
    diff = torch.nan_to_num(diff, nan=0.0)
    bound = tol.atol + tol.rtol * e64.abs()
    bad = (diff > bound) & keep
    flat = int(diff.flatten().argmax())
    at = _index(flat, e64.shape)
    max_abs = float(diff.flatten()[flat])
    rel = diff / e64.abs().clamp_min(torch.finfo(torch.float64).tiny)
    rel = torch.where(e64 != 0, rel, torch.zeros((), dtype=torch.float64))
    max_rel = float(rel.max())
    if not bad.any():
        return Comparison(True, f"max abs error {max_abs:.2e}", max_abs, max_rel, at)
    return _differ(int(bad.sum()), int(keep.sum()), max_abs, max_rel, at, e64, g64, tol)


def _differ(
    n: int,
    compared: int,
    max_abs: float,
    max_rel: float,
    at: tuple[int, ...],
    e64: Tensor,
    g64: Tensor,
    tol: Tolerance,
) -> Comparison:
    return Comparison(
        False,
        f"{n} of {compared} values differ; max abs error {max_abs:.3g} at {list(at)} "
        f"(expected {e64[at].item():.6g}, got {g64[at].item():.6g}); max rel error {max_rel:.3g}; "
        f"tolerance atol={tol.atol:g}, rtol={tol.rtol:g}",
        max_abs,
        max_rel,
        at,
    )


def matches(got: Tensor, candidate: Tensor, tol: Tolerance, region: Tensor | None = None) -> bool:
    """Does ``got`` equal ``candidate`` (a known mistake's output), NaN matching NaN?"""
    got, candidate = got.detach().cpu(), candidate.detach().cpu()
    if got.shape != candidate.shape or got.dtype != candidate.dtype:
        return False
    keep = None if region is None else _region(region, candidate.shape)
    n = candidate.numel()
    if n > 4 * _PROBE:
        # A failing case is held against every named mistake's outputs, most of which it is
        # not: a spread of its values settles most of them first (03's 8 MB tables: a failing
        # stage 3x the time of a passing one, all of it here). A value that differs there
        # differs in the whole; values that agree there decide nothing.
        step = n // _PROBE
        probe = None if keep is None else keep.reshape(-1)[::step]
        if not _all_close(got.reshape(-1)[::step], candidate.reshape(-1)[::step], tol, probe):
            return False
    return _all_close(got, candidate, tol, keep)


_PROBE = 1024  # values ``matches`` looks at first, in a tensor of more than four times as many


def _all_close(got: Tensor, candidate: Tensor, tol: Tolerance, keep: Tensor | None) -> bool:
    """``torch.isclose(..., equal_nan=True)`` everywhere ``keep`` is True."""
    if candidate.numel() == 0:
        return True
    if not candidate.is_floating_point():
        same = got == candidate
    else:
        g64, c64 = got.double(), candidate.double()
        # isclose's own test where every difference is finite (both values finite), in a
        # third of its passes: a failing case is held against each of the stage's mistakes
        diff = (g64 - c64).abs_()
        if keep is not None:
            diff.masked_fill_(~keep, 0.0)
        if math.isfinite(float(diff.max())):
            same = diff.le(c64.abs().mul_(tol.rtol).add_(tol.atol))
        else:  # a NaN or an inf
            same = torch.isclose(g64, c64, tol.rtol, tol.atol, equal_nan=True)
    return bool((same if keep is None else same | ~keep).all())

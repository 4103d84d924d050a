"""Stage 03: sinusoidal positional encoding (CURRICULUM.md, 03_positional)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

import reference
from autograder.stages.spec import (
    Case,
    CaseData,
    Dim,
    Graded,
    StageSpec,
    Test,
    Tolerance,
    Variant,
    tolerance_for,
)

ref = reference.load("03_positional")

# -- tolerance ----------------------------------------------------------------------------
#
# Both graded names return sin and cos of angles t_i = a * w_i with w_i = 10000^(-2i/d),
# a = pos <= max_len - 1 for the encoding and a = |k| for the shift matrix. In float32 the
# angle itself is only known to a relative error of a few eps, and sin/cos carry that error
# over one to one (|d sin/dt| <= 1): near pos 512 half an ulp of the angle is already
# 3e-5, and it grows linearly with pos. The relative error of a correctly computed w_i
# depends on the order of operations:
#   exp(-x_i) with x_i = 2i ln(10000)/d (up to ln 10000 = 9.2) computed in floats:
#       the rounding of x_i becomes a relative error of about x_i eps in w_i;
#   r ** i with r = 10000^(-2/d) rounded first (or a cumulative product of r):
#       r's rounding is raised to the power i, about i eps;
#   pow(10000, 2i/d), 1 / 10000 ** (2i/d), pos / 10000 ** (2i/d): a few eps more.
# So |error of t_i| <= t_i * eps * (x_i + i + 4) covers every order (each has only one of
# x_i or i; the sum and the 4 leave room for the last roundings and the product with
# pos). The bound added to the dtype's default atol is its largest value over i, for the
# largest angle of the case. tests/reference/test_03_positional.py shows that ten correct
# orders pass it up to max_len 8192 in float32 and that every misconception fails it by
# orders of magnitude (their errors are O(0.1 - 1)). Float64 gets the same formula with
# its own eps, which stays far below the default atol.

LOG_10000 = math.log(10000.0)


def angle_error_bound(largest: float, d_model: int, dtype: torch.dtype) -> float:
    """max over i of eps * t_i * (x_i + i + 4), t_i = largest * w_i (see above)."""
    i = torch.arange(d_model // 2, dtype=torch.float64)
    x = 2 * i / d_model * LOG_10000  # w_i = exp(-x_i)
    t = abs(largest) * torch.exp(-x)
    return float(torch.finfo(dtype).eps * (t * (x + i + 4)).max()) if d_model >= 2 else 0.0


def _widened(largest: float, d_model: int, dtype: torch.dtype, device: str) -> Tolerance:
    base = tolerance_for(dtype, device)
    return Tolerance(rtol=base.rtol, atol=base.atol + angle_error_bound(largest, d_model, dtype))


def encoding_tolerance(data: CaseData, dtype: torch.dtype, device: str) -> Tolerance:
    max_len, d_model = data.args
    return _widened(max(max_len - 1, 0), d_model, dtype, device)


def shift_tolerance(data: CaseData, dtype: torch.dtype, device: str) -> Tolerance:
    d_model, k = data.args
    return _widened(abs(k), d_model, dtype, device)


# -- the known mistakes, written out ------------------------------------------------------


def _column_frequencies(d_model: int, mistake: str | None = None) -> Tensor:
    """The frequency each column uses, (d_model,), float64: w_i at columns 2i and 2i+1."""
    j = torch.arange(d_model, dtype=torch.float64)  # the column index
    pair = 2 * torch.div(j, 2, rounding_mode="floor")  # 2i, for both columns of pair i
    exponent = {
        None: pair / d_model,
        "i": pair / 2 / d_model,  # i instead of 2i
        "2j": 2 * pair / d_model,  # a loop over j = 0, 2, 4... writing 2 * j
        "j": j / d_model,  # each column its own exponent: the cos column uses 2i + 1
        # a widely copied loop: j = 0, 2, 4, ...; sin uses 2 * j, cos uses 2 * (j + 1)
        "tutorial": torch.where(j % 2 == 0, 2 * pair, 2 * (pair + 1)) / d_model,
    }[mistake]
    return 10000.0 ** (-exponent)


def _pairs_swapped(d_model: int) -> Tensor:
    return torch.arange(d_model).view(-1, 2).flip(-1).reshape(-1)  # 1, 0, 3, 2, ...


def _halves(d_model: int) -> Tensor:
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])  # sin half, cos half


def _layout(d_model: int, layout: str) -> Tensor:
    """Which interleaved column each column of the student's layout holds."""
    if layout == "interleaved":
        return torch.arange(d_model)
    if layout == "swapped":
        return _pairs_swapped(d_model)
    if layout == "halves":
        return _halves(d_model)
    if layout == "cos-half-first":
        if d_model == 2:  # one pair: the same as "swapped", and not a layout mistake
            raise ValueError("does not apply to d_model = 2")
        return torch.cat([torch.arange(1, d_model, 2), torch.arange(0, d_model, 2)])
    raise KeyError(layout)


def _encoding(layout: str = "interleaved", mistake: str | None = None):
    def pe(max_len: int, d_model: int) -> Tensor:
        w = _column_frequencies(d_model, mistake)  # (d_model,)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * w  # (max_len, d_model)
        even = torch.arange(d_model) % 2 == 0
        interleaved = torch.where(even, angles.sin(), angles.cos())
        return interleaved[:, _layout(d_model, layout)].to(torch.get_default_dtype())

    pe.__name__ = f"encoding({layout}, {mistake})"
    return pe


def _shift(layout: str = "interleaved", mistake: str | None = None):
    """The shift matrix consistent with an encoding written with the same mistake."""

    def shift(d_model: int, k: int) -> Tensor:
        t = k * _column_frequencies(d_model, mistake)[0::2]  # (d_model // 2,)
        even = torch.arange(0, d_model, 2)
        m = torch.zeros(d_model, d_model, dtype=torch.float64)
        m[even, even] = m[even + 1, even + 1] = t.cos()
        m[even, even + 1], m[even + 1, even] = t.sin(), -t.sin()
        p = _layout(d_model, layout)  # PE' = PE[:, p]  =>  M' = M[p][:, p]
        return m[p][:, p].to(torch.get_default_dtype())

    shift.__name__ = f"shift({layout}, {mistake})"
    return shift


ENCODING_VARIANTS = (
    Variant("sin-cos-swapped", _encoding("swapped")),
    Variant("sin-cos-swapped", _encoding("cos-half-first")),
    Variant("not-interleaved", _encoding("halves")),
    Variant("not-interleaved", _encoding("cos-half-first")),
    Variant("exponent-off-by-two", _encoding(mistake="i")),
    Variant("exponent-off-by-two", _encoding(mistake="2j")),
    Variant("exponent-off-by-two", _encoding(mistake="j")),
    Variant("exponent-off-by-two", _encoding(mistake="tutorial")),
    Variant("exponent-off-by-two", _encoding("halves", mistake="i")),
    Variant("not-interleaved", _encoding("halves", mistake="i")),
)

SHIFT_VARIANTS = (
    # with sin and cos swapped, the rotation runs the other way: M(k).T = M(-k)
    Variant("sin-cos-swapped", _shift("swapped")),
    Variant("sin-cos-swapped", _shift("cos-half-first")),
    Variant("not-interleaved", _shift("halves")),
    Variant("not-interleaved", _shift("cos-half-first")),
    Variant("exponent-off-by-two", _shift(mistake="i")),
    Variant("exponent-off-by-two", _shift(mistake="2j")),
    Variant("exponent-off-by-two", _shift("halves", mistake="i")),
    Variant("not-interleaved", _shift("halves", mistake="i")),
)

# -- cases --------------------------------------------------------------------------------


def _ints(a: int, b: int):
    """A case of two int arguments; the driver sets the default dtype to the test's."""

    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        return CaseData(args=(a, b), init_kwargs={"default_dtype": str(dtype).removeprefix("torch.")})

    return build


def _pe_cases(*sizes: tuple[int, int]) -> tuple[Case, ...]:
    return tuple(Case(f"max_len={n}, d_model={d}", _ints(n, d)) for n, d in sizes)


def _shift_cases(*sizes: tuple[int, int]) -> tuple[Case, ...]:
    return tuple(Case(f"d_model={d}, k={k}", _ints(d, k)) for d, k in sizes)


# The columns come in (sin, cos) pairs: d_model is even (CURRICULUM.md), never 1.
EVEN = "d_model is even: its columns are (sin, cos) pairs (CURRICULUM.md)"

ENCODING = Graded(
    name="sinusoidal_positional_encoding",
    clause="03.sinusoidal_positional_encoding",
    task=1,
    signature="sinusoidal_positional_encoding(max_len, d_model) -> (max_len, d_model)",
    outputs=("pe",),
    reference=ref.sinusoidal_positional_encoding,
    kind="driver",
    driver="positional:sinusoidal_positional_encoding",
    tolerance=encoding_tolerance,
    check_device=False,  # takes no tensor: the result is on the default device
    variants=ENCODING_VARIANTS,
    dims=(Dim("max_len", lambda c: c.args[0]), Dim("d_model", lambda c: c.args[1], never_one=EVEN)),
    # one pair (sin and cos swapped), two pairs (their layout), a second position (the
    # frequencies); inputs are sizes only, so these run in the order given
    small=(_ints(1, 2), _ints(1, 4), _ints(2, 4), _ints(3, 6)),
    tests=(
        Test(
            "float32, small",
            torch.float32,
            points=2,
            hidden=False,
            cases=_pe_cases((6, 4), (50, 16)),
        ),
        Test(
            "float64, small",
            torch.float64,
            points=1,
            hidden=False,
            cases=_pe_cases((10, 8), (1, 2), (3, 10)),
        ),
        Test(
            "float32, BERT-sized (512, 768)",
            torch.float32,
            points=1,
            cases=_pe_cases((512, 768)),
        ),
        Test(
            "float32, long sequences",
            torch.float32,
            points=1,
            cases=_pe_cases((2048, 64), (1000, 6)),
        ),
        Test(
            "float64, other sizes",
            torch.float64,
            points=1,
            cases=_pe_cases((100, 2), (128, 512), (33, 30)),
        ),
    ),
)

SHIFT = Graded(
    name="relative_shift_matrix",
    clause="03.relative_shift_matrix",
    task=2,
    signature="relative_shift_matrix(d_model, k) -> (d_model, d_model)",
    outputs=("m",),
    reference=ref.relative_shift_matrix,
    kind="driver",
    driver="positional:relative_shift_matrix",
    tolerance=shift_tolerance,
    check_device=False,
    variants=SHIFT_VARIANTS,
    dims=(Dim("d_model", lambda c: c.args[0], never_one=EVEN),),
    small=(_ints(2, 1), _ints(2, -1), _ints(4, 1), _ints(4, -2), _ints(6, 3)),
    tests=(
        Test(
            "float64, small d_model and offsets",
            torch.float64,
            points=2,
            hidden=False,
            cases=_shift_cases((4, 1), (8, -3), (2, 5)),
        ),
        Test(
            "float32, d_model=16",
            torch.float32,
            points=1,
            hidden=False,
            cases=_shift_cases((16, 7)),
        ),
        Test(
            "float32, large offsets",
            torch.float32,
            points=1,
            cases=_shift_cases((64, 100), (128, -511)),
        ),
        Test(
            "float64, k = 0 and large d_model",
            torch.float64,
            points=1,
            cases=_shift_cases((32, 0), (256, 1000)),
        ),
        Test(
            "float64, negative offsets",
            torch.float64,
            points=1,
            cases=_shift_cases((12, -1), (768, -37)),
        ),
    ),
)

SPEC = StageSpec(
    id="03_positional",
    title="Sinusoidal positional encoding",
    graded=(ENCODING, SHIFT),
    # A plain Python double loop over the 512 x 768 entries (the form of a widely copied
    # tutorial) is correct and takes about 3 s on a busy machine: it must not time out.
    call_timeout_s=15.0,
    misconceptions={
        "sin-cos-swapped": "your output matches the encoding with sin and cos swapped. Column 2i must hold "
        "sin(pos·w_i) and column 2i+1 cos(pos·w_i), so row 0 is [0, 1, 0, 1, ...]. In relative_shift_matrix "
        "this shows as the rotation turning the wrong way (the matrix of -k, the transpose): each 2x2 block "
        "must be [[cos t, sin t], [-sin t, cos t]] with t = k·w_i.",
        "not-interleaved": "your output matches the sines in the first half of the columns and the "
        "cosines in the second. Here they are interleaved: sin(pos·w_i) at column 2i and cos(pos·w_i) at "
        "column 2i+1 (write pe[:, 0::2] and pe[:, 1::2]); the shift matrix's 2x2 blocks then sit on the "
        "diagonal.",
        "exponent-off-by-two": "your frequencies are off: w_i = 1 / 10000^(2i / d_model), where i = 0, 1, "
        "..., d_model/2 - 1 numbers the (sin, cos) pair and both columns 2i and 2i+1 use the same w_i. "
        "If you loop over the columns j = 0, 2, 4, ..., the exponent is j / d_model, not 2j / d_model.",
    },
)

"""Stage 01: scaled dot-product attention (CURRICULUM.md, 01_attention)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

import reference
from autograder.stages.spec import Case, CaseData, Dim, Graded, StageSpec, Test, Variant, randint, randn

ref = reference.load("01_attention")

# Operator-level names: every alias (torch.softmax, F.softmax, Tensor.softmax,
# torch.special.softmax, log_softmax, modules that call them) reaches one of these.
SOFTMAX_OPS = (
    "aten::softmax",
    "aten::_softmax",
    "aten::_safe_softmax",
    "aten::_masked_softmax",
    "aten::log_softmax",
    "aten::_log_softmax",
    "aten::special_softmax",
    "aten::special_log_softmax",
)
ATTENTION_OPS = (
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_*",
    "aten::_native_multi_head_attention",
    "aten::_fused_sdp_choice",
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.functional.multi_head_attention_forward",
)

# -- softmax ------------------------------------------------------------------------------


def _unstable_softmax(x: Tensor, dim: int = -1) -> Tensor:
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


def _softmax_case(*shape: int, dim: int | None = None, scale: float = 1.0):
    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        x = randn(g, *shape, dtype=dtype, scale=scale)
        return CaseData(args=(x,), kwargs={} if dim is None else {"dim": dim})

    return build


def _label(shape: tuple[int, ...], dim: int | None, scale: float = 1.0) -> str:
    s = "x" + str(tuple(shape)).replace(" ", "")
    s += "" if dim is None else f", dim={dim}"
    return s + ("" if scale == 1.0 else f", |x|~{scale:g}")


def _axis(i: int):
    """x.size(i), None when x has no axis i."""
    return lambda c: c.args[0].size(i) if c.args[0].dim() > i else None


# x has any shape: each of its axes, and the one the softmax runs along (a softmax over one
# value is 1, which code that squeezes or indexes that axis can get wrong)
SOFTMAX_DIMS = (
    Dim("x.size(0)", _axis(0)),
    Dim("x.size(1)", _axis(1)),
    Dim("x.size(2)", _axis(2)),
    Dim("x.size(dim)", lambda c: c.args[0].size(c.kwargs.get("dim", -1))),
)


def _softmax_cases(specs: list[tuple[tuple[int, ...], int | None, float]]) -> tuple[Case, ...]:
    return tuple(
        Case(_label(shape, dim, scale), _softmax_case(*shape, dim=dim, scale=scale))
        for shape, dim, scale in specs
    )


SOFTMAX = Graded(
    name="softmax",
    clause="01.softmax",
    task=1,
    signature="softmax(x, dim=-1)",
    outputs=("y",),
    reference=ref.softmax,
    forbidden=SOFTMAX_OPS,
    dims=SOFTMAX_DIMS,
    tests=(
        Test(
            "float32, vectors and batches",
            torch.float32,
            points=1,
            hidden=False,
            cases=_softmax_cases([((7,), None, 1.0), ((3, 5), -1, 1.0), ((2, 3, 4), None, 1.0)]),
        ),
        Test(
            "float64, the dim argument",
            torch.float64,
            points=1,
            cases=_softmax_cases(
                # and size-1 axes: one along dim (every weight is 1), two beside it
                [
                    ((4, 5, 6), 0, 1.0),
                    ((4, 5, 6), 1, 1.0),
                    ((3, 6), -2, 1.0),
                    ((1, 3, 1), 1, 1.0),
                    ((3, 1, 4), 1, 1.0),
                ]
            ),
        ),
        Test(
            "float64, large magnitude",
            torch.float64,
            points=1,
            hidden=False,
            cases=_softmax_cases([((3, 8), -1, 1e4), ((5,), None, 1e3)]),
        ),
        Test(
            "float32, large magnitude",
            torch.float32,
            points=1,
            cases=_softmax_cases([((2, 4, 16), -1, 1e4), ((6, 3), 0, 1e4)]),
        ),
    ),
    # a softmax over 2 values (one over 1 is 1 whatever is wrong), a dim that is not the
    # last (and the last of 2 rows), magnitudes where exp overflows
    small=(
        _softmax_case(2),
        _softmax_case(1, 2, dim=0),
        _softmax_case(2, 1),
        _softmax_case(2, 2, dim=0),
        _softmax_case(2, scale=1e3),
        # rows far apart in magnitude: one max taken out for the whole tensor leaves a row
        # whose every exp underflows (0 / 0), where each row's own max does not
        _softmax_case(2, 2, scale=1e3),
    ),
    variants=(
        Variant("unstable-softmax", _unstable_softmax),
        Variant("softmax-wrong-dim", lambda x, dim=-1: ref.softmax(x, dim=-1)),
        Variant("softmax-wrong-dim", lambda x, dim=-1: ref.softmax(x, dim=0)),
        Variant("softmax-wrong-dim", lambda x, dim=-1: ref.softmax(x.flatten(), dim=0).reshape(x.shape)),
    ),
)

# -- scaled dot-product attention ---------------------------------------------------------


def _attention(q, k, v, mask, *, scale: float, softmax=ref.softmax, dim: int = -1, fill=None):
    """Attention written out with each knob a known mistake can turn."""
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min if fill is None else fill)
    weights = softmax(scores, dim=dim)
    return weights @ v, weights


def _variants_with_fills(misconception: str, fn) -> tuple[Variant, ...]:
    # A fully masked row is uniform with a finite fill (-1e9, finfo.min) and NaN with -inf:
    # a mistake is recognised whichever fill the student chose.
    return (
        Variant(misconception, lambda q, k, v, mask=None: fn(q, k, v, mask, None)),
        Variant(misconception, lambda q, k, v, mask=None: fn(q, k, v, mask, float("-inf"))),
    )


def _invert(mask: Tensor | None) -> Tensor | None:
    if mask is None:
        raise ValueError("not applicable without a mask")
    return ~mask


ATTENTION_VARIANTS = (
    *_variants_with_fills("missing-scale", lambda q, k, v, m, f: _attention(q, k, v, m, scale=1.0, fill=f)),
    *_variants_with_fills(
        "scale-by-d", lambda q, k, v, m, f: _attention(q, k, v, m, scale=1 / q.size(-1), fill=f)
    ),
    *_variants_with_fills(
        "softmax-wrong-dim",
        lambda q, k, v, m, f: _attention(q, k, v, m, scale=1 / math.sqrt(q.size(-1)), dim=-2, fill=f),
    ),
    *_variants_with_fills(
        "mask-inverted",
        lambda q, k, v, m, f: _attention(q, k, v, _invert(m), scale=1 / math.sqrt(q.size(-1)), fill=f),
    ),
    *_variants_with_fills(
        "unstable-softmax",
        lambda q, k, v, m, f: _attention(
            q, k, v, m, scale=1 / math.sqrt(q.size(-1)), softmax=_unstable_softmax, fill=f
        ),
    ),
    Variant(
        "weights-transposed",
        lambda q, k, v, mask=None: (lambda out, w: (out, w.transpose(-2, -1)))(
            *ref.scaled_dot_product_attention(q, k, v, mask)
        ),
    ),
)


def _qkv(g, dtype, batch, lq, lk, d_k, d_v, scale=1.0):
    q = randn(g, *batch, lq, d_k, dtype=dtype, scale=scale)
    k = randn(g, *batch, lk, d_k, dtype=dtype, scale=scale)
    v = randn(g, *batch, lk, d_v, dtype=dtype)
    return q, k, v


def _no_mask(batch, lq, lk, d_k, d_v, scale=1.0):
    def build(g, dtype):
        return CaseData(args=_qkv(g, dtype, batch, lq, lk, d_k, d_v, scale))

    return build


def _padding(b, h, length, d_k, fully_masked_row=False):
    def build(g, dtype):
        q, k, v = _qkv(g, dtype, (b, h), length, length, d_k, d_k)
        # lengths in [1, L-1]: every row keeps a key, and the inverted mask does too
        mask = ref.padding_mask(randint(g, 1, length, b), length)  # (B, 1, 1, L)
        if fully_masked_row:
            mask = mask.expand(b, 1, length, length).clone()
            mask[0, 0, 1, :] = False  # a query that may attend nothing: not graded
        return CaseData(args=(q, k, v), kwargs={"mask": mask})

    return build


def _causal(batch, length, d_k, with_padding=False):
    def build(g, dtype):
        q, k, v = _qkv(g, dtype, batch, length, length, d_k, d_k)
        mask = ref.causal_mask(length)  # (L, L)
        if with_padding:
            mask = mask & ref.padding_mask(randint(g, 1, length, batch[0]), length)  # (B, 1, L, L)
        return CaseData(args=(q, k, v), kwargs={"mask": mask})

    return build


def _graded_rows(data: CaseData) -> tuple[Tensor | None, Tensor | None]:
    """Rows in which every key is masked are not graded (CURRICULUM.md)."""
    mask = data.kwargs.get("mask")
    if mask is None:
        return None, None
    q, k, _ = data.args
    # numpy's, not torch.broadcast_shapes: that imports sympy (half a second of a cold grade)
    shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], mask.shape[:-2]) + (q.size(-2), k.size(-2))
    rows = mask.expand(shape).any(dim=-1, keepdim=True)  # (..., Lq, 1)
    return rows, rows


def _lead(i: int):
    """The i-th of q's leading (batch) axes, None when it has fewer."""
    return lambda c: c.args[0].size(i) if c.args[0].dim() > i + 2 else None


# q (..., Lq, d_k), k (..., Lk, d_k), v (..., Lk, d_v); the leading axes are B, h and a third
ATTENTION_DIMS = (
    Dim("B", _lead(0)),
    Dim("h", _lead(1)),
    Dim("...[2]", _lead(2)),
    Dim("L_q", lambda c: c.args[0].size(-2)),
    Dim("L_k", lambda c: c.args[1].size(-2)),
    Dim("d_k", lambda c: c.args[0].size(-1)),
    Dim("d_v", lambda c: c.args[2].size(-1)),
)

ATTENTION = Graded(
    name="scaled_dot_product_attention",
    clause="01.scaled_dot_product_attention",
    task=2,
    signature="scaled_dot_product_attention(q, k, v, mask=None) -> (out, weights)",
    outputs=("out", "weights"),
    reference=ref.scaled_dot_product_attention,
    forbidden=ATTENTION_OPS,
    graded_region=_graded_rows,
    variants=ATTENTION_VARIANTS,
    dims=ATTENTION_DIMS,
    # one query and two keys (with one key every softmax is 1), d_k = 2 (with 1 a missing
    # scale changes nothing); a padding mask that keeps one key of two; causal over two
    # positions; scores where exp overflows
    small=(
        _no_mask((1,), 1, 2, 2, 1),
        _no_mask((1,), 2, 2, 2, 1),
        _padding(1, 1, 2, 1),
        _causal((1,), 2, 1),
        _padding(1, 1, 3, 2),
        _no_mask((1,), 1, 2, 2, 1, scale=100.0),
        # two queries whose scores are far apart: each row's softmax needs its own max
        _no_mask((1,), 2, 2, 2, 1, scale=100.0),
    ),
    tests=(
        Test(
            "float32, no mask",
            torch.float32,
            points=2,
            hidden=False,
            cases=(
                Case("B=2, L=5, d_k=8", _no_mask((2,), 5, 5, 8, 8)),
                Case("Lq=4, Lk=7, d_k=6, d_v=5", _no_mask((3,), 4, 7, 6, 5)),
                Case("(B, h)=(2, 3), L=4, d_k=8", _no_mask((2, 3), 4, 4, 8, 8)),
            ),
        ),
        Test(
            "float64, no mask",
            torch.float64,
            points=1,
            cases=(
                Case("B=1, L=6, d_k=16", _no_mask((1,), 6, 6, 16, 16)),
                Case("(2, 2, 3) batch, Lq=3, Lk=9, d_v=2", _no_mask((2, 2, 3), 3, 9, 4, 2)),
                # size-1 axes: one query, one value feature, a batch axis of 1; then one key
                # (every weight is 1) with d_k = 1 (where the scale is 1 too)
                Case("(3, 2, 1) batch, Lq=1, Lk=4, d_k=3, d_v=1", _no_mask((3, 2, 1), 1, 4, 3, 1)),
                Case("B=2, Lq=3, Lk=1, d_k=1, d_v=3", _no_mask((2,), 3, 1, 1, 3)),
            ),
        ),
        Test(
            "float64, padding mask",
            torch.float64,
            points=2,
            hidden=False,
            cases=(
                Case("B=3, h=2, L=6, d_k=8", _padding(3, 2, 6, 8)),
                Case(
                    "B=2, h=1, L=5, d_k=4, one fully masked row",
                    _padding(2, 1, 5, 4, fully_masked_row=True),
                ),
            ),
        ),
        Test(
            "float32, padding mask",
            torch.float32,
            points=1,
            cases=(Case("B=4, h=3, L=7, d_k=16", _padding(4, 3, 7, 16)),),
        ),
        Test(
            "float64, causal mask",
            torch.float64,
            points=1,
            hidden=False,
            cases=(
                Case("B=2, L=5, d_k=8", _causal((2,), 5, 8)),
                Case("(B, h)=(2, 2), L=6, d_k=4", _causal((2, 2), 6, 4)),
            ),
        ),
        Test(
            "float32, padding and causal",
            torch.float32,
            points=1,
            cases=(Case("(B, h)=(3, 2), L=8, d_k=8", _causal((3, 2), 8, 8, with_padding=True)),),
        ),
        Test(
            "float64, large magnitude",
            torch.float64,
            points=1,
            cases=(Case("B=2, L=6, d_k=16, |q|,|k|~30", _no_mask((2,), 6, 6, 16, 16, scale=30.0)),),
        ),
    ),
)

# -- masks --------------------------------------------------------------------------------


def _lengths(values: list[int] | None, b: int, max_len: int):
    def build(g, dtype):
        lengths = torch.tensor(values) if values is not None else randint(g, 0, max_len + 1, b)
        return CaseData(args=(lengths, max_len))

    return build


PADDING_MASK = Graded(
    name="padding_mask",
    clause="01.padding_mask",
    task=3,
    signature="padding_mask(lengths, max_len) -> BoolTensor (B, 1, 1, max_len)",
    outputs=("mask",),
    reference=ref.padding_mask,
    variants=(Variant("mask-inverted", lambda lengths, max_len: ~ref.padding_mask(lengths, max_len)),),
    dims=(Dim("B", lambda c: c.args[0].size(0)), Dim("max_len", lambda c: c.args[1])),
    small=(
        _lengths([0], 1, 1),
        _lengths([1], 1, 2),
        _lengths([0, 1], 2, 1),
        _lengths([2, 1], 2, 3),
        _lengths(None, 3, 4),
    ),
    tests=(
        Test(
            "lengths [3, 1, 5] and [2]",
            torch.int64,
            points=1,
            hidden=False,
            cases=(
                Case("lengths=[3, 1, 5], max_len=5", _lengths([3, 1, 5], 3, 5)),
                Case("lengths=[2], max_len=4", _lengths([2], 1, 4)),
            ),
        ),
        Test(
            "random lengths, 0 and max_len included",
            torch.int64,
            points=1,
            cases=(
                Case("B=6, max_len=9", _lengths(None, 6, 9)),
                Case("lengths=[0, 4, 4], max_len=4", _lengths([0, 4, 4], 3, 4)),
                Case("lengths=[1], max_len=1", _lengths([1], 1, 1)),
            ),
        ),
    ),
)


def _length(n: int):
    return lambda g, dtype: CaseData(args=(n,))


CAUSAL_MASK = Graded(
    name="causal_mask",
    clause="01.causal_mask",
    task=3,
    signature="causal_mask(L) -> BoolTensor (L, L)",
    outputs=("mask",),
    reference=ref.causal_mask,
    check_device=False,  # takes no tensor, so there is no device to follow
    variants=(Variant("mask-inverted", lambda L: ~ref.causal_mask(L)),),
    dims=(Dim("L", lambda c: c.args[0]),),
    small=(_length(1), _length(2), _length(3)),
    tests=(
        Test(
            "L = 1 and 4",
            torch.bool,
            points=1,
            hidden=False,
            cases=(
                Case("L=1", lambda g, dtype: CaseData(args=(1,))),
                Case("L=4", lambda g, dtype: CaseData(args=(4,))),
            ),
        ),
        Test(
            "L = 7 and 33",
            torch.bool,
            points=1,
            cases=(
                Case("L=7", lambda g, dtype: CaseData(args=(7,))),
                Case("L=33", lambda g, dtype: CaseData(args=(33,))),
            ),
        ),
    ),
)

SPEC = StageSpec(
    id="01_attention",
    title="Scaled dot-product attention",
    graded=(SOFTMAX, ATTENTION, PADDING_MASK, CAUSAL_MASK),
    misconceptions={
        "missing-scale": "your output matches attention without the 1/sqrt(d_k) scale: divide q·kᵀ by "
        "sqrt(d_k), with d_k = q.size(-1), before the softmax.",
        "scale-by-d": "your output matches scores divided by d_k instead of sqrt(d_k): the scale is "
        "1/sqrt(d_k), which keeps the variance of q·kᵀ near 1.",
        "softmax-wrong-dim": "your output matches a softmax over the wrong dimension: normalise along `dim` "
        "(for attention, the last one: each query's weights over all keys sum to 1).",
        "mask-inverted": "your output matches the mask read the wrong way round: True means 'may attend' "
        "(a real token), so fill the scores where the mask is False: masked_fill(~mask, ...).",
        "unstable-softmax": "your result overflows to NaN/inf on large inputs: exp() of a big number is inf. "
        "Subtract the maximum along the softmax dimension before exp(); it cancels in the ratio.",
        "weights-transposed": "your weights are transposed: weights[..., i, j] is how much query i attends "
        "to key j, shape (..., Lq, Lk).",
    },
)

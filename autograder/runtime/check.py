"""One case: from what a call produced to a verdict, a message and a named mistake.

Shared by the grader (on what the child returned) and by the notebook self-check (on
what the student's function returned in the kernel), so a student sees in the notebook
exactly the message the grader will give.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from autograder.runtime.compare import Tolerance, compare, matches, tolerance_for
from autograder.runtime.results import CaseResult, KeptArrays

Item = tuple[str, Tensor | None, Mapping[str, str]]  # (kind, plain tensor, facts) per output

KIND_NAMES = {
    "tensor": "a torch.Tensor",
    "ndarray": "a numpy.ndarray",
    "scalar": "a Python/numpy number",
}

# Mistakes named in every stage, recognised from what was returned rather than from a
# stage's variants: the right values in another order, or in another dtype. Their hints
# are written here, once, and are trusted text like a spec's: every place that shows a
# spec's hints (messages, hidden tests, the HTML feedback, the self-check) shows these too,
# through ``all_hints``. A spec may not reuse these ids (tests/test_structural_mistakes.py).
GENERIC_MISCONCEPTIONS: Mapping[str, str] = {
    "returns-swapped": "your outputs hold the right values, in another order than the signature's: "
    "return them in the order the task's signature lists them after `->` (e.g. `return out, weights` "
    "for `-> (out, weights)`), and check that each variable holds what its name says.",
    "dtype-hard-coded": "your values are right, but in another precision than expected (e.g. float32 "
    "for float64 inputs, or the reverse): a dtype is hard-coded somewhere, such as `.float()`, "
    "`.double()`, `torch.float32`, `dtype=torch.float64`, `np.float32`, `.astype(...)` or a detour "
    "through numpy (float64). Keep the inputs' dtype: `torch.zeros_like(x)`, `x.new_zeros(...)`, "
    "`dtype=x.dtype`, `.to(x.dtype)`: the grader runs your code in every dtype your stage lists.",
    "dtype-wrong-kind": "your values are right, but in another kind of dtype than expected: a mask is "
    "a bool tensor (a comparison such as `<` or `&` gives one; don't turn it into 0/1 with `.int()`, "
    "`.long()` or `.float()`), positions and indices are integers (`argmax` gives int64; don't "
    "convert them to float), and values computed from floats stay floating point.",
    "shape-squeezable": "your values are right, but with size-1 axes added or missing (e.g. a loss "
    "returned as an array of shape (1,) instead of a number, a gradient of shape (d, 1) instead of "
    "(d,), a (1, L) row for an (L,) vector): return exactly the shape the signature gives: "
    "`.item()` or `float(...)` for a number, `.reshape(...)` or `.squeeze(axis)` with the axis named "
    "(a bare `.squeeze()` also drops the axes whose size happens to be 1, such as a batch of one).",
    "float32-intermediates": "your values are right to float32's precision, not to float64's: they "
    "agree with the reference computed in float32. Somewhere your code computes in float32 and casts "
    "back: a tensor made without `dtype=` (`torch.arange`, `torch.tensor(...)`, `torch.ones` default "
    "to float32), `.float()`, `np.float32`, a library routine ported from float32 code (angles, "
    "`log(1 - sigmoid(s))`). Make every intermediate in the inputs' dtype (`dtype=x.dtype`, "
    "`x.new_tensor(...)`).",
}
# A case graded in float64 carries, among its variants, the reference's outputs on its inputs
# cast to float32 (``plan.LazyVariants``): code whose values are within float32's tolerance of
# those, and not within float64's of the expected ones, computes in float32 somewhere.
FLOAT32 = "float32-intermediates"


def all_hints(hints: Mapping[str, str]) -> dict[str, str]:
    """A stage's hints and the generic ones: every id ``check_case`` may name, with its hint."""
    return {**GENERIC_MISCONCEPTIONS, **hints}


@dataclass(frozen=True)
class Expectation:
    """What the trusted side knows about one case."""

    name: str
    signature: str
    outputs: tuple[str, ...]
    returns: str | Sequence[str]  # tensor | ndarray | scalar, for all outputs or one per output
    values: Sequence[Tensor]  # expected, one per output
    regions: Sequence[Tensor | None]
    tolerance: Tolerance
    device: str | None  # the device outputs must be on; None: not checked
    variants: Sequence[tuple[str, Sequence[Tensor]]]  # (misconception id, outputs)
    # The share of the case each output earns when right (``Graded.credit``); None: the case
    # is right or wrong as a whole.
    credit: Sequence[float] | None = None


def _a(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


def failure_message(name: str, signature: str, status: str, info: Mapping[str, object]) -> str:
    """The student-facing sentence for a call that did not return usable values."""
    where = f" at {info['where']}" if info.get("where") else ""
    message = str(info.get("message", "")).strip()
    said = f": {message}" if message else ""
    if status == "missing":
        return f"`{name}` is not defined. Define it at the top level of a code cell: {signature}."
    if status == "not_callable":
        what = str(info.get("type", "object"))
        what = what if what.startswith("is ") else f"is {_a(what)}, not a function or class"
        return f"`{name}` {what}; expected {signature}."
    if status == "not_implemented":
        return f"`{name}` is not implemented yet (it raises NotImplementedError)."
    if status == "type_error":
        if where:  # raised inside the student's code: the parameters were accepted
            return f"calling {signature} raised TypeError{said}{where}"
        return (
            f"calling {signature} raised TypeError{said}. "
            f"Check that your definition takes exactly these parameters."
        )
    if status == "error" and info.get("type") == "SystemExit":
        return f"`{name}` called sys.exit(){where}: a graded function must return its result, not exit."
    if status == "error":
        return f"raised {info.get('type', 'an exception')}{said}{where}"
    if status == "forbidden":
        calls = ", ".join(str(c) for c in info.get("calls", []))  # type: ignore[union-attr]
        return f"`{name}` called {calls}, which this task forbids: build it from basic tensor operations."
    if status == "untrusted":
        return (
            f"`{name}` could not be graded: the process running your code sent a report the grader "
            "cannot trust (did your code replace a module such as json, os or torch?)"
        )
    return message or status


def _device_type(device: str) -> str | None:
    """``cuda`` for "cuda:1"; None for what names no device (a fact the grader cannot read)."""
    try:
        return torch.device(device).type
    except (RuntimeError, ValueError, TypeError):
        return None


def returned_what(kind: str, facts: Mapping[str, str]) -> str:
    if kind in KIND_NAMES:
        return KIND_NAMES[kind]
    typename = facts.get("type", "value")
    if typename == "NoneType":
        return "None (is a `return` missing?)"
    return f"{_a(typename)} object"


def check_case(
    label: str,
    status: str,
    info: Mapping[str, object],
    items: Sequence[Item],
    exp: Expectation,
    hints: Mapping[str, str],
    keep: bool = False,
) -> CaseResult:
    """The verdict on one case. With ``keep``, a failing result also carries a small 2-D
    window of each wrong output's values and the expected ones (``CaseResult.arrays``)."""
    if status != "ok":
        failed = CaseResult(label, False, failure_message(exp.name, exp.signature, status, info))
        failed.status = status
        return failed
    problems: list[str] = []
    errors: list[float] = []
    worst: tuple[float, str] | None = None  # the largest error of any output compared, and where
    got: list[Tensor | None] = []
    right: list[bool] = []  # per output, for a case whose outputs earn credit apart
    wrong: list[tuple[str, Tensor, Tensor, Tensor | None]] = []  # for keep
    kinds = [exp.returns] * len(exp.outputs) if isinstance(exp.returns, str) else list(exp.returns)
    for out_name, expected_kind, (kind, tensor, facts), want, region in zip(
        exp.outputs, kinds, items, exp.values, exp.regions, strict=True
    ):
        prefix = f"`{out_name}`: " if len(exp.outputs) > 1 else ""
        right.append(False)
        if kind != expected_kind:
            what = returned_what(kind, facts)
            problems.append(f"{prefix}returned {what}; expected {KIND_NAMES[expected_kind]}")
            got.append(None)
            continue
        got.append(tensor)
        if exp.device is not None and kind == "tensor":
            dev = str(facts.get("device", "unknown"))
            if _device_type(dev) != torch.device(exp.device).type:
                problems.append(f"{prefix}is on {dev}; expected {exp.device}, the inputs' device")
                continue
        assert tensor is not None
        cmp = compare(tensor, want, exp.tolerance, region)
        if cmp.max_abs is not None and (worst is None or cmp.max_abs > worst[0]):
            at = ", ".join(str(i) for i in cmp.where or ())
            worst = (cmp.max_abs, f"{_output_name(out_name)}[{at}]" if at else _output_name(out_name))
        if not cmp.ok:
            problems.append(prefix + cmp.message)
            wrong.append((out_name, tensor, want, region))
            continue
        right[-1] = True
        if cmp.max_abs is not None:
            errors.append(cmp.max_abs)
    max_abs, where = worst if worst is not None else (None, None)
    if not problems:
        message = f"passed (max abs error {max(errors):.1e})" if errors else "passed"
        return CaseResult(label, True, message, max_abs=max_abs, where=where)
    found: list[str] = []
    for mid, outs in exp.variants:
        if mid in found or mid == FLOAT32:
            continue
        if all(
            g is not None and matches(g, v, exp.tolerance, r)
            for g, v, r in zip(got, outs, exp.regions, strict=True)
        ):
            found.append(mid)
    if not found:  # generic names only where none of the stage's mistakes explains the case
        found, order = _structural(items, exp, kinds)
        if order is not None:
            expected = ", ".join(_output_name(o) for o in exp.outputs[: len(order)])
            problems.append(
                f"your outputs are the expected ones in another order: you return ({', '.join(order)}), "
                f"expected ({expected})"
            )
    every = all_hints(hints)
    hinted = {mid: every.get(mid, "") for mid in found}
    share = _credit(exp, right)
    if share:
        kept = ", ".join(o for o, ok in zip(exp.outputs, right, strict=True) if ok)
        problems.append(f"right: {kept}, which earn {share:.0%} of this case")
    result = CaseResult(label, False, "; ".join(problems), found, hinted, max_abs, where)
    result.credit = share
    if keep:
        kept = (window(n, g, w, r) for n, g, w, r in wrong)
        result.arrays = tuple(k for k in kept if k is not None)
    return result


def _credit(exp: Expectation, right: Sequence[bool]) -> float:
    """The share of a failing case its right outputs earn (0 unless its outputs earn apart)."""
    if not exp.credit:
        return 0.0
    return sum(w for w, ok in zip(exp.credit, right, strict=True) if ok) / sum(exp.credit)


# -- mistakes named in every stage ----------------------------------------------------------

_DTYPE_IDS = {"precision": "dtype-hard-coded", "kind": "dtype-wrong-kind"}
_NAME = re.compile(r"\s*([A-Za-z_]\w*)")
# an output named as the signature names it, perhaps with a note: "output_tokens (as
# vocabulary ids)"; not "out of call 1 (train)", which a driver gathered
_OUTPUT = re.compile(r"\s*([A-Za-z_]\w*)\s*(?:\(.*\))?\s*$")


def _category(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "float" if dtype.is_floating_point else "int"


def _fit(got: Tensor, want: Tensor, tol: Tolerance, region: Tensor | None, device: str) -> str | None:
    """How ``got`` holds ``want``'s values: "same" (in its dtype too), "precision" (in
    another dtype of the same kind: float32 for float64, int32 for int64), "kind" (0/1
    numbers for bools, floats for integers...), or None (it does not).

    Another precision is held to the tolerance of the lower of the two: float32 values of
    a float64 result are right when they are within float32's tolerance. An integer or
    bool result is exact: the values must survive the cast both ways (0.5 is not True)."""
    if got.shape != want.shape:
        return None
    if got.dtype == want.dtype:
        return "same" if matches(got, want, tol, region) else None
    have, need = _category(got.dtype), _category(want.dtype)
    if "complex" in (have, need):
        return None
    how = "precision" if have == need else "kind"
    if need == "float":
        if have == "float" and torch.finfo(got.dtype).eps > torch.finfo(want.dtype).eps:
            tol = at_least(tol, got.dtype, device)
        return how if matches(got.to(want.dtype), want, tol, region) else None
    if have == "float" and not bool(torch.isfinite(got).all()):
        return None  # a float NaN or inf has no integer value
    exact = Tolerance(0.0, 0.0)
    cast = got.to(want.dtype)
    if not matches(cast, want, exact, region) or not matches(cast.to(got.dtype), got, exact, region):
        return None
    return how


def at_least(tol: Tolerance, dtype: torch.dtype, device: str) -> Tolerance:
    """``tol``, loosened to ``dtype``'s own tolerance where that is looser."""
    lower = tolerance_for(dtype, device)
    return Tolerance(max(tol.rtol, lower.rtol), max(tol.atol, lower.atol))


def _squeezable(
    item: Item, expected_kind: str, want: Tensor, region: Tensor | None, tol: Tolerance, device: str
) -> str | None:
    """How an output whose shape differs from the expected one only by size-1 axes holds the
    expected values ("same", "precision", "kind" as ``_fit``), or None. A number and a
    one-element array are the same value in another shape."""
    kind, got, _ = item
    numeric = {"ndarray", "scalar"}
    if got is None or (kind != expected_kind and {kind, expected_kind} != numeric):
        return None
    if got.shape == want.shape or got.numel() != want.numel():
        return None
    if [s for s in got.shape if s != 1] != [s for s in want.shape if s != 1]:
        return None
    return _fit(got.reshape(want.shape), want, tol, region, device)


def returned_in_order(signature: str, outputs: Sequence[str]) -> int:
    """How many leading outputs are what the signature says the call returns, in that
    order (``-> (out, weights)``): those a student can return in another order. The other
    outputs (a driver's statistics, the rng's next draws) are the driver's own."""
    _, arrow, returned = signature.rpartition("->")
    returned = returned.strip()
    if not arrow or not returned.startswith("("):
        return 0
    names, depth, start = [], 0, 1
    for i, ch in enumerate(returned):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if (ch == "," and depth == 1) or depth == 0:
            names.append(returned[start:i])
            start = i + 1
        if depth == 0:
            break
    count = 0
    for part, output in zip(names, outputs, strict=False):
        a, b = _NAME.match(part), _OUTPUT.match(output)
        if a is None or b is None or a[1] != b[1]:
            break
        count += 1
    return count


def _structural(
    items: Sequence[Item], exp: Expectation, kinds: Sequence[str]
) -> tuple[list[str], tuple[str, ...] | None]:
    """The generic mistakes (and a stage's, made in another dtype) that explain a failing
    case no variant of the stage matches as it is; for returns-swapped, also the order in
    which the outputs were returned, by their expected names."""
    device = exp.device or "cpu"

    def fit(i: int, j: int, values: Sequence[Tensor]) -> str | None:
        kind, tensor, _ = items[i]
        if kind != kinds[j] or tensor is None:
            return None
        return _fit(tensor, values[j], exp.tolerance, exp.regions[j], device)

    def dtype_ids(fits: Sequence[str | None]) -> list[str]:
        return [_DTYPE_IDS[f] for f in ("precision", "kind") if f in fits]

    n = len(exp.outputs)
    in_place = [fit(i, i, exp.values) for i in range(n)]
    if all(f is not None for f in in_place):  # the right values: only dtypes differ
        return dtype_ids(in_place), None
    squeezed = [
        in_place[i] or _squeezable(items[i], kinds[i], exp.values[i], exp.regions[i], exp.tolerance, device)
        for i in range(n)
    ]
    if all(f is not None for f in squeezed):  # the right values, with size-1 axes added or dropped
        return ["shape-squeezable", *dtype_ids(squeezed)], None
    lower = next((outs for mid, outs in exp.variants if mid == FLOAT32), None)
    if lower is not None and all(
        items[i][0] == kinds[i]
        and items[i][1] is not None
        and items[i][1].dtype == exp.values[i].dtype
        and matches(items[i][1], lower[i], at_least(exp.tolerance, torch.float32, device), exp.regions[i])
        for i in range(n)
    ):
        return [FLOAT32], None
    # A stage's mistake made in another dtype: both are named. Only when the values do not
    # also fit the expected ones (above): within float32's tolerance of the reference, a
    # variant's outputs are no evidence of its mistake.
    stage_ids: list[str] = []
    casts: list[str | None] = []
    recast = any(t is not None and t.dtype != v.dtype for (_, t, _), v in zip(items, exp.values, strict=True))
    for mid, outs in exp.variants if recast else ():  # in the same dtypes, check_case tried them
        if mid == FLOAT32:
            continue
        fits = [fit(i, i, outs) for i in range(n)]
        if all(f is not None for f in fits) and mid not in stage_ids:
            stage_ids.append(mid)
            casts += fits
    if stage_ids:
        return stage_ids + dtype_ids(casts), None
    k = returned_in_order(exp.signature, exp.outputs)
    if k >= 2 and all(f is not None for f in in_place[k:]):
        pairs = {(i, j): in_place[i] if i == j else fit(i, j, exp.values) for i in range(k) for j in range(k)}
        for perm in itertools.permutations(range(k)):
            fits = [pairs[i, perm[i]] for i in range(k)]
            if perm != tuple(range(k)) and all(f is not None for f in fits):
                order = tuple(_output_name(exp.outputs[j]) for j in perm)
                return ["returns-swapped", *dtype_ids(fits + in_place[k:])], order
    return dtype_ids(in_place), None


def _output_name(output: str) -> str:
    """``output_tokens`` for "output_tokens (as vocabulary ids)"."""
    m = _NAME.match(output)
    return m[1] if m else output


def _bounds(centre: int, size: int, side: int) -> tuple[int, int]:
    start = min(max(centre - side // 2, 0), max(size - side, 0))
    return start, min(start + side, size)


def window(
    name: str, got: Tensor, expected: Tensor, region: Tensor | None = None, side: int = 64
) -> KeptArrays | None:
    """At most ``side`` x ``side`` values of ``got`` and ``expected`` around their largest
    difference: the matrix (last two dims) that holds it, cropped; a vector is one row.
    Matrices of another shape (e.g. transposed) keep the first matrix of each, top-left.
    None when there is no picture to draw (a single value, complex, other ranks)."""
    got, expected = got.detach().cpu(), expected.detach().cpu()
    if got.numel() < 2 or expected.numel() < 2 or got.is_complex() or expected.is_complex():
        return None
    if got.shape != expected.shape:
        if got.dim() != expected.dim() or got.dim() < 2 or got.shape[:-2] != expected.shape[:-2]:
            return None
        first = (0,) * (got.dim() - 2)
        g, e = got[first][:side, :side], expected[first][:side, :side]
        idx = ", ".join([*(str(i) for i in first), ":", ":"])
        return KeptArrays(
            output=name,
            where=f"{name}[{idx}]: yours is {tuple(got.shape[-2:])}, expected {tuple(expected.shape[-2:])}",
            got=g.float().numpy().copy(),
            expected=e.float().numpy().copy(),
            graded=torch.ones(e.shape, dtype=torch.bool).numpy(),
        )
    g, e = got.double(), expected.double()
    keep = torch.ones(e.shape, dtype=torch.bool) if region is None else region.cpu().bool().expand(e.shape)
    err = torch.nan_to_num((g - e).abs(), nan=float("inf"))  # a NaN where a number belongs is worst
    err = torch.where(keep, err, torch.zeros((), dtype=torch.float64))
    flat = int(err.flatten().argmax())
    at: list[int] = []
    for size in reversed(e.shape):
        at.insert(0, flat % size)
        flat //= size
    if e.dim() == 1:
        g, e, keep, at = g[None], e[None], keep[None], [0, *at]
    lead = tuple(at[:-2])
    g, e, keep = g[lead], e[lead], keep[lead]  # (rows, cols)
    r0, r1 = _bounds(at[-2], g.shape[0], side)
    c0, c1 = _bounds(at[-1], g.shape[1], side)
    idx = ", ".join([*(str(i) for i in lead), ":", ":"]) if got.dim() > 1 else ":"
    where = f"{name}[{idx}]"
    if (r1 - r0, c1 - c0) != tuple(g.shape):
        rows = f"rows {r0}-{r1 - 1}, " if got.dim() > 1 else ""
        where += f", {rows}{'columns' if rows else 'values'} {c0}-{c1 - 1}"
    return KeptArrays(
        output=name,
        where=where,
        got=g[r0:r1, c0:c1].float().numpy().copy(),
        expected=e[r0:r1, c0:c1].float().numpy().copy(),
        graded=keep[r0:r1, c0:c1].numpy().copy(),
        row0=r0,
        col0=c0,
    )

"""One case: from what a call produced to a verdict, a message and a named mistake.

Shared by the grader (on what the child returned) and by the notebook self-check (on
what the student's function returned in the kernel), so a student sees in the notebook
exactly the message the grader will give.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from autograder.compare import compare, matches
from autograder.results import CaseResult, KeptArrays
from autograder.spec import Tolerance

Item = tuple[str, Tensor | None, Mapping[str, str]]  # (kind, plain tensor, facts) per output

KIND_NAMES = {
    "tensor": "a torch.Tensor",
    "ndarray": "a numpy.ndarray",
    "scalar": "a Python/numpy number",
}


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
        return CaseResult(label, False, failure_message(exp.name, exp.signature, status, info))
    problems: list[str] = []
    errors: list[float] = []
    got: list[Tensor | None] = []
    wrong: list[tuple[str, Tensor, Tensor, Tensor | None]] = []  # for keep
    kinds = [exp.returns] * len(exp.outputs) if isinstance(exp.returns, str) else list(exp.returns)
    for out_name, expected_kind, (kind, tensor, facts), want, region in zip(
        exp.outputs, kinds, items, exp.values, exp.regions, strict=True
    ):
        prefix = f"`{out_name}`: " if len(exp.outputs) > 1 else ""
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
        if not cmp.ok:
            problems.append(prefix + cmp.message)
            wrong.append((out_name, tensor, want, region))
        elif cmp.max_abs is not None:
            errors.append(cmp.max_abs)
    if not problems:
        return CaseResult(label, True, f"passed (max abs error {max(errors):.1e})" if errors else "passed")
    found: list[str] = []
    for mid, outs in exp.variants:
        if mid in found:
            continue
        if all(
            g is not None and matches(g, v, exp.tolerance, r)
            for g, v, r in zip(got, outs, exp.regions, strict=True)
        ):
            found.append(mid)
    message = "; ".join(problems)
    for mid in found:
        message += f"\n    likely mistake [{mid}]: {hints.get(mid, '')}"
    result = CaseResult(label, False, message, found)
    if keep:
        kept = (window(n, g, w, r) for n, g, w, r in wrong)
        result.arrays = tuple(k for k in kept if k is not None)
    return result


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

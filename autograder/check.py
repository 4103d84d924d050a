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
from autograder.results import CaseResult
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
    return message or status


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
) -> CaseResult:
    if status != "ok":
        return CaseResult(label, False, failure_message(exp.name, exp.signature, status, info))
    problems: list[str] = []
    errors: list[float] = []
    got: list[Tensor | None] = []
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
            dev = facts.get("device", "?")
            if torch.device(dev).type != torch.device(exp.device).type:
                problems.append(f"{prefix}is on {dev}; expected {exp.device}, the inputs' device")
                continue
        assert tensor is not None
        cmp = compare(tensor, want, exp.tolerance, region)
        if not cmp.ok:
            problems.append(prefix + cmp.message)
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
    return CaseResult(label, False, message, found)

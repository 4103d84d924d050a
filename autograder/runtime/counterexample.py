"""Counterexamples as a student reads them: values as Python literals, and the one function
that turns a failing small input into a ``Counterexample``.

Shared by the grader (``grader/counterexample.py``, on what a clean child returned) and the
notebook self-check (on what the student's function returned in the kernel), so both show
the same text for the same input. The input's own code (``Counterexample.code``) is written
by the grader from the case, and shipped as text with the self-check data.

Every value prints as Python that rebuilds it exactly: ``torch.tensor([...], dtype=...)``,
``np.array([...], dtype=...)``, numbers as the shortest text that reads back to the same
float in their own precision (``float('nan')`` and ``float('inf')`` where needed).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch

from autograder.runtime.check import Expectation, Item, returned_what
from autograder.runtime.results import NO_INPUT_CHANGES, CaseResult, Counterexample

WIDTH = 96  # a literal longer than this breaks after each item of its outermost list
MAX_SHOWN = 256  # numbers of one returned value shown; a larger (wrong) one is described instead

# The statuses of a call on which no input can disagree with the reference: the name is
# missing, forbidden, unfinished or stopped. A counterexample shows values that differ or an
# exception that a small input raises, nothing else.
NOT_A_COUNTEREXAMPLE = NO_INPUT_CHANGES


def number(x: Any, dtype: torch.dtype | None = None) -> str:
    """A number as Python that reads back to the same value (in ``dtype``'s precision)."""
    if isinstance(x, bool):
        return repr(x)
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if math.isnan(x):
        return "float('nan')"
    if math.isinf(x):
        return "float('inf')" if x > 0 else "-float('inf')"
    if dtype in (torch.float32, np.float32):
        # numpy writes a float32 as the shortest text that reads back to it in float32;
        # checked through a double, which torch.tensor(..., dtype=float32) parses first
        short = str(np.float32(x))
        if float(np.float32(float(short))) == x:
            return short
    return repr(x)


def _nested(values: Any, fmt: Any) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_nested(v, fmt) for v in values) + "]"
    return fmt(values)


def _broken(values: list, fmt: Any, indent: str) -> str:
    """One item of the outermost list per line, when the whole does not fit on one."""
    inner = indent + "    "
    items = [_nested(v, fmt) for v in values]
    return "[\n" + "".join(f"{inner}{item},\n" for item in items) + indent + "]"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_literal(t: torch.Tensor, numpy: bool = False, indent: str = "") -> str:
    """``torch.tensor([...], dtype=torch.float64)`` (or ``np.array``) holding ``t`` exactly."""
    t = t.detach().cpu()
    name = _dtype_name(t.dtype)
    dtype = f"np.{name}" if numpy else f"torch.{name}"
    if t.numel() == 0:
        shape = "(" + ", ".join(str(s) for s in t.shape) + ("," if t.dim() == 1 else "") + ")"
        return f"np.empty({shape}, dtype={dtype})" if numpy else f"torch.empty({shape}, dtype={dtype})"
    head = "np.array(" if numpy else "torch.tensor("
    values = t.tolist()

    def fmt(x: Any) -> str:
        return number(x, t.dtype)

    one_line = _nested(values, fmt)
    if t.dim() >= 1 and len(indent) + len(head) + len(one_line) + len(dtype) + 9 > WIDTH:
        one_line = _broken(values, fmt, indent)
    return f"{head}{one_line}, dtype={dtype})"


def literal(value: Any, indent: str = "") -> str:
    """Any case value (tensors, arrays, numbers, strings, None and lists, tuples and
    str-keyed dicts of them) as Python that rebuilds it."""
    if isinstance(value, torch.Tensor):
        return tensor_literal(value, indent=indent)
    if isinstance(value, np.ndarray):
        return tensor_literal(torch.from_numpy(np.ascontiguousarray(value)), numpy=True, indent=indent)
    if isinstance(value, bool | int | float | np.generic) and not isinstance(value, str):
        return number(value.item() if isinstance(value, np.generic) else value)
    if value is None or isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple | list):
        open_, close = ("(", ")") if isinstance(value, tuple) else ("[", "]")
        items = [literal(v, indent + "    ") for v in value]
        trail = "," if isinstance(value, tuple) and len(value) == 1 else ""
        flat = open_ + ", ".join(items) + trail + close
        if len(indent) + len(flat) <= WIDTH and "\n" not in flat:
            return flat
        inner = indent + "    "
        return open_ + "\n" + "".join(f"{inner}{i},\n" for i in items) + indent + close
    if isinstance(value, dict):
        items = [f"{k!r}: {literal(v, indent + '    ')}" for k, v in value.items()]
        flat = "{" + ", ".join(items) + "}"
        if len(indent) + len(flat) <= WIDTH and "\n" not in flat:
            return flat
        inner = indent + "    "
        return "{\n" + "".join(f"{inner}{i},\n" for i in items) + indent + "}"
    raise TypeError(f"no literal for a {type(value).__name__}")


def _value(kind: str, tensor: torch.Tensor) -> str:
    """A returned or expected value of ``kind`` (tensor, ndarray, scalar) as its literal."""
    if tensor.numel() > MAX_SHOWN:
        return (
            f"<{kind} of shape {tuple(tensor.shape)}, {_dtype_name(tensor.dtype)}: too many values to show>"
        )
    if kind == "scalar":
        return number(tensor.item(), tensor.dtype)
    return tensor_literal(tensor, numpy=kind == "ndarray")


def _output_name(output: str) -> str:
    """A driver's output names say what they are ("out of call 1 (train)"): quoted unless a name."""
    return output if output.isidentifier() else repr(output)


def expected_text(exp: Expectation) -> str:
    kinds = [exp.returns] * len(exp.outputs) if isinstance(exp.returns, str) else list(exp.returns)
    return "\n".join(
        f"{_output_name(o)} = {_value(k, v)}" for o, k, v in zip(exp.outputs, kinds, exp.values, strict=True)
    )


def got_text(outputs: Sequence[str], items: Sequence[Item]) -> str:
    lines = []
    for o, (kind, tensor, facts) in zip(outputs, items, strict=True):
        shown = _value(kind, tensor) if tensor is not None else f"<{returned_what(kind, facts)}>"
        lines.append(f"{_output_name(o)} = {shown}")
    return "\n".join(lines)


def counterexample(
    function: str,
    code: str,
    status: str,
    items: Sequence[Item],
    exp: Expectation,
    result: CaseResult,
    rank: int,
    size: int,
) -> Counterexample | None:
    """The counterexample a small input makes, or None: it passes, or its status is one no
    input could change (``NOT_A_COUNTEREXAMPLE``)."""
    if result.passed or status in NOT_A_COUNTEREXAMPLE:
        return None
    return Counterexample(
        function=function,
        code=code,
        expected=expected_text(exp),
        got=got_text(exp.outputs, items) if status == "ok" else "",
        message=result.message,
        misconceptions=list(result.misconceptions),
        rank=rank,
        size=size,
    )


class Pick:
    """Which of a name's failing small inputs, offered smallest first, is its counterexample:
    the first, unless it names several of the stage's own mistakes (an input that small may
    not tell them apart, and a student would chase the wrong one); then the first that names
    at most one, if a later input does, else the first after all. The grader and the
    self-check pick with this one rule, so they show the same input."""

    def __init__(self, stage_mistakes: Collection[str]) -> None:
        self.stage_mistakes = set(stage_mistakes)
        self.first: Counterexample | None = None
        self.chosen: Counterexample | None = None

    def offer(self, ce: Counterexample | None) -> bool:
        """Consider the next input's counterexample (None: it passed); True once settled."""
        if ce is None or self.chosen is not None:
            return self.chosen is not None
        self.first = self.first or ce
        if len(self.stage_mistakes.intersection(ce.misconceptions)) <= 1:
            self.chosen = ce
        return self.chosen is not None

    @property
    def result(self) -> Counterexample | None:
        return self.chosen or self.first

"""The notebook self-check: public cases, in the student's own kernel, in milliseconds.

    from autograder.runtime.selfcheck import check
    check(softmax)

It reads the stage's public data shipped beside the notebook
(``NN_stage.selfcheck.safetensors``: public inputs, expected outputs, and the outputs of
known mistakes), calls the student's function exactly as the grader will, and shows per
case whether it passes, the largest error and where, and the likely mistake. When a case
fails, it also tries the name's small inputs (shipped the same way), smallest first, and
shows the first on which the function disagrees: the grader's counterexample, in the
grader's words. It uses the grader's own harness and checks, so its messages are the
grader's messages. It never imports the reference and knows nothing of hidden cases beyond
their group names.
"""

from __future__ import annotations

import contextlib
import html
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import safetensors
import torch

from autograder.runtime.check import Expectation, all_hints, check_case
from autograder.runtime.compare import Tolerance
from autograder.runtime.counterexample import Pick, counterexample
from autograder.runtime.harness import CallSpec
from autograder.runtime.results import CaseResult, Counterexample, counterexample_text

# The data's layout (``grader/public.py`` writes it): 2, each case holds its call as
# ``CallSpec.to_json`` writes it, the form the grading child's plan holds. Its ``small``
# list (the counterexamples' inputs, in the same form) came later without a new format: a
# self-check that does not know it ignores it, and this one reads data without it.
FORMAT = 3


@cache
def _load(path: Path, mtime: float) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    with safetensors.safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["bertlab"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return meta, tensors


def find_data(stage: str | None = None, where: Path | None = None) -> Path:
    """The self-check data beside the notebook (the kernel's working directory)."""
    where = where or Path.cwd()
    pattern = f"{stage}.selfcheck.safetensors" if stage else "*.selfcheck.safetensors"
    found = sorted(where.glob(pattern))
    if not found:
        raise FileNotFoundError(
            f"no {pattern} in {where}: open the notebook from its own folder, where the data is shipped"
        )
    if len(found) > 1:
        raise FileNotFoundError(f"several stages' data in {where}: pass stage='NN_name'")
    return found[0]


@dataclass
class GroupReport:
    group: str
    cases: list[CaseResult]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)


@dataclass
class Report:
    name: str
    signature: str
    groups: list[GroupReport]
    hidden_groups: list[str]
    hints: dict[str, str]
    # the smallest of the name's small inputs on which ``fn`` disagrees, when a case fails
    counterexample: Counterexample | None = None

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.groups)

    @property
    def misconceptions(self) -> list[str]:
        return sorted({m for g in self.groups for c in g.cases for m in c.misconceptions})

    def __str__(self) -> str:
        n = sum(len(g.cases) for g in self.groups)
        ok = sum(c.passed for g in self.groups for c in g.cases)
        lines = [f"{self.name}: {ok}/{n} public cases pass" + (" ✓" if ok == n else "")]
        for g in self.groups:
            lines.append(f"  {'✓' if g.passed else '✗'} {g.group}")
            for c in g.cases:
                lines.append(f"      {'✓' if c.passed else '✗'} {c.label}: {c.text}")
        if self.hidden_groups:
            lines.append("  The grader also runs hidden cases: " + "; ".join(self.hidden_groups) + ".")
        if self.counterexample is not None:
            lines += ["  " + line for line in counterexample_text(self.counterexample).splitlines()]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        n = sum(len(g.cases) for g in self.groups)
        ok = sum(c.passed for g in self.groups for c in g.cases)
        colour = "#1a7f37" if ok == n else "#cf222e"
        rows = []
        for g in self.groups:
            for c in g.cases:
                mark = "✓" if c.passed else "✗"
                style = "color:#1a7f37" if c.passed else "color:#cf222e"
                msg = html.escape(c.text).replace("\n", "<br>")
                rows.append(
                    f"<tr><td style='{style}'>{mark}</td><td>{html.escape(g.group)}</td>"
                    f"<td>{html.escape(c.label)}</td><td style='text-align:left'>{msg}</td></tr>"
                )
        hidden = ""
        if self.hidden_groups:
            hidden = (
                "<p><i>The grader also runs hidden cases: "
                + html.escape("; ".join(self.hidden_groups))
                + ".</i></p>"
            )
        found = ""
        if self.counterexample is not None:
            found = f"<pre>{html.escape(counterexample_text(self.counterexample))}</pre>"
        return (
            f"<div><b style='color:{colour}'>{html.escape(self.name)}: {ok}/{n} public cases pass</b>"
            f"<table><tr><th></th><th>group</th><th>case</th><th style='text-align:left'>result</th></tr>"
            + "".join(rows)
            + "</table>"
            + hidden
            + found
            + "</div>"
        )


def _home(fn: Any) -> dict[str, Any]:
    """The namespace ``fn`` was defined in (the notebook's, in a kernel)."""
    found = getattr(fn, "__globals__", None)
    if found is None:
        module = sys.modules.get(getattr(fn, "__module__", "") or "")
        found = vars(module) if module is not None else {}
    return dict(found)


def check(
    fn: Any,
    name: str | None = None,
    stage: str | None = None,
    data: Path | None = None,
    device: str = "cpu",
) -> Report:
    """Run the public cases of the graded name ``name`` (default: ``fn.__name__``) on ``fn``."""
    path = data or find_data(stage)
    meta, tensors = _load(path, path.stat().st_mtime)
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"{path.name} is self-check data for another version of bertlab's self-check "
            f"(format {meta.get('format')}, this one reads {FORMAT}): install the bundle it came with"
        )
    name = name or getattr(fn, "__name__", None)
    if name not in meta["graded"]:
        raise KeyError(f"{name!r} is not graded in {meta['stage']}: one of {', '.join(meta['graded'])}")
    g = meta["graded"][name]
    # A driver may call other names of the notebook (a backward pass calls your forward):
    # they are looked up where ``fn`` was defined, as the grader finds them in your notebook.
    namespace = {**_home(fn), name: fn}
    groups: dict[str, list[CaseResult]] = {}
    with one_thread():
        for case in meta["cases"]:
            if case["name"] != name:
                continue
            _, status, info, items, exp = _run(case, g, namespace, tensors, device)
            groups.setdefault(case["group"], []).append(
                check_case(case["label"], status, info, items, exp, meta["misconceptions"])
            )
    report = Report(
        name,
        g["signature"],
        [GroupReport(k, v) for k, v in groups.items()],
        g["hidden_groups"],
        # the generic mistakes' hints come with this runtime, not with the stage's data
        all_hints(meta["misconceptions"]),
    )
    if not report.passed:
        with one_thread():
            report.counterexample = _counterexample(meta, g, name, namespace, tensors, device)
    return report


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside this block, then as the caller had it.

    The self-check: public cases are small, a thread pool costs more than it saves, and on a
    busy laptop its threads wait for cores (a check took seconds instead of milliseconds).
    One thread is also how the grading child computes, so the grader's own computations of
    what a child is compared with (the expected values, the self-check data) use it too, and
    ``batch``, whose cores are its workers' and their children's."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _run(
    case: dict[str, Any], g: dict[str, Any], namespace: dict[str, Any], tensors: dict, device: str
) -> tuple[CallSpec, str, dict[str, Any], list, Expectation]:
    """Make one case's call as the grader's child makes it; the call, what it returned and
    the case's expectation."""
    call = CallSpec.from_json(case)
    status, info, items = call.run(namespace, tensors, device)
    i, n_out = call.index, len(call.outputs)
    regions = [tensors.get(f"r{i}.{k}") if case["regions"][k] else None for k in range(n_out)]
    expected = [tensors[f"e{i}.{k}"] for k in range(n_out)]
    variants = [  # an output a variant leaves right is stored once, as the expected one
        (mid, [tensors.get(f"v{i}.{j}.{k}", expected[k]) for k in range(n_out)])
        for j, mid in enumerate(case["variants"])
    ]
    exp = Expectation(
        name=call.name,
        signature=g["signature"],
        outputs=call.outputs,
        returns=tuple(g["returns"]) if isinstance(g["returns"], list) else g["returns"],
        values=expected,
        regions=regions,
        tolerance=Tolerance(case["rtol"], case["atol"]),
        device=device if case["check_device"] else None,
        variants=variants,
        credit=case.get("credit"),
    )
    return call, status, info, items, exp


def _counterexample(
    meta: dict[str, Any], g: dict[str, Any], name: str, namespace: dict[str, Any], tensors: dict, device: str
) -> Counterexample | None:
    """The name's small inputs, smallest first, until one settles its counterexample (the
    grader's rule, ``Pick``)."""
    pick = Pick(meta["misconceptions"])
    for case in meta.get("small", []):
        if case["name"] != name:
            continue
        _, status, info, items, exp = _run(case, g, namespace, tensors, device)
        result = check_case(case["label"], status, info, items, exp, meta["misconceptions"])
        found = counterexample(name, case["code"], status, items, exp, result, case["rank"], case["size"])
        if pick.offer(found):
            break
    return pick.result

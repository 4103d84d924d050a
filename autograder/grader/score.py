"""From what the children produced to test results: every case checked, every test scored.

``score_stage`` turns a run's call outcomes into ``TestResult``s (a load failure or a
forbidden call heads a test, partial credit per the spec); the cell helpers say, in the
student's words, which cell raised and why a graded name is "not defined".
"""

from __future__ import annotations

import re

from autograder.grader.plan import PlannedCase, StagePlan
from autograder.grader.runner import (
    CallOutcome,
    RunReport,
)
from autograder.runtime.check import check_case, failure_message
from autograder.runtime.load import Source
from autograder.runtime.results import CaseResult, StageResult, TestResult
from autograder.stages.spec import StageSpec


def _cell_label(source: Source, i: int) -> str:
    """``code cell 9 (`def padding_mask(lengths, max_len):`)``: findable in any notebook."""
    label = source.cells[i][0] if i < len(source.cells) else f"cell {i}"
    first = source.heads[i] if i < len(source.heads) else ""
    return f"{label} (`{first[:60]}`)" if first and len(source.cells) > 1 else label


def _cell_error(err: dict[str, str]) -> str:
    message = err.get("message", "")[:300]
    return f"raised {err.get('type')}" + (f": {message}" if message else "")


def cell_notes(source: Source, errors: dict[int, dict[str, str]], notes: list[str]) -> list[str]:
    out = []
    for i, err in sorted(errors.items()):
        where = f" at {err['where']}" if err.get("where") else ""
        out.append(f"{_cell_label(source, i)} {_cell_error(err)}{where}")
    return out + notes


def lost_names(spec: StageSpec, source: Source, report: RunReport) -> dict[str, str]:
    """Graded names whose defining cell raised: why a name is "not defined"."""
    lost = {}
    for g in spec.graded:
        pattern = re.compile(Source.definition_pattern(g.name), re.MULTILINE)
        for i, err in sorted(report.cell_errors.items()):
            if i < len(source.cells) and pattern.search(source.cells[i][1]):
                lost[g.name] = f"Its cell, {source.cells[i][0]}, {_cell_error(err)}."
                break
    return lost


def score_stage(
    plan: StagePlan,
    file: str | None,
    outcomes: dict[int, CallOutcome] | None,
    notes: list[str],
    failure: str | None = None,
    stdout: str = "",
    lost: dict[str, str] | None = None,
    keep_arrays: bool = False,
    private_notes: list[str] | None = None,
    private_stdout: str = "",
    checked: dict[int, CaseResult] | None = None,
) -> StageResult:
    """Turn call outcomes into test results. ``failure`` (a load problem) fails every case.
    ``keep_arrays``: failing cases keep small windows of their wrong outputs (for pictures).
    ``private_*``: what the code produced after it received hidden inputs (instructors only).
    ``checked``: cases checked already, by index (the counterexample search checks the public
    ones while the child runs: ``counterexample.Search``)."""
    spec = plan.spec
    by_test: dict[tuple[str, str], list[tuple[PlannedCase, CaseResult]]] = {}
    forbidden: dict[str, str] = {}
    public_forbidden: set[str] = set()
    for pc in plan.cases:
        if failure is not None or outcomes is None:
            result = CaseResult(pc.label, False, "not run")  # the reason heads the test's output
        else:
            o = outcomes[pc.index]
            result = (checked or {}).get(pc.index) or check_case(
                pc.label, o.status, o.info, o.outputs, pc.expectation, spec.misconceptions, keep_arrays
            )
            if o.status == "missing" and lost and pc.graded.name in lost:
                result.message += " " + lost[pc.graded.name]
            if o.status == "forbidden" and (pc.graded.name not in forbidden or not pc.test.hidden):
                # the headline of every test of this name: the calls a public case named,
                # else a fixed text (what a child says on a hidden case is not shown)
                if not pc.test.hidden and pc.graded.name not in public_forbidden:
                    public_forbidden.add(pc.graded.name)
                    forbidden[pc.graded.name] = failure_message(
                        pc.graded.name, pc.graded.signature, o.status, o.info
                    )
                elif pc.graded.name not in forbidden:
                    forbidden[pc.graded.name] = (
                        f"`{pc.graded.name}` called a function this task forbids (on a hidden case): "
                        "build it from basic tensor operations."
                    )
        by_test.setdefault((pc.graded.name, pc.test.group), []).append((pc, result))
    tests = []
    number = 0
    for graded in spec.graded:
        for test in graded.tests:
            pairs = by_test.get((graded.name, test.group))
            if not pairs:
                continue
            number += 1
            results = [r for _, r in pairs]
            passed = sum(r.passed for r in results)
            earned = sum(1.0 if r.passed else r.credit for r in results)
            if graded.name in forbidden:
                score = 0.0  # a forbidden call anywhere in this name costs all of its points
            elif test.partial_credit:
                score = round(test.points * earned / len(results), 4)
            else:
                score = float(test.points) if passed == len(results) else 0.0
            mistakes: list[str] = []
            for r in results:
                for m in r.misconceptions:
                    if m not in mistakes:
                        mistakes.append(m)
            tests.append(
                TestResult(
                    stage=spec.id,
                    function=graded.name,
                    group=test.group,
                    number=f"{spec.number}.{number}",
                    max_score=float(test.points),
                    score=score,
                    hidden=test.hidden,
                    cases=results,
                    misconceptions=mistakes,
                    headline=failure or forbidden.get(graded.name),
                    ran=failure is None and outcomes is not None,
                )
            )
    return StageResult(spec.id, file, tests, notes, stdout, list(private_notes or ()), private_stdout)

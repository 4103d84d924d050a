"""What a student may see of a result: the one rule every student-facing output applies.

Gradescope's results, the CLI's results files, the HTML feedback and the batch's exports
for students all render ``for_students(result)``, never the result itself. The rule:

- A **public** test is shown whole: its cases' labels, messages, values and pictures. Its
  calls ran before the submission received any hidden input (``runner.run_submission``
  gives the child the hidden inputs only after every public call has its outcome), so
  nothing in it can carry one.
- A **hidden** test becomes ``redacted`` (every renderer then shows it as a summary): its
  score, how many of its cases passed, the grader's own remarks, and the named mistakes
  with their hints (trusted text: the stage spec's, or ours for the mistakes named in every
  stage, ``check.GENERIC_MISCONCEPTIONS``). Not its cases' labels or shapes, not
  an error message, not a value: they are derived from hidden inputs or expected values, or
  were written by code that held hidden inputs.
- A failing test's **counterexample** (``TestResult.counterexample``) is shown with hidden
  tests too: its input is one of its name's small inputs (public: the self-check data ships
  them), never a hidden case's, and the student's output on it comes from a child that never
  received a hidden input (``runner.run_public``, ``grader/counterexample.py``).
- What the code printed, its notes and its cells' errors are shown only from before it
  received hidden inputs (``StageResult.stdout``, ``notes``); what came after
  (``private_stdout``, ``private_notes``) is for instructors.

Scores themselves depend on hidden cases, by design: that is what a score is. A student can
learn no more from them than how many hidden cases pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from autograder.runtime.results import CaseResult, StageResult, SubmissionResult, TestResult

PRIVATE_OUTPUT_NOTE = (
    "What your code printed or raised after it received hidden inputs is not shown; "
    "run your notebook to see what it prints."
)


def _hints(stage: str) -> Mapping[str, str]:
    """The hints a hidden test may show: the stage spec's, and the mistakes named in every
    stage (``check.GENERIC_MISCONCEPTIONS``), whose text is ours as much as a spec's is."""
    from autograder.runtime.check import all_hints
    from autograder.stages import load_spec

    try:
        return all_hints(load_spec(stage).misconceptions)
    except (ImportError, KeyError, ValueError, FileNotFoundError):  # not a stage of ours
        return all_hints({})


def _hidden_test(t: TestResult, hints: Mapping[str, str]) -> TestResult:
    """A hidden test as its student may see it: placeholders for its cases, the named
    mistakes that have trusted hints, and those hints (``TestResult.redacted``)."""

    def known(ids: list[str]) -> list[str]:
        return [m for m in ids if m in hints]

    cases = [
        CaseResult(
            f"hidden case {k}",
            c.passed,
            "passed" if c.passed else "failed",
            known(c.misconceptions),
            {m: hints[m] for m in known(c.misconceptions)},
        )
        for k, c in enumerate(t.cases, start=1)
    ]
    return dataclasses.replace(
        t,
        cases=cases,
        misconceptions=known(t.misconceptions),
        redacted=True,
        counterexample=t.counterexample,  # public inputs, a clean child: see the module's rule
    )


def _stage(s: StageResult) -> StageResult:
    hints = _hints(s.stage)
    tests = [_hidden_test(t, hints) if t.hidden else t for t in s.tests]
    notes = list(s.notes)
    if s.private_notes or s.private_stdout.strip():
        notes.append(PRIVATE_OUTPUT_NOTE)
    return dataclasses.replace(s, tests=tests, notes=notes, private_notes=[], private_stdout="")


def for_students(result: SubmissionResult) -> SubmissionResult:
    """A copy of ``result`` holding only what its student may see (the module's rule)."""
    return dataclasses.replace(result, stages=[_stage(s) for s in result.stages])

"""What grading produced, as data: every output is a renderer of these dataclasses.

A ``TestResult`` holds its headline, its cases (label, verdict, numbers, named mistakes
with their hints), the earlier stages it blames, whether it is hidden and, when it fails,
its name's smallest counterexample (``Counterexample``); nothing is built as text to be
parsed back. ``TestResult.output`` (results.json's text) and
``CaseResult.text`` (the self-check's) are the plain-text renderers, kept here because the
self-check ships with them; ``grader/report.py`` (results.json, terminal tables, the
gradebook's rows), ``grader/feedback.py`` (HTML) and ``grader/gradescope.py`` render the
same fields. What a student may see of a hidden test is ``grader/visibility.for_students``
(a ``redacted`` test), decided there once for every renderer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class KeptArrays:
    """A 2-D window of one wrong output, for the HTML feedback's pictures.

    At most 64 x 64 values (``check.window``) around the largest error: the matrix of the
    leading dimensions that holds it, cropped. Kept only when the grader is asked to
    (``Grader(keep_arrays=True)``); never written to results.json or the gradebook.
    """

    output: str  # the output's name, e.g. "weights"
    where: str  # which values these are, e.g. "weights[1, 0, :, :], rows 0-7, columns 0-7"
    got: np.ndarray  # float32 (rows, cols), the student's values
    expected: np.ndarray  # float32 (rows, cols); another shape than got's only when the
    # student's output had another shape (then no error is drawn)
    graded: np.ndarray  # bool (rows, cols): False where the values are not graded
    row0: int = 0  # index of the window's first row and column in the slice
    col0: int = 0


HINT_LINE = "\n    likely mistake [{id}]: {hint}"  # how a named mistake follows a case's message
CASE_MISTAKE = "\n    likely mistake [{id}]"  # ... in a test's text, whose hints follow its cases once


def points(value: float) -> str:
    """A score as text: at most 2 decimals (29.33, not 29.3333); the data keeps every digit."""
    return f"{round(value, 2):g}"


HIDDEN_NOTE = (
    "The inputs, errors and messages of hidden cases are not shown. Run the self-check of "
    "`{function}` in your notebook: its public cases show each message in full."
)


@dataclass
class CaseResult:
    label: str
    passed: bool
    message: str  # the verdict in words: "passed (max abs error 2.2e-16)", or what is wrong
    misconceptions: list[str] = field(default_factory=list)  # the mistakes it names, by id
    # each named mistake's hint: trusted text (the stage spec's, or check.GENERIC_MISCONCEPTIONS')
    hints: dict[str, str] = field(default_factory=dict)
    max_abs: float | None = None  # the largest absolute error of the values compared, if any
    where: str | None = None  # where that error is: "weights[1, 0, 2, 3]"
    # The failing outputs' values (tuple[KeptArrays, ...]), set on the instance by
    # check_case(..., keep=True) only. Deliberately not a dataclass field (no annotation):
    # dataclasses.asdict, hence the gradebook and test snapshots, never see it.
    arrays = ()
    # The share of a failing case's points its right outputs earn (``Graded.credit``), set by
    # check_case; likewise no field: the score it makes is what the results keep.
    credit = 0.0
    # The call's status when it did not return values ("timeout", "missing", "error"...):
    # what ``TestResult.explanation`` reads. No field either.
    status = "ok"

    @property
    def text(self) -> str:
        """The message as a student reads it: a line per named mistake with its hint."""
        return self.message + "".join(
            HINT_LINE.format(id=m, hint=self.hints.get(m, "")) for m in self.misconceptions
        )


@dataclass(frozen=True)
class Counterexample:
    """The smallest public input found on which a graded name disagrees with the reference,
    as data (``counterexample_text`` renders it; ``grader/counterexample.py`` finds it, the
    self-check finds the same one). Derived only from the stage's public small inputs
    (``stages/spec.small_cases``), run in a child that never received a hidden input, so a
    hidden test shows it too (``visibility.for_students``)."""

    function: str
    # Python that reproduces the call in the student's notebook: its last line is an
    # expression whose value is the output ("yours" below)
    code: str
    expected: str  # the expected outputs, one `name = value` line each, values as Python literals
    got: str  # the student's outputs likewise; empty when the call returned none (``message`` says why)
    message: str  # the verdict on this input, as a case's message
    misconceptions: list[str] = field(default_factory=list)  # the mistakes it names, by id
    rank: int = 0  # its place among the name's small inputs, smallest first (1-based)
    size: int = 0  # how many numbers (and words) the input holds


COUNTEREXAMPLE_HEAD = (
    "Smallest input found on which your `{function}` disagrees (paste it into your notebook):"
)


def counterexample_text(ce: Counterexample) -> str:
    """A counterexample as every output shows it: results.json, Gradescope, the HTML
    feedback and the self-check (one text, so a student recognises it everywhere)."""

    def block(text: str) -> list[str]:
        return ["    " + line for line in text.splitlines()]

    lines = [
        COUNTEREXAMPLE_HEAD.format(function=ce.function),
        *block(ce.code),
        "expected:",
        *block(ce.expected),
    ]
    if ce.got:
        lines += ["yours:", *block(ce.got)]
    lines.append(f"what differs: {ce.message}")
    lines += [f"likely mistake [{m}]" for m in ce.misconceptions]
    return "\n".join(lines)


# A call's statuses on which no input could make a name right (``runtime.counterexample``
# says the same of counterexamples): the name is missing, unfinished, forbidden or stopped.
NO_INPUT_CHANGES = frozenset(
    {"missing", "not_callable", "not_implemented", "forbidden", "untrusted", "timeout", "crashed", "skipped"}
)


@dataclass
class TestResult:
    stage: str
    function: str
    group: str
    number: str  # "1.3": stage number . test position, Gradescope's sort key
    max_score: float
    score: float
    hidden: bool
    cases: list[CaseResult]
    misconceptions: list[str]  # ids named on any failing case
    # What the grader itself says of the whole test, never derived from a hidden case, so
    # shown with hidden tests too: first why no case could pass (a file it could not load,
    # a forbidden call), then which earlier stages it runs lose points too (fix those first).
    headline: str | None = None
    blame: list[str] = field(default_factory=list)
    ran: bool = True  # False: no case ran (a missing or unreadable file: the headline says why)
    # What a student may see of a hidden test (``visibility.for_students``): its cases are
    # placeholders ("hidden case 1": passed or failed, the trusted hints), its text a summary.
    redacted: bool = False
    # A failing test's counterexample, when its name has one within the search's budget
    # (public data only: shown with hidden tests too).
    counterexample: Counterexample | None = None

    @property
    def remarks(self) -> list[str]:
        return [r for r in (self.headline, *self.blame) if r]

    @property
    def hints(self) -> dict[str, str]:
        """The hint of every mistake its cases name."""
        return {m: h for c in self.cases for m, h in c.hints.items()}

    @property
    def summary(self) -> str:
        """Its first line: "2/3 cases passed; 6/9 points."."""
        scored = f"{points(self.score)}/{points(self.max_score)} points."
        if not self.ran:
            return f"no case ran; {scored}"
        passed = sum(c.passed for c in self.cases)
        cases = "hidden cases" if self.redacted else "cases"
        return f"{passed}/{len(self.cases)} {cases} passed; {scored}"

    @property
    def summary_notes(self) -> list[str]:
        """What a redacted test says beyond its summary and remarks: the named mistakes with
        their hints and how to see the cases' messages (nothing when it passes)."""
        if not self.redacted or self.passed or not self.ran:
            return []
        hints = self.hints
        lines = [f"likely mistake [{m}]: {hints.get(m, '')}" for m in self.misconceptions]
        return [*lines, HIDDEN_NOTE.format(function=self.function)]

    @property
    def output(self) -> str:
        """Its text, as results.json and Gradescope show it: the summary, the remarks and a
        line per case (a redacted test: the summary, remarks and named mistakes), then its
        counterexample, if it has one."""
        found = [counterexample_text(self.counterexample)] if self.counterexample else []
        if self.redacted:
            return "\n".join([self.summary, *self.remarks, *self.summary_notes, *found])
        cases = self.case_lines
        return "\n".join(
            [self.summary, *([self.headline] if self.headline else []), *cases, *self.blame, *found]
        )

    @property
    def case_lines(self) -> list[str]:
        """A line per case naming its mistakes by id, then each named mistake's hint once, not
        once per failing case; none when no case ran (the headline says why)."""
        if not self.ran:
            return []
        lines = [
            f"{'✓' if c.passed else '✗'} {c.label}: {c.message}"
            + "".join(CASE_MISTAKE.format(id=m) for m in c.misconceptions)
            for c in self.cases
        ]
        hints = self.hints
        return lines + [f"likely mistake [{m}]: {hints.get(m, '')}" for m in self.misconceptions]

    @property
    def explanation(self) -> str | None:
        """Why a failing test fails, as its student can read it (None: passed, or nothing
        says why): a named mistake, a counterexample (a public input that fails too), its
        own failing public case, or a reason no input could change (the file did not load,
        the name is missing, unfinished, forbidden or hangs). A hidden test that fails with
        none of them shows a bare "2/3 hidden cases passed": each is a gap in its stage's
        catalogue of mistakes or in its ladder of small inputs (issue 26)."""
        if self.passed:
            return None
        if self.misconceptions:
            return "named mistake"
        if self.counterexample is not None:
            return "counterexample"
        if self.headline is not None or not self.ran:
            return "headline"
        failing = [c for c in self.cases if not c.passed]
        if failing and all(c.status in NO_INPUT_CHANGES for c in failing):
            return f"no input changes it ({', '.join(sorted({c.status for c in failing}))})"
        if not self.hidden:
            return "its public case"
        return None

    @property
    def name(self) -> str:
        return f"{self.stage} · {self.function} · {self.group}"

    @property
    def passed(self) -> bool:
        return self.score >= self.max_score


@dataclass
class StageResult:
    stage: str
    file: str | None  # the file graded, relative to the submission; None if missing
    tests: list[TestResult]
    notes: list[str]  # load problems, cells that raised, neutralised magics
    stdout: str = ""  # what the code printed before it received any hidden input
    # What the code produced after it received hidden inputs (cells that raised, notes,
    # and all it printed): it may carry them, so instructors only (visibility.for_students).
    private_notes: list[str] = field(default_factory=list)
    private_stdout: str = ""
    grader_fault: bool = False  # the grader itself failed on this stage: no grade (batch retries it)

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)


@dataclass
class SubmissionResult:
    student: str
    stages: list[StageResult]
    execution_time: float = 0.0
    # What is said once of the whole submission, above every stage: that it holds no stage
    # file at all, and which names were expected (``Submission.nothing_found``).
    notes: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        return sum(s.score for s in self.stages)

    @property
    def max_score(self) -> float:
        return sum(s.max_score for s in self.stages)

    @property
    def misconceptions(self) -> list[str]:
        seen: list[str] = []
        for s in self.stages:
            for t in s.tests:
                for m in t.misconceptions:
                    if m not in seen:
                        seen.append(m)
        return seen

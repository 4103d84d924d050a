"""What grading produced, as dataclasses; report.py turns them into files and tables."""

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


@dataclass
class CaseResult:
    label: str
    passed: bool
    message: str
    misconceptions: list[str] = field(default_factory=list)
    # The failing outputs' values (tuple[KeptArrays, ...]), set on the instance by
    # check_case(..., keep=True) only. Deliberately not a dataclass field (no annotation):
    # dataclasses.asdict, hence the gradebook and test snapshots, never see it.
    arrays = ()


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
    output: str  # student-facing text
    # what the grader itself says of the whole test (a file it could not load, a forbidden
    # call a public case made, an earlier stage to fix first): never derived from a hidden
    # case, so shown with hidden tests too
    remarks: list[str] = field(default_factory=list)

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

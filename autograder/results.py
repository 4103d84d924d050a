"""What grading produced, as dataclasses; report.py turns them into files and tables."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CaseResult:
    label: str
    passed: bool
    message: str
    misconceptions: list[str] = field(default_factory=list)


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
    stdout: str = ""

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

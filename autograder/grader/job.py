"""One stage of one submission, resolved once: what every later step of grading reads.

Grading a stage needs its file, the file's cells, the stage's spec and plan, the cells of
the student's earlier stages it runs, its limits and the device. ``Jobs`` finds and reads
each of these once per submission (``Submission.file``, ``load_source``, the spec) and
hands a ``StageJob`` to running, scoring, the counterexample search, the earlier-stage
blame and the instructor's own tests: none of them looks a file, a spec or an earlier
stage up again. An earlier stage that a later one runs is read once and shared (09 runs
the same 02 that 02's own job graded).

Data flows one way::

    Submission ──▶ Jobs.job(stage) ──▶ StageJob ──▶ run (runner) ──▶ score ──▶ counterexamples ──▶ blame
                    (file, cells, spec, parts, limits: found once)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from autograder.grader.runner import Limits
from autograder.runtime.load import LoadError, Source, load_source
from autograder.runtime.parts import Cells
from autograder.runtime.submission import Submission
from autograder.stages import requires
from autograder.stages.spec import StageSpec

T = TypeVar("T")


def _once(cache: dict[Any, Any], key: Any, compute: Callable[[], T]) -> T:
    """``compute()``, the first time ``key`` is asked for; a ``LoadError`` is kept and
    raised again, as it was the first time."""
    if key not in cache:
        try:
            cache[key] = compute()
        except LoadError as exc:
            cache[key] = exc
    found = cache[key]
    if isinstance(found, LoadError):
        raise found
    return found


@dataclass
class StageJob:
    """One (submission, stage): found and read once (``Jobs.job``)."""

    submission: Path  # as handed in: a folder, or one file
    stage: str
    spec: StageSpec
    limits: Limits  # the grader's, with the stage's call limit where the grader sets none
    file: Path | None = None  # its file; None when there is none (``failure`` says why)
    shown: str | None = None  # the file, as results name it
    source: Source | None = None  # its cells; None when it runs nothing
    failure: str | None = None  # why it runs nothing: not handed in, a link, unreadable
    handed_in: bool = True  # False: no file for it at all (its failure is all it says)
    parts: dict[str, Cells] = field(default_factory=dict)  # the earlier stages' cells it runs
    part_notes: list[str] = field(default_factory=list)  # earlier stages it wanted and had not
    own_earlier: list[str] = field(default_factory=list)  # earlier stages it runs the student's file of


class Jobs:
    """The ``StageJob``s of one submission. Each file is found, and each stage file read,
    once: a later stage's earlier parts are the same ``Source`` its own job holds.
    ``spec_of``: the grader's spec of a stage (looked up once per grader)."""

    def __init__(self, submission: Path, spec_of: Callable[[str], StageSpec], limits: Limits) -> None:
        self.path = submission
        self.submission = Submission(submission)
        self.spec_of = spec_of
        self.limits = limits
        self._files: dict[tuple[Path, str], Any] = {}  # a path, None or the LoadError
        self._sources: dict[tuple[Path, str], Any] = {}  # a Source or the LoadError
        self._jobs: dict[str, StageJob] = {}

    def _find(self, where: Submission, stage: str) -> Path | None:
        """``where.file(stage)``, once per folder and stage (a ``LoadError`` too)."""
        return _once(self._files, (where.path, stage), lambda: where.file(stage))

    def _read(self, path: Path, stage: str) -> Source:
        return _once(self._sources, (path, stage), lambda: load_source(path, stage))

    def holds(self, stage: str) -> bool:
        """Whether it holds a file for ``stage`` (one that cannot be found counts: graded,
        the student reads why), as ``Submission.holds`` says."""
        try:
            return self._find(self.submission, stage) is not None
        except LoadError:
            return True

    def job(self, stage: str) -> StageJob:
        if stage not in self._jobs:
            self._jobs[stage] = self._resolve(stage)
        return self._jobs[stage]

    def _resolve(self, stage: str) -> StageJob:
        spec = self.spec_of(stage)
        limits = Limits(
            call_s=self.limits.call_s or spec.call_timeout_s,
            cell_s=self.limits.cell_s,
            submission_s=self.limits.submission_s,
        )
        job = StageJob(self.path, stage, spec, limits)
        try:
            job.file = self._find(self.submission, stage)
        except LoadError as exc:
            job.failure = str(exc)
            return job
        if job.file is None:
            job.handed_in = False
            job.failure = f"not submitted: no {stage}.ipynb or {stage}.py in the submission; it scores 0"
            return job
        job.shown = job.file.name if self.path.is_dir() else self.path.name
        # (found even when its own file cannot be read: the blame names what it would run)
        self._earlier_parts(job)
        try:
            job.source = self._read(job.file, stage)
        except LoadError as exc:
            job.failure = str(exc)
        return job

    def _earlier_parts(self, job: StageJob) -> None:
        """The submission's own files of the stages ``job`` builds on (and theirs, in turn)."""
        assert job.file is not None
        for stage in requires(job.stage, self.spec_of):
            try:
                dep = self.submission.earlier(stage, job.file, of=job.stage, find=self._find)
                if dep is None:
                    job.part_notes.append(f"this stage uses your {stage}, which is not in the submission")
                    continue
                job.own_earlier.append(stage)
                job.parts[stage] = self._read(dep, stage).cells
            except LoadError as exc:
                job.part_notes.append(f"this stage uses your {stage}, which cannot be read: {exc}")

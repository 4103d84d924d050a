"""The trusted pipeline, orchestrated: load → run (child) → check → diagnose → score.

A ``Grader`` holds one fork server and, per (stage, device), a ``StagePlan``
(``grader/plan.py``), finds a submission's files (``runtime/submission.py``), runs them in
a child (``grader/runner.py``) and scores what came back (``grader/score.py``). It says
which earlier stages a failing stage runs, and which of them lose points too.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from pathlib import Path

import torch

from autograder.grader.plan import StagePlan
from autograder.grader.runner import (
    ForkServer,
    Limits,
    run_submission,
)
from autograder.grader.score import cell_notes, lost_names, score_stage
from autograder.runtime.load import LoadError, load_source
from autograder.runtime.parts import Cells
from autograder.runtime.results import StageResult, SubmissionResult
from autograder.runtime.submission import Submission
from autograder.stages import load_spec, requires
from autograder.stages.spec import StageSpec


class Grader:
    """Grades submissions; holds the fork server and the per-stage expected values."""

    def __init__(self, device: str = "cpu", limits: Limits | None = None, keep_arrays: bool = False) -> None:
        """``keep_arrays``: failing cases keep small 2-D windows of the student's and the
        expected values (``CaseResult.arrays``, for the HTML feedback's pictures)."""
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for, but torch sees no CUDA device here")
        self.device = device
        self.limits = limits or Limits()
        self.keep_arrays = keep_arrays
        self._plans: dict[str, StagePlan] = {}
        self._server: ForkServer | None = None
        # one Grader may serve several threads (batch's workers): what it builds once is
        # built under this lock; grading itself shares nothing mutable
        self._lock = threading.RLock()

    def plan(self, stage: str) -> StagePlan:
        plan = self._plans.get(stage)
        if plan is None:
            with self._lock:
                if stage not in self._plans:
                    self._plans[stage] = StagePlan.build(load_spec(stage), self.device)
                plan = self._plans[stage]
        return plan

    @property
    def server(self) -> ForkServer:
        if self._server is None:
            with self._lock:
                if self._server is None:
                    self._server = ForkServer()
        return self._server

    def prepare(self, stages: list[str]) -> None:
        """Start the fork server (it warms up meanwhile) and compute ``stages``' expected
        values and those of the stages they run, before any submission is graded."""
        self.server  # noqa: B018  (starts it)
        for stage in sorted(set(stages) | {dep for s in stages for dep in requires(s)}):
            plan = self.plan(stage)
            plan.inputs_file, plan.hidden_file  # noqa: B018  (serialised once, here)
        self.server.wait_ready()  # a sandbox that cannot run student code fails here, once

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def grade_stage(self, submission: Path, stage: str) -> StageResult:
        """Grade one stage; a fault of the grader itself costs this stage only, loudly."""
        try:
            return self._grade_stage(submission, stage)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)  # for the TA: this is our bug, not the student's
            message = (
                f"the grader failed on this stage ({type(exc).__name__}: {str(exc)[:200]}). "
                "This is a fault in the grader, not in your code: please tell your instructor."
            )
            result = score_stage(self.plan(stage), None, None, [message], failure=message)
            result.grader_fault = True
            return result

    def _grade_stage(self, submission: Path, stage: str) -> StageResult:
        plan = self.plan(stage)
        handed_in = Submission(submission)
        try:
            path = handed_in.file(stage)
        except LoadError as exc:
            return score_stage(plan, None, None, [str(exc)], failure=str(exc))
        if path is None:
            return score_stage(
                plan,
                None,
                None,
                [],
                failure=(f"no {stage}.ipynb or {stage}.py in the submission: this stage scores 0"),
            )
        shown = path.name if submission.is_dir() else submission.name
        try:
            source = load_source(path, stage)
        except LoadError as exc:
            return score_stage(plan, shown, None, [str(exc)], failure=str(exc))
        spec_limits = Limits(
            call_s=self.limits.call_s or plan.spec.call_timeout_s,
            cell_s=self.limits.cell_s,
            submission_s=self.limits.submission_s,
        )
        parts, part_notes = self._parts(handed_in, path, plan.spec)
        report = run_submission(
            self.server,
            source.cells,
            source.module_name,
            plan.calls,
            plan.inputs_file,
            self.device,
            spec_limits,
            parts,
            hidden_inputs=plan.hidden_file,
        )
        return score_stage(
            plan,
            shown,
            report.calls,
            part_notes + source.notes + cell_notes(source, report.cell_errors, report.notes),
            stdout=report.stdout,
            lost=lost_names(plan.spec, source, report),
            keep_arrays=self.keep_arrays,
            private_notes=cell_notes(source, report.private_cell_errors, report.private_notes),
            private_stdout=report.private_stdout,
        )

    def _parts(
        self, submission: Submission, path: Path, spec: StageSpec
    ) -> tuple[dict[str, Cells], list[str]]:
        """The submission's own files of the stages ``spec`` builds on (and theirs, in turn)."""
        parts: dict[str, Cells] = {}
        notes: list[str] = []
        for stage in requires(spec.id):
            try:
                dep = submission.earlier(stage, path, of=spec.id)
                if dep is None:
                    notes.append(f"this stage uses your {stage}, which is not in the submission")
                    continue
                parts[stage] = load_source(dep, stage).cells
            except LoadError as exc:
                notes.append(f"this stage uses your {stage}, which cannot be read: {exc}")
        return parts, notes

    def grade(self, submission: Path, stages: list[str], student: str | None = None) -> SubmissionResult:
        # Start-up is per run, not per student: the server's warm-up and the expected values
        # are ready before the clock starts.
        self.server.wait_ready()
        for s in stages:
            self.plan(s)
        t0 = time.monotonic()
        results = [self.grade_stage(submission, s) for s in stages]
        self._blame_earlier_stages(submission, results)
        name = student or Submission(submission).name
        return SubmissionResult(name, results, time.monotonic() - t0)

    def _blame_earlier_stages(self, submission: Path, results: list[StageResult]) -> None:
        """A stage that runs the student's earlier stages and loses points says which of
        those lose points too: their mistakes may be what fails here. An earlier stage not
        asked for is graded for this purpose only (failing submissions pay for it)."""
        by_stage = {r.stage: r for r in results}
        for r in results:
            if r.score >= r.max_score:
                continue
            failing = []
            for dep in sorted(requires(r.stage)):
                if dep not in by_stage:
                    by_stage[dep] = self.grade_stage(submission, dep)
                d = by_stage[dep]
                if d.file is not None and d.score < d.max_score:
                    failing.append(f"{dep} ({d.score:g}/{d.max_score:g})")
            if failing:
                note = (
                    f"{r.stage} runs your own {', '.join(failing)}, which also lose"
                    f"{'s' if len(failing) == 1 else ''} points: fix "
                    f"{'it' if len(failing) == 1 else 'those'} first, the failures here may come from there."
                )
                r.notes.insert(0, note)
                for t in r.tests:
                    if t.score < t.max_score:
                        t.blame.append(note)

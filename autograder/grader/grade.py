"""The trusted pipeline, orchestrated: load → run (child) → check → diagnose → score.

A ``Grader`` holds one fork server and, per (stage, device), a ``StagePlan``
(``grader/plan.py``), finds a submission's files (``runtime/submission.py``), runs them in
a child (``grader/runner.py``) and scores what came back (``grader/score.py``). It says
which earlier stages a failing stage runs, and which of them lose points too.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch

from autograder.grader import expected
from autograder.grader.counterexample import Counterexamples
from autograder.grader.job import Jobs, StageJob
from autograder.grader.launch import PLOTS, Launched, plot_extras
from autograder.grader.plan import StagePlan
from autograder.grader.runner import (
    ForkServer,
    Limits,
    run_submission,
)
from autograder.grader.score import cell_notes, lost_names, score_stage
from autograder.runtime.load import LoadError, load_source
from autograder.runtime.results import StageResult, SubmissionResult, points
from autograder.runtime.submission import Submission
from autograder.sandbox.forkserver import DRIVER_PREFIX
from autograder.stages import load_spec, requires
from autograder.stages.spec import StageSpec


class Grader:
    """Grades submissions; holds the fork server and the per-stage expected values."""

    def __init__(
        self,
        device: str = "cpu",
        limits: Limits | None = None,
        keep_arrays: bool = False,
        counterexamples: bool = True,
        server: Launched | None = None,
        expected_dir: Path | None | Literal["auto"] = "auto",
    ) -> None:
        """``keep_arrays``: failing cases keep small 2-D windows of the student's and the
        expected values (``CaseResult.arrays``, for the HTML feedback's pictures).
        ``counterexamples``: each failing test gets its name's smallest failing public input
        (``grader/counterexample.py``: searched in the grading child, before it is given any
        hidden input; ``grade`` searches a name that failed hidden cases only in a child of
        its own).
        ``server``: a fork server ``launch()``ed before this process imported torch.
        ``expected_dir``: expected values computed ahead (``grader/expected.py``; "auto":
        the store beside the code, or ``$BERTLAB_EXPECTED_DIR``; None: compute them all)."""
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for, but torch sees no CUDA device here")
        self.device = device
        self.limits = limits or Limits()
        self.keep_arrays = keep_arrays
        self.counterexamples = Counterexamples(self) if counterexamples else None
        self.expected_dir = expected.store_dir() if expected_dir == "auto" else expected_dir
        # stage -> why its expected values were computed here, not read from the store
        self.recomputed: dict[str, str] = {}
        self._plans: dict[str, StagePlan] = {}
        self._specs: dict[str, StageSpec] = {}  # each stage's spec, looked up once
        self._server: ForkServer | None = None
        self._launched = server
        # one Grader may serve several threads (batch's workers): what it builds once is
        # built under this lock; grading itself shares nothing mutable
        self._lock = threading.RLock()

    def spec(self, stage: str) -> StageSpec:
        """``stage``'s spec, looked up once per grader."""
        spec = self._specs.get(stage)
        if spec is None:
            with self._lock:
                spec = self._specs.setdefault(stage, load_spec(stage))
        return spec

    def jobs(self, submission: Path) -> Jobs:
        """``submission``'s stage jobs, each found and read once (``grader/job.py``)."""
        return Jobs(submission, self.spec, self.limits)

    def plan(self, stage: str) -> StagePlan:
        plan = self._plans.get(stage)
        if plan is None:
            with self._lock:
                if stage not in self._plans:
                    planned, why = expected.plan(self.spec(stage), self.device, self.expected_dir)
                    if why is not None and self.expected_dir is not None:
                        self.recomputed[stage] = why
                    self._plans[stage] = planned
                plan = self._plans[stage]
        return plan

    def outline(self, stage: str) -> StagePlan:
        """``stage``'s cases without inputs or expected values: what scoring a stage that
        runs nothing needs (its plan if there is one already)."""
        return self._plans.get(stage) or StagePlan.outline(self.spec(stage), self.device)

    @property
    def server(self) -> ForkServer:
        if self._server is None:
            with self._lock:
                if self._server is None:
                    launched, self._launched = self._launched, None
                    self._server = ForkServer(launched)
        return self._server

    def prepare(self, stages: list[str]) -> None:
        """Start the fork server (it warms up meanwhile) and compute ``stages``' expected
        values and those of the stages they run, before any submission is graded."""
        self.server  # noqa: B018  (starts it)
        for stage in sorted(set(stages) | {dep for s in stages for dep in requires(s, self.spec)}):
            plan = self.plan(stage)
            plan.inputs_file, plan.hidden_file  # noqa: B018  (serialised once, here)
            self.server.warm(self._driver_extras(plan.spec))  # a class's children all inherit them
        self.server.wait_ready()  # a sandbox that cannot run student code fails here, once

    def warm_for(self, units: list[tuple[Path, str]], files: int = 12) -> None:
        """Ask the fork server now for what the children grading ``units`` (submission,
        stage) will need (``_driver_extras``; matplotlib if a graded cell imports it), so
        that it loads them while this process still plans, not when the first child is
        due (matplotlib alone is half a second, before which no child is forked). Only the
        first ``files`` files are read for a plot (a class of thousands is not read twice
        before it starts); ``grade_stage`` asks again for what each child needs, so a file
        left unread, or one that cannot be read, only starts later."""
        # (already asked before torch loaded, by the command that launched the server: not read again)
        extras = set() if "matplotlib" in self.server._warmed else plot_extras(units, files)
        for stage in {stage for _, stage in units}:
            extras |= self._driver_extras(self.spec(stage))
        self.server.warm(extras)
        # while the server loads them: the first file read as grading reads it, so that what
        # reading needs (IPython's transformer, for a magic line) is imported now, not when
        # the first child is due
        for submission, stage in units[:1]:
            try:
                path = Submission(submission).file(stage)
                if path is not None:
                    load_source(path, stage)
            except LoadError:
                pass

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._launched is not None:  # launched, never needed (nothing ran any code)
            self._launched.close()
            self._launched = None

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def grade_stage(self, submission: Path, stage: str, job: StageJob | None = None) -> StageResult:
        """Grade one stage (``job``: its job, when the caller resolved it); a fault of the
        grader itself costs this stage only, loudly."""
        try:
            return self._grade_stage(job or self.jobs(submission).job(stage))
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)  # for the TA: this is our bug, not the student's
            message = (
                f"the grader failed on this stage ({type(exc).__name__}: {str(exc)[:200]}). "
                "This is a fault in the grader, not in your code: please tell your instructor."
            )
            result = score_stage(self.outline(stage), None, None, [message], failure=message)
            result.grader_fault = True
            return result

    def _grade_stage(self, job: StageJob) -> StageResult:
        if job.source is None:  # not handed in, or not readable: it runs nothing
            assert job.failure is not None
            notes = [job.failure] if job.handed_in else []
            return score_stage(self.outline(job.stage), job.shown, None, notes, failure=job.failure)
        plan = self.plan(job.stage)
        source = job.source
        self.server.warm(self._driver_extras(plan.spec) | _plots(job))
        search = self.counterexamples.search(plan) if self.counterexamples is not None else None
        report = run_submission(
            self.server,
            source.cells,
            source.module_name,
            plan.calls,
            plan.inputs_file,
            self.device,
            job.limits,
            job.parts,
            hidden_inputs=plan.hidden_file,
            ladder=search,
        )
        result = score_stage(
            plan,
            job.shown,
            report.calls,
            job.part_notes + source.notes + cell_notes(source, report.cell_errors, report.notes),
            stdout=report.stdout,
            lost=lost_names(plan.spec, source, report),
            keep_arrays=self.keep_arrays,
            private_notes=cell_notes(source, report.private_cell_errors, report.private_notes),
            private_stdout=report.private_stdout,
            checked=search.checked if search is not None and not self.keep_arrays else None,
        )
        if search is not None:
            search.attach(result)
        return result

    def grade(
        self, submission: Path, stages: list[str], student: str | None = None, workers: int = 1
    ) -> SubmissionResult:
        """Grade ``stages`` of one submission, up to ``workers`` stages at a time (each in
        its own child; batch grades students side by side instead, with ``workers=1``)."""
        # A stage without a file runs nothing: an empty submission starts no server and
        # runs no reference. A sandbox that cannot run student code fails here, before any
        # stage. Each stage's expected values are read (``plan``) where it is graded, not
        # all of them first: in a cold grade of several stages side by side, one stage's
        # child runs while the next stage's values load (batch's ``prepare`` planned its own).
        jobs = self.jobs(submission)
        held = [s for s in stages if jobs.holds(s)]
        if held and self._server is None:  # a cold start (batch's ``prepare`` warmed its own)
            # what the children will need, asked for while this process reads the files
            self.server.warm(set().union(*(self._driver_extras(self.spec(s)) for s in held)))
        todo = {s: jobs.job(s) for s in stages}  # found and read once, here, before any thread
        if held:
            self.server.warm(set().union(*map(_plots, todo.values())))
            self.server.wait_ready()
        t0 = time.monotonic()
        if workers > 1 and len(held) > 1:
            # the later stages are the longer ones (09 builds a model per case): first, so
            # that the last stage to start is a short one
            with cf.ThreadPoolExecutor(
                min(workers, len(held)), initializer=torch.set_num_threads, initargs=(1,)
            ) as pool:
                futures = {s: pool.submit(self.grade_stage, submission, s, todo[s]) for s in reversed(stages)}
                results = [futures[s].result() for s in stages]
        else:
            results = [self.grade_stage(submission, s, todo[s]) for s in stages]
        if self.counterexamples is not None:
            self.counterexamples.attach(jobs, results)
        self._blame_earlier_stages(jobs, results)
        name = student or jobs.submission.name
        nothing = jobs.submission.nothing_found(stages, jobs.holds)
        return SubmissionResult(name, results, time.monotonic() - t0, notes=[nothing] if nothing else [])

    def _blame_earlier_stages(self, jobs: Jobs, results: list[StageResult]) -> None:
        """A stage that runs the student's earlier stages and loses points says which of
        those lose points too: their mistakes may be what fails here. An earlier stage not
        asked for is graded for this purpose only (failing submissions pay for it)."""
        by_stage = {r.stage: r for r in results}
        for r in results:
            if r.score >= r.max_score:
                continue
            failing = []
            # the earlier stages it ran the student's own file of: nothing else to fix there
            for dep in sorted(jobs.job(r.stage).own_earlier):
                if dep not in by_stage:
                    by_stage[dep] = self.grade_stage(jobs.path, dep, jobs.job(dep))
                d = by_stage[dep]
                if d.file is not None and d.score < d.max_score:
                    failing.append(f"{dep} ({points(d.score)}/{points(d.max_score)})")
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

    def _driver_extras(self, spec: StageSpec) -> set[str]:
        return _driver_extras(spec, self.spec)


def _plots(job: StageJob) -> set[str]:
    """matplotlib, for a child whose cells (its own, or an earlier stage's it runs) plot."""
    if job.source is None:
        return set()
    code = [text for cells in (job.source.cells, *job.parts.values()) for _, text in cells]
    return {"matplotlib"} if any(PLOTS.search(text) for text in code) else set()


def _driver_extras(spec: StageSpec, spec_of: Callable[[str], StageSpec] = load_spec) -> set[str]:
    """What the fork server loads for children that grade ``spec``: the ``warm_up`` of its
    drivers' modules, and of the stages it runs (11 loads the weights through 09's).
    ``spec_of``: where the specs of those come from (a grader's: each looked up once)."""
    specs = [spec, *(spec_of(s) for s in requires(spec.id, spec_of))]
    return {DRIVER_PREFIX + g.driver.split(":")[0] for s in specs for g in s.graded if g.driver}

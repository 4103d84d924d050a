"""The trusted pipeline: load → run (child) → check → diagnose → score.

A ``Grader`` holds one fork server and, per (stage, device), a ``StagePlan``: the seeded
case inputs, the reference's expected outputs and every misconception variant's outputs,
computed once per grading run and shared by all submissions. Only this process ever
sees expected values; the child gets inputs alone.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import Tensor

from autograder.grader.runner import (
    MIN_RETURN_BYTES,
    CallOutcome,
    ForkServer,
    Limits,
    Planned,
    RunReport,
    encode_inputs,
    run_submission,
)
from autograder.runtime.check import Expectation, check_case, failure_message
from autograder.runtime.compare import tolerance_for
from autograder.runtime.harness import invoke, split_outputs
from autograder.runtime.load import LoadError, Source, load_source
from autograder.runtime.parts import Cells
from autograder.runtime.results import CaseResult, StageResult, SubmissionResult, TestResult
from autograder.runtime.submission import Submission
from autograder.stages import load_spec, requires
from autograder.stages.spec import CaseData, Graded, StageSpec, Test, build_case


def _data_dict(data: CaseData) -> dict[str, Any]:
    return {
        "args": data.args,
        "kwargs": dict(data.kwargs),
        "init_args": data.init_args,
        "init_kwargs": dict(data.init_kwargs),
        "state": dict(data.state) if data.state else None,
    }


def _on(value: Any, device: str) -> Any:
    """A deep copy of a case value with tensors on ``device`` (the reference may not mutate cases)."""
    if isinstance(value, Tensor):
        return value.to(device, copy=True)
    if isinstance(value, tuple):
        return tuple(_on(v, device) for v in value)
    if isinstance(value, list):
        return [_on(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _on(v, device) for k, v in value.items()}
    return value


def run_trusted(
    fn: Any,
    graded: Graded,
    data: CaseData,
    device: str,
    spec: StageSpec | None = None,
    replaces: str | None = None,
) -> list[Tensor]:
    """Outputs of the reference (or a variant) on one case, as CPU tensors. A driver runs
    on the stage's reference names, with ``fn`` in place of ``replaces`` (default: the
    graded name)."""
    namespace = None
    if graded.kind == "driver":
        if spec is None:
            raise ValueError(f"{graded.name}: a driver needs the stage's reference names")
        namespace = {g.name: g.reference for g in spec.graded} | {replaces or graded.name: fn}
        fn = namespace[graded.name]
    result = invoke(fn, graded.kind, _on(_data_dict(data), device), device, namespace, graded.driver)
    outs = []
    for item in split_outputs(result, graded.outputs):
        if isinstance(item, Tensor):
            outs.append(item.detach().cpu())
        else:
            outs.append(torch.as_tensor(item).cpu())
    return outs


class LazyVariants(Sequence[tuple[str, list[Tensor]]]):
    """The misconception variants' outputs on one case, as (misconception id, outputs),
    computed the first time a failing submission needs them: most submissions pass most
    cases, and a class's grading starts sooner without them (09's plan: 1.9 -> 0.6 s).
    Computed at most once; a variant that does not apply to the case (ValueError) is left out."""

    def __init__(self, graded: Graded, data: CaseData, device: str, spec: StageSpec) -> None:
        self._case: tuple[Graded, CaseData, str, StageSpec] | None = (graded, data, device, spec)
        self._outputs: tuple[tuple[str, list[Tensor]], ...] = ()
        self._lock = threading.Lock()  # batch workers are threads sharing one plan

    def _computed(self) -> tuple[tuple[str, list[Tensor]], ...]:
        if self._case is None:
            return self._outputs
        with self._lock:
            if self._case is None:
                return self._outputs
            graded, data, device, spec = self._case
            outputs = []
            for variant in graded.variants:
                try:
                    outputs.append(
                        (
                            variant.misconception,
                            run_trusted(variant.fn, graded, data, device, spec, variant.replaces),
                        )
                    )
                except ValueError:
                    continue
            self._outputs, self._case = tuple(outputs), None
        return self._outputs

    def __len__(self) -> int:
        return len(self._computed())

    def __getitem__(self, i):  # type: ignore[override]
        return self._computed()[i]


@dataclass
class PlannedCase:
    index: int
    graded: Graded
    test: Test
    label: str
    expectation: Expectation


@dataclass
class StagePlan:
    spec: StageSpec
    device: str
    cases: list[PlannedCase]
    calls: list[Planned]  # public calls first, then hidden ones (each group in spec order)
    inputs: dict[str, Tensor]  # the public calls' inputs
    hidden_inputs: dict[str, Tensor] = field(default_factory=dict)

    @cached_property
    def inputs_file(self) -> bytes:
        """The public inputs as one safetensors file, serialised once for every submission."""
        return safetensors.torch.save(self.inputs)

    @cached_property
    def hidden_file(self) -> bytes:
        """The hidden inputs, likewise: a child receives them after its public calls."""
        return safetensors.torch.save(self.hidden_inputs)

    @classmethod
    def build(cls, spec: StageSpec, device: str, hidden: bool = True) -> StagePlan:
        """Cases of ``spec`` (public only unless ``hidden``) with their expected outputs."""
        cases, items = [], []
        index = 0
        for graded in spec.graded:
            for test in graded.tests:
                if test.hidden and not hidden:
                    continue
                for case in test.cases:
                    data = build_case(spec, graded, test, case)
                    expected = run_trusted(graded.reference, graded, data, device, spec)
                    variants = LazyVariants(graded, data, device, spec)
                    regions = (
                        graded.graded_region(data) if graded.graded_region else (None,) * len(graded.outputs)
                    )
                    has_tensor = any(isinstance(a, Tensor) for a in (*data.args, *data.kwargs.values()))
                    expectation = Expectation(
                        name=graded.name,
                        signature=graded.signature,
                        outputs=graded.outputs,
                        returns=graded.returns_per_output(),
                        values=expected,
                        regions=[None if r is None else r.cpu() for r in regions],
                        tolerance=(
                            graded.tolerance(data, test.dtype, device)
                            if graded.tolerance
                            else tolerance_for(test.dtype, device)
                        ),
                        device=device if graded.check_device and has_tensor else None,
                        variants=variants,
                    )
                    cases.append(PlannedCase(index, graded, test, case.label, expectation))
                    items.append((index, _data_dict(data), test.hidden))
                    index += 1
        # the two kinds of input travel apart: a child gets the hidden ones only after it
        # has answered every public case (runner.run_submission)
        skeletons, inputs = encode_inputs([(i, d) for i, d, h in items if not h])
        hidden_skeletons, hidden_inputs = encode_inputs([(i, d) for i, d, h in items if h])
        skeletons |= hidden_skeletons
        calls = [
            Planned(
                pc.index,
                pc.graded.name,
                pc.graded.kind,
                pc.graded.outputs,
                pc.graded.forbidden,
                skeletons[pc.index],
                pc.graded.driver,
                hidden=pc.test.hidden,
                max_return_bytes=max(MIN_RETURN_BYTES, 16 * sum(v.nbytes for v in pc.expectation.values)),
            )
            for pc in cases
        ]
        calls.sort(key=lambda c: c.hidden)  # stable: spec order within each kind
        return cls(spec, device, cases, calls, inputs, hidden_inputs)


def _cell_label(source: Source, i: int) -> str:
    """``code cell 9 (`def padding_mask(lengths, max_len):`)``: findable in any notebook."""
    label = source.cells[i][0] if i < len(source.cells) else f"cell {i}"
    first = source.heads[i] if i < len(source.heads) else ""
    return f"{label} (`{first[:60]}`)" if first and len(source.cells) > 1 else label


def _cell_error(err: dict[str, str]) -> str:
    message = err.get("message", "")[:300]
    return f"raised {err.get('type')}" + (f": {message}" if message else "")


def _cell_notes(source: Source, errors: dict[int, dict[str, str]], notes: list[str]) -> list[str]:
    out = []
    for i, err in sorted(errors.items()):
        where = f" at {err['where']}" if err.get("where") else ""
        out.append(f"{_cell_label(source, i)} {_cell_error(err)}{where}")
    return out + notes


def _lost_names(spec: StageSpec, source: Source, report: RunReport) -> dict[str, str]:
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
) -> StageResult:
    """Turn call outcomes into test results. ``failure`` (a load problem) fails every case.
    ``keep_arrays``: failing cases keep small windows of their wrong outputs (for pictures).
    ``private_*``: what the code produced after it received hidden inputs (instructors only)."""
    spec = plan.spec
    by_test: dict[tuple[str, str], list[tuple[PlannedCase, CaseResult]]] = {}
    forbidden: dict[str, str] = {}
    public_forbidden: set[str] = set()
    for pc in plan.cases:
        if failure is not None or outcomes is None:
            result = CaseResult(pc.label, False, "not run")  # the reason heads the test's output
        else:
            o = outcomes[pc.index]
            result = check_case(
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
            if graded.name in forbidden:
                score = 0.0  # a forbidden call anywhere in this name costs all of its points
            elif test.partial_credit:
                score = round(test.points * passed / len(results), 4)
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
                )
            )
    return StageResult(spec.id, file, tests, notes, stdout, list(private_notes or ()), private_stdout)


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
            part_notes + source.notes + _cell_notes(source, report.cell_errors, report.notes),
            stdout=report.stdout,
            lost=_lost_names(plan.spec, source, report),
            keep_arrays=self.keep_arrays,
            private_notes=_cell_notes(source, report.private_cell_errors, report.private_notes),
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

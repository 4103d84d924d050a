"""Grade mutants as student submissions through the real pipeline and classify them.

One ``Grader`` (one fork server, each stage's plan built once) grades every mutant in
worker threads, as ``batch`` does: each mutant is a folder holding the mutated
``NN_name.py`` and, for a stage that runs earlier stages, those stages' unmutated
references, handed to the child exactly as a student's own earlier stages are.

A mutant is **killed** when it loses points on a graded name it changes (``timeout`` and
``crashed`` are kills, counted apart), **equivalent** when it keeps them and
``equivalent.toml`` says why no allowed input can tell, and a **survivor** otherwise.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from autograder.grader.grade import Grader
from autograder.runtime.results import StageResult
from autograder.stages import requires
from mutation.generate import ROOT, Generated, Mutant, generate, submission_source

EQUIVALENTS = Path(__file__).with_name("equivalent.toml")
TARGET = 0.97
KILLS = ("killed", "timeout", "crashed")


def load_equivalents(path: Path = EQUIVALENTS) -> dict[str, dict[str, str]]:
    """stage -> {mutant id: why it is equivalent}."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    for stage, entries in data.items():
        if not isinstance(entries, dict) or not all(
            isinstance(v, str) and v.strip() for v in entries.values()
        ):
            raise ValueError(f"{path}: [{stage}] must map each mutant id to a one-line reason")
    return data


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | timeout | crashed | survived | equivalent | error
    lost: dict[str, tuple[float, float]]  # graded name -> (score, max score), names that lost points
    lost_tests: list[str]  # "name · group (hidden)" of every test that lost points
    seconds: float
    why: str = ""  # equivalent: the reviewed reason; error: what the grader said
    # With ``run(explain=True)``: the failing tests that say nothing of why (no named mistake,
    # no counterexample, no public case, no reason: ``TestResult.explanation``)
    bare: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        m = self.mutant
        return {
            "id": m.id,
            "operator": m.operator,
            "qualname": m.qualname,
            "line": m.line,
            "affects": list(m.affects),
            "status": self.status,
            "lost": {k: list(v) for k, v in self.lost.items()},
            "lost_tests": self.lost_tests,
            "seconds": round(self.seconds, 3),
            "why": self.why,
            "bare": self.bare,
            "diff": m.diff,
        }


def classify(mutant: Mutant, result: StageResult, equivalents: dict[str, str], seconds: float) -> Outcome:
    failed = [n for n in result.notes if n.startswith("the grader failed")]
    lost: dict[str, tuple[float, float]] = {}
    for t in result.tests:
        score, top = lost.get(t.function, (0.0, 0.0))
        lost[t.function] = (score + t.score, top + t.max_score)
    lost = {name: v for name, v in lost.items() if v[0] < v[1]}
    lost_tests = [
        f"{t.function} · {t.group}{' (hidden)' if t.hidden else ''}"
        for t in result.tests
        if t.score < t.max_score
    ]
    if failed:
        return Outcome(mutant, "error", lost, lost_tests, seconds, failed[0])
    hit = [name for name in mutant.affects if name in lost]
    if not hit:
        why = equivalents.get(mutant.id, "")
        return Outcome(mutant, "equivalent" if why else "survived", lost, lost_tests, seconds, why)
    messages = [c.message for t in result.tests if t.function in hit for c in t.cases if not c.passed]
    if any("did not finish within" in m for m in messages):
        status = "timeout"
    elif any(" stopped: the process" in m or "crashed the process twice" in m for m in messages):
        status = "crashed"
    else:
        status = "killed"
    return Outcome(mutant, status, lost, lost_tests, seconds, equivalents.get(mutant.id, ""))


@dataclass
class StageReport:
    generated: Generated
    outcomes: list[Outcome]
    seconds: float  # grading the mutants, wall clock
    generate_seconds: float
    workers: int
    equivalents: dict[str, str]
    complete: bool  # every mutant of the stage was graded (not a selection by id)
    problems: list[str] = field(default_factory=list)

    def count(self, *statuses: str) -> int:
        return sum(o.status in statuses for o in self.outcomes)

    @property
    def score(self) -> float:
        graded = len(self.outcomes) - self.count("equivalent")
        return self.count(*KILLS) / graded if graded else 1.0

    def by_name(self) -> dict[str, dict[str, int]]:
        """Per graded name, the mutants that change it: killed on this name's tests, killed
        only on another name's (a helper two names share; a forward whose cache a backward
        test uses), equivalent, survived."""
        table = {
            g: {"mutants": 0, "killed": 0, "killed_elsewhere": 0, "equivalent": 0, "survived": 0}
            for g in self.generated.graded
        }
        for o in self.outcomes:
            for name in o.mutant.affects:
                row = table[name]
                row["mutants"] += 1
                if o.status in KILLS:
                    row["killed" if name in o.lost else "killed_elsewhere"] += 1
                elif o.status == "equivalent":
                    row["equivalent"] += 1
                else:
                    row["survived"] += 1
        return table

    def check(self) -> list[str]:
        """What keeps this stage from passing the gate (empty: it passes)."""
        stage = self.generated.stage
        problems = list(self.problems)
        problems += [f"grader fault on {o.mutant.id}: {o.why}" for o in self.outcomes if o.status == "error"]
        survivors = [o for o in self.outcomes if o.status == "survived"]
        if survivors:
            problems.append(f"{len(survivors)} survivor(s) neither killed nor listed as equivalent")
        if self.score < TARGET:
            problems.append(f"score {self.score:.1%} is below {TARGET:.0%}")
        contradicted = [o.mutant.id for o in self.outcomes if o.status in KILLS and o.why]
        problems += [f"{i} is listed as equivalent but loses points: remove its line" for i in contradicted]
        if self.complete:
            problems += [
                f"{name} has no mutants" for name, row in self.by_name().items() if not row["mutants"]
            ]
            ids = {o.mutant.id for o in self.outcomes}
            problems += [
                f"{i} is listed as equivalent but no longer generated: remove its line"
                for i in self.equivalents
                if i not in ids
            ]
        return [f"{stage}: {p}" for p in problems]

    def to_json(self) -> dict:
        return {
            "stage": self.generated.stage,
            "mutants": len(self.outcomes),
            "killed": self.count(*KILLS),
            "timeout": self.count("timeout"),
            "crashed": self.count("crashed"),
            "equivalent": self.count("equivalent"),
            "survived": self.count("survived"),
            "errors": self.count("error"),
            "score": round(self.score, 4),
            "target": TARGET,
            "seconds": round(self.seconds, 1),
            "generate_seconds": round(self.generate_seconds, 1),
            "workers": self.workers,
            "by_name": self.by_name(),
            "skipped_positions": self.generated.skipped,
            "problems": self.check(),
            "outcomes": [o.to_json() for o in self.outcomes],
        }


def _write_submission(folder: Path, stage: str, source: str, deps: dict[str, str]) -> None:
    shutil.rmtree(folder, ignore_errors=True)  # a stage named twice in one run
    folder.mkdir(parents=True)
    (folder / f"{stage}.py").write_text(source)
    for dep, text in deps.items():
        (folder / f"{dep}.py").write_text(text)


def grade_stage(
    grader: Grader,
    generated: Generated,
    mutants: list[Mutant],
    equivalents: dict[str, str],
    workers: int,
    scratch: Path,
    progress: Callable[[int, int], None] | None = None,
    explain: bool = False,
) -> tuple[list[Outcome], float, list[str]]:
    """Grade ``mutants`` of one stage; (outcomes in the mutants' order, wall seconds, problems).
    ``explain``: each mutant's failing tests also get their counterexamples, as a student's
    do, and the outcome lists those that still say nothing of why they fail."""
    stage = generated.stage
    deps = {dep: submission_source(dep) for dep in requires(stage)}
    grader.prepare([stage])
    grader.server.wait_ready()
    problems = []
    # The unmutated reference must score full marks, or no outcome below means anything.
    baseline = grader.grade_stage(_fresh(scratch, "reference", stage, generated.source, deps), stage)
    if baseline.score < baseline.max_score:
        lost = [f"{t.function} · {t.group}" for t in baseline.tests if t.score < t.max_score]
        problems.append(f"the unmutated reference scores {baseline.score:g}/{baseline.max_score:g}: {lost}")
        return [], 0.0, problems
    done = 0
    lock = threading.Lock()

    def one(index: int, mutant: Mutant) -> Outcome:
        nonlocal done
        folder = _fresh(scratch, f"m{index:05d}", stage, mutant.source, deps)
        t0 = time.monotonic()
        # grade_stage, not grade: grade() would also re-grade the unmutated earlier stages
        # of every failing mutant, only to add a note naming them
        jobs = grader.jobs(folder)  # the stage's job, resolved once for the grade and the search
        result = grader.grade_stage(folder, stage, jobs.job(stage))
        if explain and grader.counterexamples is not None:
            grader.counterexamples.attach(jobs, [result])
        outcome = classify(mutant, result, equivalents, time.monotonic() - t0)
        outcome.bare = [t.name for t in result.tests if not t.passed and t.explanation is None]
        shutil.rmtree(folder, ignore_errors=True)
        with lock:
            done += 1
            if progress:
                progress(done, len(mutants))
        return outcome

    t0 = time.monotonic()
    # torch's thread count is per thread: each worker keeps to one core, as batch's do
    with cf.ThreadPoolExecutor(
        max_workers=max(1, workers), initializer=torch.set_num_threads, initargs=(1,)
    ) as pool:
        outcomes = list(pool.map(one, range(len(mutants)), mutants))
    return outcomes, time.monotonic() - t0, problems


def _fresh(scratch: Path, name: str, stage: str, source: str, deps: dict[str, str]) -> Path:
    """A new submission folder: ``scratch/<stage>/<name>/`` with the stage's file and its deps."""
    folder = scratch / stage / name
    _write_submission(folder, stage, source, deps)
    return folder


def run(
    stages: Iterable[str],
    workers: int = 2,
    equivalents: dict[str, dict[str, str]] | None = None,
    only: set[str] | None = None,
    grader: Grader | None = None,
    log: Callable[[str], None] | None = None,
    on_stage: Callable[[StageReport], None] | None = None,
    explain: bool = False,
) -> list[StageReport]:
    """Generate and grade the mutants of ``stages`` (those in ``only``, if given);
    ``on_stage`` gets each stage's report as soon as it is done (a long run keeps them)."""
    equivalents = load_equivalents() if equivalents is None else equivalents
    log = log or (lambda _: None)
    own = grader is None
    # counterexamples only where asked: a failing mutant's search costs its grade a child's time
    grader = grader or Grader(counterexamples=explain)
    reports = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="bertlab-mutation-") as tmp:
            for stage in stages:
                t0 = time.monotonic()
                generated = generate(stage)
                generate_seconds = time.monotonic() - t0
                mutants = [m for m in generated.mutants if only is None or m.id in only]
                log(f"{stage}: {len(mutants)} mutants, made in {generate_seconds:.1f} s")
                step = max(1, len(mutants) // 10)

                def progress(done: int, total: int, stage: str = stage, step: int = step) -> None:
                    if done % step == 0 or done == total:
                        log(f"{stage}: {done}/{total} graded")

                outcomes, seconds, problems = grade_stage(
                    grader,
                    generated,
                    mutants,
                    equivalents.get(stage, {}),
                    workers,
                    Path(tmp),
                    progress,
                    explain=explain,
                )
                report = StageReport(
                    generated,
                    outcomes,
                    seconds,
                    generate_seconds,
                    workers,
                    equivalents.get(stage, {}),
                    complete=only is None,
                    problems=problems,
                )
                reports.append(report)
                if on_stage:
                    on_stage(report)
                log(
                    f"{stage}: {report.count(*KILLS)} killed, {report.count('equivalent')} equivalent, "
                    f"{report.count('survived')} survived: {report.score:.1%} in {seconds:.1f} s"
                )
                if explain:
                    failing = sum(len(o.lost_tests) for o in outcomes)
                    bare = sum(len(o.bare) for o in outcomes)
                    log(f"{stage}: {bare} of {failing} failing tests say nothing of why (report: bare)")
    finally:
        torch.set_num_threads(threads)
        if own:
            grader.close()
    return reports


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


__all__ = ["ROOT", "Outcome", "StageReport", "classify", "load_equivalents", "run"]

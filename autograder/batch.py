"""Grading a whole class: every student × stage, in parallel, into a resumable gradebook.

The gradebook is one SQLite database. A grade is committed, in its own transaction, as
soon as it is computed, so a batch killed at any moment (SIGKILL included) loses at most
the grades in flight; running it again grades only what is missing. A grade is keyed by
(student, stage) and remembers a fingerprint of the files it was computed from: code that
changed since is graded again, code that did not is not (``regrade=True`` grades all).

Layouts: nbgrader's ``CLASS/submitted/<student>/<stage>/<files>`` and a flat
``CLASS/<student>/<files>``. Work is split by student (``shard=(k, n)``) so a job array
on a cluster runs one shard per task, and ``merge`` combines their databases.

Only this (trusted) process writes the database; workers are trusted graders too (each
owns a fork server) and send back results, never student text to execute.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
import multiprocessing
import os
import sqlite3
import statistics
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS grades (
    student     TEXT NOT NULL,
    stage       TEXT NOT NULL,
    fingerprint TEXT NOT NULL,   -- sha256 of the files the grade was computed from
    score       REAL NOT NULL,
    max_score   REAL NOT NULL,
    result      TEXT NOT NULL,   -- the StageResult, as JSON
    graded_at   REAL NOT NULL,   -- unix time
    PRIMARY KEY (student, stage)
);
"""


@dataclass(frozen=True)
class Unit:
    """One student's one stage."""

    student: str
    stage: str
    submission: Path  # the folder the grader reads (the student's)
    fingerprint: str


def _layout_root(class_dir: Path) -> Path:
    submitted = class_dir / "submitted"
    return submitted if submitted.is_dir() else class_dir


def fingerprint(submission: Path, stage: str) -> str:
    """The stage's file and those of the earlier stages it runs: what its grade depends on."""
    from autograder.load import LoadError, find_stage_file
    from autograder.stages import requires

    digest = hashlib.sha256()
    for s in [stage, *requires(stage)]:
        try:
            path = find_stage_file(submission, s)
        except LoadError:
            path = None
        digest.update(s.encode() + b"\0")
        if path is not None and path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def in_shard(student: str, shard: tuple[int, int] | None) -> bool:
    """Students are split by a stable hash of their name: shard k of n holds a fixed set."""
    if shard is None:
        return True
    k, n = shard
    h = int.from_bytes(hashlib.sha256(student.encode()).digest()[:8], "big")
    return h % n == k - 1


def discover(class_dir: Path, stages: list[str] | None, shard: tuple[int, int] | None = None) -> list[Unit]:
    """Every (student, stage) to grade: the stages asked for, or those each student holds."""
    from autograder.stages import stages_for

    root = _layout_root(class_dir)
    units = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not in_shard(folder.name, shard):
            continue
        for stage in stages_for(folder, stages):
            units.append(Unit(folder.name, stage, folder, fingerprint(folder, stage)))
    return units


class Gradebook:
    """The SQLite gradebook: one row per (student, stage), written one transaction each."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(path, timeout=60)
        self.db.execute("PRAGMA journal_mode=WAL")  # a reader (export) never blocks the batch
        self.db.execute("PRAGMA synchronous=FULL")  # a committed grade survives a crash
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Gradebook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def done(self) -> dict[tuple[str, str], str]:
        return {(s, st): f for s, st, f in self.db.execute("SELECT student, stage, fingerprint FROM grades")}

    def put(self, unit: Unit, result: dict[str, Any]) -> None:
        with self.db:  # one transaction: the row is there entirely or not at all
            self.db.execute(
                "INSERT OR REPLACE INTO grades VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    unit.student,
                    unit.stage,
                    unit.fingerprint,
                    result["score"],
                    result["max_score"],
                    json.dumps(result),
                    time.time(),
                ),
            )

    def rows(self) -> list[dict[str, Any]]:
        cur = self.db.execute(
            "SELECT student, stage, fingerprint, score, max_score, result, graded_at FROM grades "
            "ORDER BY student, stage"
        )
        keys = [c[0] for c in cur.description]
        return [dict(zip(keys, row, strict=True)) for row in cur]

    def merge(self, other: Path) -> int:
        """Copy ``other``'s grades in; where both hold a (student, stage), the newer wins.
        Merging the same database twice changes nothing."""
        before = self.db.total_changes
        self.db.execute("ATTACH DATABASE ? AS other", (str(other),))
        try:
            with self.db:
                self.db.execute(
                    "INSERT INTO grades SELECT * FROM other.grades WHERE true "
                    "ON CONFLICT(student, stage) DO UPDATE SET fingerprint = excluded.fingerprint, "
                    "score = excluded.score, max_score = excluded.max_score, result = excluded.result, "
                    "graded_at = excluded.graded_at WHERE excluded.graded_at > grades.graded_at"
                )
        finally:
            self.db.execute("DETACH DATABASE other")
        return self.db.total_changes - before

    def export_csv(self, path: Path) -> None:
        """One row per student: each stage's score, the total and the maximum."""
        import csv

        rows = self.rows()
        stages = sorted({r["stage"] for r in rows})
        by_student: dict[str, dict[str, Any]] = {}
        for r in rows:
            by_student.setdefault(r["student"], {})[r["stage"]] = r
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["student", *stages, "total", "max"])
            for student, graded in sorted(by_student.items()):
                scores = [graded[s]["score"] if s in graded else "" for s in stages]
                total = sum(g["score"] for g in graded.values())
                w.writerow([student, *scores, round(total, 4), sum(g["max_score"] for g in graded.values())])


# -- workers --------------------------------------------------------------------------------

_grader = None


def _init_worker(device: str, call_s: float | None, submission_s: float) -> None:
    global _grader
    import torch

    from autograder.grade import Grader
    from autograder.runner import Limits

    # Workers already fill the cores, one each (and each one's child runs beside it): torch's
    # thread pool in a worker would only oversubscribe them. With two threads per worker on
    # two cores, the comparisons ran 25x slower (threads spinning while the other core works).
    torch.set_num_threads(1)

    _grader = Grader(device=device, limits=Limits(call_s=call_s, submission_s=submission_s))


def _grade_student(units: list[Unit]) -> list[tuple[Unit, dict[str, Any]]]:
    """One student's stages in one go: a stage that runs an earlier one reuses that stage's
    grade to say whether it fails too, instead of grading it again."""
    assert _grader is not None
    r = _grader.grade(units[0].submission, [u.stage for u in units], student=units[0].student)
    return [
        (u, {**dataclasses.asdict(stage), "score": stage.score, "max_score": stage.max_score})
        for u, stage in zip(units, r.stages, strict=True)
    ]


@dataclass
class BatchReport:
    graded: int
    skipped: int
    seconds: float


def run(
    units: list[Unit],
    book: Gradebook,
    workers: int,
    regrade: bool = False,
    device: str = "cpu",
    call_s: float | None = None,
    submission_s: float = 120.0,
    progress: Any = None,
) -> BatchReport:
    """Grade ``units`` not already in ``book`` (with the same fingerprint), ``workers`` at a time."""
    done = {} if regrade else book.done()
    todo = [u for u in units if done.get((u.student, u.stage)) != u.fingerprint]
    t0 = time.monotonic()
    if progress is not None:
        progress(0, len(todo))
    if not todo:
        return BatchReport(0, len(units), 0.0)
    # spawn, not fork: each worker starts its own clean fork server (no inherited threads)
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(
        max_workers=max(1, min(workers, len(todo))),
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(device, call_s, submission_s),
    ) as pool:
        futures = [pool.submit(_grade_student, group) for group in _by_student(todo)]
        n = 0
        for future in cf.as_completed(futures):
            for unit, result in future.result():
                book.put(unit, result)  # one transaction per grade
                n += 1
            if progress is not None:
                progress(n, len(todo))
    return BatchReport(len(todo), len(units) - len(todo), time.monotonic() - t0)


def _by_student(units: Iterable[Unit]) -> list[list[Unit]]:
    """Each student's units, in stage order: one task per student."""
    groups: dict[str, list[Unit]] = {}
    for u in sorted(units, key=lambda u: (u.student, u.stage)):
        groups.setdefault(u.student, []).append(u)
    return list(groups.values())


# -- summary --------------------------------------------------------------------------------


@dataclass
class StageSummary:
    stage: str
    students: int
    max_score: float
    mean: float
    median: float
    mistakes: list[tuple[str, int]]  # most frequent named misconceptions, with student counts


def summarise(rows: list[dict[str, Any]], top: int = 3) -> list[StageSummary]:
    """Per stage: mean, median, and the mistakes most students made (what to review in lecture)."""
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_stage.setdefault(r["stage"], []).append(r)
    out = []
    for stage, rs in sorted(by_stage.items()):
        scores = [r["score"] for r in rs]
        mistakes: Counter[str] = Counter()
        for r in rs:
            result = json.loads(r["result"])
            mistakes.update({m for t in result["tests"] for m in t["misconceptions"]})
        out.append(
            StageSummary(
                stage,
                len(rs),
                max(r["max_score"] for r in rs),
                statistics.fmean(scores),
                statistics.median(scores),
                mistakes.most_common(top),
            )
        )
    return out


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

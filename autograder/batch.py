"""Grading a whole class: every student × stage, in parallel, into a resumable gradebook.

The gradebook is one SQLite database. A grade is committed, in its own transaction, as
soon as it is computed, so a batch killed at any moment (SIGKILL included) loses at most
the grades in flight; running it again grades only what is missing. A grade is keyed by
(student, stage) and remembers a fingerprint of the files it was computed from: code that
changed since is graded again, code that did not is not (``regrade=True`` grades all).

Layouts: nbgrader's ``CLASS/submitted/<student>/<stage>/<files>`` and a flat
``CLASS/<student>/<files>``. Work is split by student (``shard=(k, n)``) so a job array
on a cluster runs one shard per task, and ``merge`` combines their databases.

Only this (trusted) process grades and writes the database: its worker threads share one
``Grader`` (one fork server, one set of expected values), and student code runs only in
the fork server's children.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
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


def _grade_student(grader: Any, units: list[Unit]) -> list[tuple[Unit, dict[str, Any]]]:
    """One student's stages in one go: a stage that runs an earlier one reuses that stage's
    grade to say whether it fails too, instead of grading it again."""
    r = grader.grade(units[0].submission, [u.stage for u in units], student=units[0].student)
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
    """Grade ``units`` not already in ``book`` (with the same fingerprint), ``workers`` at a time.

    One ``Grader`` serves every worker: one fork server, and each stage's expected values
    computed once. The workers are threads of this process: what they wait for is their
    child (a student's code, a process of its own), while the parent's share (reading
    notebooks, comparing) is a small part. Processes would each import torch, start a fork
    server and build every plan: at two workers on two cores, a class started 12 s later
    and held a gigabyte more."""
    import torch

    from autograder.grade import Grader
    from autograder.runner import Limits

    done = {} if regrade else book.done()
    todo = [u for u in units if done.get((u.student, u.stage)) != u.fingerprint]
    t0 = time.monotonic()
    if progress is not None:
        progress(0, len(todo))
    if not todo:
        return BatchReport(0, len(units), 0.0)
    threads = torch.get_num_threads()
    # The cores are the workers' (and their children's): torch's own thread pool in this
    # process would oversubscribe them (two threads on two busy cores made comparisons 25x slower).
    torch.set_num_threads(1)
    try:
        with Grader(device=device, limits=Limits(call_s=call_s, submission_s=submission_s)) as grader:
            grader.prepare(sorted({u.stage for u in todo}))
            # torch's thread count is per thread (OpenMP): each worker sets its own
            pool = cf.ThreadPoolExecutor(
                max_workers=max(1, min(workers, len(todo))), initializer=torch.set_num_threads, initargs=(1,)
            )
            try:
                futures = [pool.submit(_grade_student, grader, group) for group in _by_student(todo)]
                n = 0
                for future in cf.as_completed(futures):
                    for unit, result in future.result():
                        book.put(unit, result)  # one transaction per grade, in this thread only
                        n += 1
                    if progress is not None:
                        progress(n, len(todo))
            finally:
                # on Ctrl-C (or a grader fault) the students not started are not graded:
                # the workers finish the student they hold, the gradebook keeps every grade
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        torch.set_num_threads(threads)
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

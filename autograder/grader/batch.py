"""Grading a whole class: every student × stage, in parallel, into a resumable gradebook.

The gradebook is one SQLite database. A grade is committed, in its own transaction, as
soon as it is computed, so a batch killed at any moment (SIGKILL included) loses at most
the grades in flight; running it again grades only what is missing. A grade is keyed by
(student, stage) and remembers a fingerprint of the files it was computed from: code that
changed since is graded again, code that did not is not (``regrade=True`` grades all).

Layouts: nbgrader's ``CLASS/submitted/<student>/<stage>/<files>`` and a flat
``CLASS/<student>/<files>``. In a flat class the students name the folders, so no folder's
name may choose the layout: nbgrader's is read only when nothing else could be meant (or
asked for). Work is split by student (``shard=(k, n)``) so a job array on a cluster runs
one shard per task, and ``merge`` combines their databases.

No one student stops the class: a folder that cannot be read, or is a link, or has a name
that no terminal or gradebook can show, is left out and reported; a grade that cannot be
computed or stored becomes an error row for that student (graded again by the next run)
and the batch goes on; and a stored grade holds a bounded share of what the student's code
produced (``bounded``), so no submission can make its row too big for SQLite.

A grade that replaces a stored one is compared with it first (``compare``): per student and
test, the old and new score and why they differ (a new case that fails, a test added, an
error row graded now), so that new hidden cases added mid-course can be announced; a dry
run (``dry_run=True``) grades and compares, and writes nothing.

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
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autograder.runtime.results import points as shown

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


# A fingerprint no file set has: an error row's, so that the next run grades it again.
FAILED = "failed:"

LAYOUTS = ("auto", "flat", "nbgrader")
# Files that only an instructor puts beside the students: in a flat class a student names a
# folder, never a file of the class directory itself.
NBGRADER_FILES = ("nbgrader_config.py", "gradebook.db")
# nbgrader's own folders: they hold assignments (stage folders), not students.
NBGRADER_DIRS = ("source", "release", "submitted", "autograded", "feedback", "downloaded")


class LayoutError(ValueError):
    """The class directory cannot be read as asked, or can be read two ways (for the instructor)."""


def layout_of(class_dir: Path, layout: str = "auto") -> str:
    """``flat`` or ``nbgrader``: ``layout`` itself, or in ``auto`` the one the directory
    shows beyond doubt. A flat class whose student named a folder ``submitted`` looks like
    nbgrader's layout; read that way, the student's sub-folders would be graded as the
    class, under the other students' names. So ``submitted/`` alone decides only where
    nothing else in the directory could be a student, or nbgrader's own files say so."""
    if layout not in LAYOUTS:
        raise LayoutError(f"unknown layout {layout!r}: choose {', '.join(LAYOUTS)}")
    submitted = class_dir / "submitted"
    if layout == "flat":
        return "flat"
    if layout == "nbgrader":
        if not submitted.is_dir():
            raise LayoutError(f"--layout nbgrader: there is no {submitted}/ (nbgrader's <student>/<stage>/)")
        return "nbgrader"
    marker = next((f for f in NBGRADER_FILES if _plain_file(class_dir / f)), None)
    if not submitted.is_dir():
        if marker is not None:  # an nbgrader course, nothing collected: its folders are not students
            raise LayoutError(
                f"{class_dir} is an nbgrader course directory ({marker}) without a submitted/ folder; "
                "to grade each of its folders as a student, pass --layout flat"
            )
        return "flat"
    if marker is not None:
        return "nbgrader"
    others = [
        e.name
        for e in sorted(class_dir.iterdir())
        if not e.name.startswith(".") and e.name not in NBGRADER_DIRS and (e.is_dir() or e.is_symlink())
    ]
    doubts = [f"{len(others)} other folder{'s' * (len(others) != 1)} ({_names(others)})"] if others else []
    if submitted.is_symlink():
        doubts.append("submitted/ is a symbolic link")
    if _holds_stages(submitted):
        doubts.append("submitted/ itself holds stage files")
    if not doubts:
        return "nbgrader"
    inside = sorted(p.name for p in submitted.iterdir() if not p.name.startswith("."))
    raise LayoutError(
        f"{class_dir} can be read two ways: as nbgrader's layout, grading the folders in submitted/ "
        f"({_names(inside)}) as the students, or as a flat class, grading each folder of {class_dir} as "
        f"a student, one of them named 'submitted' ({'; '.join(doubts)}). A student's folder name must "
        "not decide whose work is graded under which name: pass --layout flat or --layout nbgrader."
    )


def _plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _names(names: list[str], shown: int = 5) -> str:
    """A few names, each as Python writes it: quoted, and its control characters escaped."""
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return (", ".join(repr(n) for n in names[:shown]) or "none") + more


def _holds_stages(folder: Path) -> bool:
    from autograder.runtime.submission import Submission
    from autograder.stages import stage_ids

    return any(Submission(folder).holds(s) for s in stage_ids())


def fingerprint(submission: Path, stage: str) -> str:
    """The stage's file and those of the earlier stages it runs: what its grade depends on."""
    from autograder.runtime.submission import Submission
    from autograder.stages import requires

    return Submission(submission).fingerprint([stage, *requires(stage)])


def in_shard(student: str, shard: tuple[int, int] | None) -> bool:
    """Students are split by a stable hash of their name: shard k of n holds a fixed set."""
    if shard is None:
        return True
    k, n = shard
    # the name's bytes on disk: a name that is not UTF-8 still falls in one shard
    h = int.from_bytes(hashlib.sha256(student.encode("utf-8", "surrogateescape")).digest()[:8], "big")
    return h % n == k - 1


def discover(
    class_dir: Path,
    stages: list[str] | None,
    shard: tuple[int, int] | None = None,
    layout: str = "auto",
    skipped: list[str] | None = None,
) -> list[Unit]:
    """Every (student, stage) to grade: the stages asked for, or those each student holds.

    ``layout``: ``auto``, ``flat`` or ``nbgrader`` (``layout_of``; ``LayoutError`` when it is
    ambiguous). A student folder left out is said in ``skipped``, one line each."""
    from autograder.runtime.submission import Submission
    from autograder.stages import stage_ids

    skipped = [] if skipped is None else skipped
    root = class_dir / "submitted" if layout_of(class_dir, layout) == "nbgrader" else class_dir
    units = []
    for folder in _student_folders(root, shard, skipped):
        try:
            units += [
                Unit(folder.name, s, folder, fingerprint(folder, s))
                for s in Submission(folder).stages(stage_ids(), stages)
            ]
        except Exception as exc:  # an unreadable folder costs its student only
            skipped.append(f"{folder.name!r} cannot be read: {_printable(f'{type(exc).__name__}: {exc}')}")
    return units


def _student_folders(root: Path, shard: tuple[int, int] | None, skipped: list[str]) -> Iterator[Path]:
    for entry in sorted(root.iterdir()):
        name = entry.name
        if name.startswith(".") or not in_shard(name, shard):
            continue  # .ipynb_checkpoints, .git: never a student; another shard's: its own report
        if entry.is_symlink():
            # graded, a link's target (the reference solutions, another student) would be this student's work
            skipped.append(f"{name!r} is a symbolic link: not followed (copy the folder itself in)")
        elif not entry.is_dir():
            continue  # a file beside the students (a README, a roster)
        elif not name.isprintable():
            # no terminal, CSV or gradebook shows such a name faithfully (a name that is not
            # UTF-8 cannot even be stored); a cleaned-up spelling could be another student's
            skipped.append(
                f"{name!r}: its name has characters that do not show as they are (control or "
                "invisible characters, or bytes that are not UTF-8): rename the folder"
            )
        else:
            yield entry


def _printable(text: str, limit: int = 300) -> str:
    """``text`` for a terminal or a log line: its control characters escaped, cut at ``limit``."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit] + "…"


# -- what a stored grade may hold -------------------------------------------------------------

# Per stage, the largest rows seen grading the example class are ~25 kB. A child's texts are
# cut at 2,000 characters (child.MAX_TEXT) but a parent-side note wraps one, and its notes
# are one per event: the stored row keeps at most these, and says what it left out.
TEXT_CHARS = 4_000  # one note, one case's message, any other text
LONG_TEXT_CHARS = 16_000  # a test's output (its cases' messages together), the stage's stdout
NOTES_KEPT = 100
NOTES_CHARS = 32_000
ROW_BYTES = 1 << 20  # 40x the largest seen; a class of 2,000 rows of it is 2 GB at worst


class RowTooLarge(ValueError):
    pass


def bounded(result: dict[str, Any]) -> str:
    """``result`` as the JSON its row holds, within ``ROW_BYTES``: each text and the notes
    cut to the limits above, and if that is not enough (a stage of many cases, all failing
    with long non-ASCII messages), cut harder. The score is never touched."""
    for scale in (1, 8, 64):
        text = json.dumps(_cut(result, scale))
        if len(text) <= ROW_BYTES:  # ASCII (json escapes the rest): characters are bytes
            return text
    raise RowTooLarge(f"its record is over {ROW_BYTES:,} bytes even with its texts cut to 1/64")


def _cut(value: Any, scale: int, limit: int = TEXT_CHARS) -> Any:
    """``value`` with each text cut to ``limit // scale`` characters (a test's output and
    stdout to ``LONG_TEXT_CHARS // scale``) and each list of texts (the notes, and whatever
    list of texts a result grows next) to its first ``NOTES_KEPT // scale`` items within
    ``NOTES_CHARS // scale`` characters, then a line saying how many were left out."""
    if isinstance(value, str):
        cut = limit // scale
        if len(value) <= cut:
            return value
        return value[:cut] + f"… ({len(value) - cut:,} more characters not kept)"
    if isinstance(value, dict):
        return {k: _cut(v, scale, LONG_TEXT_CHARS if _long(k) else TEXT_CHARS) for k, v in value.items()}
    if not isinstance(value, list | tuple):
        return value
    if not all(isinstance(v, str) for v in value):
        return [_cut(v, scale, limit) for v in value]
    kept: list[str] = []
    chars = 0
    for note in value[: NOTES_KEPT // scale]:
        note = _cut(note, scale, limit)
        chars += len(note)
        if kept and chars > NOTES_CHARS // scale:
            break
        kept.append(note)
    if len(kept) < len(value):
        kept.append(
            f"… {len(value) - len(kept):,} more notes not kept (the gradebook keeps the first "
            f"{NOTES_KEPT // scale}, at most {NOTES_CHARS // scale:,} characters)"
        )
    return kept


def _long(key: object) -> bool:
    return key == "output" or (isinstance(key, str) and key.endswith("stdout"))


class Gradebook:
    """The SQLite gradebook: one row per (student, stage), written one transaction each.

    ``read_only``: SQLite itself refuses every write (a dry run), and a gradebook that does
    not exist yet is read as an empty one, not created."""

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = path
        if read_only:
            if path.exists():
                self.db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=60)
                return
            self.db = sqlite3.connect(":memory:")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
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

    def get(self, student: str, stage: str) -> dict[str, Any] | None:
        """The stored row of (student, stage), as ``rows`` gives it; None if there is none."""
        cur = self.db.execute(
            "SELECT student, stage, fingerprint, score, max_score, result, graded_at FROM grades "
            "WHERE student = ? AND stage = ?",
            (student, stage),
        )
        row = cur.fetchone()
        return None if row is None else dict(zip([c[0] for c in cur.description], row, strict=True))

    def put(self, unit: Unit, result: dict[str, Any]) -> None:
        """Store a grade (its texts ``bounded``); raises if it cannot be stored."""
        self._write(unit, unit.fingerprint, result)

    def put_failure(self, unit: Unit, result: dict[str, Any]) -> None:
        """Store an error row: a fingerprint that no files have, so that the next run grades
        the unit again (a grader fixed since, or a fault that does not recur)."""
        self._write(unit, FAILED + unit.fingerprint, result)

    def _write(self, unit: Unit, fingerprint: str, result: dict[str, Any]) -> None:
        row = (unit.student, unit.stage, fingerprint, result["score"], result["max_score"], bounded(result))
        with self.db:  # one transaction: the row is there entirely or not at all
            self.db.execute("INSERT OR REPLACE INTO grades VALUES (?, ?, ?, ?, ?, ?, ?)", (*row, time.time()))

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
        """One row per student: each stage's score, the total and the maximum. An error row
        is no grade: its cell is empty, as a stage not graded, and counts in neither sum."""
        import csv

        rows = self.rows()
        stages = sorted({r["stage"] for r in rows})
        by_student: dict[str, dict[str, Any]] = {}
        for r in rows:
            graded = by_student.setdefault(r["student"], {})
            if not r["fingerprint"].startswith(FAILED):
                graded[r["stage"]] = r
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["student", *stages, "total", "max"])
            for student, graded in sorted(by_student.items()):
                scores = [graded[s]["score"] if s in graded else "" for s in stages]
                total = sum(g["score"] for g in graded.values())
                w.writerow(
                    [_cell(student), *scores, round(total, 4), sum(g["max_score"] for g in graded.values())]
                )


def _cell(text: str) -> str:
    """A CSV cell that a spreadsheet shows as text: one opening like a formula (``=``, ``+``,
    ``-``, ``@``: a folder named ``=HYPERLINK(...)``) is quoted, as OWASP advises."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


# -- workers --------------------------------------------------------------------------------


def _grade_student(
    grader: Any, units: list[Unit], in_flight: InFlight | None = None
) -> list[tuple[Unit, dict[str, Any]]]:
    """One student's stages in one go: a stage that runs an earlier one reuses that stage's
    grade to say whether it fails too, instead of grading it again."""
    student = units[0].student
    if in_flight is not None:
        in_flight.start(student, [u.stage for u in units])
    try:
        r = grader.grade(units[0].submission, [u.stage for u in units], student=student)
    finally:
        if in_flight is not None:
            in_flight.finish(student)
    return [(u, _row(stage)) for u, stage in zip(units, r.stages, strict=True)]


class InFlight:
    """The students being graded now, and since when: the workers write it as they start and
    finish a student, the progress display reads it. A student whose code hangs holds a
    worker until its limits stop it; this is how the instructor sees who."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self._since: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._said: dict[str, float] = {}  # student -> the time in flight last reported (``overdue``)
        self._lock = threading.Lock()

    def start(self, student: str, stages: Sequence[str]) -> None:
        with self._lock:
            self._since[student] = (self.clock(), tuple(stages))

    def finish(self, student: str) -> None:
        with self._lock:
            self._since.pop(student, None)
            self._said.pop(student, None)

    def now(self) -> list[tuple[str, tuple[str, ...], float]]:
        """(student, stages, seconds in flight), the longest first."""
        t = self.clock()
        with self._lock:
            found = [(s, stages, t - t0) for s, (t0, stages) in self._since.items()]
        return sorted(found, key=lambda x: -x[2])

    def lines(self) -> list[str]:
        """A line per student in flight (for a terminal's live display)."""
        return [f"grading {_printable(s, 80)} ({', '.join(st)}): {sec:.0f} s" for s, st, sec in self.now()]

    def overdue(self, after_s: float = 30.0) -> list[str]:
        """For a log, where nothing redraws: a line for each student in flight for
        ``after_s`` seconds, then again each time that time doubles (never once a tick)."""
        lines = []
        for student, stages, seconds in self.now():
            with self._lock:
                said = self._said.get(student)
                if seconds < (after_s if said is None else 2 * said):
                    continue
                self._said[student] = seconds
            lines.append(
                f"still grading {_printable(student, 80)} ({', '.join(stages)}) after {seconds:.0f} s"
            )
        return lines


def _row(stage: Any) -> dict[str, Any]:
    from autograder.grader.report import stage_record

    return stage_record(stage)


@dataclass(frozen=True)
class Failure:
    """A unit that could not be graded or stored: its gradebook row is an error row."""

    student: str
    stage: str
    reason: str  # printable, for the instructor


@dataclass
class BatchReport:
    graded: int  # graded and stored (in a dry run: graded)
    skipped: int  # already in the gradebook
    seconds: float
    failed: list[Failure] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)  # what differs from the grades replaced
    new: int = 0  # graded with no earlier grade to compare with
    # A dry run's grades, stored nowhere: what ``summarise`` needs of each (scores, named mistakes).
    unstored: list[dict[str, Any]] = field(default_factory=list)


def run(
    units: list[Unit],
    book: Gradebook,
    workers: int,
    regrade: bool = False,
    device: str = "cpu",
    call_s: float | None = None,
    submission_s: float = 120.0,
    progress: Any = None,
    dry_run: bool = False,
    changes: list[Change] | None = None,
    in_flight: InFlight | None = None,
) -> BatchReport:
    """Grade ``units`` not already in ``book`` (with the same fingerprint), ``workers`` at a time.

    One ``Grader`` serves every worker: one fork server, and each stage's expected values
    computed once. The workers are threads of this process: what they wait for is their
    child (a student's code, a process of its own), while the parent's share (reading
    notebooks, comparing) is a small part. Processes would each import torch, start a fork
    server and build every plan: at two workers on two cores, a class started 12 s later
    and held a gigabyte more.

    A student whose grading raises, or a grade the gradebook refuses, is an error row
    (``Gradebook.put_failure``) and a ``Failure`` in the report; the other students go on.

    Each grade is compared with the one it replaces (``compare``) before that one is gone:
    the report's ``changes``, also appended to ``changes`` as each grade is settled, so that
    a caller interrupted midway still holds those of the grades already stored.
    ``dry_run``: grade and compare, store nothing (``book`` may be read-only).
    ``in_flight``: told as each student's grading starts and ends (the progress display's)."""
    from autograder.grader.launch import plot_extras, warm_early

    done = {} if regrade else book.done()
    todo = [u for u in units if done.get((u.student, u.stage)) != u.fingerprint]
    t0 = time.monotonic()
    report = BatchReport(0, len(units) - len(todo), 0.0, changes=[] if changes is None else changes)
    if progress is not None:
        progress(0, len(todo))
    if not todo:
        return report
    # before torch loads here: the CLI's early server loads matplotlib right after torch
    warm_early(plot_extras([(u.submission, u.stage) for u in todo]))
    from autograder.grader.grade import Grader
    from autograder.grader.runner import Limits
    from autograder.runtime.selfcheck import one_thread

    # The cores are the workers' (and their children's): torch's own thread pool in this
    # process would oversubscribe them (two threads on two busy cores made comparisons 25x slower).
    with (
        one_thread(),
        Grader(device=device, limits=Limits(call_s=call_s, submission_s=submission_s)) as grader,
    ):
        grader.warm_for([(u.submission, u.stage) for u in todo])
        grader.prepare(sorted({u.stage for u in todo}))
        _grade_all(grader, todo, book, workers, report, dry_run, progress, in_flight)
    report.graded = len(todo) - len(report.failed)
    report.seconds = time.monotonic() - t0
    return report


def _grade_all(
    grader: Any,
    todo: list[Unit],
    book: Gradebook,
    workers: int,
    report: BatchReport,
    dry_run: bool,
    progress: Any,
    in_flight: InFlight | None,
) -> None:
    """Grade ``todo`` on ``workers`` threads, one student to a task, settling each student's
    grades (``_settle``) as their task ends, in this thread only: the gradebook's connection
    and ``report`` are never shared between threads."""
    import torch

    # torch's thread count is per thread (OpenMP): each worker sets its own
    pool = cf.ThreadPoolExecutor(
        max_workers=max(1, min(workers, len(todo))), initializer=torch.set_num_threads, initargs=(1,)
    )
    try:
        futures = {
            pool.submit(_grade_student, grader, group, in_flight): group for group in _by_student(todo)
        }
        n = 0
        for future in cf.as_completed(futures):
            group = futures[future]
            # a worker's exception stays in its future (the thread lives on): here it
            # is this student's, not the batch's
            error = future.exception()
            if error is not None:
                traceback.print_exception(error, file=sys.stderr)  # for the TA: our fault
                for unit in group:
                    _settle(book, grader, unit, None, error, report, dry_run)
            else:
                for unit, result in future.result():
                    _settle(book, grader, unit, result, None, report, dry_run)
            n += len(group)
            if progress is not None:
                progress(n, len(todo))
    finally:
        # on Ctrl-C (or a grader fault) the students not started are not graded:
        # the workers finish the student they hold, the gradebook keeps every grade
        pool.shutdown(wait=True, cancel_futures=True)


def _settle(
    book: Gradebook,
    grader: Any,
    unit: Unit,
    result: dict[str, Any] | None,
    error: BaseException | None,
    report: BatchReport,
    dry_run: bool,
) -> None:
    """Store ``unit``'s grade (one transaction, in this thread only), or its error row when
    grading raised ``error`` or storing fails, and add to ``report`` how it differs from the
    grade it replaces, read before it is replaced."""
    before = book.get(unit.student, unit.stage)
    if error is None and result is not None and result.get("grader_fault"):
        # the grader failed on this stage (its message is the note): no grade to keep
        error = RuntimeError((result.get("notes") or ["the grader failed on this stage"])[0])
        result = None
    storing = error is None
    if result is not None and not dry_run:
        try:
            book.put(unit, result)
        except Exception as exc:
            error = exc
    if error is not None:
        result, failure = _failed(grader, unit, error, storing=storing)
        if not dry_run:
            try:
                book.put_failure(unit, result)
            except Exception as again:  # the gradebook itself fails (a full disk): the report says so
                why = _printable(f"{type(again).__name__}: {again}")
                failure = dataclasses.replace(
                    failure, reason=f"{failure.reason}; nor store its error row: {why}"
                )
        report.failed.append(failure)
    assert result is not None
    if before is None:
        report.new += 1
    else:
        report.changes += compare(before, unit, result, None if error is None else failure.reason)
    if dry_run:
        report.unstored.append(_summary_row(unit, error is not None, result))


def _failed(grader: Any, unit: Unit, exc: BaseException, *, storing: bool) -> tuple[dict[str, Any], Failure]:
    """The error row of a ``unit`` that could not be graded (or its grade ``storing``):
    scoring 0, its tests all there, failed, with the reason; the next run grades it again."""
    from autograder.grader.score import score_stage

    why = _printable(f"{type(exc).__name__}: {exc}")
    doing = "store the grade of" if storing else "grade"
    note = (
        f"the grader could not {doing} this stage ({why}). This is a fault of the grader, not of "
        "your code: it is graded again the next time the class is graded."
    )
    try:
        result = _row(score_stage(grader.plan(unit.stage), None, None, [note], failure=note))
    except Exception:  # the stage's plan itself fails: the note alone
        result = {"stage": unit.stage, "file": None, "tests": [], "notes": [note], "stdout": ""}
        result |= {"score": 0.0, "max_score": 0.0}
    reason = f"{'storing its grade' if storing else 'grading it'} failed: {why}"
    return result, Failure(unit.student, unit.stage, reason)


def _summary_row(unit: Unit, failed: bool, result: dict[str, Any]) -> dict[str, Any]:
    """A grade as ``summarise`` reads a stored row, with only what it reads: a dry run keeps
    each grade in memory until the end, and a class's full grades could be gigabytes."""
    kept = {"tests": [{"misconceptions": t["misconceptions"]} for t in result["tests"]]}
    return {
        "student": unit.student,
        "stage": unit.stage,
        "fingerprint": (FAILED if failed else "") + unit.fingerprint,
        "score": result["score"],
        "max_score": result["max_score"],
        "result": json.dumps(kept),
    }


# -- what a regrade changes ------------------------------------------------------------------

ERROR = "error"  # a score that is none: the grade is an error row


@dataclass(frozen=True)
class Change:
    """One test of one student whose score differs from the gradebook's previous grade, or,
    where either grade is an error row, that student's whole stage (``function`` empty).

    For instructors: ``why`` and ``failing`` name hidden cases."""

    student: str
    stage: str
    function: str
    group: str
    old: float | str | None  # the score; ERROR for an error row; None: no such test before
    old_max: float | None
    new: float | str | None
    new_max: float | None
    why: str
    failing: tuple[str, ...] = ()  # labels of the cases that fail now and did not before

    @property
    def test(self) -> str:
        return f"{self.function} · {self.group}" if self.function else "(the whole stage)"

    @property
    def delta(self) -> float | None:
        """Points gained (negative: lost); None where either side is an error row, whose 0
        is no grade. A test added or removed moves all of its score."""
        if ERROR in (self.old, self.new):
            return None
        return round(float(self.new or 0.0) - float(self.old or 0.0), 4)


def compare(before: dict[str, Any], unit: Unit, result: dict[str, Any], failure: str | None) -> list[Change]:
    """How ``result``, ``unit``'s grade now (an error row when ``failure`` says why),
    differs from ``before``, the gradebook's row it replaces: one ``Change`` per test whose
    score or points differ, matched by (function, group); nothing when no score moved."""
    old = json.loads(before["result"])
    was_error = before["fingerprint"].startswith(FAILED)
    edited = before["fingerprint"].removeprefix(FAILED) != unit.fingerprint
    also = ["the student's files changed since"] if edited else []

    def whole(old_: Any, old_max: Any, new: Any, new_max: Any, why: str) -> list[Change]:
        return [
            Change(unit.student, unit.stage, "", "", old_, old_max, new, new_max, "; ".join([why, *also]))
        ]

    if was_error and failure is not None:
        return []  # no grade before, none now
    if was_error:
        why = "the previous grade was an error row (the grader's fault, no grade): graded now"
        return whole(ERROR, None, result["score"], result["max_score"], why)
    if failure is not None:
        why = f"the grader failed on it now, an error row (no grade): {failure}"
        return whole(before["score"], before["max_score"], ERROR, None, why)
    olds = {(t["function"], t["group"]): t for t in old["tests"]}
    news = {(t["function"], t["group"]): t for t in result["tests"]}
    changes = []
    for key in [*news, *(k for k in olds if k not in news)]:
        o, n = olds.get(key), news.get(key)
        if o is not None and n is not None and _same(o, n):
            continue
        why, failing = _why(o, n)
        changes.append(
            Change(
                unit.student,
                unit.stage,
                *key,
                None if o is None else o["score"],
                None if o is None else o["max_score"],
                None if n is None else n["score"],
                None if n is None else n["max_score"],
                "; ".join([why, *also]),
                failing,
            )
        )
    return changes


def _same(old: dict[str, Any], new: dict[str, Any]) -> bool:
    # scores are rounded to 4 places (grade.score_stage): a smaller difference is noise
    return abs(old["score"] - new["score"]) < 1e-6 and abs(old["max_score"] - new["max_score"]) < 1e-6


def _why(old: dict[str, Any] | None, new: dict[str, Any] | None) -> tuple[str, tuple[str, ...]]:
    """Why a test's score moved, in words, and the labels of its cases that fail now and did not."""
    if new is None:
        return "test removed", ()
    kind = "hidden " if new.get("hidden") else ""
    group = f"in group {new['group']!r}"
    now = {c["label"]: c["passed"] for c in new["cases"]}
    if old is None:
        failing = tuple(label for label, passed in now.items() if not passed)
        said = f": fails {kind}{_cases(failing)}" if failing else ""
        return f"test added, worth {_points(new['max_score'])}, {group}{said}", failing
    was = {c["label"]: c["passed"] for c in old["cases"]}
    added_failing = [label for label, passed in now.items() if not passed and label not in was]
    now_failing = [label for label, passed in now.items() if not passed and was.get(label) is True]
    added_passing = [label for label, passed in now.items() if passed and label not in was]
    now_passing = [label for label, passed in now.items() if passed and was.get(label) is False]
    removed = [label for label in was if label not in now]
    parts = []
    if added_failing:
        parts.append(f"new {kind}{_cases(added_failing)} {group} {_verb(added_failing, 'fail', 'fails')}")
    if now_failing:
        parts.append(f"{_cases(now_failing)} {group} now {_verb(now_failing, 'fail', 'fails')}")
    if added_passing:
        parts.append(f"new {_cases(added_passing)} {group} {_verb(added_passing, 'pass', 'passes')}")
    if now_passing:
        parts.append(f"{_cases(now_passing)} {group} now {_verb(now_passing, 'pass', 'passes')}")
    if removed:
        parts.append(f"{_cases(removed)} {group} removed")
    if abs(old["max_score"] - new["max_score"]) >= 1e-6:
        parts.append(f"worth {_points(old['max_score'])}, now {_points(new['max_score'])}")
    gained = [m for m in new["misconceptions"] if m not in old["misconceptions"]]
    lost = [m for m in old["misconceptions"] if m not in new["misconceptions"]]
    if gained:
        parts.append(f"named mistake{'s' * (len(gained) > 1)} now {', '.join(gained)}")
    if lost:
        parts.append(f"no longer named {', '.join(lost)}")
    if not parts:  # e.g. a forbidden call in another test of the function costs this one too
        parts.append("the same cases pass, scored differently")
    return "; ".join(parts), (*added_failing, *now_failing)


def _cases(labels: Sequence[str]) -> str:
    return f"case{'s' * (len(labels) != 1)} {_names(list(labels))}"


def _verb(items: Sequence[object], many: str, one: str) -> str:
    return one if len(items) == 1 else many


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _points(points: float) -> str:
    return f"{shown(points)} point{'s' * (points != 1)}"


def changes_summary(changes: list[Change], new: int) -> str:
    """One line: how many students and tests changed, and the points they moved."""
    if not changes:
        line = "no grade changed since the gradebook's previous grades"
    else:
        gained = round(sum(d for c in changes if (d := c.delta) is not None and d > 0), 4)
        lost = round(-sum(d for c in changes if (d := c.delta) is not None and d < 0), 4)
        line = f"{_count(len({c.student for c in changes}), 'student')} changed"
        if tests := sum(1 for c in changes if c.function):
            line += f", {_count(tests, 'test')}"
        net = round(gained - lost, 2)
        line += f": {shown(gained)} points gained, {shown(lost)} lost (net {'+' * (net >= 0)}{shown(net)})"
    if fixed := sum(c.old == ERROR for c in changes):
        line += f"; {_count(fixed, 'error row')} graded now"
    if broken := sum(c.new == ERROR for c in changes):
        rows = "an error row" if broken == 1 else "error rows"
        line += f"; {_count(broken, 'grade')} now {rows} (the grader failed)"
    if new:
        line += f"; {_count(new, 'grade')} with no previous grade (not compared)"
    return line


CHANGE_COLUMNS = (
    "student",
    "stage",
    "function",
    "group",
    "old_score",
    "old_max",
    "new_score",
    "new_max",
    "change",
    "why",
    "cases_now_failing",
)


def write_changes_csv(changes: list[Change], path: Path) -> None:
    """One row per changed student × test (``CHANGE_COLUMNS``); a score that is an error row
    reads ``error``, a test that was not there is empty. For instructors: it names hidden cases."""
    import csv

    def number(value: float | str | None) -> float | str:
        return "" if value is None else value

    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CHANGE_COLUMNS)
        for c in changes:
            delta = c.delta
            w.writerow(
                [
                    _cell(c.student),
                    c.stage,
                    _cell(c.function),
                    _cell(c.group),
                    number(c.old),
                    number(c.old_max),
                    number(c.new),
                    number(c.new_max),
                    "" if delta is None else delta,
                    _cell(c.why),
                    _cell("; ".join(c.failing)),
                ]
            )


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
        if not r.get("fingerprint", "").startswith(FAILED):  # an error row is no grade
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


# -- the `batch` command: grade a class and show it ---------------------------------------------


@dataclass(frozen=True)
class ClassRun:
    """What ``python -m autograder batch`` was asked for (its options, checked)."""

    class_dir: Path
    stages: list[str] | None
    layout: str
    db: Path
    workers: int | None
    regrade: bool
    dry_run: bool
    diff_csv: Path | None  # what changed, as CSV (it names hidden cases: instructors only)
    shard: tuple[int, int] | None
    csv: Path | None  # the gradebook, exported
    device: str
    call_s: float | None
    submission_s: float

    @property
    def changes_asked(self) -> bool:
        return self.regrade or self.dry_run or self.diff_csv is not None


def grade_class(asked: ClassRun, console: Any, err: Any) -> int:
    """Grade every student × stage of ``asked.class_dir`` into the gradebook, showing
    progress, what changed (when asked) and a table per stage on ``console``; problems on
    ``err``. Returns the exit status: 0; 1 when a folder was left out or a grade could not
    be computed or stored; 2 for a class whose layout is unclear; 130 when interrupted."""
    from autograder.grader.options import warn_if_exposed

    skipped: list[str] = []
    try:
        units = discover(asked.class_dir, asked.stages, asked.shard, layout=asked.layout, skipped=skipped)
    except LayoutError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        return 2
    warn_if_exposed()
    students = len({u.student for u in units})
    console.print(f"{students} students, {len(units)} student×stage grades; gradebook {asked.db}")
    if asked.dry_run:
        console.print(f"dry run: nothing is written to {asked.db}")
    # Names and reasons are the students' text: never rich markup, never a raw control character.
    for line in skipped:
        err.print(f"not graded: {line}", markup=False, highlight=False)
    changes: list[Change] = []
    with Gradebook(asked.db, read_only=asked.dry_run) as book:
        try:
            report = _run_with_progress(asked, units, book, changes, console)
        except KeyboardInterrupt:  # the students in flight were finished, the rest not started
            if asked.dry_run:
                err.print(f"interrupted: nothing was written to {asked.db}")
                return 130
            if asked.changes_asked:  # what the grades stored so far replaced is in no other record
                _show_changes(changes, 0, asked.diff_csv, console)
            kept = len(book.done())
            err.print(
                f"interrupted: {asked.db} keeps {kept} grades; run the same command again to grade the rest"
            )
            return 130
        asked_for = {(u.student, u.stage) for u in units}
        rows = [r for r in book.rows() if (r["student"], r["stage"]) in asked_for]
        if asked.dry_run:  # the table shows the class as the gradebook would be
            replaced = {(r["student"], r["stage"]) for r in report.unstored}
            rows = [r for r in rows if (r["student"], r["stage"]) not in replaced] + report.unstored
        if asked.csv is not None:
            book.export_csv(asked.csv)
    console.print(
        f"graded {report.graded}, already in the gradebook {report.skipped}, in {report.seconds:.1f} s"
    )
    if asked.changes_asked:
        _show_changes(changes, report.new, asked.diff_csv, console)
    console.print(_stage_table(rows, asked.dry_run))
    if asked.csv is not None:
        console.print(f"CSV: {asked.csv}")
    return _said_problems(asked, report, skipped, err)


def _run_with_progress(
    asked: ClassRun, units: list[Unit], book: Gradebook, changes: list[Change], console: Any
) -> BatchReport:
    """``run`` under a progress bar and, below it, a line per student in flight. A hanging
    student holds a worker until its limits stop it: a terminal shows who is in flight and
    for how long; a log (Docker without -t, CI), where nothing redraws, says which students
    take long, as they do."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.text import Text

    in_flight = InFlight()

    class Watch(Progress):
        """The bar and, under it, a line per student being graded and for how long."""

        def get_renderables(self):
            yield from super().get_renderables()
            for line in in_flight.lines():
                yield Text(line, style="dim")  # Text: a name is the student's, never markup

    stop_log = threading.Event()

    def log_slow() -> None:
        while not stop_log.wait(1.0):
            for line in in_flight.overdue():
                console.print(line, markup=False, highlight=False)

    if not console.is_terminal:
        threading.Thread(target=log_slow, name="bertlab-in-flight", daemon=True).start()
    columns = (TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"))
    with Watch(*columns, TimeRemainingColumn(), console=console, transient=not console.is_terminal) as bar:
        task = bar.add_task("grading", total=None, rate="")
        t0 = time.monotonic()

        def progress(n: int, total: int) -> None:
            rate = n / max(time.monotonic() - t0, 1e-9)
            bar.update(task, completed=n, total=total, rate=f"{rate:.1f}/s" if n else "")

        try:
            return run(
                units,
                book,
                asked.workers or default_workers(),
                regrade=asked.regrade,
                device=asked.device,
                call_s=asked.call_s,
                submission_s=asked.submission_s,
                progress=progress,
                dry_run=asked.dry_run,
                changes=changes,
                in_flight=in_flight,
            )
        finally:
            stop_log.set()


def _grade_text(score: float | str | None, max_score: float | None) -> str:
    if score is None:
        return "—"
    return score if isinstance(score, str) else f"{shown(score)}/{shown(max_score or 0)}"


def _show_changes(changes: list[Change], new: int, diff_csv: Path | None, console: Any) -> None:
    """What changed since the gradebook's previous grades: a table (for the instructor, who
    runs this: it names hidden cases), its CSV, a summary line."""
    from rich.table import Table
    from rich.text import Text

    changes.sort(key=lambda c: (c.student, c.stage))  # stable: each grade's tests in order
    if changes:
        table = Table(title="changed since the gradebook's previous grade")
        for col in ("student", "stage", "test", "old", "new", "change", "why"):
            table.add_column(col)
        for c in changes:
            delta = "" if c.delta is None else "+" * (c.delta >= 0) + shown(c.delta)
            # Text: names are the students' text, never rich markup
            cells = (c.student, c.stage, c.test, _grade_text(c.old, c.old_max), _grade_text(c.new, c.new_max))
            table.add_row(*(Text(x) for x in (*cells, delta, c.why)))
        console.print(table)
    console.print(changes_summary(changes, new), markup=False, highlight=False)
    if diff_csv is not None:
        write_changes_csv(changes, diff_csv)
        console.print(f"changes CSV (instructors only: it names hidden cases): {diff_csv}")


def _stage_table(rows: list[dict[str, Any]], dry_run: bool) -> Any:
    """Per stage: students, mean, median and the most frequent named mistakes."""
    from rich.table import Table

    table = Table(title="per stage, if stored (dry run)" if dry_run else "per stage")
    for col in ("stage", "students", "mean", "median", "most frequent named mistakes"):
        table.add_column(col)
    for s in summarise(rows):
        mistakes = ", ".join(f"{m} ({n})" for m, n in s.mistakes) or "—"
        mean, median = f"{shown(s.mean)} / {shown(s.max_score)}", shown(s.median)
        table.add_row(s.stage, str(s.students), mean, median, mistakes)
    return table


def _said_problems(asked: ClassRun, report: BatchReport, skipped: list[str], err: Any) -> int:
    """Say, at the end, which grades could not be computed or stored and which folders were
    left out; 1 if any, else 0."""
    if report.failed:
        fate = (
            "nothing was written (--dry-run)."
            if asked.dry_run
            else "each has an error row (score 0, the reason in its notes) that the next run grades again."
        )
        err.print(
            f"{len(report.failed)} could not be graded or stored: {fate}", markup=False, highlight=False
        )
        for f in report.failed:
            err.print(f"  {f.student!r} {f.stage}: {f.reason}", markup=False, highlight=False)
    if skipped:
        folders = f"{len(skipped)} folder{'s' * (len(skipped) != 1)}"
        err.print(
            f"not graded: {folders} of {asked.class_dir} (said above).",
            markup=False,
            highlight=False,
        )
    return 1 if report.failed or skipped else 0

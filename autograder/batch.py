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
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
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
    from autograder.load import LoadError, find_stage_file
    from autograder.stages import stage_ids

    for s in stage_ids():
        try:
            if find_stage_file(folder, s) is not None:
                return True
        except LoadError:
            return True
    return False


def fingerprint(submission: Path, stage: str) -> str:
    """The stage's file and those of the earlier stages it runs: what its grade depends on."""
    from autograder.load import MAX_FILE_BYTES, LoadError, find_stage_file
    from autograder.stages import requires

    digest = hashlib.sha256()
    for s in [stage, *requires(stage)]:
        try:
            path = find_stage_file(submission, s)
        except LoadError:
            path = None
        digest.update(s.encode() + b"\0")
        if path is not None and path.is_file() and not path.is_symlink():
            size = path.stat().st_size
            # the loader refuses a larger file whatever it holds, so its grade depends on its
            # size alone; reading it would let one (sparse) file exhaust this process's memory
            digest.update(path.read_bytes() if size <= MAX_FILE_BYTES else f"{size} bytes".encode())
        digest.update(b"\0")
    return digest.hexdigest()


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
    from autograder.stages import stages_for

    skipped = [] if skipped is None else skipped
    root = class_dir / "submitted" if layout_of(class_dir, layout) == "nbgrader" else class_dir
    units = []
    for folder in _student_folders(root, shard, skipped):
        try:
            units += [
                Unit(folder.name, s, folder, fingerprint(folder, s)) for s in stages_for(folder, stages)
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


def _grade_student(grader: Any, units: list[Unit]) -> list[tuple[Unit, dict[str, Any]]]:
    """One student's stages in one go: a stage that runs an earlier one reuses that stage's
    grade to say whether it fails too, instead of grading it again."""
    r = grader.grade(units[0].submission, [u.stage for u in units], student=units[0].student)
    return [(u, _row(stage)) for u, stage in zip(units, r.stages, strict=True)]


def _row(stage: Any) -> dict[str, Any]:
    return {**dataclasses.asdict(stage), "score": stage.score, "max_score": stage.max_score}


@dataclass(frozen=True)
class Failure:
    """A unit that could not be graded or stored: its gradebook row is an error row."""

    student: str
    stage: str
    reason: str  # printable, for the instructor


@dataclass
class BatchReport:
    graded: int  # graded and stored
    skipped: int  # already in the gradebook
    seconds: float
    failed: list[Failure] = field(default_factory=list)


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
    and held a gigabyte more.

    A student whose grading raises, or a grade the gradebook refuses, is an error row
    (``Gradebook.put_failure``) and a ``Failure`` in the report; the other students go on."""
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
    failed: list[Failure] = []
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
                futures = {pool.submit(_grade_student, grader, group): group for group in _by_student(todo)}
                n = 0
                for future in cf.as_completed(futures):
                    group = futures[future]
                    # a worker's exception stays in its future (the thread lives on): here it
                    # is this student's, not the batch's
                    error = future.exception()
                    if error is not None:
                        traceback.print_exception(error, file=sys.stderr)  # for the TA: our fault
                        for unit in group:
                            _failed(book, grader, unit, error, failed, storing=False)
                    else:
                        for unit, result in future.result():
                            try:
                                book.put(unit, result)  # one transaction per grade, in this thread only
                            except Exception as exc:
                                _failed(book, grader, unit, exc, failed, storing=True)
                    n += len(group)
                    if progress is not None:
                        progress(n, len(todo))
            finally:
                # on Ctrl-C (or a grader fault) the students not started are not graded:
                # the workers finish the student they hold, the gradebook keeps every grade
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        torch.set_num_threads(threads)
    return BatchReport(len(todo) - len(failed), len(units) - len(todo), time.monotonic() - t0, failed)


def _failed(
    book: Gradebook, grader: Any, unit: Unit, exc: BaseException, failed: list[Failure], *, storing: bool
) -> None:
    """Record that ``unit`` could not be graded (or its grade ``storing``): an error row
    scoring 0 (its tests all there, failed, with the reason) that the next run grades again."""
    from autograder.grade import score_stage

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
    try:
        book.put_failure(unit, result)
    except Exception as again:  # the gradebook itself fails (a full disk): the report says so
        reason += f"; nor store its error row: {_printable(f'{type(again).__name__}: {again}')}"
    failed.append(Failure(unit.student, unit.stage, reason))


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

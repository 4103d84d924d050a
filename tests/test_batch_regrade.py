"""A regrade after the grading changed mid-course (a new hidden case, a test added or worth
more points): ``batch --regrade --dry-run`` says, per student and test, what would change
since the gradebook's grades and why, and writes nothing; ``--regrade`` then stores them.

The class is graded for real, on the toy stage (tests/toy_stage) and on copies of it with
the changes an instructor makes to a spec."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.support import CALL_S, DEVICE, ROOT, cli_command

TOY = ROOT / "tests" / "toy_stage"

CORRECT = """
import torch
from torch import nn

def scale_rows(x, alpha):
    return alpha * x / torch.sqrt((x * x).sum(-1, keepdim=True))

class Gate(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w_g = nn.Linear(d, d)
        self.w_v = nn.Linear(d, d)

    def forward(self, x):
        return torch.sigmoid(self.w_g(x)) * self.w_v(x)
"""
STUDENTS = {
    "ada": CORRECT,
    # normalises over dim 1: right for the 2-D cases only (float32's 3-D one fails already)
    "bo": CORRECT.replace("sum(-1,", "sum(1,"),
    # forgets alpha and the sigmoid: every case fails, before and after
    "cy": CORRECT.replace("alpha * x", "x").replace("torch.sigmoid(self.w_g(x))", "self.w_g(x)"),
}
BEFORE = {"ada": 5.0, "bo": 4.0, "cy": 0.0}

FLOAT64 = 'Test("float64", torch.float64, points=1, cases=(Case("(4, 3)", _rows((4, 3), 3.0)),)),'
# The instructor adds a 3-D hidden case to scale_rows' float64 test: bo fails it, ada passes
# it, cy failed every case already (her score stays 0).
NEW_CASE = FLOAT64.replace(")),)),", ")), Case('(2, 3, 4)', _rows((2, 3, 4), 3.0)))),")


def _stage(root: Path, *edits: tuple[str, str]) -> Path:
    """A copy of the toy stage with ``edits`` (old, new) made to its spec."""
    shutil.copytree(TOY, root)
    spec = root / "99_toy.py"
    text = spec.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    spec.write_text(text)
    return root


def _class(root: Path, students: dict[str, str]) -> Path:
    for name, code in students.items():
        (root / name).mkdir(parents=True)
        (root / name / "99_toy.py").write_text(code)
    return root


def _batch(stages: Path, klass: Path, db: Path, *args: str) -> subprocess.CompletedProcess:
    command = cli_command(
        "batch", str(klass), "--db", str(db), "--stage", "99_toy", "--workers", "2", "--device", DEVICE
    )
    command["args"] += ["--call-timeout", str(CALL_S), *args]
    command["env"]["BERTLAB_STAGE_PATH"] = str(stages)
    return subprocess.run(**command, capture_output=True, timeout=300)


def _rows(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT * FROM grades ORDER BY student").fetchall()


def _scores(db: Path) -> dict[str, float]:
    return {row[0]: row[3] for row in _rows(db)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded on the toy stage as it was: a real gradebook, kept pristine (each
    test works on a copy)."""
    root = tmp_path_factory.mktemp("regrade")
    klass = _class(root / "class", STUDENTS)
    stages = _stage(root / "stage_v1")
    db = root / "book.sqlite"
    run = _batch(stages, klass, db)
    assert run.returncode == 0, run.stderr
    assert _scores(db) == BEFORE
    return root, klass, stages, db


def _copy(db: Path, to: Path) -> Path:
    shutil.copy(db, to)
    return to


def _table(stdout: str) -> str:
    """The printed table of changes: from its title to the summary line after it."""
    start = stdout.index("changed since the gradebook's previous grade")
    return stdout[start : stdout.index("student changed", start)]


def test_a_dry_run_regrade_reports_each_changed_test_and_writes_nothing_then_a_regrade_stores(
    graded, tmp_path
):
    _, klass, _, book = graded
    db = _copy(book, tmp_path / "book.sqlite")
    rows, digest = _rows(db), hashlib.sha256(db.read_bytes()).hexdigest()
    stages = _stage(tmp_path / "stage_v2", (FLOAT64, NEW_CASE))

    dry = _batch(stages, klass, db, "--regrade", "--dry-run", "--diff-csv", str(tmp_path / "dry.csv"))
    assert dry.returncode == 0, dry.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest and _rows(db) == rows

    with (tmp_path / "dry.csv").open() as f:
        changed = list(csv.DictReader(f))
    assert changed == [
        {
            "student": "bo",
            "stage": "99_toy",
            "function": "scale_rows",
            "group": "float64",
            "old_score": "1.0",
            "old_max": "1.0",
            "new_score": "0.5",
            "new_max": "1.0",
            "change": "-0.5",
            "why": "new hidden case '(2, 3, 4)' in group 'float64' fails",
            "cases_now_failing": "(2, 3, 4)",
        }
    ]
    table = _table(dry.stdout)
    [line] = [line for line in table.splitlines() if line.startswith("│")]  # one row: bo's
    assert line.split("│")[1].strip() == "bo"
    for cell in ("99_toy", "scale_rows · float64", "1/1", "0.5/1", "-0.5", "new hidden case '(2, 3, 4)'"):
        assert cell in line, line
    assert "ada" not in table and "cy" not in table  # unchanged: cy's new failing case costs her nothing
    assert "1 student changed, 1 test: 0 points gained, 0.5 lost (net -0.5)" in dry.stdout
    assert "2.83 / 5" in dry.stdout  # the stage's mean as it would be: (5 + 3.5 + 0) / 3

    real = _batch(stages, klass, db, "--regrade", "--diff-csv", str(tmp_path / "real.csv"))
    assert real.returncode == 0, real.stderr
    assert (tmp_path / "real.csv").read_text() == (tmp_path / "dry.csv").read_text()
    assert _scores(db) == {**BEFORE, "bo": 3.5}
    with sqlite3.connect(db) as c:
        result = json.loads(c.execute("SELECT result FROM grades WHERE student = 'bo'").fetchone()[0])
    [float64] = [t for t in result["tests"] if (t["function"], t["group"]) == ("scale_rows", "float64")]
    assert [(c["label"], c["passed"]) for c in float64["cases"]] == [("(4, 3)", True), ("(2, 3, 4)", False)]

    again = _batch(stages, klass, db, "--regrade", "--dry-run")
    assert again.returncode == 0, again.stderr
    assert "no grade changed since the gradebook's previous grades" in again.stdout


def _run(klass: Path, book, **kwargs):
    from autograder.grader import batch as b

    units = b.discover(klass, ["99_toy"])
    return b.run(units, book, 2, regrade=True, device=DEVICE, call_s=CALL_S, **kwargs)


def test_error_rows_show_as_errors_on_either_side_never_as_points_lost_or_gained(
    graded, tmp_path, monkeypatch
):
    from autograder.grader import batch as b
    from autograder.grader.grade import Grader

    _, klass, stages, book = graded
    monkeypatch.setenv("BERTLAB_STAGE_PATH", str(stages))
    real = Grader.grade

    def faulty(self, submission, stages, student=None):
        if student == "ada":
            raise RuntimeError("the grader tripped on this one")
        return real(self, submission, stages, student)

    # the grader fails on ada now: her stored 5/5 would become an error row, not a 5-point drop
    db = _copy(book, tmp_path / "book.sqlite")
    monkeypatch.setattr(Grader, "grade", faulty)
    with b.Gradebook(db, read_only=True) as ro:
        report = _run(klass, ro, dry_run=True)
    assert [(f.student, f.stage) for f in report.failed] == [("ada", "99_toy")]
    [change] = report.changes
    assert (change.student, change.function, change.old, change.new) == ("ada", "", 5.0, b.ERROR)
    assert change.delta is None and "the grader tripped on this one" in change.why
    summary = b.changes_summary(report.changes, report.new)
    assert (
        summary
        == "1 student changed: 0 points gained, 0 lost (net +0); 1 grade now an error row (the grader failed)"
    )
    assert _scores(db) == BEFORE

    # stored as an error row, then graded by a grader that works: no 5-point gain either
    with b.Gradebook(db) as rw:
        _run(klass, rw)
    assert _rows(db)[0][2].startswith(b.FAILED)
    monkeypatch.setattr(Grader, "grade", real)
    with b.Gradebook(db, read_only=True) as ro:
        report = _run(klass, ro, dry_run=True)
    assert report.failed == []
    [change] = report.changes
    assert (change.student, change.function, change.old, change.new, change.delta) == (
        "ada",
        "",
        b.ERROR,
        5.0,
        None,
    )
    assert "the previous grade was an error row" in change.why
    assert b.changes_summary(report.changes, report.new).endswith("(net +0); 1 error row graded now")
    assert _rows(db)[0][2].startswith(b.FAILED)  # the dry run left it as it was

    # nor is a gradebook created by a dry run that finds none: every grade is new
    missing = tmp_path / "none.sqlite"
    with b.Gradebook(missing, read_only=True) as ro:
        report = _run(klass, ro, dry_run=True)
    assert (report.new, report.changes, report.graded) == (3, [], 3)
    assert not missing.exists()


def test_tests_added_removed_or_worth_more_and_edited_files_are_named(graded, tmp_path, monkeypatch):
    from autograder.grader import batch as b

    _, klass, _, book = graded
    batched = (
        'Test("float64, 3-D", torch.float64, points=1, cases=(Case("(2, 3, 4)", _rows((2, 3, 4), 3.0)),)),'
    )
    gate32 = '"float32", torch.float32, points=1, hidden=False, cases=(Case("B=3, d=4", _gate(3, 4)),)'
    gate64 = 'Test("float64", torch.float64, points=1, cases=(Case("B=2, d=6", _gate(2, 6)),)),'
    stages = _stage(
        tmp_path / "stage_v3",
        (FLOAT64, FLOAT64 + batched),  # a test added
        (f"Test(\n{' ' * 20}{gate32}\n{' ' * 16}),", ""),  # a test removed
        (gate64, gate64.replace("points=1", "points=2")),  # a test worth more
    )
    monkeypatch.setenv("BERTLAB_STAGE_PATH", str(stages))
    # cy fixed her code since she was graded
    edited = shutil.copytree(klass, tmp_path / "class")
    (edited / "cy" / "99_toy.py").write_text(CORRECT)
    db = _copy(book, tmp_path / "book.sqlite")
    with b.Gradebook(db, read_only=True) as ro:
        report = _run(edited, ro, dry_run=True)
    assert report.failed == [] and report.new == 0
    got = {(c.student, c.test): (c.old, c.old_max, c.new, c.new_max, c.why) for c in report.changes}
    added = "test added, worth 1 point, in group 'float64, 3-D'"
    assert got[("ada", "scale_rows · float64, 3-D")] == (None, None, 1.0, 1.0, added)
    assert got[("ada", "Gate · float32")] == (1.0, 1.0, None, None, "test removed")
    assert got[("ada", "Gate · float64")] == (1.0, 1.0, 2.0, 2.0, "worth 1 point, now 2 points")
    assert got[("bo", "scale_rows · float64, 3-D")] == (
        None,
        None,
        0.0,
        1.0,
        added + ": fails hidden case '(2, 3, 4)'",
    )
    assert {t for s, t in got if s == "ada"} == {t for s, t in got if s == "bo"}  # the same tests moved
    # cy's grade moved because of her own files, and that is said on each of her tests
    assert got[("cy", "Gate · float64")] == (
        0.0,
        1.0,
        2.0,
        2.0,
        "case 'B=2, d=6' in group 'float64' now passes; worth 1 point, now 2 points; "
        "no longer named no-sigmoid; the student's files changed since",
    )
    assert all(why.endswith("the student's files changed since") for s, *_, why in _flat(got) if s == "cy")
    # in the stage's order, then what it no longer has
    assert [(c.test, c.delta) for c in report.changes if c.student == "ada"] == [
        ("scale_rows · float64, 3-D", 1.0),
        ("Gate · float64", 1.0),
        ("Gate · float32", -1.0),
    ]
    assert _scores(db) == BEFORE


def _flat(got: dict) -> list[tuple]:
    return [(student, *value) for (student, _), value in got.items()]

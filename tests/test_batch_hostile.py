"""A class batch against its own students: no folder name decides how the class is read
or whose grade is whose, and no one student's submission, name or grade stops the others
from being graded and stored."""

from __future__ import annotations

import csv
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import CALL_S, DEVICE, ROOT, cli_command, max_score, n_tests

CLASS = ROOT / "examples" / "class"
# student -> the example whose 01_attention they hand in, and its score
HONEST = {
    "ada": ("ada_correct_matmul", max_score()),
    "bob": ("bob_missing_scale", 8.25),
    "carol": ("carol_scale_by_d", 8.25),
}


def _hand_in(folder: Path, example: str = "ada_correct_matmul") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for f in (CLASS / example).glob("01_attention.*"):
        shutil.copy(f, folder / f.name)
    return folder


def _flat_class(root: Path) -> Path:
    for student, (example, _) in HONEST.items():
        _hand_in(root / student, example)
    return root


def _batch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        **cli_command(
            "batch", *args, "--stage", "01_attention", "--call-timeout", str(CALL_S), "--device", DEVICE
        ),
        capture_output=True,
        timeout=300,
    )


def _grades(db: Path) -> dict[str, tuple[float, str, dict]]:
    with sqlite3.connect(db) as c:
        return {
            s: (score, fp, json.loads(result))
            for s, score, fp, result in c.execute("SELECT student, score, fingerprint, result FROM grades")
        }


# -- whose grade is whose: the layout ------------------------------------------------------


def test_a_student_named_submitted_cannot_make_the_batch_read_nbgrader_layout(tmp_path):
    """In a flat class, a student's folder `submitted/` holding folders named after the
    other students must neither hide the class nor be graded under their names."""
    from autograder.grader.batch import LayoutError, discover

    klass = _flat_class(tmp_path / "class")
    for victim in HONEST:  # the attacker's "submissions" for everyone else
        _hand_in(klass / "submitted" / victim / "01_attention", "bob_missing_scale")

    with pytest.raises(LayoutError) as refused:
        discover(klass, None)
    message = str(refused.value)
    assert "--layout flat" in message and "--layout nbgrader" in message
    assert "submitted" in message and "ada" in message  # both readings, named

    run = _batch(str(klass), "--db", str(tmp_path / "book.sqlite"))
    assert run.returncode == 2, run.stderr
    assert "--layout" in run.stderr
    assert not (tmp_path / "book.sqlite").exists()  # refused before anything was graded

    units = discover(klass, None, layout="flat")
    assert {u.student: u.submission for u in units} == {
        name: klass / name for name in [*HONEST, "submitted"]
    }  # each graded from their own folder, the attacker under their own name


def test_an_nbgrader_course_directory_is_read_as_such_and_an_explicit_layout_is_obeyed(tmp_path):
    from autograder.grader.batch import LayoutError, discover

    course = tmp_path / "course"
    for student in ("alice", "bo"):
        _hand_in(course / "submitted" / student / "01_attention")
    # nbgrader's own folders hold stage folders too: they are not students
    for own in ("source", "release", "autograded/alice", "feedback/alice"):
        _hand_in(course / own / "01_attention")
    units = discover(course, None)
    assert [(u.student, u.submission) for u in units] == [
        ("alice", course / "submitted" / "alice"),
        ("bo", course / "submitted" / "bo"),
    ]
    assert discover(course, None, layout="nbgrader") == units
    flat = discover(course, None, layout="flat")
    assert sorted({u.student for u in flat}) == ["autograded", "feedback", "release", "source", "submitted"]

    # any other folder makes it ambiguous, unless nbgrader's config file says what this is
    _hand_in(course / "zoe")
    with pytest.raises(LayoutError):
        discover(course, None)
    (course / "nbgrader_config.py").write_text("c = get_config()\n")
    assert discover(course, None) == units

    with pytest.raises(LayoutError, match="no .*submitted"):
        discover(tmp_path / "course" / "source", None, layout="nbgrader")
    run = _batch(str(course), "--layout", "sideways")
    assert run.returncode == 2


def test_a_linked_student_folder_is_not_followed(tmp_path):
    """A folder that is a link (to the reference solutions, to another student) would be
    graded as if its target were the student's work."""
    from autograder.grader.batch import discover

    klass = _flat_class(tmp_path / "class")
    outside = _hand_in(tmp_path / "elsewhere")
    (klass / "mallory").symlink_to(outside, target_is_directory=True)
    (klass / "trudy").symlink_to(klass / "ada", target_is_directory=True)
    (klass / "nobody").symlink_to(tmp_path / "missing")
    skipped: list[str] = []
    units = discover(klass, None, skipped=skipped)
    assert sorted(u.student for u in units) == sorted(HONEST)
    assert len(skipped) == 3 and all("symbolic link" in s for s in skipped)
    assert all(any(name in s for s in skipped) for name in ("mallory", "trudy", "nobody"))


def test_a_folder_that_cannot_be_read_is_reported_and_the_others_are_discovered(tmp_path, monkeypatch):
    from autograder.grader import batch as b

    klass = _flat_class(tmp_path / "class")
    real = b.fingerprint

    def failing(submission, stage):  # as reading a folder of the wrong owner and mode would
        if submission.name == "bob":
            raise PermissionError(13, "Permission denied", str(submission / "01_attention.ipynb"))
        return real(submission, stage)

    monkeypatch.setattr(b, "fingerprint", failing)
    skipped: list[str] = []
    assert sorted(u.student for u in b.discover(klass, None, skipped=skipped)) == ["ada", "carol"]
    assert skipped == [
        f"'bob' cannot be read: PermissionError: [Errno 13] Permission denied: '{klass}/bob/01_attention.ipynb'"
    ]


WEIRD = ["eve\x1b[2J", "bob\nmallory", "tab\tbed"]


def test_unprintable_student_names_are_reported_never_graded_never_crash_the_batch(tmp_path):
    from autograder.grader.batch import discover

    klass = _flat_class(tmp_path / "class")
    for name in WEIRD:
        _hand_in(klass / name)
    os.mkdir(os.fsencode(klass) + b"/jos\xe9")  # Latin-1 from an old archive: not UTF-8
    shutil.copy(
        CLASS / "ada_correct_matmul" / "01_attention.py", os.fsdecode(os.fsencode(klass) + b"/jos\xe9")
    )
    skipped: list[str] = []
    units = discover(klass, None, shard=(1, 1), skipped=skipped)
    assert sorted(u.student for u in units) == sorted(HONEST)
    assert len(skipped) == 4 and all(s.isprintable() for s in skipped)

    db, table = tmp_path / "book.sqlite", tmp_path / "book.csv"
    run = _batch(str(klass), "--db", str(db), "--csv", str(table))
    assert run.returncode == 1, run.stderr  # finished, but not every student was graded
    said = run.stdout + run.stderr
    assert "\x1b" not in said and "bob\nmallory" not in said
    assert "not graded: 4" in said and "'eve\\x1b[2J'" in said
    assert {s: v for s, (v, _, _) in _grades(db).items()} == {s: score for s, (_, score) in HONEST.items()}
    assert "\x1b" not in table.read_text()


def test_csv_cells_that_a_spreadsheet_would_run_as_formulas_are_quoted(tmp_path):
    from autograder.grader.batch import Gradebook, Unit

    names = ['=HYPERLINK("http://x","y")', "+1", "-2", "@SUM(A1)", "plain"]
    with Gradebook(tmp_path / "book.sqlite") as book:
        for name in names:
            book.put(
                Unit(name, "01_attention", tmp_path, "f"),
                {"score": 1.0, "max_score": 2.0, "stage": "01_attention", "tests": [], "notes": []},
            )
        book.export_csv(tmp_path / "book.csv")
    with (tmp_path / "book.csv").open() as f:
        students = [r["student"] for r in csv.DictReader(f)]
    assert sorted(students) == sorted(["'" + n for n in names[:4]] + ["plain"])


def test_an_oversized_stage_file_is_not_read_into_memory_to_fingerprint_it(tmp_path):
    """A 4 GB (sparse) file must not cost discovery 4 GB: it is not graded anyway."""
    klass = _flat_class(tmp_path / "class")
    with (klass / "carol" / "01_attention.py").open("r+b") as f:
        f.truncate(4 << 30)
    probe = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from autograder.grader.batch import discover\n"
        "from autograder.stages import requires\n"
        "requires('01_attention')\n"  # what discovery imports, before the limit
        "vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))\n"
        "units = discover(Path(sys.argv[1]), ['01_attention'])\n"
        "print(sorted(u.student for u in units))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe, str(klass)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == str(sorted(HONEST))


# -- one student's grade cannot stop the others ---------------------------------------------


@pytest.fixture
def four(tmp_path):
    klass = _flat_class(tmp_path / "class")
    _hand_in(klass / "mallory")  # a correct 01_attention: full marks, when it can be stored
    return klass


def _run(klass: Path, book, **kwargs):
    from autograder.grader import batch as b

    return b.run(b.discover(klass, ["01_attention"]), book, 2, device=DEVICE, call_s=CALL_S, **kwargs)


EXPECTED = {**{s: score for s, (_, score) in HONEST.items()}, "mallory": max_score()}


def test_a_giant_result_is_stored_within_the_row_budget(four, tmp_path, monkeypatch):
    """~60k forged notes made a 1.5 GB row that SQLite refused (its limit, here lowered
    1000x so the test does not need 1.5 GB): the batch died on every run. The stored row
    keeps the grade and a bounded share of the notes, and says how many it dropped."""
    from autograder.grader import batch as b
    from autograder.grader.grade import Grader

    real = Grader.grade
    own: list[str] = []

    def flooded(self, submission, stages, student=None):
        r = real(self, submission, stages, student)
        if student == "mallory":
            own[:] = r.stages[0].notes
            r.stages[0].notes.extend(f"cell {i} raised: " + "x" * 1000 for i in range(60_000))
        return r

    monkeypatch.setattr(Grader, "grade", flooded)
    with b.Gradebook(tmp_path / "book.sqlite") as book:
        book.db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_500_000)
        report = _run(four, book)
        assert (report.graded, report.failed) == (4, [])
        again = _run(four, book)
        assert (again.graded, again.skipped, again.failed) == (0, 4, [])
    grades = _grades(tmp_path / "book.sqlite")
    assert {s: v for s, (v, _, _) in grades.items()} == EXPECTED
    with sqlite3.connect(tmp_path / "book.sqlite") as c:
        size = c.execute("SELECT length(result) FROM grades WHERE student = 'mallory'").fetchone()[0]
    assert size <= b.ROW_BYTES
    notes = grades["mallory"][2]["notes"]
    assert len(own) + 1 < len(notes) <= b.NOTES_KEPT + 1  # her own notes first, then forged ones
    assert notes[: len(own)] == own and notes[len(own)].startswith("cell 0 raised: xxx")
    assert f"{len(own) + 60_000 - (len(notes) - 1):,} more notes not kept" in notes[-1]


def test_every_text_of_a_stored_grade_is_cut_and_the_row_fits_its_budget(tmp_path):
    """Whatever a result holds (here texts of non-ASCII characters, which JSON spells in 12
    bytes each), its row fits, cut harder where cutting each text is not enough; the grade
    itself, its tests and their cases, are all there."""
    from autograder.grader.batch import ROW_BYTES, Gradebook, Unit

    case = {"label": "c", "passed": False, "message": "\U0001f600" * 100_000, "misconceptions": ["m"]}
    test = {"function": "f", "group": "g", "max_score": 1.0, "score": 0.5, "cases": [case] * 40}
    test |= {"misconceptions": [], "output": "o" * 1_000_000}
    result = {"stage": "01_attention", "file": "x", "tests": [test] * 20, "notes": ["n" * 100_000] * 1000}
    result |= {
        "stdout": "s" * 10_000_000,
        "private_stdout": "p" * 10_000_000,
        "score": 10.0,
        "max_score": 20.0,
    }
    with Gradebook(tmp_path / "book.sqlite") as book:
        book.db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, ROW_BYTES)
        book.put(Unit("eve", "01_attention", tmp_path, "f"), result)
        [(score, max_score, text)] = book.db.execute("SELECT score, max_score, result FROM grades")
    assert (score, max_score) == (10.0, 20.0) and len(text) <= ROW_BYTES
    stored = json.loads(text)
    assert len(stored["tests"]) == 20 and all(len(t["cases"]) == 40 for t in stored["tests"])
    assert stored["tests"][0]["cases"][0]["misconceptions"] == ["m"]
    for cut in (stored["stdout"], stored["private_stdout"], stored["tests"][0]["output"]):
        assert cut.endswith("more characters not kept)") and len(cut) < 20_000
    assert stored["tests"][0]["cases"][0]["message"].endswith("more characters not kept)")
    assert "more notes not kept" in stored["notes"][-1] and len(stored["notes"]) < 100


def test_a_student_whose_grading_raises_gets_an_error_row_and_the_others_are_graded(
    four, tmp_path, monkeypatch
):
    from autograder.grader import batch as b
    from autograder.grader.grade import Grader

    real = Grader.grade

    def faulty(self, submission, stages, student=None):
        if student == "mallory":
            raise RuntimeError("the grader tripped on this one")
        return real(self, submission, stages, student)

    monkeypatch.setattr(Grader, "grade", faulty)
    db = tmp_path / "book.sqlite"
    with b.Gradebook(db) as book:
        report = _run(four, book)
    assert report.graded == 3
    assert [(f.student, f.stage) for f in report.failed] == [("mallory", "01_attention")]
    assert "the grader tripped on this one" in report.failed[0].reason
    grades = _grades(db)
    assert {s: v for s, (v, _, _) in grades.items()} == {**EXPECTED, "mallory": 0}
    score, fp, result = grades["mallory"]
    assert fp.startswith("failed:")  # no files have it: the next run grades her again
    assert result["max_score"] == max_score() and "could not grade" in result["notes"][0]
    assert all(t["score"] == 0 for t in result["tests"]) and len(result["tests"]) == n_tests()

    monkeypatch.setattr(Grader, "grade", real)  # the grader fixed: the next run grades her
    with b.Gradebook(db) as book:
        report = _run(four, book)
    assert (report.graded, report.skipped, report.failed) == (1, 3, [])
    assert {s: v for s, (v, _, _) in _grades(db).items()} == EXPECTED


# The store call refuses one student, as SQLite refused a 1.5 GB row.
REFUSE_MALLORY = """
import sqlite3, sys
from autograder.grader import batch
real = batch.Gradebook.put
def put(self, unit, result):
    if unit.student == "mallory":
        raise sqlite3.DataError("string or blob too big")
    return real(self, unit, result)
batch.Gradebook.put = put
sys.argv[0] = "bertlab"
from autograder.grader.cli import main
main()
"""


def test_a_grade_that_cannot_be_stored_is_an_error_row_and_every_run_goes_on(four, tmp_path):
    db, table = tmp_path / "book.sqlite", tmp_path / "book.csv"
    args = ["batch", str(four), "--db", str(db), "--stage", "01_attention", "--call-timeout", str(CALL_S)]
    args += ["--device", DEVICE, "--csv", str(table)]
    refusing = {**cli_command(*args), "args": [sys.executable, "-c", REFUSE_MALLORY, *args]}

    for attempt in (1, 2):  # a rerun grades her again, fails again, and still finishes the class
        run = subprocess.run(**refusing, capture_output=True, timeout=300)
        said = run.stdout + run.stderr
        assert run.returncode == 1, said
        assert "1 could not be graded or stored" in said, said
        assert "mallory" in said and "string or blob too big" in said
        grades = _grades(db)
        assert {s: v for s, (v, _, _) in grades.items()} == {**EXPECTED, "mallory": 0}
        assert "could not store" in grades["mallory"][2]["notes"][0]
        assert (
            f"graded {3 if attempt == 1 else 0}, already in the gradebook {0 if attempt == 1 else 3}" in said
        )
        with table.open() as f:  # an error row is no grade: not a 0 to upload
            assert {r["student"]: r["01_attention"] for r in csv.DictReader(f)}["mallory"] == ""

    run = _batch(str(four), "--db", str(db))
    assert run.returncode == 0, run.stderr
    assert "graded 1, already in the gradebook 3" in run.stdout
    assert {s: v for s, (v, _, _) in _grades(db).items()} == EXPECTED


def test_a_stage_the_grader_fails_on_is_an_error_row_graded_again_and_not_exported(
    four, tmp_path, monkeypatch
):
    """``Grader.grade_stage`` turns its own fault into a 0 "the grader failed" result: it
    is no grade. Stored with the files' fingerprint it was never graded again; it is an
    error row now, and nbgrader's gradebook does not receive it as a 0."""
    from autograder.grader import batch as b
    from autograder.grader.grade import Grader
    from autograder.grader.nbgrader_export import export

    real = Grader._grade_stage

    def faulty(self, job):
        if job.submission.name == "mallory":
            raise RuntimeError("a bug in the grader")
        return real(self, job)

    monkeypatch.setattr(Grader, "_grade_stage", faulty)
    db = tmp_path / "book.sqlite"
    with b.Gradebook(db) as book:
        report = _run(four, book)
        assert [(f.student, f.stage) for f in report.failed] == [("mallory", "01_attention")]
        assert "a bug in the grader" in report.failed[0].reason
        rows = book.rows()
    score, fp, result = _grades(db)["mallory"]
    assert fp.startswith(b.FAILED) and score == 0
    monkeypatch.chdir(tmp_path)
    export(rows, f"sqlite:///{tmp_path / 'nbgrader.db'}")
    from nbgrader.api import Gradebook as NbGradebook

    with NbGradebook(f"sqlite:///{tmp_path / 'nbgrader.db'}") as gb:
        students = {s.id for s in gb.students}
    assert "mallory" not in students and set(HONEST) <= students

    monkeypatch.setattr(Grader, "_grade_stage", real)  # fixed: the next run grades her
    with b.Gradebook(db) as book:
        again = _run(four, book)
    assert (again.graded, again.skipped, again.failed) == (1, 3, [])
    assert {s: v for s, (v, _, _) in _grades(db).items()} == EXPECTED

"""bertlab's grades land in nbgrader's real gradebook: per grade cell with the right
points, read back by nbgrader's own API and by the real `nbgrader export`; a re-export
keeps a manual grade an instructor entered."""

from __future__ import annotations

import csv
import dataclasses
import subprocess
import sys

import pytest

from autograder.grader.batch import Gradebook, Unit
from autograder.grader.nbgrader_export import grade_cell_name
from autograder.stages import load_spec
from tests.support import ROOT, cli_command, max_score

CLASS = ROOT / "examples" / "class"
STAGE = "01_attention"
SCORES = {"ada_correct_matmul": max_score(STAGE), "bob_missing_scale": 8.25}  # examples/class/README.md


@pytest.fixture(scope="module")
def bertlab_book(tmp_path_factory):
    from autograder.grader.grade import Grader

    path = tmp_path_factory.mktemp("book") / "bertlab.sqlite"
    with Grader() as grader, Gradebook(path) as book:
        for student in SCORES:
            (stage,) = grader.grade(CLASS / student, [STAGE]).stages
            result = {**dataclasses.asdict(stage), "score": stage.score, "max_score": stage.max_score}
            book.put(Unit(student, STAGE, CLASS / student, "f"), result)
    return path


def _export(book, url):
    run = subprocess.run(
        **cli_command("nbgrader-export", str(book), "--to", url), capture_output=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_grades_are_nbgrader_grades_per_grade_cell(bertlab_book, tmp_path):
    from nbgrader.api import Gradebook as NbGradebook

    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    spec = load_spec(STAGE)
    n_cells = sum(len(g.tests) for g in spec.graded)
    assert f"wrote {n_cells * len(SCORES)} grades" in _export(bertlab_book, url)
    with NbGradebook(url) as gb:
        nb = gb.find_notebook(STAGE, STAGE)
        assert {c.name: c.max_score for c in nb.grade_cells} == {
            grade_cell_name(g, t): t.points for g in spec.graded for t in spec.graded_name(g.name).tests
        }
        for student, score in SCORES.items():
            sub = gb.find_submission(STAGE, student)
            assert sub.score == score and sub.max_score == max_score(STAGE)
        bob = gb.find_grade(
            grade_cell_name(spec.graded[1], spec.graded[1].tests[0]), STAGE, STAGE, "bob_missing_scale"
        )
        assert bob.auto_score == 0 and bob.max_score == spec.graded[1].tests[0].points

        bob.manual_score = 1.5  # an instructor's override in formgrader
        gb.db.commit()
    _export(bertlab_book, url)  # a second export: idempotent, the manual grade stays
    with NbGradebook(url) as gb:
        again = gb.find_grade(
            grade_cell_name(spec.graded[1], spec.graded[1].tests[0]), STAGE, STAGE, "bob_missing_scale"
        )
        assert again.manual_score == 1.5 and again.auto_score == 0
        assert len(gb.find_notebook(STAGE, STAGE).grade_cells) == n_cells
        assert gb.find_submission(STAGE, "ada_correct_matmul").score == max_score(STAGE)


def test_nbgrader_export_reads_them(bertlab_book, tmp_path):
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    _export(bertlab_book, url)
    out = tmp_path / "grades.csv"
    nbgrader = [sys.executable, "-m", "nbgrader", "export", f"--db={url}", f"--to={out}"]
    run = subprocess.run(nbgrader, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rows = {r["student_id"]: r for r in csv.DictReader(out.open())}
    assert {s: float(rows[s]["score"]) for s in SCORES} == SCORES
    assert all(
        float(rows[s]["max_score"]) == max_score(STAGE) and rows[s]["assignment"] == STAGE for s in SCORES
    )

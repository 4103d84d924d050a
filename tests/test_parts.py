"""A later stage runs the student's own earlier stage (autograder.parts): in Jupyter from
the files beside the notebook, in grading from the same submission, with a note naming the
earlier stage when both lose points."""

from __future__ import annotations

import contextlib
import os

import nbformat
import pytest

from autograder.runtime import parts
from autograder.stages import STAGE_PATH_ENV
from tests.support import ROOT, write_py
from tests.test_toy_stage import BUGGY, CORRECT

USES = """
from autograder.parts import load_stage

toy = load_stage("99_toy")

def twice_scaled(x, alpha):
    return 2 * toy.scale_rows(x, alpha)
"""


def _notebook(path, cells):
    nb = nbformat.v4.new_notebook()
    for source, tags in cells:
        nb.cells.append(nbformat.v4.new_code_cell(source, metadata={"tags": tags}))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


@pytest.fixture
def kernel_mode(monkeypatch):
    monkeypatch.setattr(parts, "_provided", None)
    monkeypatch.setattr(parts, "_loaded", {})
    monkeypatch.setattr(parts, "_globals", {})


def test_load_stage_runs_the_sibling_notebook_as_the_grader_would(tmp_path, monkeypatch, capsys, kernel_mode):
    _notebook(
        tmp_path / "10_first" / "10_first.ipynb",
        [
            ("%matplotlib inline\nimport math\ndef f(x):\n    return math.sqrt(x)", []),
            ("raise RuntimeError('plots only')", ["skip-grading"]),
            ("raise ValueError('half done')", []),
            ("def g(x):\n    return f(x) + 1", []),
        ],
    )
    (tmp_path / "11_second").mkdir()
    monkeypatch.chdir(tmp_path / "11_second")
    first = parts.load_stage("10_first")
    assert first.g(4) == 3.0
    err = capsys.readouterr().err
    assert "[10_first] code cell 3 raised ValueError: half done" in err
    assert "plots only" not in err
    assert parts.load_stage("10_first") is first  # cached while the file is unchanged
    _notebook(tmp_path / "10_first" / "10_first.ipynb", [("def g(x):\n    return -x", [])])
    os.utime(tmp_path / "10_first" / "10_first.ipynb", (1, 1))
    assert parts.load_stage("10_first").g(4) == -4


def test_load_stage_says_where_it_looked(tmp_path, monkeypatch, kernel_mode):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ImportError, match="cannot find your 10_first notebook"):
        parts.load_stage("10_first")


def test_load_stage_refuses_a_cycle(tmp_path, monkeypatch, kernel_mode):
    write_py(tmp_path, "10_loop", "from autograder.parts import load_stage\nload_stage('10_loop')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ImportError, match="loads itself"):
        # the inner ImportError is reported like any cell error; the cycle guard raises it
        parts._loading.append("10_loop")
        try:
            parts.load_stage("10_loop")
        finally:
            parts._loading.clear()


@contextlib.contextmanager
def _toy_stages():
    """The toy stages of tests/toy_stage/ in the registry, for the duration of the block."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(STAGE_PATH_ENV, str(ROOT / "tests" / "toy_stage"))
        yield


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from autograder.grader.grade import Grader

    root = tmp_path_factory.mktemp("uses")
    write_py(root / "good", "99_toy", CORRECT)
    write_py(root / "good", "98_toy_uses", USES)
    write_py(root / "bad_base", "99_toy", BUGGY)
    write_py(root / "bad_base", "98_toy_uses", USES)
    write_py(root / "no_base", "98_toy_uses", USES)
    with _toy_stages(), Grader() as grader:
        return {n: grader.grade(root / n, ["98_toy_uses"]) for n in ("good", "bad_base", "no_base")}


def test_the_submissions_own_earlier_stage_is_used(graded):
    assert graded["good"].score == 2 and graded["good"].stages[0].notes == []


def test_a_failing_earlier_stage_is_named(graded):
    (stage,) = graded["bad_base"].stages
    assert stage.score == 0
    note = "98_toy_uses runs your own 99_toy (0/5), which also loses points: fix it first"
    assert stage.notes[0].startswith(note), stage.notes
    assert all(note in t.output for t in stage.tests)


def test_a_missing_earlier_stage_is_explained(graded):
    (stage,) = graded["no_base"].stages
    assert stage.score == 0
    assert "this stage uses your 99_toy, which is not in the submission" in stage.notes
    assert any("holds no 99_toy.ipynb or 99_toy.py" in n for n in stage.notes), stage.notes


def test_dataclasses_work_in_a_py_submission_and_in_a_part(tmp_path):
    from autograder.grader.grade import Grader

    code = (
        "from dataclasses import dataclass\n\n@dataclass\nclass Pair:\n    a: int\n    b: int\n\n"
        "def scale_rows(x, alpha):\n    p = Pair(1, 2)\n    return alpha * x / (x * x).sum(-1, keepdim=True).sqrt() * (p.b - p.a)\n"
    )
    uses = "from autograder.parts import load_stage\ntoy = load_stage('99_toy')\n" + (
        "def twice_scaled(x, alpha):\n    return 2 * toy.scale_rows(x, alpha) * toy.Pair(0, 1).b\n"
    )
    write_py(tmp_path / "s", "99_toy", code)
    write_py(tmp_path / "s", "98_toy_uses", uses)
    with _toy_stages(), Grader() as grader:
        r = grader.grade(tmp_path / "s", ["99_toy", "98_toy_uses"])
    toy, uses_toy = r.stages
    assert [t.score for t in toy.tests if t.function == "scale_rows"] == [2, 1], toy.notes
    assert uses_toy.score == 2, uses_toy.notes

"""A submission that holds no stage file, or misses some: said once, at the top, with the
names expected; each test says "not submitted" in one line; and an earlier stage is blamed
("fix those first") only when the student's own file of it ran and loses points."""

from __future__ import annotations

import json
import shutil

import pytest
from rich.console import Console

from autograder.grader import report
from autograder.grader.grade import Grader
from autograder.grader.runner import Limits
from autograder.grader.visibility import for_students
from tests.support import CALL_S, DEVICE, ROOT, assert_gradescope_results, max_score, n_tests

CLASS = ROOT / "examples" / "class"
STAGES = ["01_attention", "02_multihead"]


@pytest.fixture(scope="module")
def grader():
    with Grader(device=DEVICE, limits=Limits(call_s=CALL_S)) as g:
        yield g


@pytest.fixture(scope="module")
def nothing(grader, tmp_path_factory) -> dict[str, tuple]:
    """name -> (result, student results.json data) of three uploads holding no stage file."""
    root = tmp_path_factory.mktemp("nothing")
    (root / "empty").mkdir()
    (root / "stray").mkdir()
    (root / "stray" / "notes.txt").write_text("I ran out of time")
    (root / "stray" / "attention.ipynb").write_text("{}")  # the wrong name
    (root / "notes.txt").write_text("I ran out of time")  # the whole upload: one text file
    out = {}
    for name in ("empty", "stray", "notes.txt"):
        r = grader.grade(root / name, STAGES)
        out[name] = (r, report.to_gradescope(for_students(r), markdown=True))
    return out


EXPECTED = "expected one of 01_attention.ipynb, 02_multihead.ipynb (or the same names ending in .py)"


@pytest.mark.parametrize(
    ("upload", "said"),
    [
        ("empty", "no stage file found in the submission (it is empty)"),
        ("stray", "no stage file found in the submission (it holds attention.ipynb, notes.txt)"),
        (
            "notes.txt",
            "no stage file was handed in: notes.txt is neither a notebook (.ipynb) nor a Python file",
        ),
    ],
)
def test_no_stage_file_is_said_once_at_the_top_with_the_names_expected(nothing, upload, said):
    result, data = nothing[upload]
    (note,) = result.notes
    assert note.startswith(said) and EXPECTED in note and note.endswith("Every stage scores 0.")
    assert data["output"].startswith(note + "\n")  # Gradescope's top-level text, first
    assert data["output"].count("no stage file") == 1
    # Gradescope needs every test: each says "not submitted" in one line, no case is listed
    assert_gradescope_results(data, sum(map(max_score, STAGES)), sum(map(n_tests, STAGES)))
    assert data["score"] == 0
    for t in data["tests"]:
        stage = t["name"].split(" · ")[0]
        summary, why = t["output"].split("\n")
        assert summary.startswith("no case ran; 0/")
        assert why == f"not submitted: no {stage}.ipynb or {stage}.py in the submission; it scores 0"
    text = json.dumps(data)
    assert "not run" not in text and "fix" not in text and "runs your own" not in text
    # the terminal: the note heads the table, and a stage that was not submitted is one row
    console = Console(record=True, width=400)
    console.print(report.test_table(result))
    printed = " ".join(console.export_text().split())  # the title wraps at the table's width
    assert printed.index(" ".join(note.split())) < printed.index("01_attention (")
    assert printed.count("not submitted") == len(STAGES)


def test_a_submission_with_a_stage_file_has_no_such_note(grader):
    result = grader.grade(CLASS / "carol_scale_by_d", STAGES)
    assert result.notes == []
    assert "no stage file" not in report.to_gradescope(result)["output"]
    (missing,) = [s for s in result.stages if s.file is None]
    assert all(t.output.endswith("not submitted: no 02_multihead.ipynb or 02_multihead.py in the submission; "
                                 "it scores 0") for t in missing.tests)  # fmt: skip


def test_an_earlier_stage_is_blamed_only_when_its_own_file_ran(grader, tmp_path):
    """02 runs the student's own 01. Walt's 02 loses points: his 01 is blamed when it ran
    (and loses points too), never when the grader ran no 01 of his."""
    walt = CLASS / "walt_bert_on_broken_heads"
    both = tmp_path / "both"
    both.mkdir()
    shutil.copy(CLASS / "carol_scale_by_d" / "01_attention.py", both)  # a 01 that loses points
    shutil.copy(walt / "02_multihead.py", both)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(walt / "02_multihead.py", alone)

    def blamed(submission, stages):
        r = grader.grade(submission, stages)
        stage = next(s for s in r.stages if s.stage == "02_multihead")
        assert stage.score < stage.max_score
        return [n for n in stage.notes if "runs your own" in n] + [b for t in stage.tests for b in t.blame]

    notes = blamed(both, ["02_multihead"])
    assert notes and all("02_multihead runs your own 01_attention (8.25/17)" in n for n in notes)
    # a single file handed in is graded as the stage asked for, and is no earlier stage's file
    assert blamed(alone / "02_multihead.py", ["02_multihead"]) == []
    assert blamed(alone, ["02_multihead"]) == []  # no 01 at all

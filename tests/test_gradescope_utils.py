"""An instructor's own gradescope-utils tests in a bertlab zip (``gradescope-zip --tests``).

The tests are real unittest files decorated with the real gradescope-utils package's
decorators; the zip is built as the README says and run by its real ``run_autograder`` on a
temporary ``/autograder`` (``tests/test_gradescope.py`` does the same for bertlab's own tests).
"""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from autograder.grader import instructor_tests
from autograder.grader.gradescope import CONFIG, build_zip
from tests.support import ROOT, max_score, run_cli
from tests.test_gradescope import _autograder, _start

STAGE = "01_attention"
EXAMPLES = ROOT / "examples" / "class"

TESTS = '''\
import unittest

import torch
from gradescope_utils.autograder_utils.decorators import hide_errors, number, partial_credit, tags, visibility, weight

from submission import softmax
import helpers


class SoftmaxProperties(unittest.TestCase):
    @weight(2)
    @number("2.1")
    @tags("softmax", "sanity")
    def test_rows_sum_to_one(self):
        """Softmax rows sum to one"""
        print("checking row sums")
        x = torch.randn(3, 5, dtype=torch.float64)
        torch.testing.assert_close(softmax(x, dim=-1).sum(-1), torch.ones(3, dtype=torch.float64))

    @weight(3)
    @visibility("hidden")
    @hide_errors("softmax differs from torch.softmax on a 4x6 input")
    def test_matches_torch(self):
        x = helpers.sample()
        torch.testing.assert_close(softmax(x, dim=-1), torch.softmax(x, dim=-1))

    @partial_credit(4)
    def test_partial(self, set_score=None):
        """Partial credit: one point per row that matches"""
        x = helpers.sample()
        ok = torch.isclose(softmax(x, dim=-1), torch.softmax(x, dim=-1)).all(-1)
        set_score(float(ok[:4].sum()))

    def test_no_weight(self):
        """An informational test with no score"""
        self.assertEqual(softmax(torch.zeros(2)).shape, (2,))

    @weight(1)
    def test_zz_hangs_for_a_student_who_defines_slow(self):
        import submission

        if hasattr(submission, "slow"):
            submission.slow()


class Inherited(SoftmaxProperties):
    """Its tests are the base's, run again under its own name (unittest's rule)."""
'''

HELPERS = """\
import torch


def sample():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 6, dtype=torch.float64, generator=g) * 3
"""

# The student's code runs in the tests' process: it replaces what writes the results,
# claiming a score far over a test's weight, a test that does not exist and a pass of a
# test that fails.
FORGER = """\
import json, os, sys
import torch

def softmax(x, dim=-1):
    import gradescope_utils.autograder_utils.json_test_runner as runner
    real = runner.JSONTestResult.buildResult
    def forged(self, test, err=None):
        result = real(self, test, None)
        result["score"], result["status"] = 1e9, "passed"
        return result
    runner.JSONTestResult.buildResult = forged
    line = "\\x1ebertlab-instructor-test " + json.dumps({"id": "extra.Fake.test_fake", "result": {"score": 50}})
    os.write(1, (line + "\\n").encode())
    return x * 0  # wrong: every test fails on its values
"""

# softmax over the wrong axis, the rest right
WRONG = (
    (EXAMPLES / "ada_correct_matmul" / f"{STAGE}.py").read_text()
    + """

def softmax(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(0, keepdim=True)
"""
)

HANGER = (
    (EXAMPLES / "ada_correct_matmul" / f"{STAGE}.py").read_text()
    + """

def slow():
    while True:
        pass
"""
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradescope-utils")
    tests = tmp / "tests"
    tests.mkdir()
    (tests / "extra.py").write_text(TESTS)
    (tests / "helpers.py").write_text(HELPERS)
    zip_path = build_zip(tmp / "a1.zip", [STAGE], tests=tests, tests_timeout_s=20)
    students = {
        "ada": (EXAMPLES / "ada_correct_matmul" / f"{STAGE}.py").read_text(),
        "wrong": WRONG,
        "forger": FORGER,
        "hanger": HANGER,
        "empty": None,
    }
    roots = {name: _autograder(tmp, zip_path, name) for name in [*students, "grace"]}
    for name, code in students.items():
        if code is not None:
            (roots[name] / "submission" / f"{STAGE}.py").write_text(code)
    # a notebook: its cells run as __main__, which the tests import as `submission` too
    shutil.copy(EXAMPLES / "grace_correct_einsum" / f"{STAGE}.ipynb", roots["grace"] / "submission")
    procs = {name: _start(root) for name, root in roots.items()}
    done = {}
    for name, proc in procs.items():
        stdout, _ = proc.communicate(timeout=300)
        results = roots[name] / "results" / "results.json"
        done[name] = {"rc": proc.returncode, "stdout": stdout, "results": json.loads(results.read_text())}
    done["zip"] = zip_path
    return done


def _own(data: dict) -> dict[str, dict]:
    return {t["name"]: t for t in data["tests"] if "instructor" in t.get("tags", [])}


WEIGHTS = {  # name -> weight, both classes' tests (the inherited ones named by their id)
    "Softmax rows sum to one": 2.0,
    "test_matches_torch (extra.SoftmaxProperties.test_matches_torch)": 3.0,
    "test_matches_torch (extra.Inherited.test_matches_torch)": 3.0,
    "Partial credit: one point per row that matches": 4.0,
    "test_zz_hangs_for_a_student_who_defines_slow (extra.SoftmaxProperties.test_zz_hangs_for_a_student_who_defines_slow)": 1.0,  # noqa: E501
    "test_zz_hangs_for_a_student_who_defines_slow (extra.Inherited.test_zz_hangs_for_a_student_who_defines_slow)": 1.0,
}


def test_the_zip_declares_the_tests_as_gradescope_utils_would_name_them(runs):
    import zipfile

    with zipfile.ZipFile(runs["zip"]) as zf:
        config = json.loads(zf.read(CONFIG))
        assert {"instructor_tests/extra.py", "instructor_tests/helpers.py"} <= set(zf.namelist())
    own = config["instructor_tests"]
    assert own["timeout_s"] == 20
    assert len(own["tests"]) == 10  # five per class, the inherited ones included
    assert config["max_score"] == max_score(STAGE) + 2 * (2 + 3 + 4 + 1)
    by_id = {t["id"]: t for t in own["tests"]}
    first = by_id["extra.SoftmaxProperties.test_rows_sum_to_one"]
    assert first == {
        "id": "extra.SoftmaxProperties.test_rows_sum_to_one",
        "name": "Softmax rows sum to one",
        "weight": 2.0,
        "visibility": "visible",
        "number": "2.1",
        "tags": ["softmax", "sanity"],
    }
    assert by_id["extra.Inherited.test_matches_torch"]["visibility"] == "hidden"
    assert by_id["extra.SoftmaxProperties.test_no_weight"]["weight"] is None


def test_a_correct_student_passes_them_beside_bertlab_tests(runs):
    r = runs["ada"]
    assert r["rc"] == 0, r["stdout"]
    data = r["results"]
    own = _own(data)
    bertlab = [t for t in data["tests"] if "instructor" not in t["tags"]]
    assert len(bertlab) == 15 and all(t["status"] == "passed" for t in bertlab)
    assert data["tests"][: len(bertlab)] == bertlab  # bertlab's tests first, then the instructor's
    assert {name: t["max_score"] for name, t in own.items() if "max_score" in t} == WEIGHTS
    assert all(t["status"] == "passed" for t in own.values()), own
    assert data["score"] == max_score(STAGE) + 2 * (2 + 3 + 4 + 1)
    rows = own["Softmax rows sum to one"]
    assert rows["number"] == "2.1" and rows["tags"] == ["instructor", "softmax", "sanity"]
    assert rows["output"] == "checking row sums\n"  # what the test printed, as JSONTestRunner keeps it
    assert own["test_matches_torch (extra.Inherited.test_matches_torch)"]["visibility"] == "hidden"
    informational = own["An informational test with no score"]
    assert "score" not in informational and "max_score" not in informational
    # the instructor's log shows them too
    assert "== instructor test Softmax rows sum to one: 2/2, passed, visible" in r["stdout"]


def test_a_notebook_is_imported_as_submission_too(runs):
    data = runs["grace"]["results"]
    own = [t for t in data["tests"] if "instructor" in t["tags"]]
    assert len(own) == 10 and all(t["status"] == "passed" for t in own), own
    assert data["score"] == max_score(STAGE) + 2 * (2 + 3 + 4 + 1)


def test_a_wrong_student_loses_their_points_with_their_messages(runs):
    data = runs["wrong"]["results"]
    own = _own(data)
    rows = own["Softmax rows sum to one"]
    assert (rows["score"], rows["status"]) == (0, "failed")
    assert rows["output"].startswith("checking row sums\n\nTest Failed: Tensor-likes are not close!")
    hidden = own["test_matches_torch (extra.SoftmaxProperties.test_matches_torch)"]
    assert hidden["output"] == "softmax differs from torch.softmax on a 4x6 input"  # @hide_errors
    partial = own["Partial credit: one point per row that matches"]
    assert (partial["score"], partial["max_score"], partial["status"]) == (0, 4.0, "failed")
    assert own["An informational test with no score"]["status"] == "passed"
    bertlab = [t for t in data["tests"] if "instructor" not in t["tags"]]
    assert data["score"] == sum(t["score"] for t in bertlab) + 2 * 1  # the hang test passes twice
    assert any(t["status"] == "failed" for t in bertlab)


def test_a_forging_student_gets_no_more_than_each_declared_weight(runs):
    r = runs["forger"]
    assert r["rc"] == 0, r["stdout"]
    data = r["results"]
    own = _own(data)
    assert set(own) == set(WEIGHTS) | {"An informational test with no score"}  # no "extra.Fake"
    for name, weight in WEIGHTS.items():
        assert 0 <= own[name]["score"] <= weight
    assert "extra.Fake" not in json.dumps(data["tests"])  # (its top-level output shows what it printed)
    # bertlab's own tests: the parent's comparison, which nothing in the child reaches
    assert sum(t["score"] for t in data["tests"] if "instructor" not in t["tags"]) == 0
    assert data["score"] <= 2 * (2 + 3 + 4 + 1)


def test_a_hanging_test_costs_the_tests_after_it_not_those_before(runs):
    r = runs["hanger"]
    assert r["rc"] == 0, r["stdout"]
    own = [t for t in r["results"]["tests"] if "instructor" in t["tags"]]
    # unittest's order (classes, then methods, by name): Inherited's four others pass, then
    # its last hangs; SoftmaxProperties' five never run
    assert [t["status"] for t in own] == ["passed"] * 4 + ["failed"] * 6, own
    hung = own[4]
    assert hung["name"].startswith("test_zz_hangs_for_a_student_who_defines_slow (extra.Inherited.")
    assert hung["score"] == 0
    stopped = "did not run: the tests stopped before it (Timeout: did not finish within 20 s"
    assert all(t["output"].startswith(stopped) for t in own[4:])
    # bertlab's own tests are untouched: the student's graded functions are correct
    bertlab = [t for t in r["results"]["tests"] if "instructor" not in t["tags"]]
    assert all(t["status"] == "passed" for t in bertlab)


def test_no_submission_file_fails_every_test_saying_why(runs):
    own = _own(runs["empty"]["results"])
    assert all(t["status"] == "failed" for t in own.values())
    assert all(t["output"] == f"did not run: no {STAGE} file in the submission" for t in own.values())


# -- the build refuses what only running the files could tell ------------------------------------


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "W = 2\nclass T(unittest.TestCase):\n    @weight(W)\n    def test_a(self): pass\n",
            "'W' is not a literal",
        ),
        ("class T(unittest.TestCase):\n    @weight(-1)\n    def test_a(self): pass\n", "one number >= 0"),
        (
            "class T(unittest.TestCase):\n    @visibility('secret')\n    def test_a(self): pass\n",
            "one of visible",
        ),
        ("class T(unittest.TestCase):\n    @leaderboard('x')\n    def test_a(self): pass\n", "leaderboard"),
        ("class T(unittest.TestCase):\n    def helper(self): pass\n", "no unittest test methods"),
        ("class T(unittest.TestCase)\n", "not valid Python"),
    ],
)
def test_the_build_refuses_what_only_running_could_tell(tmp_path, source, message):
    (tmp_path / "extra.py").write_text("import unittest\n" + source)
    with pytest.raises(ValueError, match=message) as info:
        instructor_tests.declare([tmp_path / "extra.py"])
    assert "extra.py" in str(info.value) or "no unittest" in message


def test_a_file_named_like_a_module_the_tests_need_is_refused(tmp_path):
    for stem in ("json", "submission", "torch-tests"):
        path = tmp_path / f"{stem}.py"
        path.write_text("")
        with pytest.raises(ValueError, match="name"):
            instructor_tests.check_stem(path)


def test_the_command_needs_one_stage_and_a_timeout_of_a_cell_at_least(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "extra.py").write_text(textwrap.dedent(TESTS))
    (tests / "helpers.py").write_text(HELPERS)
    refused = run_cli("gradescope-zip", "--tests", str(tests), "--out", f"{tmp_path}/all/")
    assert refused.returncode == 2 and "--stage" in refused.stderr, refused.stderr
    short = run_cli("gradescope-zip", "--stage", STAGE, "--tests", str(tests), "--tests-timeout", "5")
    assert short.returncode == 2 and "at least 20 s" in short.stderr, short.stderr
    built = run_cli("gradescope-zip", "--stage", STAGE, "--tests", str(tests), "--out", f"{tmp_path}/a1.zip")
    assert built.returncode == 0, built.stderr
    assert f"grades {STAGE} and 10 instructor tests for {max_score(STAGE) + 20:g} points" in built.stdout
    shutil.rmtree(tests)

"""The grading path as data flowing one way (issue 30): each stage of a submission is
resolved once into a ``StageJob`` (``grader/job.py``), and no function of the package is
too long to read."""

from __future__ import annotations

import ast
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

from autograder.stages import stage_ids
from tests.support import ROOT

MAX_LINES = 120  # no function in autograder/ is longer
MAX_STEP_LINES = 80  # nor any step of a run (runner.py)
CLASS = ROOT / "examples" / "class"


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def test_no_function_in_the_package_is_over_120_lines():
    long = [
        f"{path.relative_to(ROOT)}:{name} ({n} lines)"
        for path in sorted((ROOT / "autograder").rglob("*.py"))
        for name, n in _functions(path)
        if n > MAX_LINES
    ]
    assert not long, long


def test_the_runner_is_steps_a_reader_can_name():
    sizes = dict(_functions(ROOT / "autograder" / "grader" / "runner.py"))
    steps = [
        "start",
        "fork",
        "watch_child",
        "answer",
        "release",
        "reap",
        "after",
        "charge",
        "collect",
        "stop",
    ]
    assert set(steps) <= sizes.keys()
    long = {name: n for name, n in sizes.items() if n > MAX_STEP_LINES}
    assert not long, long


class LookUps:
    """Counts, per stage, ``Submission.file``, ``load_spec`` and ``load_source`` calls,
    wherever in the package they are made (every module's binding of them is wrapped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import autograder.runtime.load as load
        import autograder.stages as stages
        from autograder.runtime.submission import Submission

        # imported first: a spec module that builds on another's looks it up as it is
        # imported, once per process (not a look-up of grading)
        stages.all_specs()

        self.counts: Counter[tuple[str, str]] = Counter()
        real_file, real_spec, real_source = Submission.file, stages.load_spec, load.load_source

        def file(this, stage):
            self.counts["Submission.file", stage] += 1
            return real_file(this, stage)

        def load_spec(stage):
            self.counts["load_spec", stage] += 1
            return real_spec(stage)

        def load_source(path, stage, *args, **kwargs):
            self.counts["load_source", stage] += 1
            return real_source(path, stage, *args, **kwargs)

        monkeypatch.setattr(Submission, "file", file)
        for module in [m for name, m in sys.modules.items() if name.startswith("autograder") and m]:
            if getattr(module, "load_spec", None) is real_spec:
                monkeypatch.setattr(module, "load_spec", load_spec)
            if getattr(module, "load_source", None) is real_source:
                monkeypatch.setattr(module, "load_source", load_source)

    def per_stage(self, stages: list[str]) -> dict[str, dict[str, int]]:
        kinds = ("Submission.file", "load_spec", "load_source")
        return {s: {k: self.counts[k, s] for k in kinds} for s in stages}


@pytest.fixture(scope="module")
def whole_course(tmp_path_factory) -> Path:
    """One student's every stage: the solutions, but a 01 that scales by d (so 01 and the
    stages that run it lose points, are searched for counterexamples and blame it)."""
    folder = tmp_path_factory.mktemp("course") / "student"
    for stage in stage_ids():
        (folder / stage).mkdir(parents=True)
        if stage == "01_attention":
            shutil.copy(CLASS / "carol_scale_by_d" / f"{stage}.py", folder / stage)
        else:
            shutil.copy(ROOT / "solutions" / stage / f"{stage}.ipynb", folder / stage)
    return folder


def test_every_graded_stage_is_looked_up_exactly_once(whole_course, monkeypatch):
    from autograder.grader.grade import Grader

    stages = stage_ids()
    looked = LookUps(monkeypatch)
    with Grader() as grader:
        result = grader.grade(whole_course, stages, workers=2)
    once = {"Submission.file": 1, "load_spec": 1, "load_source": 1}
    assert looked.per_stage(stages) == {s: once for s in stages}
    by_stage = {r.stage: r for r in result.stages}
    assert by_stage["01_attention"].score < by_stage["01_attention"].max_score
    # 02 runs the student's 01 (read once, for both): it loses points and says why
    assert any(
        n.startswith("02_multihead runs your own 01_attention") for n in by_stage["02_multihead"].notes
    )
    assert any(t.counterexample for t in by_stage["01_attention"].tests)
    assert by_stage["04_word2vec"].score == by_stage["04_word2vec"].max_score


def test_an_earlier_stage_graded_only_for_the_blame_is_looked_up_once_too(whole_course, monkeypatch):
    from autograder.grader.grade import Grader

    looked = LookUps(monkeypatch)
    with Grader() as grader:
        result = grader.grade(whole_course, ["02_multihead"])
    (r,) = result.stages
    assert r.notes[0].startswith("02_multihead runs your own 01_attention (")  # 01 graded for it
    once = {"Submission.file": 1, "load_spec": 1, "load_source": 1}
    assert looked.per_stage(["02_multihead", "01_attention"]) == {"02_multihead": once, "01_attention": once}

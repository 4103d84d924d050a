"""A cold grade does only what its submission needs (issue 19), and changes no grade.

- Expected values computed ahead (``grader/expected.py``) are the reference's, byte for
  byte, and are used only when fresh: another key, other inputs or another shape make the
  grader compute them again, and say why. They live where no child can read them.
- A stage without a file costs no expected values and no fork server; what the fork server
  loads for children (matplotlib, 09's weights) is loaded only when a submission uses it,
  and a submission that plots in a graded cell still grades.
- Stages of one submission graded side by side give the results of grading them in turn.

Speed itself is measured by benchmarks/bench_cold.py, never here.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

from autograder.grader import expected
from autograder.grader.grade import Grader, _driver_extras
from autograder.grader.plan import StagePlan
from autograder.grader.report import stage_record
from autograder.sandbox import confine
from autograder.stages import load_spec
from tests.support import ROOT, full_marks, max_score, run_cli, write_notebook, write_py

STAGE = "01_attention"
EXAMPLES = ROOT / "examples" / "class"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("expected")
    assert expected.build(directory, [STAGE]) == {STAGE: "computed"}
    return directory


def _values(plan: StagePlan) -> list[list[torch.Tensor]]:
    return [pc.expectation.values for pc in plan.cases]


def test_stored_values_are_the_references_own(store):
    computed = StagePlan.build(load_spec(STAGE), "cpu")
    stored, why = expected.plan(load_spec(STAGE), "cpu", store)
    assert why is None
    for a, b in zip(_values(computed), _values(stored), strict=True):
        assert len(a) == len(b) and all(
            x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True)
        )
    assert [c.to_json() for c in stored.calls] == [c.to_json() for c in computed.calls]
    assert stored.inputs_file == computed.inputs_file and stored.hidden_file == computed.hidden_file
    # the small inputs' values and every named mistake's outputs are stored too, bit for bit
    assert [c.to_json() for c in stored.rung_calls] == [c.to_json() for c in computed.rung_calls]
    assert stored.rung_file == computed.rung_file
    cases = list(zip([*stored.cases, *stored.rungs], [*computed.cases, *computed.rungs], strict=True))
    assert len(cases) > len(stored.cases)
    for a, b in cases:
        assert a.expectation.variants.computed  # read, not computed
        ours, theirs = list(a.expectation.variants), list(b.expectation.variants)
        assert [m for m, _ in ours] == [m for m, _ in theirs]
        for (_, x), (_, y) in zip(ours, theirs, strict=True):
            assert all(expected.same_bits(u, v) for u, v in zip(x, y, strict=True))
    assert sum(len(pc.expectation.variants) for pc in stored.cases) > 0
    # a fresh file is kept, not computed again
    assert expected.build(store, [STAGE]) == {STAGE: "kept"}


def _rewrite(path: Path, change) -> None:
    """The store file with its metadata (a JSON entry) changed by ``change``."""
    with safetensors.safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()[expected.META])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    change(meta, tensors)
    path.write_bytes(safetensors.torch.save(tensors, metadata={expected.META: json.dumps(meta)}))


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda meta, t: meta.update(key="0" * 64), "other code, libraries or machine"),
        (lambda meta, t: meta.update(inputs="0" * 64), "other inputs"),
        (lambda meta, t: meta.update(outputs=meta["outputs"][: meta["graded"] - 1]), "cases"),
        (lambda meta, t: meta.update(stage="02_multihead"), "is not a store file"),
        (lambda meta, t: t.clear(), "cannot be read"),
    ],
)
def test_a_stale_or_damaged_store_is_never_used(store, tmp_path, change, why):
    copy = tmp_path / "expected"
    shutil.copytree(store, copy)
    _rewrite(expected.path_for(copy, STAGE), change)
    planned, reason = expected.plan(load_spec(STAGE), "cpu", copy)
    assert reason is not None and why in reason, reason
    computed = StagePlan.build(load_spec(STAGE), "cpu")
    for a, b in zip(_values(computed), _values(planned), strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert expected.build(copy, [STAGE]) == {STAGE: "computed"}  # and rebuilding mends it
    assert expected.plan(load_spec(STAGE), "cpu", copy)[1] is None


@pytest.mark.parametrize(
    "change",
    [
        lambda meta, t: meta.update(small_inputs="0" * 64),
        lambda meta, t: meta.update(outputs=meta["outputs"][:-1]),
    ],
)
def test_stale_small_inputs_are_computed_when_first_needed(store, tmp_path, change):
    """The small inputs' stored values are checked when a failing submission first needs
    them (a passing class never makes them): computed from other inputs, or missing, they
    are not used; the reference runs on each instead."""
    copy = tmp_path / "expected"
    shutil.copytree(store, copy)
    _rewrite(expected.path_for(copy, STAGE), change)
    planned, why = expected.plan(load_spec(STAGE), "cpu", copy)
    assert why is None  # the graded cases' values are fresh
    computed = StagePlan.build(load_spec(STAGE), "cpu")
    assert planned.rungs and not any(pc.expectation.variants.computed for pc in planned.rungs)
    for a, b in zip(planned.rungs, computed.rungs, strict=True):
        assert all(
            expected.same_bits(x, y) for x, y in zip(a.expectation.values, b.expectation.values, strict=True)
        )


@pytest.mark.parametrize("which", ["an expected value", "a named mistake's output"])
def test_an_install_checks_shipped_values_against_its_own_reference(store, tmp_path, which):
    # what setup.sh does to the zip's store on Gradescope's machine (install.sh: --verify)
    copy = tmp_path / "expected"
    shutil.copytree(store, copy)
    assert expected.build(copy, [STAGE], verify=True) == {STAGE: "verified"}
    variant = which != "an expected value"

    def nudge(meta, tensors):  # one value off by its last bit, the key and inputs untouched
        name = next(
            k
            for k, t in sorted(tensors.items())
            if t.is_floating_point() and t.numel() and (".v" in k) == variant
        )
        t = tensors[name].clone()
        t.view(-1)[0] = torch.nextafter(t.view(-1)[0], torch.tensor(float("inf"), dtype=t.dtype))
        tensors[name] = t

    _rewrite(expected.path_for(copy, STAGE), nudge)
    assert expected.plan(load_spec(STAGE), "cpu", copy)[1] is None  # fresh by its key alone
    done = expected.build(copy, [STAGE], verify=True)
    assert done[STAGE].startswith("replaced: 1 of "), done
    computed = StagePlan.build(load_spec(STAGE), "cpu")
    mended, why = expected.plan(load_spec(STAGE), "cpu", copy)
    assert why is None and expected.differences(mended, computed) is None


def test_the_key_names_what_the_values_depend_on(monkeypatch):
    spec = load_spec(STAGE)
    assert expected.key(spec, "cuda") is None  # computed on the grading device, never stored
    before = expected.key(spec, "cpu")
    assert before == expected.key(spec, "cpu") != expected.key(load_spec("02_multihead"), "cpu")
    monkeypatch.setattr(expected, "_version", lambda package: "0.0-other")
    assert expected.key(spec, "cpu") != before
    monkeypatch.undo()
    monkeypatch.setattr(expected.platform, "machine", lambda: "riscv64")
    assert expected.key(spec, "cpu") != before


def test_no_child_can_read_the_store():
    # a child reads only the system and the Python installation: the store is beside the
    # code (the checkout's, the image's, the Gradescope zip's source/expected/), never there
    for directory in (expected.DEFAULT_DIR, expected.store_dir()):
        if directory is None:
            continue
        for root in confine.readable_roots():
            assert not directory.resolve().is_relative_to(root.resolve()), (directory, root)


def test_grades_are_the_same_from_the_store(store, tmp_path):
    sub = tmp_path / "carol"
    sub.mkdir()
    shutil.copy(EXAMPLES / "carol_scale_by_d" / f"{STAGE}.py", sub)
    with Grader(expected_dir=store) as stored, Grader(expected_dir=None) as computed:
        a, b = stored.grade(sub, [STAGE]), computed.grade(sub, [STAGE])
        assert stored.recomputed == {} and computed.recomputed == {}
    assert stage_record(a.stages[0]) == stage_record(b.stages[0])
    assert a.score == b.score == 8.25  # examples/class/README.md


def test_a_failing_student_graded_from_the_store_runs_no_reference(store, tmp_path, monkeypatch):
    """Everything derived from the reference is in the store: the expected values, the small
    inputs' and every named mistake's outputs. A grader's first failing student (named
    mistakes, counterexamples) runs none of it, and is graded as one that computes it all."""
    from autograder.grader import plan as planning

    sub = tmp_path / "gus"
    sub.mkdir()
    shutil.copy(EXAMPLES / "gus_unstable_softmax" / f"{STAGE}.ipynb", sub)
    with Grader(expected_dir=None) as computed:
        b = computed.grade(sub, [STAGE])

    def refuse(*args, **kwargs):
        raise AssertionError("the reference ran while grading from the store")

    monkeypatch.setattr(planning, "run_trusted", refuse)
    with Grader(expected_dir=store) as stored:
        a = stored.grade(sub, [STAGE])
    assert stage_record(a.stages[0]) == stage_record(b.stages[0])
    assert any(t.misconceptions for t in a.stages[0].tests)
    assert any(t.counterexample for t in a.stages[0].tests)


def test_a_grader_says_why_it_computed_values(tmp_path):
    with Grader(expected_dir=tmp_path / "empty") as grader:
        grader.plan(STAGE)
    assert "no " in grader.recomputed[STAGE]


def test_stages_without_a_file_cost_no_server_and_no_expected_values(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    stages = ["01_attention", "06_transformer_block", "09_mini_bert"]
    with Grader(expected_dir=None) as grader:
        result = grader.grade(empty, stages)
        assert grader._server is None and grader._plans == {}
    assert result.score == 0 and result.max_score == sum(max_score(s) for s in stages)
    assert [len(s.tests) for s in result.stages] == [
        sum(len(g.tests) for g in load_spec(s).graded) for s in stages
    ]
    assert all(c.message == "not run" for s in result.stages for t in s.tests for c in t.cases)


def test_the_server_loads_only_what_a_submission_uses(tmp_path):
    assert _driver_extras(load_spec("01_attention")) == set()
    assert _driver_extras(load_spec("09_mini_bert")) == {"driver:bert"}
    code = (EXAMPLES / "ada_correct_matmul" / f"{STAGE}.py").read_text()
    plain = write_py(tmp_path / "plain", STAGE, code)
    plots = write_py(
        tmp_path / "plots",
        STAGE,
        "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\nplt.title('attention')\n" + code,
    )
    with Grader(expected_dir=None) as grader:
        assert grader.grade(plain, [STAGE]).score == max_score(STAGE)
        assert grader.server._warmed == set()
        result = grader.grade(plots, [STAGE])
        assert grader.server._warmed == {"matplotlib"}
    # a graded cell that imports matplotlib and plots still grades, in full
    assert {t.function: t.score for t in result.stages[0].tests if t.score}.keys() == full_marks(STAGE).keys()
    assert result.score == max_score(STAGE), [n for s in result.stages for n in s.notes]


def test_a_cold_grade_asks_the_server_for_its_extras_before_it_plans(tmp_path, monkeypatch):
    code = (EXAMPLES / "ada_correct_matmul" / f"{STAGE}.py").read_text()
    plots = write_py(tmp_path / "plots", STAGE, "import matplotlib.pyplot as plt\n" + code)
    asked: list[set[str]] = []
    with Grader(expected_dir=None) as grader:
        plan = grader.plan

        def planning(stage: str) -> StagePlan:
            asked.append(set(grader.server._warmed))  # what the server loads while this plans
            return plan(stage)

        monkeypatch.setattr(grader, "plan", planning)
        assert grader.grade(plots, [STAGE]).score == max_score(STAGE)
    assert asked and asked[0] == {"matplotlib"}
    # 09's driver (its weights) too; a file that cannot be read only starts nothing early
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "09_mini_bert.ipynb").write_text("{not a notebook")
    with Grader(expected_dir=None) as grader:
        grader.warm_for([(broken, "09_mini_bert")])
        assert grader.server._warmed == {"driver:bert"}
        grader.warm_for([(tmp_path / "plain", STAGE), (plots, STAGE)], files=1)  # only the first read
        assert "matplotlib" not in grader.server._warmed


# What a command does before torch loads, in a fresh interpreter (this one has torch).
BEFORE_TORCH = """
import json, sys
from pathlib import Path
from autograder.grader.options import launch_for
from autograder.runtime.load import load_source
launched = launch_for([Path(p) for p in sys.argv[1:]], None)
plain = load_source(Path("solutions/01_attention/01_attention.ipynb"), "01_attention")
print(json.dumps({
    "warmed": sorted(launched.warmed) if launched else None,
    "torch": "torch" in sys.modules,
    "IPython": "IPython" in sys.modules,
}))
if launched:
    launched.close()
"""


def _before_torch(*submissions: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", BEFORE_TORCH, *map(str, submissions)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_cold_grade_asks_for_matplotlib_before_torch_loads(tmp_path):
    # the fork server loads it right after its own torch, not once this process, ready
    # later, asks; a notebook without IPython syntax is read without importing IPython
    code = (EXAMPLES / "ada_correct_matmul" / f"{STAGE}.py").read_text()
    plots = write_py(tmp_path / "plots", STAGE, "import matplotlib.pyplot as plt\n" + code)
    plain = write_py(tmp_path / "plain", STAGE, code)
    assert _before_torch(plots) == {"warmed": ["matplotlib"], "torch": False, "IPython": False}
    assert _before_torch(plain) == {"warmed": [], "torch": False, "IPython": False}
    # a magic line is no reason to import IPython before torch; a demo cell plots unasked
    magic = write_notebook(
        tmp_path / "magic",
        ["%matplotlib inline\nimport matplotlib.pyplot as plt", ("code", "import pylab", ["skip-grading"])],
    )
    demo = write_notebook(tmp_path / "demo", [code, ("code", "import pylab", ["skip-grading"])])
    assert _before_torch(magic.parent) == {"warmed": ["matplotlib"], "torch": False, "IPython": False}
    assert _before_torch(demo.parent)["warmed"] == []
    (tmp_path / "empty").mkdir()
    assert _before_torch(tmp_path / "empty")["warmed"] is None  # nothing runs: no server


def test_a_child_guards_the_kernels_every_pattern_names():
    # a graded name's forbidden kernels, looked up once per child: the operators fnmatch
    # names, every stage's patterns, and a pattern that is neither exact nor a plain prefix
    from autograder.runtime.detector import _matching, aten_op_names
    from autograder.stages import stage_ids

    lists = {tuple(g.forbidden) for s in stage_ids() for g in load_spec(s).graded if g.forbidden}
    lists |= {("aten::*_softmax", "aten::gelu"), ("aten::soft?ax", "aten::[lm]*_norm", "aten::nope")}
    for patterns in lists:
        ops = tuple(p.removeprefix("aten::") for p in patterns if p.startswith("aten::"))
        want = tuple(n for n in aten_op_names() if any(fnmatch.fnmatchcase(n, p) for p in ops))
        assert _matching(ops) == want, patterns
    assert "_softmax" in _matching(("_softmax", "softmax")) and _matching(("nope",)) == ()


def test_a_class_already_graded_starts_and_ends_quietly(tmp_path):
    student = tmp_path / "class" / "ada"
    student.mkdir(parents=True)
    shutil.copy(EXAMPLES / "ada_correct_matmul" / f"{STAGE}.py", student)
    db = str(tmp_path / "grades.sqlite")
    first = run_cli("batch", str(tmp_path / "class"), "--db", db)
    assert first.returncode == 0, first.stderr
    again = run_cli("batch", str(tmp_path / "class"), "--db", db)  # its early server is never used
    assert again.returncode == 0 and "already in the gradebook 1" in again.stdout, again.stdout
    assert "Traceback" not in again.stderr and "Error" not in again.stderr, again.stderr


def test_stages_side_by_side_grade_as_in_turn(tmp_path):
    sub = tmp_path / "grace"
    shutil.copytree(EXAMPLES / "grace_correct_einsum", sub)
    (sub / "02_multihead.ipynb").unlink()  # one stage missing among those it runs
    stages = ["01_attention", "02_multihead", "03_positional", "05_normalization"]
    with Grader() as grader:
        serial = grader.grade(sub, stages)
        parallel = grader.grade(sub, stages, workers=3)
    assert [s.stage for s in parallel.stages] == stages
    assert [stage_record(s) for s in parallel.stages] == [stage_record(s) for s in serial.stages]


def test_the_gradescope_zip_ships_its_stages_expected_values(store, tmp_path):
    from autograder.grader.gradescope import build_zip

    out = build_zip(tmp_path / "autograder.zip", [STAGE])
    with zipfile.ZipFile(out) as zf:
        shipped = {n: zf.read(n) for n in zf.namelist() if n.startswith("expected/")}
    # stage 01 runs no earlier stage: its file alone, the same bytes as a store built here
    assert shipped == {f"expected/{STAGE}.safetensors": expected.path_for(store, STAGE).read_bytes()}


def test_an_unpacked_zip_builds_only_the_stages_it_grades(monkeypatch, tmp_path):
    from autograder.grader import gradescope

    assert expected.GRADESCOPE_CONFIG == gradescope.CONFIG
    assert expected.installed_stages() is None or (expected.PROJECT / gradescope.CONFIG).is_file()
    monkeypatch.setattr(expected, "PROJECT", tmp_path)
    assert expected.installed_stages() is None  # a checkout: every stage
    (tmp_path / gradescope.CONFIG).write_text(json.dumps({"stages": ["02_multihead"], "max_score": 1}))
    assert expected.installed_stages() == ["02_multihead"]
    (tmp_path / gradescope.CONFIG).write_text("{")
    assert expected.installed_stages() is None

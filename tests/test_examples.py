"""The example class (examples/class/): every student gets, on every stage it is listed
for in examples/expected/<stage>.json, the score, the named mistakes and the graded names
losing points promised there. The class is graded once per session with one Grader.
Stage-specific behaviours (a hang, a syntax error, a forbidden call) are checked below."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autograder.grader.report import stage_record, to_gradescope
from autograder.stages import load_spec
from tests.support import CALL_S, DEVICE, ROOT, assert_gradescope_results, max_score, once_per_session

CLASS = ROOT / "examples" / "class"
EXPECTED_DIR = ROOT / "examples" / "expected"

SOFTMAX, ATTENTION = "softmax", "scaled_dot_product_attention"
PADDING, CAUSAL = "padding_mask", "causal_mask"
MASKS = {PADDING, CAUSAL}


def _promises() -> dict[tuple[str, str], tuple[float, set[str], set[str]]]:
    """(student, stage) -> (score, misconception ids named anywhere, names losing points)."""
    out = {}
    for path in sorted(EXPECTED_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        assert data["stage"] == path.stem, path
        for student, p in data["students"].items():
            out[(student, data["stage"])] = (p["score"], set(p["misconceptions"]), set(p["losing"]))
    return out


EXPECTED = _promises()
CASES = sorted(EXPECTED)
# Students whose every lost point on a stage is one known mistake: each failing test names it.
ONE_MISTAKE = {key: ids for key, (_, ids, _) in EXPECTED.items() if len(ids) == 1}


def _grade_class() -> dict[str, dict]:
    from autograder.grader.grade import Grader
    from autograder.grader.runner import Limits

    out = {}
    with Grader(device=DEVICE, limits=Limits(call_s=CALL_S)) as grader:
        for student, stage in CASES:
            r = grader.grade(CLASS / student, [stage])
            out[f"{student}/{stage}"] = {
                **dataclasses.asdict(r),
                "stages": [stage_record(s) for s in r.stages],
                "score": r.score,
                "gradescope": to_gradescope(r),
                # why each failing test fails, as its student can read it (None: nothing says)
                "explanations": [
                    [t.name, t.hidden, t.explanation] for s in r.stages for t in s.tests if not t.passed
                ],
            }
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict]:
    return once_per_session(tmp_path_factory, f"example_class_{DEVICE}", _grade_class)


def _result(graded: dict, student: str, stage: str = "01_attention") -> dict:
    return graded[f"{student}/{stage}"]


def _stage(graded: dict, student: str, stage: str = "01_attention") -> dict:
    (result,) = _result(graded, student, stage)["stages"]
    return result


def _tests(
    graded: dict, student: str, function: str | None = None, stage: str = "01_attention"
) -> list[dict]:
    return [t for t in _stage(graded, student, stage)["tests"] if function in (None, t["function"])]


def test_the_promises_cover_the_whole_class():
    on_disk = {p.name for p in CLASS.iterdir() if p.is_dir()}
    promised = {student for student, _ in EXPECTED}
    assert on_disk == promised
    # `make demo` grades examples/class/*/: nothing but the README may sit beside the students
    assert {p.name for p in CLASS.iterdir() if not p.is_dir()} == {"README.md"}
    readme = (CLASS / "README.md").read_text()
    for student in promised:
        assert f"`{student}`" in readme, f"{student} is missing from examples/class/README.md"
    for student, stage in EXPECTED:
        files = {p.name for p in (CLASS / student).iterdir()}
        assert files & {f"{stage}.py", f"{stage}.ipynb"}, f"{student} has no {stage} file"
    # every stage file a student holds is promised something (or used by a stage that is)
    for student in promised:
        for path in (CLASS / student).iterdir():
            assert path.suffix in (".py", ".ipynb"), path


@pytest.mark.parametrize("student,stage", CASES, ids=[f"{a}/{b}" for a, b in CASES])
def test_score_and_named_mistakes(graded, student, stage):
    score, ids, losing = EXPECTED[(student, stage)]
    r = _result(graded, student, stage)
    tests = _tests(graded, student, stage=stage)
    tags = {m for t in tests for m in t["misconceptions"]}
    lost = {t["function"] for t in tests if t["score"] < t["max_score"]}
    # per-test scores carry 4 decimals; their float sum may not (24.583399999999997)
    assert (round(r["score"], 4), tags, lost) == (score, ids, losing), _stage(graded, student, stage)["notes"]
    spec = load_spec(stage)
    assert_gradescope_results(r["gradescope"], spec.max_score, sum(len(g.tests) for g in spec.graded))
    gs_tags = {x for t in r["gradescope"]["tests"] for x in t["tags"] if x.startswith("misconception:")}
    assert gs_tags == {f"misconception:{i}" for i in ids}


@pytest.mark.parametrize(
    "student,stage", sorted(ONE_MISTAKE), ids=[f"{a}/{b}" for a, b in sorted(ONE_MISTAKE)]
)
def test_every_failing_test_names_the_mistake(graded, student, stage):
    (mid,) = ONE_MISTAKE[(student, stage)]
    for t in _tests(graded, student, stage=stage):
        if t["score"] < t["max_score"]:
            assert t["misconceptions"] == [mid], t["output"]
            assert f"likely mistake [{mid}]" in t["output"]
        else:
            assert t["misconceptions"] == []


def test_every_failing_test_says_why(graded):
    """Every failing test ends with a named mistake, a counterexample (a public input that
    fails too), its own public case, or a reason no input changes (not defined, unfinished,
    forbidden, hangs): never a bare "2/3 hidden cases passed" (issue 26)."""
    bare = [
        (key, name) for key, r in graded.items() for name, hidden, why in r["explanations"] if why is None
    ]
    assert not bare, bare
    assert sum(len(r["explanations"]) for r in graded.values()) > 300


def test_correct_students_pass_everything_without_problems(graded):
    for student in ("ada_correct_matmul", "grace_correct_einsum"):
        assert all(t["score"] == t["max_score"] for t in _tests(graded, student))
        # grace's %matplotlib line is neutralised; nothing else is worth a note
        assert all("neutralised" in n for n in _stage(graded, student)["notes"]), student
    assert "tensor([0.0900, 0.2447, 0.6652])" in _stage(graded, "grace_correct_einsum")["stdout"]


def test_forbidden_softmax_costs_softmax_only_and_is_named(graded):
    student = "ivan_forbidden_torch_softmax"
    for t in _tests(graded, student, SOFTMAX):
        assert t["score"] == 0
        assert "torch.softmax" in t["output"] and "forbids" in t["output"]
    others = [t for t in _tests(graded, student) if t["function"] != SOFTMAX]
    assert others and all(t["score"] == t["max_score"] for t in others)


def test_syntax_error_is_reported_with_its_cell_and_the_rest_graded(graded):
    student = "judy_syntax_error"
    notes = _stage(graded, student)["notes"]
    assert any("code cell 9" in n and "'(' was never closed" in n for n in notes), notes
    assert (
        "code cell 9 (`def padding_mask(lengths: Tensor, max_len: int) -> Tensor:`) raised SyntaxError: '(' was never closed at code cell 9, line 8"
        in _result(graded, student)["gradescope"]["output"]
    )
    for t in _tests(graded, student, PADDING):
        assert t["score"] == 0 and "`padding_mask` is not defined" in t["output"]


def test_hanging_function_loses_only_its_points(graded):
    student = "leo_infinite_loop"
    tests = _tests(graded, student)
    assert all(t["score"] == t["max_score"] for t in tests if t["function"] != CAUSAL)
    hung = [t for t in tests if t["function"] == CAUSAL]
    assert hung and all(t["score"] == 0 for t in hung)
    first = hung[0]["cases"][0]
    assert first["message"].startswith("causal_mask did not finish within 2 s (an infinite loop"), first
    assert all("did not finish" in c["message"] for t in hung for c in t["cases"])
    # one call hangs to its limit; the other calls of the name are not made
    assert _result(graded, student)["execution_time"] < 2.0 + 8.0


def test_untouched_template_says_not_implemented_everywhere(graded):
    tests = _tests(graded, "ken_untouched_template")
    assert _stage(graded, "ken_untouched_template")["notes"] == []  # skip-grading cells skipped
    assert all(t["score"] == 0 for t in tests)
    for t in tests:
        for c in t["cases"]:
            assert "not implemented yet" in c["message"], c


def test_partial_submission_grades_what_is_done(graded):
    for t in _tests(graded, "noah_partial"):
        if t["function"] in MASKS:
            assert all("not implemented yet" in c["message"] for c in t["cases"])


def test_wrong_shape_is_named(graded):
    (first, *_) = _tests(graded, "mia_padding_mask_2d", PADDING)
    assert "expected shape (3, 1, 1, 5), got (3, 5)" in first["output"]


def test_neutralised_shell_line_is_noted(graded):
    notes = _stage(graded, "dan_softmax_ignores_dim")["notes"]
    assert any("!pip install -q torch" in n and "neutralised" in n for n in notes), notes


def test_notebooks_are_clean_v4_without_outputs():
    import nbformat

    notebooks = sorted(CLASS.glob("*/01_attention.ipynb"))
    scripts = sorted(CLASS.glob("*/01_attention.py"))
    assert len(notebooks) >= 5 and len(scripts) >= 5
    for path in notebooks:
        raw = json.loads(path.read_text())
        assert raw["nbformat"] == 4, path
        nb = nbformat.reads(path.read_text(), as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path


def test_a_type_error_inside_forward_points_at_the_line_not_the_signature(graded):
    tests = _tests(
        graded, "otto_added_attention_tuple", "TransformerEncoderLayer", stage="06_transformer_block"
    )
    assert tests and all(t["score"] == 0 for t in tests)
    text = tests[0]["output"]
    assert "unsupported operand type(s) for +: 'Tensor' and 'tuple'" in text
    assert "line 37: x = self.norm1(x + self.attention(x, x, x, mask))" in text
    assert "takes exactly these parameters" not in text  # its parameters were fine


def test_a_later_stage_names_the_failing_earlier_stage_it_runs(graded):
    (stage,) = _result(graded, "walt_bert_on_broken_heads", "09_mini_bert")["stages"]
    assert stage["notes"][0].startswith(
        f"09_mini_bert runs your own 02_multihead (3/{max_score('02_multihead'):g}), 06_transformer_block"
    )
    failing = [t for t in stage["tests"] if t["score"] < t["max_score"]]
    assert failing and all("fix those first" in t["output"] for t in failing)

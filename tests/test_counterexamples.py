"""A minimal counterexample for every failing test (issue 20): the smallest public input on
which a student's graded name disagrees with the reference, found by the grader in a clean
child and by the self-check in the notebook, shown with public and hidden tests alike.

The example class (examples/class/, each student one known mistake) is graded once per
session with the same Grader as tests/test_examples.py. Every failing test there gets its
name's counterexample, except the names no input can make right, listed below with why;
each counterexample reproduces outside the grader (a subprocess runs the student's code on
the shown code and prints the shown output), is small, and is the one the self-check finds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from autograder.runtime.counterexample import MAX_SHOWN, Pick, literal, tensor_literal
from autograder.runtime.results import Counterexample, counterexample_text
from autograder.stages import load_spec
from autograder.stages.spec import MAX_SMALL_CASES
from tests.support import CALL_S, DEVICE, ROOT, once_per_session, write_py
from tests.test_examples import CLASS, EXPECTED, _grade_class

# The failing names of the example class that have no counterexample, and why: none of them
# disagrees with the reference on any input's values (it is forbidden, missing, unfinished or
# never returns), so the test's own message says what is wrong.
WITHOUT = {
    ("ivan_forbidden_torch_softmax", "01_attention", "softmax"): "a forbidden call",
    ("judy_syntax_error", "01_attention", "padding_mask"): "not defined (its cell has a syntax error)",
    ("ken_untouched_template", "01_attention", "softmax"): "not implemented",
    ("ken_untouched_template", "01_attention", "scaled_dot_product_attention"): "not implemented",
    ("ken_untouched_template", "01_attention", "padding_mask"): "not implemented",
    ("ken_untouched_template", "01_attention", "causal_mask"): "not implemented",
    ("leo_infinite_loop", "01_attention", "causal_mask"): "never returns",
    ("noah_partial", "01_attention", "padding_mask"): "not implemented",
    ("noah_partial", "01_attention", "causal_mask"): "not implemented",
    ("xavier_forbidden_torch_sdpa", "02_multihead", "MultiHeadAttention"): "a forbidden call",
    ("vera_autograd_in_backward", "05_normalization", "batchnorm_backward"): "a forbidden call",
    ("elif_forbidden_f_gelu", "06_transformer_block", "gelu"): "a forbidden call",
    # named (source-padding-ignored, no-causal-mask) on these tests; a tiny random model's
    # greedy tokens are one token repeated, and these mistakes move its logits by at most
    # 0.15, never past the winner: no small input's tokens differ
    ("ola_memory_mask_ignored", "12_seq2seq", "greedy_decode"): "no small model's tokens change",
    ("sami_decoder_sees_future", "12_seq2seq", "greedy_decode"): "no small model's tokens change",
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict]:
    return once_per_session(tmp_path_factory, f"example_class_{DEVICE}", _grade_class)


def _failing(graded: dict) -> list[tuple[str, str, dict]]:
    """(student, stage, test record) of every failing test of the example class."""
    out = []
    for student, stage in sorted(EXPECTED):
        (record,) = graded[f"{student}/{stage}"]["stages"]
        out += [(student, stage, t) for t in record["tests"] if t["score"] < t["max_score"]]
    return out


def _counterexample(record: dict) -> Counterexample | None:
    found = record.get("counterexample")
    return None if found is None else Counterexample(**found)


# -- literals ----------------------------------------------------------------------------------


@given(
    st.sampled_from([torch.float64, torch.float32]),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=12),
    st.booleans(),
)
def test_a_tensor_literal_rebuilds_the_tensor_exactly(dtype, values, matrix):
    """Every bit (-0.0 included) but a NaN's payload: the literal is the value."""
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    t = t.reshape(1, -1) if matrix else t
    back = eval(tensor_literal(t), {"torch": torch})
    assert back.dtype == t.dtype and back.shape == t.shape
    bits = torch.int64 if dtype == torch.float64 else torch.int32
    nan = torch.tensor(float("nan"), dtype=dtype)
    assert torch.equal(
        torch.where(back.isnan(), nan, back).view(bits), torch.where(t.isnan(), nan, t).view(bits)
    )


def test_literals_of_every_kind_of_case_value():
    value = {
        "x": np.array([[0.5, -1.0]], dtype=np.float64),
        "ids": torch.tensor([1, 2], dtype=torch.int64),
        "mask": torch.tensor([[True, False]]),
        "empty": torch.empty(0, 3, dtype=torch.float32),
        "words": ["a b", ("c",)],
        "n": 3,
        "p": 0.1,
        "none": None,
    }
    back = eval(literal(value), {"torch": torch, "np": np})
    assert back["ids"].dtype == torch.int64 and back["mask"].dtype == torch.bool
    assert np.array_equal(back["x"], value["x"]) and back["x"].dtype == np.float64
    assert back["empty"].shape == (0, 3) and back["words"] == ["a b", ("c",)]
    assert (back["n"], back["p"], back["none"]) == (3, 0.1, None)
    assert literal(math.inf) == "float('inf')" and literal(torch.tensor(1.5, dtype=torch.float64)).startswith(
        "torch.tensor(1.5,"
    )


def test_a_huge_wrong_output_is_described_not_printed():
    from autograder.runtime.counterexample import got_text

    text = got_text(["y"], [("tensor", torch.zeros(MAX_SHOWN + 1), {})])
    assert "too many values to show" in text and "0.0, 0.0" not in text


def test_an_input_that_names_several_mistakes_gives_way_to_a_later_one_naming_one():
    def ce(rank: int, ids: list[str]) -> Counterexample:
        return Counterexample("f", "f()", "y = 1", "y = 2", "differs", ids, rank, 1)

    pick = Pick({"a", "b"})
    assert not pick.offer(None) and not pick.offer(ce(2, ["a", "b"]))
    assert pick.offer(ce(3, ["b", "dtype-hard-coded"]))  # a generic id does not make it ambiguous
    assert pick.result.rank == 3
    only = Pick({"a", "b"})
    only.offer(ce(1, ["a", "b"]))
    assert only.result.rank == 1  # none better: the first after all


# -- the example class --------------------------------------------------------------------------


def test_every_failing_test_of_the_class_gets_a_counterexample_where_one_exists(graded):
    without = {}
    for student, stage, t in _failing(graded):
        ce = _counterexample(t)
        if ce is None:
            without[(student, stage, t["function"])] = t["output"]
            continue
        assert ce.function == t["function"] and 1 <= ce.rank <= MAX_SMALL_CASES
        assert counterexample_text(ce) in t["output"], "the test's output shows it"
    assert set(without) == set(WITHOUT), {k: v[:300] for k, v in without.items() if k not in WITHOUT}


def test_a_hidden_test_shows_its_counterexample_to_the_student(grader, tmp_path):
    """What a student sees of a failing hidden test (``visibility.for_students``: results.json,
    Gradescope, the HTML feedback) still holds its counterexample, and nothing of its cases."""
    from autograder.grader.feedback import render_html
    from autograder.grader.report import write_results
    from autograder.grader.visibility import for_students

    result = grader.grade(CLASS / "bob_missing_scale", ["01_attention"])
    (full,) = [t for t in result.stages[0].tests if t.hidden and t.group == "float64, no mask"]
    (shown,) = [t for t in for_students(result).stages[0].tests if t.hidden and t.group == full.group]
    assert shown.redacted and full.counterexample is not None and shown.counterexample == full.counterexample
    text = counterexample_text(full.counterexample)
    assert text in shown.output and "likely mistake [missing-scale]" in shown.output
    assert not any(c.label in shown.output for c in full.cases)
    write_results(result, tmp_path / "results.json")
    (entry,) = [
        t for t in json.loads((tmp_path / "results.json").read_text())["tests"] if t["name"] == full.name
    ]
    if entry.get("output_format") == "md":
        assert f"```\n{text}\n```" in entry["output"], "a code block: it pastes as Python"
    else:
        assert text in entry["output"], "plain text, indented as Python: it pastes as it is"
    import html

    page = render_html(result)
    for line in text.splitlines():
        if line.startswith("    "):  # its Python, line for line, as it pastes
            assert f"\n{html.escape(line, quote=True)}\n" in page, line
    assert 'class="callout hint counterexample"' in page and "disagrees (paste it into your notebook)" in page


def test_no_counterexample_on_a_passing_test(graded):
    for student, stage in sorted(EXPECTED):
        (record,) = graded[f"{student}/{stage}"]["stages"]
        for t in record["tests"]:
            if t["score"] >= t["max_score"]:
                assert t["counterexample"] is None, (student, stage, t["function"], t["group"])


def test_the_missing_scale_counterexample_is_one_query_against_two_keys(graded):
    (record,) = graded["bob_missing_scale/01_attention"]["stages"]
    ces = {json.dumps(t["counterexample"]) for t in record["tests"] if t["score"] < t["max_score"]}
    assert len(ces) == 1, "one counterexample per name, on every failing test"
    ce = Counterexample(**json.loads(ces.pop()))
    assert ce.rank == 1 and ce.misconceptions == ["missing-scale"]
    env = {"torch": torch}
    exec(ce.expected, env)
    assert tuple(env["weights"].shape[-2:]) == (1, 2) and tuple(env["out"].shape[-2:]) == (1, 1)
    assert ce.code.endswith("scaled_dot_product_attention(q, k, v)")


REPRODUCE = r"""
import contextlib, io, json, os, sys, types
from pathlib import Path
import torch
from autograder.runtime.counterexample import got_text
from autograder.runtime.harness import as_plain, split_outputs
from autograder.runtime.load import load_source
from autograder.runtime.submission import Submission
from autograder.stages import load_spec

torch.set_num_threads(1)
out = []
for job in json.load(sys.stdin):
    os.chdir(job["dir"])
    stage = job["stage"]
    source = load_source(Submission(Path(job["dir"])).file(stage), stage)
    module = types.ModuleType(source.module_name)
    sys.modules[source.module_name] = module
    ns = module.__dict__
    ns["get_ipython"] = lambda: type("Shell", (), {"__getattr__": lambda self, n: lambda *a, **k: None})()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for label, cell in source.cells:
            try:
                exec(compile(cell, f"<{label}>", "exec"), ns)
            except Exception:
                pass
    for ce in job["counterexamples"]:
        torch.set_default_dtype(torch.float32)
        *setup, last = ce["code"].splitlines()
        env = dict(ns)
        try:
            exec("\n".join(setup), env)
            value = eval(last, env)
            graded = load_spec(stage).graded_name(ce["function"])
            items = [as_plain(v) for v in split_outputs(value, graded.outputs)]
            out.append({"got": got_text(graded.outputs, items)})
        except Exception as exc:
            out.append({"raised": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""


def test_every_counterexample_reproduces_outside_the_grader(graded):
    """The student runs the shown code in a notebook: a fresh process that runs the student's
    file, then each counterexample's code, gets the shown output (or the shown exception)."""
    jobs, shown = [], []
    for student, stage in sorted(EXPECTED):
        (record,) = graded[f"{student}/{stage}"]["stages"]
        found = {}
        for t in record["tests"]:
            if t["counterexample"] is not None:
                found[t["function"]] = t["counterexample"]
        if found:
            jobs.append(
                {"dir": str(CLASS / student), "stage": stage, "counterexamples": list(found.values())}
            )
            shown += [(student, stage, ce) for ce in found.values()]
    assert len(shown) >= 40
    run = subprocess.run(
        [sys.executable, "-c", REPRODUCE],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.splitlines()[-1])
    for (student, stage, ce), got in zip(shown, results, strict=True):
        if ce["got"]:
            assert got == {"got": ce["got"]}, (student, stage, ce["function"])
        else:  # the call raised: the shown message says what
            assert "raised" in got and got["raised"].split(":")[0] in ce["message"], (student, stage, got)


def test_the_self_check_shows_the_graders_counterexample(graded, tmp_path):
    """A public failure: the self-check in the kernel finds the counterexample the grader
    showed, in the same words (its data built on this machine, so the same bits)."""
    from autograder.grader import public
    from autograder.runtime.load import load_source
    from autograder.runtime.selfcheck import check

    for student, stage, name in [
        ("bob_missing_scale", "01_attention", "scaled_dot_product_attention"),
        ("gus_unstable_softmax", "01_attention", "softmax"),
        ("zoe_softmax_gradient_sign", "04_word2vec", "naive_softmax_loss_and_gradient"),
        ("lars_layernorm_over_batch", "05_normalization", "layernorm_backward"),
    ]:
        (record,) = graded[f"{student}/{stage}"]["stages"]
        expected = next(
            _counterexample(t)
            for t in record["tests"]
            if t["function"] == name and not t["hidden"] and t["score"] < t["max_score"]
        )
        data = public.write(load_spec(stage), tmp_path)
        ns: dict = {}
        source = (
            load_source(CLASS / student / f"{stage}.py", stage)
            if (CLASS / student / f"{stage}.py").exists()
            else load_source(CLASS / student / f"{stage}.ipynb", stage)
        )
        ns["get_ipython"] = lambda: type("S", (), {"__getattr__": lambda self, n: lambda *a, **k: None})()
        for _, cell in source.cells:
            exec(compile(cell, stage, "exec"), ns)
        report = check(ns[name], data=data)
        assert not report.passed
        assert report.counterexample == expected, (student, name)
        assert counterexample_text(expected) in "\n".join(line[2:] for line in str(report).splitlines())
        assert "Smallest input found" in report._repr_html_()
        # the committed data (perhaps computed on other CPU kernels) tries the same inputs
        committed = check(ns[name], data=ROOT / "assignments" / stage / public.selfcheck_file(stage))
        assert (committed.counterexample.rank, committed.counterexample.code) == (
            expected.rank,
            expected.code,
        )


def test_the_self_check_shows_no_counterexample_when_the_public_cases_pass(tmp_path):
    from autograder.runtime.selfcheck import check

    ns: dict = {}
    exec((CLASS / "ada_correct_matmul" / "01_attention.py").read_text(), ns)
    stage = "01_attention"
    report = check(ns["softmax"], data=ROOT / "assignments" / stage / f"{stage}.selfcheck.safetensors")
    assert report.passed and report.counterexample is None


# -- the grader's search -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grader():
    from autograder.grader.grade import Grader
    from autograder.grader.runner import Limits

    with Grader(device=DEVICE, limits=Limits(call_s=CALL_S)) as g:
        yield g


def test_the_same_submission_gets_the_same_counterexample(grader, graded):
    first = grader.grade(CLASS / "carol_scale_by_d", ["01_attention"])
    again = grader.grade(CLASS / "carol_scale_by_d", ["01_attention"])
    shown = [t.counterexample for t in first.stages[0].tests if t.counterexample]
    assert shown and shown == [t.counterexample for t in again.stages[0].tests if t.counterexample]
    (record,) = graded["carol_scale_by_d/01_attention"]["stages"]
    assert shown[0] == next(_counterexample(t) for t in record["tests"] if t["counterexample"])


def test_the_search_runs_public_calls_only_and_refuses_hidden_ones(grader):
    from autograder.grader.runner import Limits, run_public

    plan = grader.plan("01_attention")
    hidden = [c for c in plan.calls if c.hidden]
    with pytest.raises(ValueError, match="public calls only"):
        run_public(grader.server, [], "m", hidden, plan.inputs_file, "cpu", Limits())


def test_a_hanging_name_costs_one_small_limit(grader):
    from autograder.grader.plan import RUNG_CALL_S

    search = grader.counterexamples
    plan = grader.plan("01_attention")
    limits = search.limits(plan)
    assert limits.call_s == RUNG_CALL_S < plan.spec.call_timeout_s
    t0 = time.monotonic()
    found = search.for_stage(grader.jobs(CLASS / "leo_infinite_loop").job("01_attention"), {"causal_mask"})
    assert found == {} and time.monotonic() - t0 < limits.call_s + 5.0


def test_a_grader_may_leave_counterexamples_out():
    from autograder.grader.grade import Grader

    with Grader(counterexamples=False) as g:
        r = g.grade(CLASS / "bob_missing_scale", ["01_attention"])
    assert r.score < r.max_score and all(t.counterexample is None for t in r.stages[0].tests)


class Forks:
    """Counts the children a grader's fork server starts, and the calls each child made."""

    def __init__(self, grader, monkeypatch):
        from autograder.grader import runner

        self.children = 0
        self.runs: list[dict] = []
        real_fork, real_run = grader.server.fork, runner.run_submission

        def fork(*args, **kwargs):
            self.children += 1
            return real_fork(*args, **kwargs)

        def run(*args, **kwargs):
            report = real_run(*args, **kwargs)
            self.runs.append(report.calls)
            return report

        monkeypatch.setattr(grader.server, "fork", fork)
        for module in ("autograder.grader.grade", "autograder.grader.runner"):
            monkeypatch.setattr(f"{module}.run_submission", run)


def test_a_name_that_is_missing_unfinished_or_hangs_starts_no_search_child(grader, monkeypatch, tmp_path):
    """noah leaves two names unwritten (NotImplementedError), leo's causal_mask never returns,
    one more student defines no causal_mask at all: no input could make those pass, and
    their grade is one child (leo's two: the restart after the hang), no search."""
    sub = write_py(
        tmp_path / "no_causal",
        "01_attention",
        (CLASS / "ada_correct_matmul" / "01_attention.py")
        .read_text()
        .replace("def causal_mask(", "def causal_mask_(", 1),
    )
    grader.grade(sub, ["01_attention"])  # the grader warm (its start-up check forks too)
    forks = Forks(grader, monkeypatch)
    for student, children in ((CLASS / "noah_partial", 1), (CLASS / "leo_infinite_loop", 2), (sub, 1)):
        before = forks.children
        r = grader.grade(student, ["01_attention"])
        failing = [t for t in r.stages[0].tests if not t.passed]
        assert failing and all(t.explanation.startswith("no input changes it") for t in failing), student
        assert forks.children - before == children, student


def test_a_name_failing_a_public_case_finds_its_counterexample_in_the_grading_child(grader, monkeypatch):
    """bob's attention fails public cases: its counterexample comes from the grading child
    (one child, no other), the same one a child of its own finds."""
    grader.grade(CLASS / "ada_correct_matmul", ["01_attention"])
    forks = Forks(grader, monkeypatch)
    r = grader.grade(CLASS / "bob_missing_scale", ["01_attention"])
    shown = [t.counterexample for t in r.stages[0].tests if t.counterexample]
    assert shown and all(c == shown[0] for c in shown) and forks.children == 1
    ce = shown[0]
    alone = grader.counterexamples.for_stage(
        grader.jobs(CLASS / "bob_missing_scale").job("01_attention"), {ce.function}
    )
    assert alone == {ce.function: ce}


def test_a_name_failing_hidden_cases_only_is_searched_in_a_child_that_never_held_one(grader, monkeypatch):
    """dan's softmax passes every public case and fails hidden ones (another dim): its
    small inputs run in a second child, which is given no hidden input."""
    grader.grade(CLASS / "ada_correct_matmul", ["01_attention"])
    forks = Forks(grader, monkeypatch)
    r = grader.grade(CLASS / "dan_softmax_ignores_dim", ["01_attention"])
    failing = [t for t in r.stages[0].tests if not t.passed]
    assert failing and all(t.hidden and t.counterexample for t in failing)
    assert forks.children == 2
    grading, search = forks.runs
    plan = grader.plan("01_attention")
    hidden = {c.index for c in plan.calls if c.hidden}
    rungs = {c.index for c in plan.rung_calls}
    assert hidden <= set(grading) and not set(grading) & rungs  # dan fails no public case
    assert not set(search) & hidden and set(search) <= rungs


def test_small_inputs_run_before_the_hidden_inputs_are_given(grader, monkeypatch):
    """Every time the grading child asks for a small input, it holds no hidden input yet:
    the ladder is asked before the hidden calls' outcomes exist, never after."""
    from autograder.grader import counterexample as search
    from autograder.grader import runner

    plan = grader.plan("01_attention")
    hidden = {c.index for c in plan.calls if c.hidden}
    asked: list[tuple[int, set[int]]] = []  # (which search, the outcomes it was asked with)
    released: list[int] = []
    real_next, real_write = search.Search.next, runner._write_hidden

    def next_(self, outcomes):
        asked.append((id(self), set(outcomes)))
        return real_next(self, outcomes)

    def write(path, calls, inputs):
        if path.name == "hidden.bin":
            released.append(len(asked))
        return real_write(path, calls, inputs)

    monkeypatch.setattr(search.Search, "next", next_)
    monkeypatch.setattr(runner, "_write_hidden", write)
    r = grader.grade(CLASS / "gus_unstable_softmax", ["01_attention"])
    assert any(t.counterexample for t in r.stages[0].tests)
    grading = [seen for who, seen in asked if who == asked[0][0]]
    assert len(grading) > 2 and released == [len(grading)]  # its last answer: the hidden inputs
    assert all(not seen & hidden for _, seen in asked)


SLOW_WRONG_SOFTMAX = """
import time


def softmax(x, dim=-1):
    time.sleep(0.15)  # slow: each small input run costs the grade
    return x * 2
"""


def test_the_search_stops_once_its_names_have_their_answer(grader, tmp_path):
    """A softmax wrong on every input: its counterexample is its first input, and no other
    small input of it runs."""
    sub = write_py(tmp_path / "slow", "01_attention", SLOW_WRONG_SOFTMAX)
    plan = grader.plan("01_attention")
    search = grader.counterexamples.search(plan)
    from autograder.grader.runner import run_submission
    from autograder.runtime.load import load_source

    source = load_source(sub / "01_attention.py", "01_attention")
    report = run_submission(
        grader.server,
        source.cells,
        source.module_name,
        plan.calls,
        plan.inputs_file,
        "cpu",
        grader.limits,
        hidden_inputs=plan.hidden_file,
        ladder=search,
    )
    ran = [i for i in report.calls if i in {c.index for c in plan.rung_calls}]
    assert search.found()["softmax"].rank == 1 and len(ran) == 1

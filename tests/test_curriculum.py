"""CURRICULUM.md is the contract, and only the contract is graded (issue 17).

The stage specs and CURRICULUM.md must agree on everything a student is graded on: each
graded name's clause and points, each stage's total and time limit, the misconception
ids, the float dtypes of the cases, and the library calls each name forbids (checked by
running the calls under the grader's own detector, not by comparing pattern strings).
The last tests grade the two submissions that issue 17 measured as misgraded.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.grader.report import to_gradescope
from autograder.runtime import results
from autograder.runtime.detector import ForbiddenCallDetector, ForbiddenKernel, KernelGuard
from autograder.stages import all_specs, requires, spec_path, stage_ids
from autograder.stages.spec import Graded, StageSpec
from autograder.stages.unfilled import unfilled_lines
from tests.support import ROOT

TEXT = (ROOT / "CURRICULUM.md").read_text(encoding="utf-8")
SPECS = {s.id: s for s in all_specs()}

ANCHOR = re.compile(r"\*\*\[([A-Za-z0-9_.-]+)\]\*\*")
NUMBER = r"(\d+(?:\.\d+)?)"
STAGE_HEADING = re.compile(
    rf"^## (?P<stage>\d\d_[a-z0-9_]+): (?P<title>.*) \({NUMBER} points; {NUMBER} s per call\)$"
)
MISCONCEPTION_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def _sections() -> list[tuple[str, str]]:
    """(heading line, body) of every ``##``/``###`` section, in order."""
    parts = re.split(r"(?m)^(?=#{2,3} )", TEXT)
    return [(p.split("\n", 1)[0], p.split("\n", 1)[1] if "\n" in p else "") for p in parts[1:]]


def _headings() -> dict[str, re.Match[str]]:
    return {m["stage"]: m for h, _ in _sections() if (m := STAGE_HEADING.match(h))}


def _clauses() -> dict[str, tuple[str | None, str]]:
    """clause id -> (the stage whose section holds it, or None; the clause's text, up to the
    next clause or heading)."""
    out: dict[str, tuple[str | None, str]] = {}
    for heading, body in _sections():
        m = STAGE_HEADING.match(heading)
        anchors = list(ANCHOR.finditer(body))
        ends = [a.start() for a in anchors[1:]] + [len(body)] if anchors else []
        for a, end in zip(anchors, ends, strict=True):
            out[a[1]] = (m["stage"] if m else None, body[a.end() : end])
    return out


CLAUSES = _clauses()


def _sentence_after(text: str, marker: str) -> str | None:
    """The rest of the sentence after ``marker``: up to a full stop outside backticks."""
    at = text.find(marker)
    if at < 0:
        return None
    rest, inside = text[at + len(marker) :], False
    for i, ch in enumerate(rest):
        if ch == "`":
            inside = not inside
        elif ch == "." and not inside and (i + 1 == len(rest) or rest[i + 1].isspace()):
            return rest[:i]
    return rest


def contract_forbids(clause: str) -> frozenset[str]:
    """The library calls a clause forbids: the backticked names of its "Forbidden:"
    sentence, and those of the clauses it refers to ("as in [05.batchnorm_forward]")."""
    _, text = CLAUSES[clause]
    sentence = _sentence_after(text, "Forbidden:")
    assert sentence is not None, f"[{clause}] does not say what it forbids (write 'Forbidden: nothing.')"
    names = set(re.findall(r"`([^`]+)`", sentence))
    strays = {n for n in names if not re.fullmatch(r"torch(\.\w+)+", n)}
    assert not strays, f"[{clause}] forbids {strays}: write full torch names, e.g. `torch.nn.GELU`"
    refs = re.findall(r"\[(\d\d\.\w+)\]", sentence)
    if not names and not refs:
        assert sentence.strip() == "nothing", f"[{clause}]: 'Forbidden: {sentence.strip()}'"
    for ref in refs:
        names |= contract_forbids(ref)
    return frozenset(names)


# -- what the grader's detector sees ---------------------------------------------------------


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


def _mha_forward():
    q, w, b, wo, bo = _x(3, 2, 4), _x(12, 4), _x(12), _x(4, 4), _x(4)
    return F.multi_head_attention_forward(q, q, q, 4, 2, w, b, None, None, False, 0.0, wo, bo, training=False)


def _with_grad(fn):
    return fn(_x(3).requires_grad_())


# One call per library function the contract names, and a few that every stage allows
# (the last group): a spec whose patterns catch a call its clause does not list, or miss
# one it lists, fails below.
PROBES: dict[str, Callable[[], object]] = {
    "torch.softmax": lambda: torch.softmax(_x(3), -1),
    "torch.nn.functional.softmax": lambda: F.softmax(_x(3), -1),
    "torch.Tensor.softmax": lambda: _x(3).softmax(-1),
    "torch.special.softmax": lambda: torch.special.softmax(_x(3), -1),
    "torch.nn.Softmax": lambda: nn.Softmax(-1)(_x(3)),
    "torch.log_softmax": lambda: torch.log_softmax(_x(3), -1),
    "torch.nn.functional.log_softmax": lambda: F.log_softmax(_x(3), -1),
    "torch.Tensor.log_softmax": lambda: _x(3).log_softmax(-1),
    "torch.special.log_softmax": lambda: torch.special.log_softmax(_x(3), -1),
    "torch.nn.LogSoftmax": lambda: nn.LogSoftmax(-1)(_x(3)),
    "torch.nn.functional.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(
        _x(1, 2, 3, 4), _x(1, 2, 3, 4), _x(1, 2, 3, 4)
    ),
    "torch.nn.MultiheadAttention": lambda: nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64)(
        _x(2, 3, 4), _x(2, 3, 4), _x(2, 3, 4)
    ),
    "torch.nn.functional.multi_head_attention_forward": _mha_forward,
    "torch.nn.TransformerEncoderLayer": lambda: nn.TransformerEncoderLayer(
        4, 2, 8, dropout=0.0, batch_first=True, dtype=torch.float64
    ).eval()(_x(2, 3, 4)),
    "torch.nn.functional.gelu": lambda: F.gelu(_x(3)),
    "torch.nn.GELU": lambda: nn.GELU(approximate="tanh")(_x(3)),
    "torch.nn.functional.batch_norm": lambda: F.batch_norm(_x(4, 3), None, None, training=True),
    "torch.batch_norm": lambda: torch.batch_norm(_x(4, 3), None, None, None, None, True, 0.1, 1e-5, False),
    "torch.nn.BatchNorm1d": lambda: nn.BatchNorm1d(3, dtype=torch.float64)(_x(4, 3)),
    "torch.nn.functional.layer_norm": lambda: F.layer_norm(_x(4, 3), (3,)),
    "torch.layer_norm": lambda: torch.layer_norm(_x(4, 3), (3,)),
    "torch.nn.LayerNorm": lambda: nn.LayerNorm(3, dtype=torch.float64)(_x(4, 3)),
    "torch.nn.functional.group_norm": lambda: F.group_norm(_x(4, 3), 1),
    "torch.nn.GroupNorm": lambda: nn.GroupNorm(1, 3, dtype=torch.float64)(_x(4, 3)),
    "torch.nn.functional.instance_norm": lambda: F.instance_norm(_x(4, 3, 5)),
    "torch.nn.InstanceNorm1d": lambda: nn.InstanceNorm1d(3)(_x(4, 3, 5)),
    "torch.nn.functional.rms_norm": lambda: F.rms_norm(_x(4, 3), (3,)),
    "torch.rms_norm": lambda: torch.rms_norm(_x(4, 3), (3,)),
    "torch.nn.RMSNorm": lambda: nn.RMSNorm(3, dtype=torch.float64)(_x(4, 3)),
    "torch.ops.aten.native_batch_norm_backward": lambda: torch.ops.aten.native_batch_norm_backward(
        _x(4, 3), _x(4, 3), _x(3), None, None, _x(3), _x(3), True, 1e-5, [True, True, True]
    ),
    "torch.ops.aten.native_layer_norm_backward": lambda: torch.ops.aten.native_layer_norm_backward(
        _x(4, 3), _x(4, 3), [3], _x(4, 1), _x(4, 1), _x(3), _x(3), [True, True, True]
    ),
    "torch.autograd.grad": lambda: _with_grad(lambda t: torch.autograd.grad((t * t).sum(), t)),
    "torch.autograd.backward": lambda: _with_grad(lambda t: torch.autograd.backward((t * t).sum())),
    "torch.Tensor.backward": lambda: _with_grad(lambda t: (t * t).sum().backward()),
    "torch.autograd.functional.jacobian": lambda: torch.autograd.functional.jacobian(lambda t: t * t, _x(3)),
    "torch.func.grad": lambda: torch.func.grad(lambda t: (t * t).sum())(_x(3)),
    "torch.func.vjp": lambda: torch.func.vjp(lambda t: t * t, _x(3))[1](_x(3)),
    "torch.func.jacrev": lambda: torch.func.jacrev(lambda t: t * t)(_x(3)),
    "torch.nn.LSTMCell": lambda: nn.LSTMCell(3, 4, dtype=torch.float64)(_x(2, 3)),
    "torch.nn.LSTM": lambda: nn.LSTM(3, 4, num_layers=2, batch_first=True, dtype=torch.float64)(_x(2, 5, 3)),
    "torch.lstm_cell": lambda: torch.lstm_cell(_x(2, 3), (_x(2, 4), _x(2, 4)), _x(16, 3), _x(16, 4)),
    # allowed everywhere
    "torch.nn.Linear": lambda: nn.Linear(3, 2, dtype=torch.float64)(_x(4, 3)),
    "torch.nn.Embedding": lambda: nn.Embedding(5, 3)(torch.tensor([0, 4])),
    "torch.erf": lambda: torch.erf(_x(3)),
    "torch.tanh": lambda: torch.tanh(_x(3)),
    "torch.einsum": lambda: torch.einsum("ij,jk->ik", _x(2, 3), _x(3, 2)),
    "torch.Tensor.masked_fill": lambda: _x(3).masked_fill(torch.tensor([True, False, True]), -1e9),
    "torch.var_mean": lambda: torch.var_mean(_x(4, 3), dim=0, unbiased=False),
}


@functools.cache
def detected(patterns: tuple[str, ...]) -> frozenset[str]:
    """The probes that the grader's detector, given ``patterns``, reports as forbidden."""
    found = set()
    for name, probe in PROBES.items():
        detector = ForbiddenCallDetector(patterns)
        try:
            with detector:
                probe()
        except ForbiddenKernel:  # a torch.func transform is stopped, not only recorded
            pass
        if detector.found:
            found.add(name)
    return frozenset(found)


@functools.cache
def guarded(patterns: tuple[str, ...]) -> frozenset[str]:
    """The probes reported as forbidden as the grading child watches: a KernelGuard open on
    ``patterns``, the detector's function mode, and no dispatch mode."""
    found = set()
    for name, probe in PROBES.items():
        guard = KernelGuard(patterns)
        detector = ForbiddenCallDetector(patterns)
        try:
            with detector:
                assert not patterns or len(detector._modes) == 1, "the dispatch mode is on: nothing tested"
                probe()
        except ForbiddenKernel:
            pass
        finally:
            guard.close()
        if detector.found or guard.found:
            found.add(name)
    return frozenset(found)


def _graded(stage: str, name: str) -> Graded:
    return SPECS[stage].graded_name(name)


# -- the contract and the specs agree --------------------------------------------------------


def _spec_file(stage: str) -> str:
    path = spec_path(stage)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _section_lines(stage: str) -> list[tuple[int, str]]:
    """(line number in CURRICULUM.md, line) of ``stage``'s section, its heading first."""
    lines = TEXT.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"## {stage}:")), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return [(i + 1, lines[i]) for i in range(start, end)]


@pytest.mark.parametrize("stage", stage_ids())
def test_a_stage_section_holds_nothing_left_to_fill_in(stage):
    """`new-stage` inserts a section whose every part to write is marked to fill in (issue 28)."""
    section = "\n".join(line for _, line in _section_lines(stage))
    first = _section_lines(stage)[0][0] if section else 1
    left = [f"CURRICULUM.md:{first + n - 1}: {what}" for n, what in unfilled_lines(section)]
    assert not left, "\n".join(
        [f"{stage}'s section is not written yet: write what each line asks for", *left]
    )


@pytest.mark.parametrize("stage", stage_ids())
def test_every_stage_has_a_section_with_its_points_and_time_limit(stage):
    spec = SPECS[stage]
    form = f"'## {stage}: <title> ({spec.max_score:g} points; {spec.call_timeout_s:g} s per call)'"
    m = _headings().get(stage)
    if m is None:
        near = [line for _, line in _section_lines(stage)[:1]]
        assert near, f"CURRICULUM.md has no section for {stage}: add a heading {form}"
        raise AssertionError(f"CURRICULUM.md's heading {near[0]!r} is not of the form {form}")
    stated = (float(m[3]), float(m[4]))
    assert stated == (spec.max_score, spec.call_timeout_s), (
        f"{m[0]!r} states {m[3]} points and {m[4]} s per call; {_spec_file(stage)} gives "
        f"{spec.max_score:g} points (the sum of its tests' points) and {spec.call_timeout_s:g} s "
        f"(call_timeout_s): make the heading {form}, or change the spec"
    )


def test_every_section_is_a_stage():
    unknown = sorted(set(_headings()) - set(SPECS))
    assert not unknown, f"CURRICULUM.md has sections for {unknown}, which no spec defines"


def test_clause_ids_are_unique():
    ids = ANCHOR.findall(TEXT)
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


@pytest.mark.parametrize("stage", stage_ids())
def test_every_graded_name_names_a_clause_that_states_it_and_its_points(stage):
    spec = SPECS[stage]
    for g in spec.graded:
        assert g.clause is not None, f"{stage}.{g.name} names no CURRICULUM.md clause"
        assert g.clause in CLAUSES, f"{stage}.{g.name}: no **[{g.clause}]** in CURRICULUM.md"
        where, text = CLAUSES[g.clause]
        assert where == stage, f"[{g.clause}] is in {where}'s section, not {stage}'s"
        assert re.search(rf"\b{re.escape(g.name)}\(", text), f"[{g.clause}] never shows `{g.name}(...)`"
        points = re.search(rf"\({NUMBER} points?\)", text)
        assert points, f"[{g.clause}] states no points: write `{g.name}(...)` ({g.max_score:g} points)"
        assert float(points[1]) == g.max_score, (
            f"[{g.clause}] says {points[0]}, {_spec_file(stage)} gives {g.name} {g.max_score:g} (the sum "
            "of its tests' points): make them agree"
        )


@pytest.mark.parametrize("stage", stage_ids())
def test_every_clause_of_a_stage_is_graded(stage):
    graded = {g.clause for g in SPECS[stage].graded} | {f"{stage[:2]}.misconceptions"}
    declared = {c for c, (where, _) in CLAUSES.items() if where == stage}
    assert declared == graded, f"clauses nothing grades: {declared - graded}"


def misconception_ids(text: str) -> list[str]:
    """The ids a ``[NN.misconceptions]`` clause lists: its backticked words outside
    parentheses. The parenthesis after an id explains it, backticked words included:
    "`not-interleaved` (sin half then cos half), `rope-pairs` (rotates `x[2i]` with `x[i]`)"."""
    ids, depth, tick = [], 0, None
    for i, ch in enumerate(text):
        if ch == "`":
            if tick is None:
                tick = i
            else:
                if depth == 0:
                    ids.append(text[tick + 1 : i])
                tick = None
        elif tick is None and ch == "(":
            depth += 1
        elif tick is None and ch == ")":
            depth = max(0, depth - 1)
    return ids


def misconception_problems(clause: str, text: str, declared: set[str], spec_file: str) -> list[str]:
    """What to change so that clause ``text`` lists exactly the ``declared`` ids, one line each."""
    listed = misconception_ids(text)
    problems = []
    for word in listed:
        if word not in declared:
            kind = "is not a misconception id (ids are kebab-case, `missing-scale`)"
            if MISCONCEPTION_ID.match(word):
                kind = f"is listed as a misconception id, but {spec_file} declares no such id"
            problems.append(
                f"[{clause}]: `{word}` {kind}. Every backticked word outside parentheses is an id: if "
                f"`{word}` explains the id before it, move it into that id's parenthesis (`id` (... `{word}` "
                f"...)) or drop its backticks; if it is a mistake the grader names, add it to "
                f"{spec_file}'s SPEC.misconceptions, with a Variant"
            )
    for missing in sorted(declared - set(listed)):
        problems.append(
            f"{spec_file} declares the misconception `{missing}` (SPEC.misconceptions), which "
            f"[{clause}] does not list: add `{missing}` to it (with what it is, in parentheses)"
        )
    return problems


def test_a_backticked_word_in_an_ids_explanation_is_no_id():
    """Issue 28: `positions`, in the parenthesis explaining an id, failed the stage with
    "Extra items: 'positions'", which said nothing of what to change."""
    text = " `rope-interleaved` (rotates `positions` pairwise, `x[2i]` with `x[2i+1]`), `rope-base`.\n"
    assert misconception_ids(text) == ["rope-interleaved", "rope-base"]
    declared = {"rope-interleaved", "rope-base"}
    assert misconception_problems("12.misconceptions", text, declared, "12.py") == []
    stray = " `rope-interleaved` rotates `positions` pairwise, `rope-base`.\n"
    (problem,) = misconception_problems("12.misconceptions", stray, declared, "12.py")
    assert "`positions` is listed as a misconception id, but 12.py declares no such id" in problem
    assert "move it into that id's parenthesis" in problem
    assert "add it to 12.py's SPEC.misconceptions" in problem
    (problem,) = misconception_problems("12.misconceptions", " `rope-interleaved`.\n", declared, "12.py")
    assert problem.startswith("12.py declares the misconception `rope-base`") and "add `rope-base`" in problem


@pytest.mark.parametrize("stage", stage_ids())
def test_misconception_ids_are_the_contracts(stage):
    clause = f"{stage[:2]}.misconceptions"
    assert clause in CLAUSES, f"CURRICULUM.md has no **[{clause}]** clause: list {stage}'s ids there"
    _, text = CLAUSES[clause]
    problems = misconception_problems(clause, text, set(SPECS[stage].misconceptions), _spec_file(stage))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("stage", stage_ids())
def test_each_name_forbids_exactly_what_its_clause_lists(stage):
    for g in SPECS[stage].graded:
        listed = contract_forbids(g.clause)
        assert listed <= PROBES.keys(), f"add a probe for {sorted(listed - PROBES.keys())}"
        caught = detected(tuple(g.forbidden))
        assert caught == listed, (
            f"{stage}.{g.name}: forbidden but not in [{g.clause}]: {sorted(caught - listed)}; "
            f"in [{g.clause}] but not caught: {sorted(listed - caught)}"
        )


@pytest.fixture(scope="module")
def caught_as_the_child_watches() -> dict[str, list[str]]:
    """``guarded`` for every graded name, in a process set up as the grading child is:
    torch.compile off, as the child's environment turns it (the detector watches the aten
    operators itself wherever torch.compile is on)."""
    code = (
        "import json; from tests.test_curriculum import SPECS, guarded\n"
        "print(json.dumps({f'{s}.{g.name}': sorted(guarded(tuple(g.forbidden)))"
        " for s, spec in SPECS.items() for g in spec.graded}))\n"
    )
    env = {**os.environ, "TORCH_COMPILE_DISABLE": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("stage", stage_ids())
def test_the_grading_childs_kernel_guard_catches_what_the_dispatch_mode_does(
    stage, caught_as_the_child_watches
):
    """The grading child leaves the aten operators to its KernelGuard (no dispatch mode):
    every probe the self-check's detector catches, the guard stops, and nothing more."""
    for g in SPECS[stage].graded:
        got = set(caught_as_the_child_watches[f"{stage}.{g.name}"])
        assert got == detected(tuple(g.forbidden)), (stage, g.name)


# A graded name that runs the student's code of another graded name, and that name.
RUNS = {
    ("02_multihead", "MultiHeadAttention"): ("01_attention", "scaled_dot_product_attention"),
    ("06_transformer_block", "PositionwiseFeedForward"): ("06_transformer_block", "gelu"),
    ("06_transformer_block", "TransformerEncoderLayer"): ("02_multihead", "MultiHeadAttention"),
    ("09_mini_bert", "BertModel"): ("06_transformer_block", "TransformerEncoderLayer"),
    ("09_mini_bert", "load_pretrained"): ("06_transformer_block", "TransformerEncoderLayer"),
    ("10_gpt", "GPTBlock"): ("02_multihead", "MultiHeadAttention"),
    ("10_gpt", "GPT"): ("02_multihead", "MultiHeadAttention"),
    ("10_gpt", "greedy_decode"): ("02_multihead", "MultiHeadAttention"),
    ("10_gpt", "sample"): ("02_multihead", "MultiHeadAttention"),
    ("11_transfer", "BertForSequenceClassification"): ("09_mini_bert", "BertModel"),
    ("11_transfer", "BertForTokenClassification"): ("09_mini_bert", "BertModel"),
    ("11_transfer", "load_backbone"): ("09_mini_bert", "load_pretrained"),
    ("11_transfer", "hidden_states"): ("09_mini_bert", "BertModel"),
}


@pytest.mark.parametrize(("later", "earlier"), sorted(RUNS.items()), ids=lambda k: f"{k[0][:2]}.{k[1]}")
def test_a_name_forbids_nothing_that_the_code_it_runs_may_call(later, earlier):
    """[conventions.forbidden]: 09 ran a 06 that called F.gelu in its feed-forward network,
    allowed there, and forbade it."""
    assert earlier[0] == later[0] or earlier[0] in requires(later[0])
    extra = detected(tuple(_graded(*later).forbidden)) - detected(tuple(_graded(*earlier).forbidden))
    assert not extra, f"{later[1]} forbids {sorted(extra)}, which {earlier[1]} allows"


@pytest.mark.parametrize("stage", stage_ids())
def test_cases_use_only_the_float_dtypes_of_the_contract(stage):
    """[conventions.dtypes]: a stage headed "float64" (04) is called with float64 only."""
    title = _headings()[stage]["title"]
    allowed = (
        {torch.float64} if "float64" in title and "float32" not in title else {torch.float32, torch.float64}
    )
    for g in SPECS[stage].graded:
        floats = {t.dtype for t in g.tests if t.dtype.is_floating_point}
        assert floats <= allowed, (
            f"{stage}.{g.name} is graded in {floats - allowed}, which [{g.clause}] never asks for"
        )


def test_every_result_carries_its_clause():
    stages = []
    for spec in SPECS.values():
        tests = [
            results.TestResult(
                spec.id, g.name, t.group, f"{spec.number}.{i}", t.points, 0.0, t.hidden, [], [], ""
            )
            for g in spec.graded
            for i, t in enumerate(g.tests, 1)
        ]
        stages.append(results.StageResult(spec.id, None, tests, []))
    entries = to_gradescope(results.SubmissionResult("s", stages))["tests"]
    for entry in entries:
        clauses = [tag.removeprefix("clause:") for tag in entry["tags"] if tag.startswith("clause:")]
        function = next(tag.removeprefix("function:") for tag in entry["tags"] if tag.startswith("function:"))
        stage = next(tag.removeprefix("stage:") for tag in entry["tags"] if tag.startswith("stage:"))
        assert clauses == [_graded(stage, function).clause], entry["name"]
        assert clauses[0] in CLAUSES


def test_a_clause_of_another_stage_is_refused():
    g = dataclasses.replace(SPECS["01_attention"].graded[0], clause="02.softmax", variants=())
    with pytest.raises(ValueError, match="clause"):
        StageSpec("01_attention", "t", (g,), {})


# -- the two misgrades issue 17 measured ---------------------------------------------------------

ADA = ROOT / "examples" / "class" / "ada_correct_matmul"


def _copy(stages: list[str], into: Path, patch: dict[str, tuple[str, str]]) -> Path:
    """ada's correct files of ``stages`` in ``into``, with one line replaced in some."""
    into.mkdir()
    for stage in stages:
        shutil.copy(ADA / f"{stage}.py", into)
    for stage, (old, new) in patch.items():
        path = into / f"{stage}.py"
        source = path.read_text()
        assert source.count(old) == 1, f"{stage}: {old!r} is not in ada's file once"
        path.write_text(source.replace(old, new))
    return into


def test_a_word2vec_whose_sigmoid_always_returns_float64_keeps_every_point(grader, tmp_path):
    """The contract says 04 is numpy float64: a sigmoid that computes in float64 whatever
    it is given is correct (it lost 0.5 on "float32 keeps its dtype")."""
    stage = "04_word2vec"
    old = "return 1.0 / (1.0 + np.exp(-x))"
    new = "return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))"
    result = grader.grade(_copy([stage], tmp_path / "s", {stage: (old, new)}), [stage])
    failed = [t.output for t in result.stages[0].tests if not t.passed]
    assert result.score == SPECS[stage].max_score, failed


def test_a_mini_bert_on_a_06_whose_feed_forward_calls_the_library_gelu_keeps_every_point(grader, tmp_path):
    """06 forbids the library GELU in `gelu` only, so this 06 scores full marks; 09 runs it
    and forbade `aten::gelu` (2/14)."""
    old = "return self.linear2(gelu(self.linear1(x)))"
    new = "return self.linear2(torch.nn.functional.gelu(self.linear1(x)))"
    stages = ["01_attention", "02_multihead", "06_transformer_block", "09_mini_bert"]
    submission = _copy(stages, tmp_path / "s", {"06_transformer_block": (old, new)})
    result = grader.grade(submission, ["06_transformer_block", "09_mini_bert"])
    for r in result.stages:
        failed = [t.output for t in r.tests if not t.passed]
        assert r.score == SPECS[r.stage].max_score, (r.stage, failed)

"""Mistakes named in every stage (``check.GENERIC_MISCONCEPTIONS``): the right values
returned in another order (``returns-swapped``), or in another dtype (``dtype-hard-coded``:
another precision; ``dtype-wrong-kind``: 0/1 numbers for a mask, floats for indices).

Recognised by ``check_case`` from what was returned, in every stage, with no variant in
any spec; named with a hint wherever a spec's mistakes are (messages, Gradescope tags and
hidden tests, the HTML feedback, the notebook self-check). Never on a passing case, never
in place of a stage's own mistake.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
from dataclasses import replace
from functools import cache
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

import reference
from autograder.grader import batch, feedback, public
from autograder.grader.gradescope import student_view
from autograder.grader.plan import StagePlan
from autograder.grader.report import markdown
from autograder.grader.visibility import for_students
from autograder.runtime import selfcheck
from autograder.runtime.check import FLOAT32, GENERIC_MISCONCEPTIONS, check_case, returned_in_order
from autograder.stages import all_specs, stage_ids
from autograder.stages.spec import build_case
from tests.support import ROOT

SPECS = {s.id: s for s in all_specs()}
GENERIC = set(GENERIC_MISCONCEPTIONS)
SWAPPED, HARD_CODED, WRONG_KIND = "returns-swapped", "dtype-hard-coded", "dtype-wrong-kind"

# How many leading outputs of a multi-output name are the values the student's code
# returns, in the signature's order; the rest a driver computes itself. Only those can be
# "returned in another order". A new driver whose outputs are not simply what the student
# returns must be listed here, with the reason.
RETURNED = {
    ("05_normalization", "batchnorm_forward"): (
        0,
        "six outputs gathered over four calls and from bn_param; the student returns (out, cache)",
    ),
    ("07_bert_pretraining", "create_instances_from_document"): (
        0,
        "the student returns a list of TrainingInstance, which the driver reads field by field",
    ),
    ("07_bert_pretraining", "mask_tokens"): (0, "statistics the driver computes over 600 calls"),
    ("07_bert_pretraining", "create_masked_lm_predictions"): (3, "the 4th output is the rng's next draws"),
    ("07_bert_pretraining", "BertPretrainingHeads"): (2, "the 3rd output is the driver's test of the tying"),
    ("11_transfer", "freeze_backbone"): (
        0,
        "the student returns nothing: the driver reads requires_grad and .grad after a backward pass",
    ),
    ("11_transfer", "param_groups"): (
        0,
        "the student returns AdamW's groups, which the driver turns into per-parameter weight decays "
        "and runs N steps with",
    ),
    ("11_transfer", "linear_schedule_with_warmup"): (
        0,
        "the student returns a scheduler, which the driver steps and reads the learning rates of",
    ),
    ("10_gpt", "to_gpt2_state_dict"): (0, "the student returns a dict, which the driver reads key by key"),
    ("10_gpt", "greedy_decode"): (0, "the student returns the tokens; the 2nd output is the driver's record"),
    ("10_gpt", "filter_logits"): (0, "the student returns the logits, which the driver splits in two"),
    ("10_gpt", "sample"): (0, "the student returns the tokens; the driver records the calls, draws again"),
    ("12_seq2seq", "Seq2SeqTransformer"): (
        0,
        "the driver gathers encode's memory, decode's (logits, weights) and the forward's logits from three calls",
    ),
    ("12_seq2seq", "greedy_decode"): (
        0,
        "the student returns the tokens; the 2nd output is the driver's count",
    ),
}


@cache
def _plan(stage: str) -> StagePlan:
    return StagePlan.build(SPECS[stage], "cpu", hidden=False)


def _item(kind: str, t: torch.Tensor) -> tuple:
    """One output as the child (or the self-check's harness) describes it."""
    return (kind, t, {"device": "cpu", "dtype": str(t.dtype), "type": "torch.Tensor"})


def _kinds(exp) -> list[str]:
    return [exp.returns] * len(exp.outputs) if isinstance(exp.returns, str) else list(exp.returns)


def _check(stage: str, pc, outputs, kinds=None):
    exp = pc.expectation
    items = [_item(k, t) for k, t in zip(kinds or _kinds(exp), outputs, strict=True)]
    return check_case(pc.label, "ok", {}, items, exp, SPECS[stage].misconceptions)


def _cases(stage: str):
    return _plan(stage).cases


def _first(stage: str, name: str, dtype: torch.dtype | None = None):
    return next(p for p in _cases(stage) if p.graded.name == name and dtype in (None, p.test.dtype))


def _returned(stage: str, graded) -> int:
    return RETURNED.get((stage, graded.name), (len(graded.outputs), ""))[0]


def _other_precision(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` as a hard-coded dtype would leave it: the other float precision, int32 for
    int64. None where the values would not survive (beyond int32's range)."""
    if t.dtype == torch.float64:
        return t.float()
    if t.dtype == torch.float32:
        return t.double()
    if t.dtype == torch.int64:
        info = torch.iinfo(torch.int32)
        ok = t.numel() == 0 or (int(t.min()) >= info.min and int(t.max()) <= info.max)
        return t.int() if ok else None
    return None


def _other_kinds(t: torch.Tensor) -> list[torch.Tensor]:
    """``t`` in another kind of dtype, the values unchanged: a bool mask as 0/1 integers or
    floats, integers as floats (only where float64 holds them exactly: the rng's 63-bit
    draws it does not)."""
    if t.dtype == torch.bool:
        return [t.long(), t.float(), t.to(torch.uint8)]
    if t.dtype == torch.int64 and (t.numel() == 0 or int(t.abs().max()) < 2**53):
        return [t.double()]
    return []


# -- the generic ids are ours ---------------------------------------------------------------


def test_no_stage_spec_reuses_a_generic_id():
    for spec in SPECS.values():
        assert not set(spec.misconceptions) & GENERIC, spec.id


def test_the_signature_says_which_outputs_are_returned_in_order():
    for spec in SPECS.values():
        for g in spec.graded:
            if len(g.outputs) > 1:
                expected = _returned(spec.id, g)
                assert returned_in_order(g.signature, g.outputs) == expected, (spec.id, g.name, g.signature)
    assert returned_in_order("f(x) -> (a (B, L), b [x, y], c)", ["a", "b", "c"]) == 3
    assert returned_in_order("f(x) -> (a, b)", ["b", "a"]) == 0
    assert returned_in_order("f(x) -> a", ["a"]) == 0


# -- every stage: outputs returned in another order ----------------------------------------


# the stages with a name whose outputs a student returns as a tuple (not every stage has one)
ORDERED = [s for s in stage_ids() if any(_returned(s, g) >= 2 for g in SPECS[s].graded)]


@pytest.mark.parametrize("stage", ORDERED)
def test_outputs_returned_in_another_order_are_named_in_every_stage(stage):
    detected: dict[str, int] = {}
    for pc in _cases(stage):
        outputs, n = pc.expectation.values, len(pc.graded.outputs)
        k = _returned(stage, pc.graded)
        if n < 2:
            continue
        kinds = _kinds(pc.expectation)
        for i in range(n):
            for j in range(i + 1, n):
                swapped = list(outputs)
                swapped[i], swapped[j] = outputs[j], outputs[i]
                swapped_kinds = list(kinds)
                swapped_kinds[i], swapped_kinds[j] = kinds[j], kinds[i]
                result = _check(stage, pc, swapped, swapped_kinds)
                if result.passed:  # both hold the same values on this case: nothing to see
                    continue
                where = (pc.graded.name, pc.label, i, j, result.message)
                if j < k:
                    assert result.misconceptions == [SWAPPED], where
                    assert "your outputs are the expected ones in another order" in result.message, where
                    assert f"likely mistake [{SWAPPED}]: {GENERIC_MISCONCEPTIONS[SWAPPED]}" in result.text
                    detected[pc.graded.name] = detected.get(pc.graded.name, 0) + 1
                else:  # an output the driver computes: its place is no return order
                    assert SWAPPED not in result.misconceptions, where
        if k == 3 and n >= 3:  # a rotation is no swap of two: the order is still found
            rotated = [outputs[1], outputs[2], outputs[0], *outputs[3:]]
            result = _check(stage, pc, rotated, [kinds[1], kinds[2], kinds[0], *kinds[3:]])
            if not result.passed:
                assert result.misconceptions == [SWAPPED], result.message
    multi = {g.name for g in SPECS[stage].graded if _returned(stage, g) >= 2}
    assert set(detected) == multi, f"never detected: {multi - set(detected)}"


def test_the_message_says_which_order_was_returned():
    stage = "01_attention"
    pc = _first(stage, "scaled_dot_product_attention")
    out, weights = pc.expectation.values
    result = _check(stage, pc, [weights, out])
    assert "you return (weights, out), expected (out, weights)" in result.message
    assert result.message.startswith("`out`: expected shape")  # the usual lines stay first


# -- every stage: outputs in another dtype ---------------------------------------------------


@pytest.mark.parametrize("stage", stage_ids())
def test_outputs_in_another_dtype_are_named_in_every_stage(stage):
    tried = {HARD_CODED: 0, WRONG_KIND: 0}
    for pc in _cases(stage):
        outputs = pc.expectation.values
        for i, t in enumerate(outputs):
            changed = [(HARD_CODED, _other_precision(t))] + [(WRONG_KIND, u) for u in _other_kinds(t)]
            for mid, u in changed:
                if u is None:
                    continue  # e.g. the rng's 63-bit draws do not fit an int32
                result = _check(stage, pc, [u if k == i else o for k, o in enumerate(outputs)])
                where = (pc.graded.name, pc.label, pc.graded.outputs[i], u.dtype, result.message)
                assert not result.passed and result.misconceptions == [mid], where
                assert f"likely mistake [{mid}]: {GENERIC_MISCONCEPTIONS[mid]}" in result.text
                tried[mid] += 1
        floats = [o.float() if o.dtype == torch.float64 else o for o in outputs]
        if any(o.dtype == torch.float64 for o in outputs):  # `.float()` on everything returned
            result = _check(stage, pc, floats)
            assert result.misconceptions == [HARD_CODED], (pc.graded.name, pc.label, result.message)
    assert tried[HARD_CODED] > 0


def test_a_float64_result_computed_in_float32_is_named_not_only_cast():
    """Computed in float32 from the start (``.float()`` on the inputs), not just rounded:
    within float32's tolerance of the float64 result."""
    stage = "01_attention"
    pc = _first(stage, "scaled_dot_product_attention", torch.float64)
    case = next(c for c in pc.test.cases if c.label == pc.label)
    data = build_case(SPECS[stage], pc.graded, pc.test, case)
    assert data.kwargs["mask"].dtype == torch.bool  # only q, k, v are floats
    q, k, v = (a.float() for a in data.args)
    out, weights = reference.load(stage).scaled_dot_product_attention(q, k, v, **data.kwargs)
    result = _check(stage, pc, [out, weights])
    assert result.misconceptions == [HARD_CODED], result.message
    assert "expected dtype torch.float64, got torch.float32" in result.message


@pytest.mark.parametrize("stage", ORDERED)
def test_swapped_and_cast_are_both_named(stage):
    named = 0
    for pc in _cases(stage):
        exp = pc.expectation
        if _returned(stage, pc.graded) < 2 or exp.values[0].dtype != torch.float64:
            continue
        out = [o.float() if o.dtype == torch.float64 else o for o in exp.values]
        out[0], out[1] = out[1], out[0]
        kinds = _kinds(exp)
        kinds[0], kinds[1] = kinds[1], kinds[0]
        result = _check(stage, pc, out, kinds)
        if result.passed:
            continue
        assert result.misconceptions == [SWAPPED, HARD_CODED], (pc.graded.name, result.message)
        named += 1
    assert named > 0


@pytest.mark.parametrize("stage", stage_ids())
def test_a_stage_mistake_made_in_another_dtype_is_named_with_it(stage):
    """A spec's mistake keeps its name when it is made in float32 on a float64 case; the
    dtype is named after it. Not where the float32 values fit the reference just as well."""
    named = 0
    for pc in _cases(stage):
        exp = pc.expectation
        for mid, outs in exp.variants:
            if mid == FLOAT32:  # generic itself: see test_float32_intermediates_*
                continue
            cast = [o.float() if o.dtype == torch.float64 else o for o in outs]
            if all(c.dtype == o.dtype for c, o in zip(cast, outs, strict=True)):
                continue
            as_is = _check(stage, pc, outs)
            if as_is.passed or mid not in as_is.misconceptions:
                continue  # this variant does not tell itself apart on this case
            result = _check(stage, pc, cast)
            if result.misconceptions == [HARD_CODED]:  # fits the reference in float32 too
                continue
            assert result.misconceptions[-1] == HARD_CODED, result.message
            if result.misconceptions[: len(as_is.misconceptions)] != as_is.misconceptions:
                # two mistakes of the stage that float32's tolerance cannot tell apart on this
                # case (eps left out or added to the std, where eps is tiny): the one named
                # must fit the cast values as well as this one does
                for other in result.misconceptions[:-1]:
                    assert any(
                        m == other
                        and all(
                            torch.allclose(c.double(), o.double(), rtol=1e-4, atol=1e-5, equal_nan=True)
                            for c, o in zip(cast, outs2, strict=True)
                        )
                        for m, outs2 in exp.variants
                    ), result.message
            assert not set(result.misconceptions) & {SWAPPED, WRONG_KIND}, result.message
            named += 1
    has_float64_variants = any(
        v.dtype == torch.float64 for pc in _cases(stage) for _, outs in pc.expectation.variants for v in outs
    )
    assert named > 0 or not has_float64_variants


# -- never a false positive ---------------------------------------------------------------


@pytest.mark.parametrize("stage", stage_ids())
def test_reference_outputs_pass_with_nothing_named(stage):
    for pc in _cases(stage):
        result = _check(stage, pc, pc.expectation.values)
        assert result.passed and result.misconceptions == [], (pc.graded.name, pc.label, result.message)
        assert "likely mistake" not in result.text


@pytest.mark.parametrize("stage", stage_ids())
def test_a_stage_mistake_is_named_alone_never_masked(stage):
    """A variant's own outputs name the stage's mistake(s) and no generic one."""
    for pc in _cases(stage):
        for mid, outs in pc.expectation.variants:
            if mid == FLOAT32:
                continue
            result = _check(stage, pc, outs)
            if not result.passed:
                assert mid in result.misconceptions and not set(result.misconceptions) & GENERIC, (
                    pc.graded.name,
                    pc.label,
                    result.message,
                )


def test_near_misses_are_not_named():
    """What is not a reordering or a cast of the right values is not named one."""
    stage = "01_attention"
    pc = _first(stage, "scaled_dot_product_attention", torch.float64)
    out, weights = pc.expectation.values
    assert _check(stage, pc, [weights * 1.01, out]).misconceptions == []  # swapped, but one value is wrong
    assert _check(stage, pc, [out, out]).misconceptions == []
    # float32 where float64 is expected: named within float32's tolerance, not beyond it
    assert _check(stage, pc, [(out * (1 + 1e-6)).float(), weights]).misconceptions == [HARD_CODED]
    assert _check(stage, pc, [(out * (1 + 1e-3)).float(), weights]).misconceptions == []
    pc = _first(stage, "scaled_dot_product_attention", torch.float32)
    out, weights = pc.expectation.values
    # a hard-coded .half() is held to float16's tolerance: right values, named; wrong ones not
    assert _check(stage, pc, [out.half(), weights]).misconceptions == [HARD_CODED]
    assert _check(stage, pc, [(out * 1.05).half(), weights]).misconceptions == []
    stage = "08_qa_span"
    pc = _first(stage, "SpanHead")
    start, end = pc.expectation.values
    assert _check(stage, pc, [end, start * 1.001]).misconceptions == []  # same shapes, one value off
    pc = _first(stage, "best_span")
    start, end = pc.expectation.values
    assert _check(stage, pc, [start, start]).misconceptions == []  # one output twice is no order
    assert _check(stage, pc, [start.double() + 0.5, end]).misconceptions == []  # not integers
    stage = "01_attention"
    pc = _first(stage, "padding_mask")
    (mask,) = pc.expectation.values
    assert _check(stage, pc, [mask.float() * 0.5]).misconceptions == []  # 0.5 is not True
    assert _check(stage, pc, [mask.long() * 2]).misconceptions == []


# -- end to end: a graded notebook, Gradescope, the HTML feedback, the self-check ----------

STAGE = "01_attention"
SOLUTION = ROOT / "solutions" / STAGE / f"{STAGE}.ipynb"
RETURN = "    return out, weights\n"
INPUTS = "    d_k = q.size(-1)\n"


def _solution(tmp: Path, old: str, new: str) -> Path:
    """The stage's solution notebook with one edit, beside its self-check data as this
    machine makes it (``generate``): the expected values the grader compares against here,
    to the bit. The committed data may come from other CPU kernels (a few ulps apart)."""
    nb = nbformat.read(SOLUTION, as_version=4)
    sources = [c.source for c in nb.cells]
    (i,) = [k for k, s in enumerate(sources) if old in s and "def scaled_dot_product_attention" in s]
    nb.cells[i].source = sources[i].replace(old, new)
    tmp.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, tmp / f"{STAGE}.ipynb")
    public.write(SPECS[STAGE], tmp)
    return tmp


MUTANTS = {
    SWAPPED: (RETURN, "    return weights, out\n"),
    HARD_CODED: (INPUTS, "    q, k, v = q.float(), k.float(), v.float()\n" + INPUTS),
}


@pytest.fixture(scope="module")
def graded(grader, tmp_path_factory):
    out = {}
    for mid, (old, new) in MUTANTS.items():
        folder = _solution(tmp_path_factory.mktemp(mid), old, new)
        out[mid] = (folder, grader.grade(folder, [STAGE]))
    return out


@pytest.mark.parametrize("mid", list(MUTANTS))
def test_a_graded_submission_is_tagged_and_hinted_in_public_and_hidden_tests(graded, mid):
    _, result = graded[mid]
    (stage,) = result.stages
    hint = GENERIC_MISCONCEPTIONS[mid]
    losing = [t for t in stage.tests if not t.passed]
    assert losing and {t.function for t in losing} == {"scaled_dot_product_attention"}
    if mid == HARD_CODED:  # float32 cases pass; float64 ones lose points
        assert all(t.group.startswith("float64") for t in losing)
        assert all(t.passed for t in stage.tests if t.group.startswith("float32"))
    named = [t for t in losing if t.misconceptions]
    assert {t.hidden for t in named} == {True, False}
    assert all(t.misconceptions == [mid] for t in named), [(t.group, t.output) for t in losing]
    assert all(t.misconceptions == [] for t in stage.tests if t.passed)
    view = student_view(result)
    by_name = {e["name"]: e for e in view["tests"]}
    for t in named:
        entry = by_name[t.name]
        assert f"misconception:{mid}" in entry["tags"]
        line = f"likely mistake [{mid}]: {hint}"
        # Gradescope's text is Markdown (output_format md): the same line, escaped
        assert (markdown(line) if entry.get("output_format") == "md" else line) in entry["output"], entry[
            "output"
        ]
        if t.hidden:  # the hint, and no case of it
            assert "hidden cases passed" in entry["output"] and "✗" not in entry["output"]
        else:
            assert "✗" in entry["output"]
    if mid == SWAPPED:
        public = next(by_name[t.name]["output"] for t in named if not t.hidden)
        assert "you return (weights, out), expected (out, weights)" in public


def test_the_html_feedback_shows_the_hint_on_hidden_and_public_tests(graded):
    _, result = graded[SWAPPED]
    page = feedback.render_html(result)
    callouts = re.findall(r'<div class="callout hint">(.*?)</div>', page, re.S)
    losing = [t for t in for_students(result).stages[0].tests if SWAPPED in t.misconceptions]
    assert any(t.hidden for t in losing) and len(callouts) == len(losing)
    # the hint as the page shows a message: escaped, its `code` spans as <code>
    shown = re.sub(r"`([^`\n]+)`", r"<code>\1</code>", html.escape(GENERIC_MISCONCEPTIONS[SWAPPED]))
    assert all(shown in c for c in callouts), callouts


def test_hidden_tests_keep_generic_ids_and_drop_unknown_ones(graded):
    """The visibility rule: a hidden test shows only ids with trusted hints; the generic
    ones have ours."""
    _, result = graded[SWAPPED]
    stage = result.stages[0]
    t = next(t for t in stage.tests if t.hidden)
    ids = [SWAPPED, HARD_CODED, "not-a-mistake"]
    forged = replace(
        t,
        score=0.0,
        misconceptions=ids,
        cases=[replace(c, passed=False, misconceptions=ids) for c in t.cases],
    )
    shown = for_students(replace(result, stages=[replace(stage, tests=[forged])])).stages[0].tests[0]
    assert shown.misconceptions == [SWAPPED, HARD_CODED]
    assert all(c.misconceptions == [SWAPPED, HARD_CODED] for c in shown.cases)
    for mid in (SWAPPED, HARD_CODED):
        assert f"likely mistake [{mid}]: {GENERIC_MISCONCEPTIONS[mid]}" in shown.output
    assert "not-a-mistake" not in shown.output


def test_the_class_summary_counts_them_like_a_stage_mistake(graded):
    """``batch``'s summary (what to go over in the next lecture) counts each named id once
    per student, generic or not, from the stored grades."""
    rows = [
        {
            "student": mid,
            "stage": STAGE,
            "fingerprint": mid,
            "score": result.stages[0].score,
            "max_score": result.stages[0].max_score,
            "result": json.dumps(dataclasses.asdict(result.stages[0])),
        }
        for mid, (_, result) in graded.items()
    ]
    (summary,) = batch.summarise(rows, top=5)
    assert sorted(summary.mistakes) == sorted((mid, 1) for mid in MUTANTS)


def _namespace(folder: Path) -> dict:
    """The notebook's definitions, run as a kernel would (its self-check cells left out)."""
    nb = nbformat.read(folder / f"{STAGE}.ipynb", as_version=4)
    ns: dict = {"__name__": "__main__"}
    for c in nb.cells:
        lines = [x for x in c.source.splitlines() if x.strip()]
        imports = all(x.startswith(("import ", "from ")) for x in lines)
        if c.cell_type == "code" and (imports or "\ndef " in c.source):
            exec(compile(c.source, "<cell>", "exec"), ns)
    return ns


@pytest.mark.parametrize("mid", list(MUTANTS))
def test_the_notebook_self_check_names_it_with_the_graders_message(graded, mid):
    folder, result = graded[mid]
    fn = _namespace(folder)["scaled_dot_product_attention"]
    report = selfcheck.check(fn, data=folder / f"{STAGE}.selfcheck.safetensors")
    assert not report.passed and report.misconceptions == [mid]
    assert report.hints[mid] == GENERIC_MISCONCEPTIONS[mid]
    assert f"likely mistake [{mid}]: {GENERIC_MISCONCEPTIONS[mid]}" in str(report)
    # the grader's message for the same public case, word for word
    graded_cases = {
        (t.group, c.label): c
        for t in result.stages[0].tests
        if not t.hidden and t.function == fn.__name__
        for c in t.cases
    }
    for g in report.groups:
        for c in g.cases:
            assert graded_cases[(g.group, c.label)].text == c.text
    # The data shipped to students was computed where the CPU kernels (MKL's exp, oneDNN,
    # torch's vectorised code) may round the last bit otherwise: within each case's tolerance
    # (tests/test_selfcheck_data.py), never to the bit. A figure computed from those bits
    # may differ (a float32 case that passes with an error of 0 here shows 1.5e-08 against
    # values from another CPU); what a student acts on may not: each case's verdict, the
    # mistakes named, and the words of the message.
    shipped = selfcheck.check(fn, data=ROOT / "assignments" / STAGE / public.selfcheck_file(STAGE))
    assert [(g.group, [c.label for c in g.cases]) for g in shipped.groups] == [
        (g.group, [c.label for c in g.cases]) for g in report.groups
    ]
    for g in shipped.groups:
        for c in g.cases:
            want = graded_cases[(g.group, c.label)]
            assert (c.passed, c.misconceptions) == (want.passed, want.misconceptions), (g.group, c.label)
            assert _words(c.text) == _words(want.text), (g.group, c.label, c.text, want.text)


_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _words(text: str) -> str:
    """A message with each figure (an error, a value, an index) replaced by ``#``."""
    return _NUMBER.sub("#", text)


def test_the_numpy_self_check_names_float32_arrays_and_swapped_gradients():
    ref = reference.load("04_word2vec")
    data = ROOT / "assignments" / "04_word2vec" / "04_word2vec.selfcheck.safetensors"

    def float32_gradients(center_vec, outside_idx, outside_vectors):
        loss, gc, go = ref.naive_softmax_loss_and_gradient(center_vec, outside_idx, outside_vectors)
        return loss, gc.astype(np.float32), go.astype(np.float32)

    def swapped_gradients(center_vec, outside_idx, outside_vectors):
        loss, gc, go = ref.naive_softmax_loss_and_gradient(center_vec, outside_idx, outside_vectors)
        return loss, go, gc

    name = "naive_softmax_loss_and_gradient"
    report = selfcheck.check(float32_gradients, name=name, data=data)
    assert report.misconceptions == [HARD_CODED], str(report)
    report = selfcheck.check(swapped_gradients, name=name, data=data)
    assert report.misconceptions == [SWAPPED], str(report)
    assert "you return (loss, grad_outside_vectors, grad_center_vec)" in str(report)


# -- float32 intermediates, size-1 axes: real students' forms ---------------------------------

_W2V = reference.load("04_word2vec")


def _naive_softmax_in_float32(center_vec, outside_idx, outside_vectors):
    """A port of float32 code: everything computed in float32, the results cast back."""
    v_c, u = center_vec.astype(np.float32), outside_vectors.astype(np.float32)
    loss, grad_c, grad_u = _W2V.naive_softmax_loss_and_gradient(v_c, outside_idx, u)
    return float(loss), grad_c.astype(np.float64), grad_u.astype(np.float64)


def _attention_scale_in_float32(q, k, v, mask=None):
    """1/sqrt(d_k) from `torch.sqrt(torch.tensor(...))`: a float32 scalar in float64 attention."""
    scores = q @ k.transpose(-2, -1) / torch.sqrt(torch.tensor(float(q.size(-1))))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@pytest.mark.parametrize(
    ("stage", "name", "fn"),
    [
        ("04_word2vec", "naive_softmax_loss_and_gradient", _naive_softmax_in_float32),
        ("01_attention", "scaled_dot_product_attention", _attention_scale_in_float32),
    ],
)
def test_float32_intermediates_are_named_on_float64_cases(stage, name, fn):
    from tests.support import case_results

    results = case_results(_plan(stage), {name: fn, "softmax": reference.load("01_attention").softmax}, name)
    failing = [(pc, r) for pc, r in results if not r.passed]
    assert failing, "every case passed: the float32 detour was not seen"
    for pc, r in failing:
        assert pc.test.dtype == torch.float64, r.message
        assert r.misconceptions == [FLOAT32], (pc.label, r.message)
        assert f"likely mistake [{FLOAT32}]: {GENERIC_MISCONCEPTIONS[FLOAT32]}" in r.text


def test_every_float64_case_can_name_float32_intermediates():
    """The reference's own float32 values name it on every float64 case they fail, and a
    value off by more than float32 rounding does not."""
    seen = 0
    for stage in stage_ids():
        for pc in _cases(stage):
            lower = [outs for mid, outs in pc.expectation.variants if mid == FLOAT32]
            if pc.test.dtype != torch.float64:
                assert not lower, (stage, pc.label)
                continue
            for outs in lower:
                result = _check(stage, pc, outs)
                if result.passed:
                    continue
                assert result.misconceptions == [FLOAT32], (stage, pc.label, result.message)
                seen += 1
                off = [o + 1e-2 * (o.abs() + 1) if o.is_floating_point() else o for o in outs]
                assert FLOAT32 not in _check(stage, pc, off).misconceptions, (stage, pc.label)
    assert seen > 20


def _naive_softmax_column_vectors(center_vec, outside_idx, outside_vectors):
    """CS224n's column-vector habit: v_c as (d, 1), so the loss is a (1,) array and
    grad_center_vec (d, 1)."""
    v_c = center_vec.reshape(-1, 1)
    scores = outside_vectors @ v_c  # (V, 1)
    y_hat = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    loss = -np.log(y_hat[outside_idx])  # (1,)
    delta = y_hat.copy()
    delta[outside_idx] -= 1
    return loss, outside_vectors.T @ delta, delta @ v_c.T


def _padding_mask_2d(lengths, max_len):
    return torch.arange(max_len)[None, :] < lengths[:, None]


@pytest.mark.parametrize(
    ("stage", "name", "fn"),
    [
        ("04_word2vec", "naive_softmax_loss_and_gradient", _naive_softmax_column_vectors),
        ("01_attention", "padding_mask", _padding_mask_2d),
    ],
)
def test_values_right_but_for_size_1_axes_are_named_shape_squeezable(stage, name, fn):
    from tests.support import case_results

    results = case_results(_plan(stage), {name: fn}, name)
    assert results and not any(r.passed for _, r in results)
    for pc, r in results:
        assert r.misconceptions == ["shape-squeezable"], (pc.label, r.message)
        assert "expected shape" in r.message or "expected a Python/numpy number" in r.message, r.message


def test_a_transposed_or_reshaped_output_is_not_called_squeezable():
    pc = _first("01_attention", "scaled_dot_product_attention", torch.float64)
    out, weights = pc.expectation.values
    for wrong in (weights.transpose(-2, -1), weights.reshape(*weights.shape[:-2], -1)[..., None]):
        if wrong.shape == weights.shape:
            continue
        result = _check("01_attention", pc, [out, wrong])
        assert "shape-squeezable" not in result.misconceptions, result.message

"""What particular hidden cases decide (issue 17): defaults, inclusive bounds and multisets
that `make mutation` found no case deciding. Computed on the reference directly, in
milliseconds, so `make test` notices when an edit to a case stops deciding them."""

from __future__ import annotations

import pytest
import torch

import reference
from autograder.stages import load_spec
from autograder.stages.spec import build_case, tolerance_for


def _hidden(stage: str, name: str):
    spec = load_spec(stage)
    g = spec.graded_name(name)
    return [(t, build_case(spec, g, t, c)) for t in g.tests if t.hidden for c in t.cases]


# -- 08_qa_span ---------------------------------------------------------------------------------

QA = reference.load("08_qa_span")


@pytest.mark.stage08
def test_08_best_span_with_the_default_left_out_is_told_from_a_limit_of_29_or_31():
    left_out = [d for _, d in _hidden("08_qa_span", "best_span") if "max_answer_len" not in d.kwargs]
    assert left_out
    for limit in (29, 31):  # 31: a limit taken as inclusive, j <= i + 30
        assert any(
            not torch.equal(torch.stack(QA.best_span(*d.args)), torch.stack(QA.best_span(*d.args, limit)))
            for d in left_out
        ), limit


@pytest.mark.stage08
def test_08_f1_counts_a_word_repeated_in_both_answers_with_its_multiplicity():
    pairs = [p for _, d in _hidden("08_qa_span", "squad_em_f1") for p in d.args[0]]

    def f1_of_sets(prediction, truth):
        p, t = (set(QA._normalize_answer(s).split()) for s in (prediction, truth))
        same = len(p & t)
        return 0.0 if same == 0 else 2 * same / (len(p) + len(t))

    assert any(
        QA.squad_em_f1(prediction, truths)[1] != max(f1_of_sets(prediction, t) for t in truths)
        for prediction, truths in pairs
    )


# -- 09_mini_bert -------------------------------------------------------------------------------

BERT = reference.load("09_mini_bert")


def _forward(name: str, data, dtype, **init):
    module = getattr(BERT, name)(**{**data.init_kwargs, **init})
    module.load_state_dict(data.state)
    module.to(dtype).eval()
    with torch.no_grad():
        return module(*data.args, **data.kwargs)


def _differ(a, b, dtype) -> bool:
    tol = tolerance_for(dtype)
    return not torch.allclose(a, b, rtol=tol.rtol, atol=tol.atol)  # NaN differs from everything


@pytest.mark.stage09
@pytest.mark.parametrize("name", ["BertEmbeddings", "BertModel"])
def test_09_eps_is_graded_at_its_default_and_away_from_it(name):
    calls = _hidden("09_mini_bert", name)
    left_out = [(t, d) for t, d in calls if "eps" not in d.init_kwargs]
    away = [(t, d) for t, d in calls if d.init_kwargs.get("eps", 1e-12) != 1e-12]
    assert left_out and away
    # another default: 0 is told apart only where a LayerNorm input has variance 0
    for wrong in (0.0, 1e-5):
        assert any(
            _differ(_forward(name, d, t.dtype, eps=wrong), _forward(name, d, t.dtype), t.dtype)
            for t, d in left_out
        ), wrong
    # an eps argument that is ignored (the default used whatever is passed)
    assert any(
        _differ(_forward(name, d, t.dtype, eps=1e-12), _forward(name, d, t.dtype), t.dtype) for t, d in away
    )


@pytest.mark.stage09
def test_09_forward_inputs_are_graded_left_out():
    embeddings = _hidden("09_mini_bert", "BertEmbeddings")
    assert any(len(d.args) == 1 for _, d in embeddings)  # forward(input_ids): token types default
    model = _hidden("09_mini_bert", "BertModel")
    assert any(not {"token_type_ids", "attention_mask"} & set(d.kwargs) for _, d in model)


# -- 10_gpt -------------------------------------------------------------------------------------

GPT = reference.load("10_gpt")


@pytest.mark.stage10
def test_10_top_p_left_at_its_default_is_told_from_a_top_p_run_at_one():
    """``if top_p <= 1.0`` (or ``< 2.0``) runs top-p at its default: in exact
    arithmetic that removes nothing, but a token whose probability is below the dtype's
    epsilon has the mass of those before it rounded to 1.0, and is removed."""
    left_out = [d for _, d in _hidden("10_gpt", "filter_logits") if "top_p" not in d.kwargs]
    assert left_out

    def top_p_at_one(logits):
        probs, order = logits.softmax(-1).sort(-1, descending=True)
        remove = probs.cumsum(-1) - probs >= 1.0
        return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))

    assert any(
        not torch.equal(GPT.filter_logits(*d.args, **d.kwargs), top_p_at_one(GPT.filter_logits(*d.args)))
        for d in left_out
    )

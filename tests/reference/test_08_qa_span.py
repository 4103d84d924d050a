"""The stage 08 reference against implementations nobody here wrote:
transformers.BertForQuestionAnswering (head and loss, weights copied), a brute-force
span search, and the official SQuAD v1.1 evaluation logic, re-implemented here
independently from its definition (evaluate-v1.1.py)."""

from __future__ import annotations

import re
import string
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference

ref = reference.load("08_qa_span")
pytestmark = pytest.mark.stage08

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-13)}

# -- SpanHead and span_loss against transformers -------------------------------------------


def _tiny_qa_model(seed: int):
    from transformers import BertConfig, BertForQuestionAnswering

    config = BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=2,
    )
    torch.manual_seed(seed)
    return BertForQuestionAnswering(config).eval()


def _head_with_weights_of(model) -> torch.nn.Module:
    head = ref.SpanHead(model.config.hidden_size)
    # transformers' checkpoint keys qa_outputs.* load by name
    head.load_state_dict({k: v for k, v in model.state_dict().items() if k.startswith("qa_outputs.")})
    return head.eval()


@pytest.mark.parametrize("seed", [0, 1])
def test_whole_tiny_model_matches_transformers(seed):
    """Run transformers' whole model; our head on its sequence output gives its logits,
    and our loss its loss, positions past the end and negative ones included."""
    model = _tiny_qa_model(seed)
    head = _head_with_weights_of(model)
    g = torch.Generator().manual_seed(seed)
    B, L = 6, 9
    input_ids = torch.randint(0, 40, (B, L), generator=g)
    start = torch.tensor([0, 3, 9, -1, 20, 4])  # L and beyond ignored, negative -> 0
    end = torch.tensor([2, 8, 9, 5, -7, 30])
    with torch.no_grad():
        out = model(input_ids, start_positions=start, end_positions=end, output_hidden_states=True)
        s, e = head(out.hidden_states[-1])
    torch.testing.assert_close(s, out.start_logits, **TOL[torch.float32])
    torch.testing.assert_close(e, out.end_logits, **TOL[torch.float32])
    torch.testing.assert_close(ref.span_loss(s, e, start, end), out.loss, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "start,end",
    [
        ([1, 2, 3], [1, 4, 5]),  # all in range
        ([-1, -5, 0], [0, -2, 5]),  # negative -> 0
        ([6, 7, 100], [1, 6, 2]),  # every start ignored (L = 6): 0/0 = nan in both
        ([2, 6, -3], [6, 6, 3]),
    ],
)
def test_head_and_loss_match_transformers_on_given_hidden_states(start, end, dtype):
    """The QA head and loss of transformers (forward on given sequence_output, by hooking the
    encoder's output) in both dtypes."""
    model = _tiny_qa_model(3).to(dtype)
    head = _head_with_weights_of(model).to(dtype)
    B, L = 3, 6
    h = torch.randn(B, L, 16, dtype=dtype, generator=torch.Generator().manual_seed(7))
    start_t, end_t = torch.tensor(start), torch.tensor(end)

    # Replace the encoder's output by h: transformers' head and loss then run on h.
    def replace_sequence_output(module, args, output):
        output["last_hidden_state"] = h
        return output

    handle = model.bert.register_forward_hook(replace_sequence_output)
    try:
        with torch.no_grad():
            out = model(torch.zeros(B, L, dtype=torch.long), start_positions=start_t, end_positions=end_t)
    finally:
        handle.remove()
    with torch.no_grad():
        s, e = head(h)
        loss = ref.span_loss(s, e, start_t, end_t)
    torch.testing.assert_close(s, out.start_logits, **TOL[dtype])
    torch.testing.assert_close(e, out.end_logits, **TOL[dtype])
    if torch.isnan(out.loss):  # every start (or end) ignored: 0/0, in transformers as in ours
        assert torch.isnan(loss)
    else:
        torch.testing.assert_close(loss, out.loss, **TOL[dtype])
    assert loss.shape == ()


def test_loss_gradients_flow_to_the_head():
    head = ref.SpanHead(8)
    h = torch.randn(2, 5, 8)
    s, e = head(h)
    ref.span_loss(s, e, torch.tensor([1, 7]), torch.tensor([3, 2])).backward()
    assert head.qa_outputs.weight.grad is not None and head.qa_outputs.weight.grad.abs().sum() > 0


# -- best_span against a brute-force search -------------------------------------------------


def _brute_force(s, e, mask, max_answer_len):
    """Every allowed (i, j) in lexicographic order; the first strict maximum wins."""
    starts, ends = [], []
    for b in range(s.size(0)):
        best, arg = None, (0, 0)
        L = s.size(1)
        for i in range(L):
            for j in range(L):
                if not (mask[b, i] and mask[b, j] and i <= j < i + max_answer_len):
                    continue
                score = s[b, i].item() + e[b, j].item()
                if best is None or score > best:
                    best, arg = score, (i, j)
        starts.append(arg[0])
        ends.append(arg[1])
    return torch.tensor(starts), torch.tensor(ends)


@settings(max_examples=150, deadline=None)
@given(
    b=st.integers(1, 4),
    length=st.integers(1, 12),
    max_answer_len=st.integers(1, 14),
    high=st.integers(0, 3),
    integer=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_best_span_equals_brute_force(b, length, max_answer_len, high, integer, dtype, seed):
    """Integer logits in [-high, high] tie often (high = 0: every sum ties); masks are random,
    so contexts may have holes or be empty (an empty row is not compared)."""
    g = torch.Generator().manual_seed(seed)
    if integer:
        s = torch.randint(-high, high + 1, (b, length), generator=g).to(dtype)
        e = torch.randint(-high, high + 1, (b, length), generator=g).to(dtype)
    else:
        s = torch.randn(b, length, generator=g, dtype=dtype)
        e = torch.randn(b, length, generator=g, dtype=dtype)
    mask = torch.rand(b, length, generator=g) < 0.7
    start, end = ref.best_span(s, e, mask, max_answer_len)
    want_start, want_end = _brute_force(s.double(), e.double(), mask, max_answer_len)
    assert start.dtype == end.dtype == torch.int64 and start.shape == end.shape == (b,)
    rows = mask.any(dim=-1)
    assert torch.equal(start[rows], want_start[rows]) and torch.equal(end[rows], want_end[rows])
    assert (start <= end).all()


def test_best_span_default_limit_is_30():
    L = 40
    s = torch.zeros(1, L)
    e = torch.zeros(1, L)
    s[0, 2], e[0, 35] = 5.0, 5.0  # the unlimited best span is 34 tokens long
    mask = torch.ones(1, L, dtype=torch.bool)
    assert ref.best_span(s, e, mask) == _brute_force(s, e, mask, 30)
    assert ref.best_span(s, e, mask, 40) == (torch.tensor([2]), torch.tensor([35]))


def test_best_span_ties_go_to_the_smallest_pair():
    s = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    e = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[False, True, True, True]])
    # (1, 1), (1, 2), (2, 2), ... all score 2: the smallest (i, j) is (1, 1)
    assert ref.best_span(s, e, mask) == (torch.tensor([1]), torch.tensor([1]))


# -- squad_em_f1 against the official SQuAD v1.1 logic --------------------------------------


def _official_normalize(s: str) -> str:
    """evaluate-v1.1.py's normalize_answer, written from its definition."""

    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _official_f1(prediction, ground_truth):
    prediction_tokens = _official_normalize(prediction).split()
    ground_truth_tokens = _official_normalize(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def _official_em(prediction, ground_truth):
    return _official_normalize(prediction) == _official_normalize(ground_truth)


def _official(prediction, ground_truths):
    return (
        float(max(_official_em(prediction, t) for t in ground_truths)),
        float(max(_official_f1(prediction, t) for t in ground_truths)),
    )


HAND_MADE = [
    # (prediction, ground truths, expected (em, f1)) worked out by hand
    ("Denver Broncos", ["Denver Broncos"], (1.0, 1.0)),
    ("the Denver Broncos!", ["Denver Broncos"], (1.0, 1.0)),  # article and punctuation
    ("An apple a day", ["apple day"], (1.0, 1.0)),  # articles anywhere
    ("  Levi's   Stadium ", ["levis stadium"], (1.0, 1.0)),  # whitespace, apostrophe, case
    ("Theodore", ["the odore"], (0.0, 0.0)),  # "the" is removed only as a word
    ("Santa Clara, California", ["Santa Clara"], (0.0, 0.8)),  # p = 2/3, r = 1
    ("New York New York", ["New York"], (0.0, 2 / 3)),  # p = 2/4, r = 1: a multiset
    ("Carolina Panthers", ["Denver Broncos", "Carolina"], (0.0, 2 / 3)),  # max over truths
    ("Carolina", ["Panthers", "carolina."], (1.0, 1.0)),
    ("three-point shot", ["three point shot", "threepoint shot"], (1.0, 1.0)),  # hyphen removed, no space
    ("U.S.", ["US"], (1.0, 1.0)),
    ("first, second, and third", ["first second third"], (0.0, 6 / 7)),  # p = 3/4, r = 1
    ("Tesla", ["Nikola Tesla", "Nikola Tesla's motor"], (0.0, 2 / 3)),
]


@pytest.mark.parametrize("prediction,ground_truths,expected", HAND_MADE)
def test_squad_em_f1_hand_made(prediction, ground_truths, expected):
    em, f1 = ref.squad_em_f1(prediction, ground_truths)
    assert isinstance(em, float) and isinstance(f1, float)
    assert (em, f1) == pytest.approx(expected, abs=1e-12)
    assert (em, f1) == pytest.approx(_official(prediction, ground_truths), abs=1e-12)


WORDS = ["a", "an", "the", "The", "Paris", "paris,", "France", "(1879)", "1879", "it's", "its", "A.", "x-y"]


@settings(max_examples=200, deadline=None)
@given(
    prediction=st.lists(st.sampled_from(WORDS), min_size=1, max_size=5),
    truths=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=5), min_size=1, max_size=3),
    sep=st.sampled_from([" ", "  ", "\t", " \n "]),
)
def test_squad_em_f1_equals_official_logic(prediction, truths, sep):
    p = sep.join(prediction)
    gts = [sep.join(t) for t in truths]
    assert ref.squad_em_f1(p, gts) == pytest.approx(_official(p, gts), abs=1e-12)

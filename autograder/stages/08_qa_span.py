"""Stage 08: extractive QA span heads (CURRICULUM.md, 08_qa_span).

``SpanHead`` and ``span_loss`` on random hidden states and logits (positions past the
end and negative ones included); ``best_span`` on integer-valued logits, so that sums
tie and the tie rule is graded, with realistic context masks ([CLS] question [SEP]
context [SEP] padding) and rows whose context logits are all negative; ``squad_em_f1``
through the ``qa:em_f1_table`` driver on hand-made (prediction, ground truths) pairs.
Rows of ``best_span`` without any context position have no answer and are not graded.
"""

from __future__ import annotations

import collections
import re
import string

import torch
from torch import Tensor

import reference
from autograder.stages.spec import Case, CaseData, Dim, Graded, StageSpec, Test, Variant, randint, randn

ref = reference.load("08_qa_span")

# -- SpanHead ---------------------------------------------------------------------------------


def _head_case(b: int, length: int, hidden: int):
    def build(g, dtype):
        state = {
            "qa_outputs.weight": randn(g, 2, hidden, dtype=dtype, scale=hidden**-0.5),
            "qa_outputs.bias": randn(g, 2, dtype=dtype),
        }
        h = randn(g, b, length, hidden, dtype=dtype)
        return CaseData(args=(h,), init_args=(hidden,), state=state)

    return build


def _head_cases(*shapes: tuple[int, int, int]) -> tuple[Case, ...]:
    return tuple(Case(f"B={b}, L={n}, hidden={h}", _head_case(b, n, h)) for b, n, h in shapes)


SPAN_HEAD = Graded(
    name="SpanHead",
    clause="08.SpanHead",
    task=1,
    signature="SpanHead(hidden); forward(h (B, L, hidden)) -> (start_logits (B, L), end_logits (B, L))",
    outputs=("start_logits", "end_logits"),
    reference=ref.SpanHead,
    kind="module",
    small=(_head_case(1, 1, 1), _head_case(1, 2, 1), _head_case(1, 2, 2)),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("L", lambda c: c.args[0].shape[1]),
        Dim("hidden", lambda c: c.init_args[0]),
    ),
    tests=(
        Test("float32", torch.float32, points=1, hidden=False, cases=_head_cases((2, 7, 8), (1, 5, 16))),
        Test("float64", torch.float64, points=1, hidden=False, cases=_head_cases((3, 4, 6))),
        Test(
            "float64, other shapes",
            torch.float64,
            points=1,
            cases=_head_cases((1, 1, 4), (4, 19, 32), (3, 5, 1)),
        ),
        Test("float32, MiniLM's width", torch.float32, points=1, cases=_head_cases((2, 12, 384))),
    ),
)

# -- span_loss --------------------------------------------------------------------------------


def _loss_case(b: int, length: int, positions: list[tuple[int, int]] | None = None, scale: float = 1.0):
    """Random logits; ``positions`` (start, end) per row, or random in-range ones."""

    def build(g, dtype):
        start_logits = randn(g, b, length, dtype=dtype, scale=scale)
        end_logits = randn(g, b, length, dtype=dtype, scale=scale)
        if positions is None:
            start = randint(g, 0, length, b)
            end = torch.minimum(start + randint(g, 0, 3, b), torch.tensor(length - 1))
        else:
            start = torch.tensor([p[0] for p in positions])
            end = torch.tensor([p[1] for p in positions])
        return CaseData(args=(start_logits, end_logits, start, end))

    return build


SPAN_LOSS = Graded(
    name="span_loss",
    clause="08.span_loss",
    task=2,
    signature="span_loss(start_logits, end_logits, start_positions, end_positions) -> scalar tensor",
    outputs=("loss",),
    reference=ref.span_loss,
    # two positions, then a position past the end (ignored) and a negative one (position 0)
    small=(
        _loss_case(1, 2, [(0, 1)]),
        _loss_case(1, 2, [(1, 1)]),
        _loss_case(2, 2, [(0, 2), (-1, 1)]),
        _loss_case(2, 3),
        # logits as large as the graded ones: 0 * log 0, an exp that overflows
        _loss_case(1, 2, [(0, 1)], scale=40.0),
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("L", lambda c: c.args[0].shape[1]),
    ),
    tests=(
        Test(
            "float32, positions inside the sequence",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("B=4, L=6", _loss_case(4, 6)),
                Case("B=1, L=9", _loss_case(1, 9)),
            ),
        ),
        Test(
            "float64, positions past the end and negative",
            torch.float64,
            points=2,
            hidden=False,
            cases=(
                Case(
                    "B=4, L=5, (start, end) = (1, 2), (5, 5), (-1, 3), (2, 7)",
                    _loss_case(4, 5, [(1, 2), (5, 5), (-1, 3), (2, 7)]),
                ),
            ),
        ),
        Test(
            "float64, more clamping",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "B=6, L=8, positions -3, 8, 100 and in range",
                    _loss_case(6, 8, [(0, 0), (-3, -3), (8, 2), (100, 100), (3, 8), (7, -1)]),
                ),
                Case("B=3, L=4, every end past the end but one", _loss_case(3, 4, [(1, 4), (2, 9), (0, 3)])),
                Case(
                    "B=3, L=1, (start, end) = (0, 0), (1, 0), (-2, 1)",
                    _loss_case(3, 1, [(0, 0), (1, 0), (-2, 1)]),
                ),
            ),
        ),
        Test(
            "float32, large logits and a long batch",
            torch.float32,
            points=1,
            cases=(
                Case("B=16, L=32, |logits|~20", _loss_case(16, 32, scale=20.0)),
                Case(
                    "B=3, L=7, one start past the end",
                    _loss_case(3, 7, [(2, 3), (7, 6), (-2, 0)], scale=5.0),
                ),
            ),
        ),
    ),
)

# -- best_span --------------------------------------------------------------------------------


def _search(start_logits, end_logits, allowed):
    """argmax of s_i + e_j over ``allowed`` (B, L, L), first maximum in row-major order."""
    B, L = start_logits.shape
    scores = start_logits[:, :, None] + end_logits[:, None, :]
    flat = scores.masked_fill(~allowed, float("-inf")).reshape(B, L * L).argmax(dim=-1)
    return flat // L, flat % L


def _band(L: int, device, lower: bool = True, limit: int | None = None) -> Tensor:
    i = torch.arange(L, device=device)[:, None]
    j = torch.arange(L, device=device)[None, :]
    allowed = torch.ones(L, L, dtype=torch.bool, device=device)
    if lower:
        allowed &= i <= j
    if limit is not None:
        allowed &= j < i + limit
    return allowed


def _pairs(mask: Tensor) -> Tensor:
    return mask[:, :, None] & mask[:, None, :]


def _independent_argmax(s, e, mask, max_answer_len=30):
    """Best start and best end chosen separately: the end may come before the start."""
    s = s.masked_fill(~mask, float("-inf"))
    e = e.masked_fill(~mask, float("-inf"))
    return s.argmax(dim=-1), e.argmax(dim=-1)


def _no_order(s, e, mask, max_answer_len=30):
    """A length limit written as j - i < max_answer_len, without i <= j."""
    return _search(s, e, _band(s.size(1), s.device, lower=False, limit=max_answer_len) & _pairs(mask))


def _no_mask(s, e, mask, max_answer_len=30):
    return _search(s, e, _band(s.size(1), s.device, limit=max_answer_len).expand(s.size(0), -1, -1))


def _mask_multiplied(s, e, mask, max_answer_len=30):
    """Logits multiplied by the mask: masked positions score 0, which beats negative context."""
    s, e = s * mask, e * mask
    return _no_mask(s, e, mask, max_answer_len)


def _start_masked_only(s, e, mask, max_answer_len=30):
    allowed = _band(s.size(1), s.device, limit=max_answer_len) & mask[:, :, None]
    return _search(s, e, allowed)


def _no_limit(s, e, mask, max_answer_len=30):
    return _search(s, e, _band(s.size(1), s.device) & _pairs(mask))


def _limit_off_by_one(s, e, mask, max_answer_len=30):
    """j <= i + max_answer_len: spans one token longer than allowed."""
    return _search(s, e, _band(s.size(1), s.device, limit=max_answer_len + 1) & _pairs(mask))


def _default_limit(s, e, mask, max_answer_len=30):
    """The max_answer_len argument ignored: always 30."""
    return ref.best_span(s, e, mask)


BEST_SPAN_VARIANTS = (
    Variant("end-before-start", _independent_argmax),
    Variant("end-before-start", _no_order),
    Variant("span-outside-context", _no_mask),
    Variant("span-outside-context", _mask_multiplied),
    Variant("span-outside-context", _start_masked_only),
    Variant("no-length-limit", _no_limit),
    Variant("no-length-limit", _limit_off_by_one),
    Variant("no-length-limit", _default_limit),
)


# best_span's default max_answer_len, as CURRICULUM.md states it (not read from the reference,
# whose default is what is being checked).
DEFAULT_MAX_ANSWER_LEN = 30


def _context_mask(g: torch.Generator, b: int, length: int, empty_row: int | None) -> Tensor:
    """[CLS] question [SEP] context [SEP] [PAD]...: True on the context tokens only."""
    mask = torch.zeros(b, length, dtype=torch.bool)
    for r in range(b):
        q = int(randint(g, 1, max(2, length // 4), 1))
        room = max(1, length - q - 3)  # [CLS], [SEP], [SEP]
        c = int(randint(g, max(1, room // 2), room + 1, 1))
        mask[r, q + 2 : q + 2 + c] = True
    if empty_row is not None:
        mask[empty_row] = False  # no context: no answer, not graded
    return mask


def _span_case(
    b: int,
    length: int,
    max_answer_len: int | None = None,
    high: int = 4,
    negative_rows: int = 0,
    empty_row: int | None = None,
    cuts: bool = False,
    long_answer: bool = False,
    edge_span: bool = False,
):
    """Integer-valued logits in [-high, high]: many sums tie, so the tie rule matters.
    ``negative_rows``: rows whose context logits are all negative (every sum below 0).
    ``cuts``: the context mask has holes, as a context split into windows would.
    ``long_answer``: the last row's context fills the sequence and its best unlimited span is all of it.
    ``edge_span``: in the row before those of ``long_answer``, the best span the default limit allows
    is exactly that limit long (it scores 2 * high + 3) and the span one token longer scores more
    (2 * high + 4), so a limit one lower, one higher or inclusive picks another span. Among random
    rows, so that each of those mistakes is told apart from the others."""

    def build(g, dtype):
        s = randint(g, -high, high + 1, b, length).to(dtype)
        e = randint(g, -high, high + 1, b, length).to(dtype)
        mask = _context_mask(g, b, length, empty_row)
        if cuts:
            mask &= randint(g, 0, 4, b, length) > 0
        if long_answer:  # [CLS] q [SEP] context [SEP]: the highest scores at the context's two ends
            mask[-1] = False
            mask[-1, 3 : length - 1] = True
            s[-1, 3], e[-1, length - 2] = high + 2, high + 2
        if edge_span:
            r = -2 if long_answer else -1
            last = 3 + DEFAULT_MAX_ANSWER_LEN - 1  # the span (3, last) has exactly the limit's tokens
            mask[r] = False
            mask[r, 3 : length - 1] = True
            s[r, 3], e[r, last], e[r, last + 1] = high + 2, high + 1, high + 2
        for r in range(negative_rows):
            s[r] = -1 - s[r].abs()
            e[r] = -1 - e[r].abs()
        kwargs = {} if max_answer_len is None else {"max_answer_len": max_answer_len}
        return CaseData(args=(s, e, mask), kwargs=kwargs)

    return build


def _span_label(
    b,
    length,
    max_answer_len=None,
    high=4,
    negative_rows=0,
    empty_row=None,
    cuts=False,
    long_answer=False,
    edge_span=False,
) -> str:
    s = f"B={b}, L={length}, integer logits in [-{high}, {high}]"
    s += "" if max_answer_len is None else f", max_answer_len={max_answer_len}"
    s += (
        f", {negative_rows} row{'s' if negative_rows > 1 else ''} of negative logits" if negative_rows else ""
    )
    s += ", a long best span" if long_answer else ""
    limit = DEFAULT_MAX_ANSWER_LEN
    s += f", a best span of exactly {limit} tokens beside a better one of {limit + 1}" if edge_span else ""
    s += ", one row without context (not graded)" if empty_row is not None else ""
    return s + (", context with holes" if cuts else "")


def _span_cases(*specs: dict) -> tuple[Case, ...]:
    return tuple(Case(_span_label(**s), _span_case(**s)) for s in specs)


def _one_position_case(b: int, high: int = 4):
    """L = 1: the one position is each row's context (its answer is (0, 0)), but in the last
    row, which has none (not graded)."""

    def build(g, dtype):
        s = randint(g, -high, high + 1, b, 1).to(dtype)
        e = randint(g, -high, high + 1, b, 1).to(dtype)
        mask = torch.ones(b, 1, dtype=torch.bool)
        mask[-1] = False
        return CaseData(args=(s, e, mask))

    return build


def _rows_with_context(data: CaseData) -> tuple[Tensor, Tensor]:
    rows = data.args[2].any(dim=-1)  # (B,)
    return rows, rows


BEST_SPAN = Graded(
    name="best_span",
    clause="08.best_span",
    task=3,
    signature="best_span(start_logits, end_logits, context_mask, max_answer_len=30) -> (start, end)",
    outputs=("start", "end"),
    reference=ref.best_span,
    graded_region=_rows_with_context,
    variants=BEST_SPAN_VARIANTS,
    # [CLS] q [SEP] and a context of one to four tokens; limits of 1 and 2; rows whose
    # context logits are all negative (a masked position's 0 must not win); several rows,
    # where one mistake shows and another does not; one long answer under the default limit.
    # The logits are integers at every level.
    small=tuple(
        _span_case(**kwargs)
        for kwargs in (
            dict(b=1, length=5),
            dict(b=1, length=6, max_answer_len=1),
            dict(b=1, length=6, negative_rows=1),
            dict(b=2, length=7, max_answer_len=1, negative_rows=1),
            dict(b=3, length=8, max_answer_len=1),
            dict(b=3, length=8, max_answer_len=2, high=2),
            # the default limit: a best span of 16 tokens, longer than a limit of 15 allows
            dict(b=1, length=20, long_answer=True),
        )
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("L", lambda c: c.args[0].shape[1]),
    ),
    tests=(
        Test(
            "float32, ties and context masks",
            torch.float32,
            points=2,
            hidden=False,
            cases=_span_cases(
                dict(b=6, length=12, max_answer_len=2, negative_rows=2),
                dict(b=4, length=10, high=1),
            ),
        ),
        Test(
            "float64, max_answer_len",
            torch.float64,
            points=2,
            hidden=False,
            cases=_span_cases(
                dict(b=8, length=16, max_answer_len=3, negative_rows=1, empty_row=7),
                dict(b=3, length=6, max_answer_len=1),
            ),
        ),
        Test(
            "float64, longer sequences and the default limit",
            torch.float64,
            points=2,
            cases=_span_cases(
                dict(b=8, length=40, high=2, negative_rows=2, long_answer=True, edge_span=True),
                dict(b=6, length=24, max_answer_len=5, negative_rows=3, empty_row=2),
                dict(b=1, length=4),
            )
            + (
                Case(
                    "B=3, L=1, the one position is the context (the last row has none)", _one_position_case(3)
                ),
            ),
        ),
        Test(
            "float32, many ties, holes in the context",
            torch.float32,
            points=1,
            cases=_span_cases(
                dict(b=10, length=20, max_answer_len=2, high=1, negative_rows=2, cuts=True),
                dict(b=5, length=32, max_answer_len=8, high=3, negative_rows=1, cuts=True),
            ),
        ),
    ),
)

# -- squad_em_f1 --------------------------------------------------------------------------------


def _raw_f1(prediction: str, truth: str, lower: bool = False) -> float:
    pred = (prediction.lower() if lower else prediction).split()
    gold = (truth.lower() if lower else truth).split()
    same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def _normalized(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def _f1_unnormalized(prediction, ground_truths, lower=False, raw_em=False):
    if raw_em:
        em = max(float(prediction == t) for t in ground_truths)
    else:
        em = max(float(_normalized(prediction) == _normalized(t)) for t in ground_truths)
    return em, max(_raw_f1(prediction, t, lower) for t in ground_truths)


SQUAD_VARIANTS = (
    Variant("f1-without-normalization", _f1_unnormalized),
    Variant("f1-without-normalization", lambda p, gts: _f1_unnormalized(p, gts, raw_em=True)),
    Variant("f1-without-normalization", lambda p, gts: _f1_unnormalized(p, gts, lower=True)),
)

PUBLIC_PAIRS = [
    ["Denver Broncos", ["Denver Broncos", "The Denver Broncos"]],
    ["the Denver Broncos!", ["Denver Broncos"]],
    ["Carolina Panthers", ["Denver Broncos"]],
    ["in Santa Clara, California", ["Santa Clara, California", "Levi's Stadium"]],
    ["  Levi's   Stadium ", ["Levi's Stadium in the San Francisco Bay Area"]],
    ["An apple a day", ["apple day"]],
]
PUBLIC_REPEATS = [
    ["New York New York", ["New York"]],
    ["1990s", ["the 1990s", "1990's"]],
    ["Gold Coast", ["gold coast", "the Gold Coast of Australia", "Coast"]],
]
HIDDEN_PAIRS = [
    ["Saint Bernadette Soubirous", ["Saint Bernadette Soubirous"]],
    ["a copper statue of Christ", ["a copper statue of Christ", "copper statue"]],
    ["The Basilica of the Sacred Heart.", ["the Basilica of the Sacred heart"]],
    ["Theodore Hesburgh", ["the odore Hesburgh"]],
    ["anthem", ["An them", "the anthem"]],
    ["(1879)", ["1879", "in 1879"]],
    ["U.S.", ["US", "the U.S. Army"]],
    ["three-point shot", ["three point shot", "threepoint shot"]],
    ["first, second, and third", ["first second third", "first and second"]],
]
HIDDEN_MIXED = [
    ["Tesla's  AC motor", ["AC motor", "tesla's ac motor", "the AC motor"]],
    ["THE END", ["end"]],
    ["the cat sat on the mat", ["Cat sat on a mat", "the dog"]],
    ["an Olympic gold medal", ["Olympic gold", "gold medal"]],
    ["Nikola\tTesla", ["Nikola Tesla"]],
    ["It was Paris.", ["paris", "Paris, France"]],
    # a word repeated in both: F1 0.8 with the multiset's 2 common tokens, 0.4 with a set's 1
    ["Walla Walla, Washington", ["Walla Walla"]],
]


def _squad_case(pairs: list):
    def build(g, dtype):
        return CaseData(args=(pairs,))

    return build


SQUAD = Graded(
    name="squad_em_f1",
    clause="08.squad_em_f1",
    task=4,
    signature="squad_em_f1(prediction, ground_truths) -> (em, f1)",
    outputs=("(em, f1) of each pair",),
    reference=ref.squad_em_f1,
    kind="driver",
    driver="qa:em_f1_table",
    returns="ndarray",
    variants=SQUAD_VARIANTS,
    # one pair each, on words of no case: an article, punctuation, capitals, a repeated word
    small=tuple(
        _squad_case([pair])
        for pair in (
            ["the cat", ["cat"]],
            ["cat!", ["cat"]],
            ["Cat", ["cat"]],
            ["cat cat", ["cat"]],
            # a word repeated on both sides: the overlap counts it twice, a set of words once
            ["cat cat", ["cat cat sat"]],
            ["a cat sat", ["cat", "the dog sat"]],
        )
    ),
    tests=(
        Test(
            "punctuation, articles, several ground truths",
            torch.float64,
            points=2,
            hidden=False,
            cases=(Case("6 SQuAD-style pairs", _squad_case(PUBLIC_PAIRS)),),
        ),
        Test(
            "repeated words and case",
            torch.float64,
            points=1,
            hidden=False,
            cases=(Case("3 pairs", _squad_case(PUBLIC_REPEATS)),),
        ),
        Test(
            "more punctuation and articles",
            torch.float64,
            points=1,
            cases=(Case("9 pairs", _squad_case(HIDDEN_PAIRS)),),
        ),
        Test(
            "whitespace, capitals and repeats",
            torch.float64,
            points=1,
            cases=(Case("7 pairs", _squad_case(HIDDEN_MIXED)),),
        ),
    ),
)

SPEC = StageSpec(
    id="08_qa_span",
    title="Extractive QA span heads",
    graded=(SPAN_HEAD, SPAN_LOSS, BEST_SPAN, SQUAD),
    misconceptions={
        "end-before-start": "your span can end before it starts (e.g. the best start and the best end "
        "chosen separately): search pairs (i, j) with i <= j, scoring start_logits[i] + end_logits[j].",
        "span-outside-context": "your span uses positions outside the context (the question, [CLS], "
        "[SEP] or padding): both i and j must be positions where context_mask is True. Set the "
        "scores of other positions to -inf; multiplying logits by the mask gives them 0, which can "
        "still win.",
        "no-length-limit": "your spans ignore max_answer_len (or allow one token more): a span (i, j) "
        "has j - i + 1 tokens, and it is allowed when j < i + max_answer_len.",
        "f1-without-normalization": "your F1 (or exact match) compares the raw words: SQuAD first "
        "normalises both strings (lower case, remove punctuation, remove the articles a/an/the, fold "
        "whitespace), then splits into tokens and counts the common ones with a multiset.",
    },
)

"""Stage 04: word2vec skip-gram gradients by hand, numpy float64 (CURRICULUM.md, 04_word2vec)."""

from __future__ import annotations

import numpy as np
import torch

import reference
from autograder.stages.spec import Case, CaseData, Dim, Graded, StageSpec, Test, Variant, randint, randn

ref = reference.load("04_word2vec")

LOSS_OUTPUTS = ("loss", "grad_center_vec", "grad_outside_vectors")
LOSS_RETURNS = ("scalar", "ndarray", "ndarray")


def _array(g: torch.Generator, *shape: int, dtype: torch.dtype, scale: float = 1.0) -> np.ndarray:
    """Seeded normal samples as a numpy array of the test's dtype."""
    return randn(g, *shape, dtype=dtype, scale=scale).numpy()


def _pick(g: torch.Generator, pool: list[int], n: int) -> list[int]:
    """n seeded draws, with replacement, from pool."""
    return [pool[i] for i in randint(g, 0, len(pool), n).tolist()]


def _others(g: torch.Generator, vocab: int, exclude: int, n: int) -> list[int]:
    """n distinct seeded words other than ``exclude``."""
    perm = torch.randperm(vocab, generator=g).tolist()
    return [w for w in perm if w != exclude][:n]


# -- sigmoid ------------------------------------------------------------------------------


def _sigmoid_case(*shape: int, scale: float, extremes: bool = False):
    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        x = _array(g, *shape, dtype=dtype, scale=scale)
        if extremes:  # exp(-x) overflows in a naive formula: still 0 or 1 in the end
            x.flat[:4] = np.array([-800.0, 800.0, -100.0, 100.0], dtype=x.dtype)
        return CaseData(args=(x,))

    return build


def _axis(i: int):
    """x.shape[i], None when x has no axis i."""
    return lambda c: c.args[0].shape[i] if c.args[0].ndim > i else None


SIGMOID = Graded(
    name="sigmoid",
    clause="04.sigmoid",
    task=1,
    signature="sigmoid(x) -> ndarray of x's shape and dtype",
    outputs=("y",),
    returns="ndarray",
    reference=ref.sigmoid,
    # x has any shape: each of its axes
    dims=(Dim("x.shape[0]", _axis(0)), Dim("x.shape[1]", _axis(1)), Dim("x.shape[2]", _axis(2))),
    small=(
        _sigmoid_case(1, scale=1.0),
        _sigmoid_case(2, scale=3.0),
        _sigmoid_case(4, scale=1.0, extremes=True),
    ),
    tests=(
        Test(
            "float64, vectors and matrices",
            torch.float64,
            points=1,
            hidden=False,
            cases=(
                Case("x (7,), |x|~3", _sigmoid_case(7, scale=3.0)),
                Case("x (3, 4), |x|~10", _sigmoid_case(3, 4, scale=10.0)),
            ),
        ),
        Test(
            "float64, large magnitude",
            torch.float64,
            points=0.5,
            cases=(
                Case(
                    "x (5, 6), |x|~30, x = ±800 and ±100 included",
                    _sigmoid_case(5, 6, scale=30.0, extremes=True),
                ),
            ),
        ),
        Test(
            "float64, three dimensions and extremes",
            torch.float64,
            points=0.5,
            cases=(
                Case("x (2, 3, 4), |x|~5", _sigmoid_case(2, 3, 4, scale=5.0)),
                Case("x (9,), ±800 and ±100 included", _sigmoid_case(9, scale=30.0, extremes=True)),
                Case("x (1, 4, 1), |x|~5", _sigmoid_case(1, 4, 1, scale=5.0)),
                Case("x (6, 1), |x|~5", _sigmoid_case(6, 1, scale=5.0)),
            ),
        ),
    ),
)

# -- naive softmax ------------------------------------------------------------------------


def _softmax_case(vocab: int, d: int, o: int | None, scale: float = 1.0):
    """v_c (d,), a word o (seeded when None), U (vocab, d)."""

    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        center_vec = _array(g, d, dtype=dtype, scale=scale)
        outside_vectors = _array(g, vocab, d, dtype=dtype, scale=scale)
        outside_idx = o if o is not None else int(randint(g, 0, vocab, 1))
        return CaseData(args=(center_vec, outside_idx, outside_vectors))

    return build


def _scores_case(scores: tuple[float, ...], o: int, d: int):
    """v_c (d,) and U (len(scores), d) with u_w . v_c = scores[w] up to rounding: seeded rows
    moved along v_c, so the scores are chosen while U stays a full matrix."""

    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        center_vec = _array(g, d, dtype=dtype)
        outside_vectors = _array(g, len(scores), d, dtype=dtype)
        if not center_vec @ center_vec > 0:  # a small input's integers: v_c = 0 has no scores to set
            raise ValueError("v_c = 0")
        target = np.asarray(scores, dtype=center_vec.dtype)
        off = (target - outside_vectors @ center_vec) / (center_vec @ center_vec)  # (V,)
        return CaseData(args=(center_vec, o, outside_vectors + np.outer(off, center_vec)))

    return build


def _softmax_label(vocab: int, d: int, o: int | None, scale: float = 1.0) -> str:
    s = f"V={vocab}, d={d}, " + ("outside_idx seeded" if o is None else f"outside_idx={o}")
    return s + ("" if scale == 1.0 else f", |vectors|~{scale:g}")


def _softmax_cases(specs: list[tuple[int, int, int | None, float]]) -> tuple[Case, ...]:
    return tuple(Case(_softmax_label(*s), _softmax_case(*s)) for s in specs)


def _negated(fn, center: bool, outside: bool):
    """A loss whose center and/or outside gradient has the opposite sign (y - y_hat)."""

    def variant(*args):
        loss, grad_c, grad_u = fn(*args)
        return loss, -grad_c if center else grad_c, -grad_u if outside else grad_u

    return variant


def _softmax_only_row_o(center_vec, outside_idx, outside_vectors):
    """dJ/dU computed for row o only: the other words' rows, y_hat_w v_c, are left at zero."""
    loss, grad_c, grad_u = ref.naive_softmax_loss_and_gradient(center_vec, outside_idx, outside_vectors)
    only = np.zeros_like(grad_u)
    only[outside_idx] = grad_u[outside_idx]
    return loss, grad_c, only


def _softmax_parts(center_vec, outside_idx, outside_vectors, stable: bool = True):
    """scores (V,), y_hat (V,) and y_hat - y, the softmax with or without the max taken out."""
    scores = outside_vectors @ center_vec
    with np.errstate(over="ignore", invalid="ignore"):  # without the max, exp(1000) = inf, inf/inf
        e = np.exp(scores - scores.max()) if stable else np.exp(scores)
        y_hat = e / e.sum()
    delta = y_hat.copy()
    delta[outside_idx] -= 1.0
    return scores, y_hat, delta


def _softmax_with_loss(loss_of, consistent: bool = False):
    """The reference's gradients (the notes' y_hat - y, derived for -log y_hat_o) with the loss
    ``loss_of(scores, y_hat, o)``; ``consistent``: the gradients of that loss instead, when it
    is a sum over the words (d/ds_w of -sum_w log y_hat_w is V y_hat_w - 1)."""

    def variant(center_vec, outside_idx, outside_vectors):
        scores, y_hat, delta = _softmax_parts(center_vec, outside_idx, outside_vectors)
        with np.errstate(divide="ignore", invalid="ignore"):  # log 0 = -inf, 0 * -inf = NaN
            loss = loss_of(scores, y_hat, outside_idx)
        if consistent:
            delta = len(scores) * y_hat - 1.0
        return loss, outside_vectors.T @ delta, np.outer(delta, center_vec)

    return variant


def _one_hot(y_hat: np.ndarray, o: int) -> np.ndarray:
    y = np.zeros_like(y_hat)
    y[o] = 1.0
    return y


def _log_softmax(scores: np.ndarray) -> np.ndarray:
    m = scores.max()
    return scores - m - np.log(np.exp(scores - m).sum())


def _softmax_unstable(loss_form: str):
    """exp of the raw scores: inf for a score past 709.8, then inf / inf = NaN. The loss as
    -log y_hat_o, or as log(sum exp) - s_o (inf)."""

    def variant(center_vec, outside_idx, outside_vectors):
        scores, y_hat, delta = _softmax_parts(center_vec, outside_idx, outside_vectors, stable=False)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            if loss_form == "-log y_hat_o":
                loss = -np.log(y_hat[outside_idx])
            else:
                loss = np.log(np.exp(scores).sum()) - scores[outside_idx]
        return loss, outside_vectors.T @ delta, np.outer(delta, center_vec)

    return variant


def _softmax_outside_transposed(center_vec, outside_idx, outside_vectors):
    """dJ/dU as v_c (y_hat - y)ᵀ: (d, V), the transpose of U's shape."""
    loss, grad_c, grad_u = ref.naive_softmax_loss_and_gradient(center_vec, outside_idx, outside_vectors)
    return loss, grad_c, grad_u.T


NAIVE_SOFTMAX = Graded(
    name="naive_softmax_loss_and_gradient",
    clause="04.naive_softmax_loss_and_gradient",
    task=2,
    signature="naive_softmax_loss_and_gradient(center_vec (d,), outside_idx, outside_vectors (V, d)) "
    "-> (loss, grad_center_vec (d,), grad_outside_vectors (V, d))",
    outputs=LOSS_OUTPUTS,
    returns=LOSS_RETURNS,
    reference=ref.naive_softmax_loss_and_gradient,
    variants=(
        Variant("softmax-gradient-sign", _negated(ref.naive_softmax_loss_and_gradient, True, True)),
        Variant("softmax-gradient-sign", _negated(ref.naive_softmax_loss_and_gradient, True, False)),
        Variant("softmax-gradient-sign", _negated(ref.naive_softmax_loss_and_gradient, False, True)),
        Variant("grad-wrong-row", _softmax_only_row_o),
        # -sum_w log y_hat_w: the log of every word's probability, not only o's
        Variant("loss-over-all-words", _softmax_with_loss(lambda s, y_hat, o: -np.sum(np.log(y_hat)))),
        Variant("loss-over-all-words", _softmax_with_loss(lambda s, y_hat, o: -np.sum(_log_softmax(s)))),
        Variant(
            "loss-over-all-words",
            _softmax_with_loss(lambda s, y_hat, o: -np.sum(np.log(y_hat)), consistent=True),
        ),
        Variant(
            "loss-over-all-words",
            _softmax_with_loss(lambda s, y_hat, o: -np.sum(_log_softmax(s)), consistent=True),
        ),
        # np.mean(y * np.log(y_hat)): the loss divided by V (where a probability underflows to 0,
        # that form's NaN is zero-log-zero's)
        Variant("loss-averaged", _softmax_with_loss(lambda s, y_hat, o: -np.log(y_hat[o]) / len(s))),
        # -sum_w y_w log y_hat_w, where a probability that underflows to 0 makes 0 * log 0 = NaN
        Variant(
            "zero-log-zero",
            _softmax_with_loss(lambda s, y_hat, o: -np.sum(_one_hot(y_hat, o) * np.log(y_hat))),
        ),
        Variant("unstable-softmax", _softmax_unstable("-log y_hat_o")),
        Variant("unstable-softmax", _softmax_unstable("log-sum-exp")),
        Variant("grad-outside-transposed", _softmax_outside_transposed),
    ),
    dims=(Dim("V", lambda c: c.args[2].shape[0]), Dim("d", lambda c: c.args[0].shape[0])),
    # two words (a softmax over one is 1), one or two features; the row of a word not o; then
    # scores of ±1000, where exp overflows without the max taken out and the other word's
    # probability underflows to 0 (0 * log 0 is NaN): P(o|c) stays well above 1e-30
    small=(
        _softmax_case(2, 1, 0),
        _softmax_case(2, 1, 1),
        _softmax_case(2, 2, 0),
        _softmax_case(3, 1, 2),
        _scores_case((-1000.0, 1000.0), 1, 1),
        _scores_case((998.0, 1000.0, -1000.0), 0, 1),
    ),
    tests=(
        Test(
            "float64, small vocabularies",
            torch.float64,
            points=2,
            hidden=False,
            cases=_softmax_cases([(5, 3, 2, 1.0), (10, 4, 0, 1.0), (8, 6, 7, 1.0)]),
        ),
        Test(
            "float64, vocabularies of 1 to 300 words",
            torch.float64,
            points=1,
            # V = 1: P(o|c) = 1, the loss and every gradient 0
            cases=_softmax_cases([(50, 10, None, 1.0), (300, 16, None, 0.5), (2, 1, 0, 1.0), (1, 3, 0, 1.0)]),
        ),
        Test(
            "float64, peaked scores",
            torch.float64,
            points=1,
            cases=(
                *_softmax_cases([(20, 8, None, 3.0), (12, 5, 11, 4.0)]),
                # exp(1000) overflows: only a softmax with the max taken out stays finite.
                # o sits 4 below the max, so P(o|c) ~ 2e-2 and -log(softmax[o]) is exact too.
                Case(
                    "V=6, d=3, scores -1000 to 1000, outside_idx=2 (4 below the max)",
                    _scores_case((-1000.0, 700.0, 996.0, 1000.0, 0.0, 350.0), 2, 3),
                ),
            ),
        ),
    ),
)

# -- negative sampling ----------------------------------------------------------------------


def _neg_case(
    vocab: int,
    d: int,
    o: int | None,
    neg: list[int] | None,
    k: int = 0,
    distinct: int = 0,
    scale: float = 1.0,
):
    """v_c, o, U and neg_indices: given, or k seeded draws from ``distinct`` words other than o."""

    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        center_vec = _array(g, d, dtype=dtype, scale=scale)
        outside_vectors = _array(g, vocab, d, dtype=dtype, scale=scale)
        outside_idx = o if o is not None else int(randint(g, 0, vocab, 1))
        neg_indices = list(neg) if neg is not None else _pick(g, _others(g, vocab, outside_idx, distinct), k)
        return CaseData(args=(center_vec, outside_idx, outside_vectors, neg_indices))

    return build


def _neg_given(vocab: int, d: int, o: int, neg: list[int]) -> Case:
    return Case(f"V={vocab}, d={d}, outside_idx={o}, neg_indices={neg}", _neg_case(vocab, d, o, neg))


def _neg_seeded(vocab: int, d: int, k: int, distinct: int, scale: float = 1.0) -> Case:
    label = f"V={vocab}, d={d}, seeded outside_idx, K={k} seeded negatives from {distinct} words"
    label += "" if scale == 1.0 else f", |vectors|~{scale:g}"
    return Case(label, _neg_case(vocab, d, None, None, k, distinct, scale))


def _neg_rows_fancy_index(center_vec, outside_idx, outside_vectors, neg_indices):
    """``grad[neg_indices] += ...``: numpy adds a repeated index's rows once, not once per repeat."""
    if len(set(neg_indices)) == len(neg_indices):
        raise ValueError("no repeated negatives")
    loss, grad_c, _ = ref.neg_sampling_loss_and_gradient(
        center_vec, outside_idx, outside_vectors, neg_indices
    )
    neg = np.asarray(neg_indices)
    grad_u = np.zeros_like(outside_vectors)
    grad_u[outside_idx] += (ref.sigmoid(outside_vectors[outside_idx] @ center_vec) - 1) * center_vec
    grad_u[neg] += ref.sigmoid(outside_vectors[neg] @ center_vec)[:, None] * center_vec
    return loss, grad_c, grad_u


def _neg_unique(center_vec, outside_idx, outside_vectors, neg_indices):
    """Each distinct negative counted once, in the loss and both gradients."""
    if len(set(neg_indices)) == len(neg_indices):
        raise ValueError("no repeated negatives")
    unique = sorted(set(neg_indices))
    return ref.neg_sampling_loss_and_gradient(center_vec, outside_idx, outside_vectors, unique)


def _neg_row_by_position(center_vec, outside_idx, outside_vectors, neg_indices):
    """The k-th negative's gradient added to row k instead of row neg_indices[k]."""
    if len(neg_indices) > len(outside_vectors):
        raise ValueError("more negatives than rows")
    loss, grad_c, _ = ref.neg_sampling_loss_and_gradient(
        center_vec, outside_idx, outside_vectors, neg_indices
    )
    grad_u = np.zeros_like(outside_vectors)
    grad_u[outside_idx] += (ref.sigmoid(outside_vectors[outside_idx] @ center_vec) - 1) * center_vec
    for k, w in enumerate(neg_indices):
        grad_u[k] += ref.sigmoid(outside_vectors[w] @ center_vec) * center_vec
    return loss, grad_c, grad_u


def _neg_written_out(
    center_vec, outside_idx, outside_vectors, neg_indices, *, weight_of=None, wrong=(), average=None
):
    """Negative sampling with each knob a known mistake can turn.

    ``weight_of(k, w, by_position, by_word)``: the score s_k used for the k-th negative (word w),
    from the per-negative scores (K,) or the per-word ones (V,); it is used in the terms named by
    ``wrong`` ("loss", "grad_c", "rows"), the right one elsewhere. ``average``: "negatives" (the
    sum over k is a mean) or "all" (the mean over the K + 1 terms), with "loss" or "all" after a
    colon for what it divides: the loss alone, or the loss and both gradients."""
    neg = list(neg_indices)
    u_o = outside_vectors[outside_idx]
    s_o = u_o @ center_vec
    by_position = outside_vectors[neg] @ center_vec  # (K,)
    by_word = outside_vectors @ center_vec  # (V,)
    what, scope = (average or ":").split(":")
    k_scale = 1 / len(neg) if what == "negatives" else 1.0
    all_scale = 1 / (len(neg) + 1) if what == "all" else 1.0
    g_scale = k_scale if scope == "all" else 1.0
    loss_neg = 0.0
    grad_c = np.zeros_like(center_vec)
    grad_u = np.zeros_like(outside_vectors)
    for k, w in enumerate(neg):
        right = by_position[k]
        taken = right if weight_of is None else weight_of(k, w, by_position, by_word)
        loss_neg += np.logaddexp(0.0, taken if "loss" in wrong else right)
        grad_c += ref.sigmoid(taken if "grad_c" in wrong else right) * outside_vectors[w]
        grad_u[w] += ref.sigmoid(taken if "rows" in wrong else right) * center_vec
    loss = (np.logaddexp(0.0, -s_o) + k_scale * loss_neg) * all_scale
    g_all = all_scale if scope == "all" else 1.0
    grad_c = ((ref.sigmoid(s_o) - 1) * u_o + g_scale * grad_c) * g_all
    grad_u = g_scale * grad_u
    grad_u[outside_idx] += (ref.sigmoid(s_o) - 1) * center_vec
    return loss, grad_c, grad_u * g_all


def _by_word_id(k, w, by_position, by_word):
    """The per-negative scores (K,) read at the word id: the score of the w-th negative."""
    if w >= len(by_position):
        raise ValueError("a word id past the K negatives: the student's code raises IndexError")
    return by_position[w]


def _by_position(k, w, by_position, by_word):
    """The per-word scores (V,) read at the position: the score of word k."""
    if k >= len(by_word):
        raise ValueError("a position past the V words: the student's code raises IndexError")
    return by_word[k]


def _neg_variant(**knobs):
    def variant(center_vec, outside_idx, outside_vectors, neg_indices):
        return _neg_written_out(center_vec, outside_idx, outside_vectors, neg_indices, **knobs)

    return variant


def _neg_outside_transposed(center_vec, outside_idx, outside_vectors, neg_indices):
    """dJ/dU returned as (d, V)."""
    loss, grad_c, grad_u = ref.neg_sampling_loss_and_gradient(
        center_vec, outside_idx, outside_vectors, neg_indices
    )
    return loss, grad_c, grad_u.T


NEG_SAMPLING = Graded(
    name="neg_sampling_loss_and_gradient",
    clause="04.neg_sampling_loss_and_gradient",
    task=3,
    signature="neg_sampling_loss_and_gradient(center_vec (d,), outside_idx, outside_vectors (V, d), "
    "neg_indices (K ints)) -> (loss, grad_center_vec (d,), grad_outside_vectors (V, d))",
    outputs=LOSS_OUTPUTS,
    returns=LOSS_RETURNS,
    reference=ref.neg_sampling_loss_and_gradient,
    variants=(
        Variant("neg-duplicates-not-accumulated", _neg_rows_fancy_index),
        Variant("neg-duplicates-not-accumulated", _neg_unique),
        Variant("grad-wrong-row", _neg_row_by_position),
        Variant("softmax-gradient-sign", _negated(ref.neg_sampling_loss_and_gradient, True, True)),
        # the k-th negative's score looked up by its word id in the (K,) scores, or by k in
        # the (V,) ones: in every term, in the gradients only, in the rows of dJ/dU only
        *(
            Variant("neg-word-id-as-position", _neg_variant(weight_of=fn, wrong=wrong))
            for fn in (_by_word_id, _by_position)
            for wrong in (("loss", "grad_c", "rows"), ("grad_c", "rows"), ("rows",))
        ),
        # np.mean instead of np.sum: over the negatives, or over all K + 1 terms; the loss
        # alone, or the loss and the gradients derived from it
        *(
            Variant("loss-averaged", _neg_variant(average=f"{what}:{scope}"))
            for what in ("negatives", "all")
            for scope in ("loss", "all")
        ),
        Variant("grad-outside-transposed", _neg_outside_transposed),
    ),
    # neg_indices never holds outside_idx, so a vocabulary of one word has no negative to draw
    dims=(
        Dim("V", lambda c: c.args[2].shape[0], never_one="neg_indices never holds outside_idx: V >= 2"),
        Dim("d", lambda c: c.args[0].shape[0]),
        Dim("K", lambda c: len(c.args[3])),
    ),
    # one negative, then a repeated one (each repeat counts), then two distinct; then
    # vectors of the graded cases' largest magnitude (|vectors|~3)
    small=(
        _neg_case(2, 1, 0, [1]),
        _neg_case(2, 1, 1, [0, 0]),
        _neg_case(3, 1, 0, [2, 1]),
        _neg_case(3, 2, 1, [2, 2, 0]),
        _neg_case(3, 1, 2, [0, 1, 0], scale=3.0),
    ),
    tests=(
        Test(
            "float64, distinct negatives",
            torch.float64,
            points=1,
            hidden=False,
            # one negative; negatives 0..K-1 out of order (each word's position is another word)
            cases=(
                _neg_given(6, 4, 1, [0, 3, 5]),
                _neg_given(10, 5, 9, [2, 4, 6, 8, 0]),
                _neg_given(4, 2, 3, [1]),
                _neg_given(7, 3, 5, [2, 0, 1]),
            ),
        ),
        Test(
            "float64, repeated negatives",
            torch.float64,
            points=2,
            hidden=False,
            cases=(_neg_given(6, 3, 0, [2, 2, 2, 4, 2]), _neg_given(5, 4, 3, [1, 1, 1, 1, 1])),
        ),
        Test(
            "float64, heavy repetition in seeded vocabularies",
            torch.float64,
            points=1,
            cases=(
                _neg_seeded(30, 8, 10, 3),
                _neg_seeded(100, 12, 15, 2),
                _neg_seeded(8, 5, 20, 4),
                _neg_seeded(6, 1, 8, 2),  # d = 1: a squeezed (d,) vector is a scalar
            ),
        ),
        Test(
            "float64, seeded vocabularies",
            torch.float64,
            points=1,
            cases=(_neg_seeded(50, 10, 10, 10), _neg_seeded(20, 6, 5, 5, scale=3.0)),
        ),
    ),
)

# -- skip-gram ----------------------------------------------------------------------------


def _window_case(vocab: int, d: int, c: int | None, window: list[int] | None, size: int = 0):
    """Center and outside matrices, a window and the toy loss's weights a, b (see the driver)."""

    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        center_vectors = _array(g, vocab, d, dtype=dtype)
        outside_vectors = _array(g, vocab, d, dtype=dtype)
        a = randn(g, vocab, dtype=dtype).abs().numpy() + 0.5
        b = randn(g, vocab, dtype=dtype).numpy()
        center_idx = c if c is not None else int(randint(g, 0, vocab, 1))
        outside_idxs = list(window) if window is not None else _pick(g, list(range(vocab)), size)
        return CaseData(
            args=(center_idx, outside_idxs, center_vectors, outside_vectors), kwargs={"a": a, "b": b}
        )

    return build


def _window_given(vocab: int, d: int, c: int, window: list[int]) -> Case:
    return Case(f"V={vocab}, d={d}, center_idx={c}, outside_idxs={window}", _window_case(vocab, d, c, window))


def _window_seeded(vocab: int, d: int, size: int) -> Case:
    return Case(
        f"V={vocab}, d={d}, seeded center word and window of {size}", _window_case(vocab, d, None, None, size)
    )


def _skipgram_center_rows(rows: str):
    """skipgram adding the center gradient to every row ('all') or to row outside_idx ('outside')."""

    def variant(center_idx, outside_idxs, center_vectors, outside_vectors, loss_and_gradient):
        loss = 0.0
        grad_center_vectors = np.zeros_like(center_vectors)
        grad_outside_vectors = np.zeros_like(outside_vectors)
        for o in outside_idxs:
            j, grad_c, grad_u = loss_and_gradient(center_vectors[center_idx], o, outside_vectors)
            loss += j
            if rows == "all":
                grad_center_vectors += grad_c  # broadcasts over every row
            else:
                grad_center_vectors[o] += grad_c
            grad_outside_vectors += grad_u
        return loss, grad_center_vectors, grad_outside_vectors

    return variant


def _skipgram_outside_row_only(center_idx, outside_idxs, center_vectors, outside_vectors, loss_and_gradient):
    """skipgram keeping only row o of each returned outside gradient."""
    loss = 0.0
    grad_center_vectors = np.zeros_like(center_vectors)
    grad_outside_vectors = np.zeros_like(outside_vectors)
    for o in outside_idxs:
        j, grad_c, grad_u = loss_and_gradient(center_vectors[center_idx], o, outside_vectors)
        loss += j
        grad_center_vectors[center_idx] += grad_c
        grad_outside_vectors[o] += grad_u[o]
    return loss, grad_center_vectors, grad_outside_vectors


def _skipgram_averaged(scope: str):
    """skipgram dividing by the window's length: the loss alone ("loss") or the loss and both
    gradients ("all"); the contract sums over the window."""

    def variant(center_idx, outside_idxs, center_vectors, outside_vectors, loss_and_gradient):
        loss, grad_c, grad_u = ref.skipgram(
            center_idx, outside_idxs, center_vectors, outside_vectors, loss_and_gradient
        )
        n = len(outside_idxs)
        return loss / n, grad_c / n if scope == "all" else grad_c, grad_u / n if scope == "all" else grad_u

    return variant


SKIPGRAM = Graded(
    name="skipgram",
    clause="04.skipgram",
    task=4,
    signature="skipgram(center_idx, outside_idxs, center_vectors (V, d), outside_vectors (V, d), "
    "loss_and_gradient) -> (loss, grad_center_vectors (V, d), grad_outside_vectors (V, d))",
    outputs=("loss", "grad_center_vectors", "grad_outside_vectors"),
    returns=LOSS_RETURNS,
    kind="driver",
    driver="word2vec:skipgram_window",
    reference=ref.skipgram,
    variants=(
        Variant("grad-wrong-row", _skipgram_center_rows("all")),
        Variant("grad-wrong-row", _skipgram_center_rows("outside")),
        Variant("grad-wrong-row", _skipgram_outside_row_only),
        Variant("loss-averaged", _skipgram_averaged("loss")),
        Variant("loss-averaged", _skipgram_averaged("all")),
    ),
    # a vocabulary of one word: the center word is its own outside word, allowed
    dims=(
        Dim("V", lambda c: c.args[2].shape[0]),
        Dim("d", lambda c: c.args[2].shape[1]),
        Dim("window", lambda c: len(c.args[1])),
    ),
    # a window of one word, then a word twice, then a center word that is not row 0
    small=(
        _window_case(2, 1, 0, [1]),
        _window_case(2, 1, 0, [1, 1]),
        _window_case(3, 1, 1, [0, 2]),
        _window_case(3, 2, 2, [0]),
    ),
    tests=(
        Test(
            "float64, one window",
            torch.float64,
            points=2,
            hidden=False,
            cases=(_window_given(6, 3, 2, [0, 4, 1, 5]), _window_given(5, 4, 0, [3])),
        ),
        Test(
            "float64, a word twice in the window",
            torch.float64,
            points=1,
            hidden=False,
            cases=(_window_given(7, 4, 3, [1, 5, 1, 1]),),
        ),
        Test(
            "float64, seeded vocabularies and windows",
            torch.float64,
            points=2,
            cases=(
                _window_seeded(40, 10, 6),
                _window_seeded(25, 6, 10),
                _window_seeded(12, 5, 2),
                _window_given(1, 2, 0, [0, 0]),  # V = 1: the center word is its own outside word
                _window_given(4, 1, 2, [3, 0, 3]),  # d = 1
            ),
        ),
    ),
)

SPEC = StageSpec(
    id="04_word2vec",
    title="word2vec: skip-gram gradients by hand",
    graded=(SIGMOID, NAIVE_SOFTMAX, NEG_SAMPLING, SKIPGRAM),
    misconceptions={
        "neg-duplicates-not-accumulated": "your output matches a word drawn several times among the "
        "negatives counted once: each entry of neg_indices is its own term of the loss, so a word "
        "drawn m times adds m times to the loss, to grad_center_vec and to its row of "
        "grad_outside_vectors. "
        "`grad[idx] += rows` adds a repeated index's row only once: loop over neg_indices, or use "
        "np.add.at(grad, idx, rows).",
        "softmax-gradient-sign": "your gradient has the opposite sign: with J = -log P(o|c), "
        "dJ/dscores = y_hat - y (predicted minus true), so dJ/dv_c = Uᵀ(y_hat - y) and "
        "dJ/dU = (y_hat - y) v_cᵀ; for negative sampling, dJ/d(u_o·v_c) = sigmoid(u_o·v_c) - 1 and "
        "dJ/d(u_k·v_c) = sigmoid(u_k·v_c). A gradient points uphill: a step against it lowers the loss.",
        "grad-wrong-row": "your gradient has values in the wrong rows of a (V, d) matrix. Row w of "
        "grad_outside_vectors is dJ/du_w: the softmax gives every row y_hat_w v_c (not only row o), and "
        "the k-th negative's term goes to row neg_indices[k] (not row k). In skipgram the center gradient "
        "goes to row center_idx alone (`grad[center_idx] += g`; `grad += g` broadcasts to every row), "
        "and each returned grad_outside_vectors is added whole.",
        "loss-over-all-words": "your loss matches -sum_w log y_hat_w, the log-probability of every word: "
        "the naive-softmax loss is the cross-entropy with the one-hot y of the outside word o, "
        "-sum_w y_w log y_hat_w = -log y_hat_o, one term only. Its gradient is then "
        "dJ/dscores = y_hat - y.",
        "loss-averaged": "your output matches a mean where the loss is a sum: the negative-sampling loss "
        "adds -log sigmoid(-u_k·v_c) for every one of the K negatives, skipgram adds the loss (and the "
        "gradients) of every word of the window, and the naive-softmax loss is -log y_hat_o itself, "
        "not divided by V (`np.mean(y * np.log(y_hat))` divides it). Use np.sum, or +=.",
        "zero-log-zero": "your loss is NaN where the scores are far apart: a probability y_hat_w that "
        "underflows to 0 gives log 0 = -inf, and y_w * log y_hat_w = 0 * -inf is NaN even though y_w = 0. "
        "y is one-hot: compute -log y_hat_o alone (or log-sum-exp of the scores minus the score of o).",
        "unstable-softmax": "your result overflows to NaN/inf on large scores: exp() of a score above 709 "
        "is inf in float64, and inf / inf is NaN. Subtract the largest score before exp(); it cancels "
        "in the ratio (and in the loss: log sum_w exp(s_w) = m + log sum_w exp(s_w - m)).",
        "grad-outside-transposed": "your grad_outside_vectors is transposed: it is the gradient of "
        "outside_vectors, shape (V, d), row w being dJ/du_w; the naive softmax's is "
        "np.outer(y_hat - y, v_c), not np.outer(v_c, y_hat - y).",
        "neg-word-id-as-position": "your negative-sampling output takes the k-th negative's score from the "
        "wrong entry: scores computed per negative, outside_vectors[neg_indices] @ v_c (K,), are read at "
        "position k; scores computed per word, outside_vectors @ v_c (V,), at the word id neg_indices[k]. "
        "Reading one by the other's index mixes up the words (or raises IndexError); loop with "
        "`for k, w in enumerate(neg_indices)`.",
    },
)

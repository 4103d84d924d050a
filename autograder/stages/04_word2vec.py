"""Stage 04: word2vec skip-gram gradients by hand, numpy float64 (CURRICULUM.md, 04_word2vec)."""

from __future__ import annotations

import numpy as np
import torch

import reference
from autograder.stages.spec import Case, CaseData, Graded, StageSpec, Test, Variant, randint, randn

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


SIGMOID = Graded(
    name="sigmoid",
    clause="04.sigmoid",
    task=1,
    signature="sigmoid(x) -> ndarray of x's shape and dtype",
    outputs=("y",),
    returns="ndarray",
    reference=ref.sigmoid,
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
    ),
    # two words (a softmax over one is 1), one or two features; the row of a word not o
    small=(_softmax_case(2, 1, 0), _softmax_case(2, 1, 1), _softmax_case(2, 2, 0), _softmax_case(3, 1, 2)),
    tests=(
        Test(
            "float64, small vocabularies",
            torch.float64,
            points=2,
            hidden=False,
            cases=_softmax_cases([(5, 3, 2, 1.0), (10, 4, 0, 1.0), (8, 6, 7, 1.0)]),
        ),
        Test(
            "float64, vocabularies of 2 to 300 words",
            torch.float64,
            points=1,
            cases=_softmax_cases([(50, 10, None, 1.0), (300, 16, None, 0.5), (2, 1, 0, 1.0)]),
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
    ),
    # one negative, then a repeated one (each repeat counts), then two distinct
    small=(
        _neg_case(2, 1, 0, [1]),
        _neg_case(2, 1, 1, [0, 0]),
        _neg_case(3, 1, 0, [2, 1]),
        _neg_case(3, 2, 1, [2, 2, 0]),
    ),
    tests=(
        Test(
            "float64, distinct negatives",
            torch.float64,
            points=1,
            hidden=False,
            cases=(_neg_given(6, 4, 1, [0, 3, 5]), _neg_given(10, 5, 9, [2, 4, 6, 8, 0])),
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
            cases=(_neg_seeded(30, 8, 10, 3), _neg_seeded(100, 12, 15, 2), _neg_seeded(8, 5, 20, 4)),
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
            cases=(_window_seeded(40, 10, 6), _window_seeded(25, 6, 10), _window_seeded(12, 5, 2)),
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
    },
)

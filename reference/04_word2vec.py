"""Stage 04 reference: the skip-gram losses of word2vec and their gradients, by hand (numpy).

Mikolov et al., "Efficient Estimation of Word Representations in Vector Space" (2013), the
skip-gram model; Mikolov et al., "Distributed Representations of Words and Phrases and their
Compositionality" (2013), eq. 4, negative sampling. Notation of Stanford CS224n: a center
word c with vector v_c (a row of the center matrix V), outside words w with vectors u_w (the
rows of the outside matrix U, shape (vocab, d)).

    naive softmax:      J = -log P(o | c),  P(o | c) = exp(u_o . v_c) / sum_w exp(u_w . v_c)
    negative sampling:  J = -log sigma(u_o . v_c) - sum_k log sigma(-u_k . v_c)
    skip-gram:          J = sum over the window's outside words o of J(v_c, o, U)

Choices where the curriculum is silent: the loss is returned as a numpy float64 scalar;
``neg_indices`` is a list of K vocabulary indices that never contains ``outside_idx`` (the
sampler excludes it, as in CS224n) and may repeat, each occurrence counting once more; the
skip-gram center gradient lives in row ``center_idx`` of a (vocab, d) array of zeros.
No work at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

LossAndGradient = Callable[[np.ndarray, int, np.ndarray], tuple[float, np.ndarray, np.ndarray]]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """sigma(x) = 1 / (1 + exp(-x)), elementwise, any shape, x's float dtype.

    Written so that exp() only ever sees a non-positive number: for x < 0,
    sigma(x) = exp(x) / (1 + exp(x)). No overflow warning for x = -1000.
    """
    e = np.exp(-np.abs(x))  # in (0, 1]
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax of a vector, max subtracted first (stage 01)."""
    e = np.exp(scores - scores.max())
    return e / e.sum()


def naive_softmax_loss_and_gradient(
    center_vec: np.ndarray, outside_idx: int, outside_vectors: np.ndarray
) -> tuple[np.floating, np.ndarray, np.ndarray]:
    """J = -log softmax(U v_c)[o] and its gradients.

    center_vec: (d,), outside_idx: int o, outside_vectors U: (V, d).
    With y_hat = softmax(U v_c) (V,) and y the one-hot vector of o:
        dJ/dv_c = U^T (y_hat - y)          (d,)
        dJ/dU   = (y_hat - y) v_c^T        (V, d): every row, not only row o
    Returns (loss, grad_center_vec (d,), grad_outside_vectors (V, d)).
    """
    scores = outside_vectors @ center_vec  # (V,): u_w . v_c for every word w
    y_hat = _softmax(scores)  # (V,): P(w | c)
    # -log y_hat[o] = log sum_w exp(s_w) - s_o, written with the max taken out
    m = scores.max()
    loss = m + np.log(np.exp(scores - m).sum()) - scores[outside_idx]
    delta = y_hat.copy()  # (V,): y_hat - y
    delta[outside_idx] -= 1.0
    grad_center_vec = outside_vectors.T @ delta  # (d,)
    grad_outside_vectors = np.outer(delta, center_vec)  # (V, d)
    return loss, grad_center_vec, grad_outside_vectors


def neg_sampling_loss_and_gradient(
    center_vec: np.ndarray,
    outside_idx: int,
    outside_vectors: np.ndarray,
    neg_indices: Sequence[int],
) -> tuple[np.floating, np.ndarray, np.ndarray]:
    """J = -log sigma(u_o . v_c) - sum_k log sigma(-u_k . v_c) and its gradients.

    center_vec: (d,), outside_idx: int o, outside_vectors U: (V, d), neg_indices: K ints
    (never o; may repeat: a word drawn twice is two terms of the sum).
        dJ/dv_c = (sigma(u_o . v_c) - 1) u_o + sum_k sigma(u_k . v_c) u_k
        dJ/du_o = (sigma(u_o . v_c) - 1) v_c
        dJ/du_k = sigma(u_k . v_c) v_c, added once per occurrence of k
    Every other row of dJ/dU is zero. Returns (loss, grad_center_vec, grad_outside_vectors).
    """
    u_o = outside_vectors[outside_idx]  # (d,)
    s_o = u_o @ center_vec  # scalar
    # -log sigma(x) = log(1 + exp(-x)) = logaddexp(0, -x): finite for any x
    loss = np.logaddexp(0.0, -s_o)
    grad_center_vec = (sigmoid(s_o) - 1) * u_o  # (d,)
    grad_outside_vectors = np.zeros_like(outside_vectors)  # (V, d)
    grad_outside_vectors[outside_idx] += (sigmoid(s_o) - 1) * center_vec
    for k in neg_indices:  # a loop, so a repeated k adds its term again
        s_k = outside_vectors[k] @ center_vec
        loss += np.logaddexp(0.0, s_k)  # -log sigma(-s_k)
        grad_center_vec += sigmoid(s_k) * outside_vectors[k]
        grad_outside_vectors[k] += sigmoid(s_k) * center_vec
    return loss, grad_center_vec, grad_outside_vectors


def skipgram(
    center_idx: int,
    outside_idxs: Sequence[int],
    center_vectors: np.ndarray,
    outside_vectors: np.ndarray,
    loss_and_gradient: LossAndGradient,
) -> tuple[float, np.ndarray, np.ndarray]:
    """The skip-gram loss of one window: the sum of ``loss_and_gradient`` over its outside words.

    center_idx: int c, outside_idxs: the window's outside word indices (may repeat),
    center_vectors: (V, d), outside_vectors: (V, d),
    loss_and_gradient(center_vec (d,), outside_idx, outside_vectors (V, d))
        -> (loss, grad_center_vec (d,), grad_outside_vectors (V, d)).
    Only row c of the center gradient is nonzero; every returned outside gradient adds up.
    Returns (loss, grad_center_vectors (V, d), grad_outside_vectors (V, d)).
    """
    center_vec = center_vectors[center_idx]  # (d,)
    loss = 0.0
    grad_center_vectors = np.zeros_like(center_vectors)  # (V, d)
    grad_outside_vectors = np.zeros_like(outside_vectors)  # (V, d)
    for outside_idx in outside_idxs:
        j, grad_c, grad_u = loss_and_gradient(center_vec, outside_idx, outside_vectors)
        loss += j
        grad_center_vectors[center_idx] += grad_c
        grad_outside_vectors += grad_u
    return loss, grad_center_vectors, grad_outside_vectors

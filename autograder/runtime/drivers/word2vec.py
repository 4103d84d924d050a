"""Driver of stage 04_word2vec: ``skipgram`` takes a function argument, which cannot travel to
the process that runs student code, so the driver defines one there.

``skipgram`` is graded with a *toy* loss of (center_vec, outside_idx, outside_vectors), not
a word2vec loss: any differentiable function of those three arguments with its exact
gradient will do, because skipgram's job is only the bookkeeping (sum the loss over the
window, hand the loss the center word's row, add each returned gradient into the right rows
of both gradient matrices). The toy loss is different for every case (its weights come with
the case) and touches every row of the outside matrix, so that bookkeeping is all tested:

    J(v_c, o, U) = a_o / 2 * ||v_c - u_o||^2 + b_o * sum_w sin(u_w) . v_c

    dJ/dv_c = a_o (v_c - u_o) + b_o * sum_w sin(u_w)
    dJ/du_w = b_o * cos(u_w) * v_c          (elementwise, every row w)
              - a_o (v_c - u_o)             (row o only, in addition)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autograder.runtime.drivers import require


def toy_loss(a: np.ndarray, b: np.ndarray, vocab: int, d: int):
    """The toy ``loss_and_gradient`` with per-word weights a, b (each (vocab,))."""

    def toy_loss_and_gradient(
        center_vec: np.ndarray, outside_idx: int, outside_vectors: np.ndarray
    ) -> tuple[np.floating, np.ndarray, np.ndarray]:
        if not isinstance(center_vec, np.ndarray) or center_vec.shape != (d,):
            got = getattr(center_vec, "shape", type(center_vec).__name__)
            raise ValueError(
                f"skipgram passed loss_and_gradient a center_vec of shape {got}; expected ({d},), "
                "the center word's row center_vectors[center_idx]"
            )
        if isinstance(outside_idx, bool) or not isinstance(outside_idx, int | np.integer):
            raise ValueError(
                f"skipgram passed loss_and_gradient an outside_idx of type {type(outside_idx).__name__}; "
                "expected one int, an entry of outside_idxs"
            )
        if not isinstance(outside_vectors, np.ndarray) or outside_vectors.shape != (vocab, d):
            got = getattr(outside_vectors, "shape", type(outside_vectors).__name__)
            raise ValueError(
                f"skipgram passed loss_and_gradient outside_vectors of shape {got}; expected "
                f"({vocab}, {d}), the whole outside matrix"
            )
        o = int(outside_idx)
        diff = center_vec - outside_vectors[o]  # (d,)
        sines = np.sin(outside_vectors)  # (vocab, d)
        loss = a[o] / 2 * (diff @ diff) + b[o] * (sines.sum(axis=0) @ center_vec)
        grad_center = a[o] * diff + b[o] * sines.sum(axis=0)  # (d,)
        grad_outside = b[o] * np.cos(outside_vectors) * center_vec  # (vocab, d)
        grad_outside[o] -= a[o] * diff
        return loss, grad_center, grad_outside

    return toy_loss_and_gradient


def skipgram_window(ns: dict[str, Any], data: dict[str, Any], device: str) -> Any:
    """``skipgram(center_idx, outside_idxs, center_vectors, outside_vectors, toy)`` on one window.

    data: args (center_idx, outside_idxs, center_vectors (V, d), outside_vectors (V, d)),
    kwargs {"a": (V,), "b": (V,)}, the toy loss's weights.
    """
    skipgram = require(ns, "skipgram")
    center_idx, outside_idxs, center_vectors, outside_vectors = data["args"]
    vocab, d = outside_vectors.shape
    toy = toy_loss(data["kwargs"]["a"], data["kwargs"]["b"], vocab, d)
    return skipgram(center_idx, list(outside_idxs), center_vectors, outside_vectors, toy)

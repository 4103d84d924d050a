"""The stage 04 reference against implementations nobody here wrote: the same losses written
with torch autograd (float64), central-difference gradient checks, torch.sigmoid."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from autograder.grader.plan import StagePlan
from autograder.stages import load_spec
from autograder.stages.spec import build_case
from tests.support import verdicts

ref = reference.load("04_word2vec")
SPEC = load_spec("04_word2vec")
pytestmark = pytest.mark.stage04

TOL = dict(rtol=1e-12, atol=1e-12)


def _vectors(seed: int, vocab: int, d: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=d) * scale, rng.normal(size=(vocab, d)) * scale


# -- the same losses, written with torch autograd ----------------------------------------


def _torch_naive(v_c: torch.Tensor, o: int, U: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy((U @ v_c)[None], torch.tensor([o]))


def _torch_neg(v_c: torch.Tensor, o: int, U: torch.Tensor, neg: list[int]) -> torch.Tensor:
    s_neg = U[torch.tensor(neg, dtype=torch.long)] @ v_c  # (K,): a repeated index is a repeated term
    return -torch.nn.functional.logsigmoid(U[o] @ v_c) - torch.nn.functional.logsigmoid(-s_neg).sum()


def _autograd(loss_fn, v_c: np.ndarray, U: np.ndarray, *args) -> tuple[float, np.ndarray, np.ndarray]:
    tv = torch.tensor(v_c, dtype=torch.float64, requires_grad=True)
    tU = torch.tensor(U, dtype=torch.float64, requires_grad=True)
    loss = loss_fn(tv, *args[:1], tU, *args[1:])
    loss.backward()
    return loss.item(), tv.grad.numpy(), tU.grad.numpy()


def _assert_same(got, want):
    loss, g_c, g_u = got
    assert np.ndim(loss) == 0 and np.asarray(loss).dtype == np.float64
    np.testing.assert_allclose(loss, want[0], **TOL)
    assert g_c.shape == want[1].shape and g_c.dtype == np.float64
    np.testing.assert_allclose(g_c, want[1], **TOL)
    assert g_u.shape == want[2].shape and g_u.dtype == np.float64
    np.testing.assert_allclose(g_u, want[2], **TOL)


@pytest.mark.parametrize("x", [np.linspace(-40, 40, 81), np.array([[-1000.0, 0.0, 1000.0]]), np.zeros(3)])
def test_sigmoid_matches_torch(x):
    with np.errstate(over="raise", invalid="raise"):  # no overflow, even at |x| = 1000
        y = ref.sigmoid(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_allclose(y, torch.sigmoid(torch.from_numpy(x)).numpy(), rtol=1e-15, atol=0)


def test_sigmoid_keeps_float32():
    x = np.linspace(-5, 5, 11, dtype=np.float32)
    y = ref.sigmoid(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, torch.sigmoid(torch.from_numpy(x)).numpy(), rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    vocab=st.integers(1, 12),
    d=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([0.1, 1.0, 3.0]),
    data=st.data(),
)
def test_naive_softmax_matches_autograd(vocab, d, seed, scale, data):
    v_c, U = _vectors(seed, vocab, d, scale)
    o = data.draw(st.integers(0, vocab - 1))
    _assert_same(ref.naive_softmax_loss_and_gradient(v_c, o, U), _autograd(_torch_naive, v_c, U, o))


@settings(max_examples=40, deadline=None)
@given(
    vocab=st.integers(2, 12),
    d=st.integers(1, 8),
    k=st.integers(0, 15),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([0.1, 1.0, 3.0]),
    data=st.data(),
)
def test_neg_sampling_matches_autograd(vocab, d, k, seed, scale, data):
    v_c, U = _vectors(seed, vocab, d, scale)
    o = data.draw(st.integers(0, vocab - 1))
    others = [w for w in range(vocab) if w != o]
    neg = data.draw(st.lists(st.sampled_from(others), min_size=k, max_size=k))
    want = _autograd(_torch_neg, v_c, U, o, neg)
    _assert_same(ref.neg_sampling_loss_and_gradient(v_c, o, U, neg), want)
    _assert_same(ref.neg_sampling_loss_and_gradient(v_c, o, U, np.array(neg, dtype=np.int64)), want)


def test_neg_sampling_counts_every_repeat():
    """Heavy repetition: one word drawn 9 times of 10 is 9 terms, in the loss and in its row."""
    v_c, U = _vectors(7, 6, 5)
    neg = [3] * 9 + [1]
    loss, g_c, g_u = ref.neg_sampling_loss_and_gradient(v_c, 0, U, neg)
    _assert_same((loss, g_c, g_u), _autograd(_torch_neg, v_c, U, 0, neg))
    s3 = U[3] @ v_c
    np.testing.assert_allclose(g_u[3], 9 * ref.sigmoid(s3) * v_c, **TOL)
    once = ref.neg_sampling_loss_and_gradient(v_c, 0, U, [3, 1])
    np.testing.assert_allclose(loss - once[0], 8 * np.logaddexp(0, s3), **TOL)
    assert not g_u[[2, 4, 5]].any()  # words never drawn get no gradient
    # all negatives the same word
    _assert_same(
        ref.neg_sampling_loss_and_gradient(v_c, 2, U, [5] * 12), _autograd(_torch_neg, v_c, U, 2, [5] * 12)
    )


def _central_difference(f, x: np.ndarray, h: float = 1e-5) -> np.ndarray:
    """d f / d x, one coordinate at a time: (f(x + h e_i) - f(x - h e_i)) / 2h."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        plus = f(x)
        x[i] = old - h
        minus = f(x)
        x[i] = old
        grad[i] = (plus - minus) / (2 * h)
    return grad


@pytest.mark.parametrize("which", ["naive", "neg"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradients_match_central_differences(which, seed):
    v_c, U = _vectors(seed, 7, 4)
    neg = [2, 5, 5, 1, 5]
    if which == "naive":
        fn = ref.naive_softmax_loss_and_gradient
        args = ()
    else:
        fn = ref.neg_sampling_loss_and_gradient
        args = (neg,)
    _, g_c, g_u = fn(v_c, 3, U, *args)
    num_c = _central_difference(lambda v: fn(v, 3, U, *args)[0], v_c.copy())
    num_u = _central_difference(lambda u: fn(v_c, 3, u, *args)[0], U.copy())
    np.testing.assert_allclose(g_c, num_c, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(g_u, num_u, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("which", ["naive", "neg"])
def test_skipgram_sums_over_the_window(which):
    """The skip-gram loss of a window (with a repeated outside word) against autograd of the sum,
    and its center gradient against central differences of the whole center matrix."""
    rng = np.random.default_rng(11)
    vocab, d = 9, 5
    C, U = rng.normal(size=(vocab, d)), rng.normal(size=(vocab, d))
    c, window = 4, [1, 7, 1, 0, 8]
    negs = {o: [int(w) for w in rng.choice([w for w in range(vocab) if w != o], 6)] for o in set(window)}
    if which == "naive":

        def fn(v, o, u):
            return ref.naive_softmax_loss_and_gradient(v, o, u)

        def torch_fn(v, o, u):
            return _torch_naive(v, o, u)
    else:

        def fn(v, o, u):
            return ref.neg_sampling_loss_and_gradient(v, o, u, negs[o])

        def torch_fn(v, o, u):
            return _torch_neg(v, o, u, negs[o])

    loss, g_C, g_U = ref.skipgram(c, window, C, U, fn)

    tC = torch.tensor(C, requires_grad=True)
    tU = torch.tensor(U, requires_grad=True)
    total = sum(torch_fn(tC[c], o, tU) for o in window)
    total.backward()
    np.testing.assert_allclose(loss, total.item(), **TOL)
    np.testing.assert_allclose(g_C, tC.grad.numpy(), **TOL)
    np.testing.assert_allclose(g_U, tU.grad.numpy(), **TOL)
    assert not np.delete(g_C, c, axis=0).any()  # only the center word's row

    num_C = _central_difference(lambda m: ref.skipgram(c, window, m, U, fn)[0], C.copy())
    np.testing.assert_allclose(g_C, num_C, rtol=1e-7, atol=1e-8)


def test_skipgram_with_an_empty_window_is_zero():
    C, U = np.ones((3, 2)), np.ones((3, 2))
    loss, g_C, g_U = ref.skipgram(1, [], C, U, ref.naive_softmax_loss_and_gradient)
    assert loss == 0 and not g_C.any() and not g_U.any()


# -- [04.naive_softmax_loss_and_gradient]'s stability, as the cases decide it --------------


def _neg_log_softmax(center_vec, outside_idx, outside_vectors, *, max_subtracted: bool):
    """J = -log softmax(s)[o], the way most students write it; with or without the max."""
    s = outside_vectors @ center_vec
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(s - s.max() if max_subtracted else s)
        y_hat = e / e.sum()
    delta = y_hat.copy()
    delta[outside_idx] -= 1.0
    return -np.log(y_hat[outside_idx]), outside_vectors.T @ delta, np.outer(delta, center_vec)


def test_naive_softmax_cases_decide_stability_and_keep_p_o_given_c_above_1e_30():
    plan = StagePlan.build(SPEC, "cpu")
    name = "naive_softmax_loss_and_gradient"
    for max_subtracted in (True, False):

        def fn(*args, max_subtracted=max_subtracted):
            return _neg_log_softmax(*args, max_subtracted=max_subtracted)

        results = verdicts(plan, {name: fn}, name)
        # overflow only shows on the hidden case with scores of 1e3
        assert all(ok for pc, ok in results if not pc.test.hidden)
        assert all(ok for _, ok in results) == max_subtracted, max_subtracted
    graded = SPEC.graded_name(name)
    for test in graded.tests:
        for case in test.cases:
            center_vec, o, outside_vectors = build_case(SPEC, graded, test, case).args
            s = outside_vectors @ center_vec
            log_p = s[o] - s.max() - np.log(np.exp(s - s.max()).sum())
            assert log_p > np.log(1e-30), case.label

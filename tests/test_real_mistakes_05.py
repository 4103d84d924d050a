"""Stage 05's catalogue names the mistakes real students make, on the forms they write them.

The forms below are written as students write them in torch (after public CS231n-style
BatchNorm/LayerNorm homework), not as the spec's variant functions: each named id must be
named on several forms of its mistake, and a correct program must be named nothing.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autograder.grader.plan import StagePlan
from autograder.stages import load_spec
from tests.support import call_of, named_mistakes


@pytest.fixture(scope="module")
def plan():
    return StagePlan.build(load_spec("05_normalization"), "cpu")


# -- BatchNorm forward forms ------------------------------------------------------------------


def _bn_form(train_norm, eval_norm, *, biased_running=False, affine_train=True, affine_eval=True):
    """A student's batchnorm_forward: ``train_norm(x, mean, var, eps)`` and
    ``eval_norm(x, running_mean, running_var, eps)`` give x_hat."""

    def batchnorm_forward(x, gamma, beta, bn_param):
        mode, eps, momentum = bn_param["mode"], bn_param["eps"], bn_param["momentum"]
        if mode == "train":
            n = x.shape[0]
            sample_mean = x.mean(dim=0)
            sample_var = ((x - sample_mean) ** 2).mean(dim=0)
            x_hat = train_norm(x, sample_mean, sample_var, eps)
            out = gamma * x_hat + beta if affine_train else x_hat
            running_var = sample_var if biased_running else sample_var * n / (n - 1)
            bn_param["running_mean"] = (1 - momentum) * bn_param["running_mean"] + momentum * sample_mean
            bn_param["running_var"] = (1 - momentum) * bn_param["running_var"] + momentum * running_var
        else:
            x_hat = eval_norm(x, bn_param["running_mean"], bn_param["running_var"], eps)
            out = gamma * x_hat + beta if affine_eval else x_hat
        return out, (x_hat, gamma)

    return {"batchnorm_forward": batchnorm_forward}


def _right(x, mean, var, eps):
    return (x - mean) / torch.sqrt(var + eps)


def _on_std(x, mean, var, eps):
    std = torch.sqrt(var)
    return (x - mean) / (std + eps)


def _eval_on_std(x, mean, var, eps):
    return (x - mean) / (var**0.5 + eps)


def _no_eps(x, mean, var, eps):
    return (x - mean) / torch.sqrt(var)


def _rsqrt_no_eps(x, mean, var, eps):
    return (x - mean) * torch.rsqrt(var)


def _train_std_method_plus_eps(x, mean, var, eps):
    return (x - mean) / (x.std(dim=0, unbiased=False) + eps)


def _train_std_method_no_eps(x, mean, var, eps):
    return (x - mean) / x.std(dim=0, unbiased=False)


EPS_OUTSIDE_SQRT = {
    "(x - mu) / (sqrt(var) + eps) in both modes": _bn_form(_on_std, _eval_on_std),
    "x.std(0) + eps in train, eval right": _bn_form(_train_std_method_plus_eps, _right),
    "(x - mu) / (sqrt(var) + eps), CS231n's biased running var": _bn_form(
        _on_std, _eval_on_std, biased_running=True
    ),
}
EPS_MISSING = {
    "(x - mu) / sqrt(var) in train, eval right": _bn_form(_no_eps, _right),
    "x.std(0) without eps in train, sqrt(running_var) in eval": _bn_form(_train_std_method_no_eps, _no_eps),
    "rsqrt(var) without eps, CS231n's biased running var": _bn_form(
        _rsqrt_no_eps, _rsqrt_no_eps, biased_running=True
    ),
}
AFFINE_DROPPED = {
    "eval returns x_hat": _bn_form(_right, _right, affine_eval=False),
    "train returns x_hat": _bn_form(_right, _right, affine_train=False),
    "neither mode applies gamma and beta": _bn_form(_right, _right, affine_train=False, affine_eval=False),
    "eval returns x_hat, CS231n's biased running var": _bn_form(
        _right, _right, affine_eval=False, biased_running=True
    ),
}


@pytest.mark.parametrize(
    ("mistake", "label"),
    [("eps-outside-sqrt", k) for k in EPS_OUTSIDE_SQRT]
    + [("eps-missing", k) for k in EPS_MISSING]
    + [("affine-dropped", k) for k in AFFINE_DROPPED],
)
def test_batchnorm_forward_mistakes_are_named(plan, mistake, label):
    ns = {**EPS_OUTSIDE_SQRT, **EPS_MISSING, **AFFINE_DROPPED}[label]
    failed, named = named_mistakes(plan, ns, "batchnorm_forward")
    assert failed > 0, label
    assert mistake in named, (label, named)
    assert "?" not in named, (label, named)  # every failing case is explained
    if "biased running var" not in label:
        # only what is wrong with the code: its running variance is right
        assert named == {mistake}, (label, named)


def test_correct_batchnorm_forward_is_named_nothing(plan):
    assert named_mistakes(plan, _bn_form(_right, _right), "batchnorm_forward") == (0, set())


def test_the_biased_running_variance_alone_keeps_its_name(plan):
    failed, named = named_mistakes(plan, _bn_form(_right, _right, biased_running=True), "batchnorm_forward")
    assert failed > 0
    assert named == {"running-var-biased"}


# -- backward forms ---------------------------------------------------------------------------


def _bn_pair():
    """A correct BatchNorm forward and backward, CS231n's staged graph."""

    def batchnorm_forward(x, gamma, beta, bn_param):
        eps, momentum = bn_param["eps"], bn_param["momentum"]
        if bn_param["mode"] == "train":
            n = x.shape[0]
            mu = x.mean(0)
            xmu = x - mu
            var = (xmu**2).mean(0)
            ivar = 1.0 / torch.sqrt(var + eps)
            x_hat = xmu * ivar
            bn_param["running_mean"] = (1 - momentum) * bn_param["running_mean"] + momentum * mu
            bn_param["running_var"] = (1 - momentum) * bn_param["running_var"] + momentum * var * n / max(
                n - 1, 1
            )
        else:
            ivar = 1.0 / torch.sqrt(bn_param["running_var"] + eps)
            x_hat = (x - bn_param["running_mean"]) * ivar
        return gamma * x_hat + beta, (x_hat, gamma, ivar)

    def batchnorm_backward(dout, cache):
        x_hat, gamma, ivar = cache
        n = dout.shape[0]
        dx_hat = dout * gamma
        dx = ivar / n * (n * dx_hat - dx_hat.sum(0) - x_hat * (dx_hat * x_hat).sum(0))
        return dx, (dout * x_hat).sum(0), dout.sum(0)

    return batchnorm_forward, batchnorm_backward


def _layernorm_forward(x, gamma, beta, eps):
    mu = x.mean(dim=1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=1, keepdim=True)
    inv_std = 1.0 / torch.sqrt(var + eps)
    x_hat = (x - mu) * inv_std
    return gamma * x_hat + beta, (x_hat, gamma, inv_std)


def _ln_transposed():
    """LayerNorm as BatchNorm of x.T: gamma and beta applied after transposing back, so the
    BatchNorm pass gets ones and zeros; the backward reuses batchnorm_backward on dout.T."""
    bn_forward, bn_backward = _bn_pair()

    def layernorm_forward(x, gamma, beta, eps):
        n = x.shape[0]
        ln_param = {
            "mode": "train",
            "eps": eps,
            "momentum": 0.0,
            "running_mean": torch.zeros(n, dtype=x.dtype),
            "running_var": torch.ones(n, dtype=x.dtype),
        }
        ones, zeros = torch.ones(n, dtype=x.dtype), torch.zeros(n, dtype=x.dtype)
        x_hat_t, bn_cache = bn_forward(x.T, ones, zeros, ln_param)
        x_hat = x_hat_t.T
        return gamma * x_hat + beta, (bn_cache, x_hat)

    def layernorm_backward(dout, cache):
        bn_cache, x_hat = cache
        dx_t, _, _ = bn_backward(dout.T, bn_cache)
        return dx_t.T, (dout * x_hat).sum(dim=0), dout.sum(dim=0)

    return {
        "batchnorm_forward": bn_forward,
        "batchnorm_backward": bn_backward,
        "layernorm_forward": layernorm_forward,
        "layernorm_backward": layernorm_backward,
    }


def _ln_gamma_after(dout, cache):
    x_hat, gamma, inv_std = cache
    d = dout.shape[1]
    dx = inv_std / d * (d * dout - dout.sum(1, keepdim=True) - x_hat * (dout * x_hat).sum(1, keepdim=True))
    return dx * gamma, (dout * x_hat).sum(0), dout.sum(0)


def _ln_gamma_forgotten(dout, cache):
    x_hat, gamma, inv_std = cache
    dx_hat = dout  # gamma forgotten
    mean_dx_hat = dx_hat.mean(dim=-1, keepdim=True)
    dx = (dx_hat - mean_dx_hat - x_hat * (dx_hat * x_hat).mean(dim=-1, keepdim=True)) * inv_std
    return dx, (dout * x_hat).sum(0), dout.sum(0)


LN_GAMMA_MISPLACED = {
    "batchnorm_backward reused on dout.T, gamma outside the BatchNorm pass": _ln_transposed(),
    "dx multiplied by gamma at the end": {
        "layernorm_forward": _layernorm_forward,
        "layernorm_backward": _ln_gamma_after,
    },
    "dx_hat = dout, gamma forgotten": {
        "layernorm_forward": _layernorm_forward,
        "layernorm_backward": _ln_gamma_forgotten,
    },
}


@pytest.mark.parametrize("label", list(LN_GAMMA_MISPLACED))
def test_layernorm_backward_with_gamma_misplaced_is_named(plan, label):
    failed, named = named_mistakes(plan, LN_GAMMA_MISPLACED[label], "layernorm_backward")
    assert failed > 0, label
    assert named == {"dx-gamma-misplaced"}, (label, named)


def test_batchnorm_backward_with_gamma_forgotten_is_named(plan):
    bn_forward, _ = _bn_pair()

    def batchnorm_backward(dout, cache):
        x_hat, gamma, ivar = cache
        n = dout.shape[0]
        dx = ivar / n * (n * dout - dout.sum(0) - x_hat * (dout * x_hat).sum(0))  # dx_hat = dout
        return dx, (dout * x_hat).sum(0), dout.sum(0)

    ns = {"batchnorm_forward": bn_forward, "batchnorm_backward": batchnorm_backward}
    failed, named = named_mistakes(plan, ns, "batchnorm_backward")
    assert failed > 0
    assert named == {"dx-gamma-misplaced"}


def test_correct_backward_passes_are_named_nothing(plan):
    ns = _ln_transposed()
    bn_forward, bn_backward = _bn_pair()

    def layernorm_backward(dout, cache):  # the right fix: gamma into dout before the transpose
        bn_cache, x_hat = cache
        gamma = ns_gamma[0]
        dx_t, _, _ = bn_backward((dout * gamma).T, bn_cache)
        return dx_t.T, (dout * x_hat).sum(dim=0), dout.sum(dim=0)

    ns_gamma: list = []
    forward = ns["layernorm_forward"]

    def layernorm_forward(x, gamma, beta, eps):
        ns_gamma[:] = [gamma]
        return forward(x, gamma, beta, eps)

    right = {**ns, "layernorm_forward": layernorm_forward, "layernorm_backward": layernorm_backward}
    assert named_mistakes(plan, right, "layernorm_backward") == (0, set())
    assert named_mistakes(plan, right, "batchnorm_backward") == (0, set())


def test_a_batchnorm_right_but_for_its_running_variance_keeps_the_train_outputs_points():
    """Issue 26: the normalised outputs exactly right, the running variance in another
    convention (biased), used to cost all 4 points of batchnorm_forward; each case now earns
    the train outputs' half and running_mean's eighth, and says which outputs are right."""
    from autograder.grader.score import score_stage
    from autograder.runtime.harness import run_call

    plan = StagePlan.build(load_spec("05_normalization"), "cpu")

    def biased_running_var(x, gamma, beta, bn_param):
        """CS231n's form: the running variance averages the biased batch variance."""
        eps, momentum = bn_param["eps"], bn_param["momentum"]
        if bn_param["mode"] == "train":
            mu, var = x.mean(dim=0), x.var(dim=0, unbiased=False)
            bn_param["running_mean"] = (1 - momentum) * bn_param["running_mean"] + momentum * mu
            bn_param["running_var"] = (1 - momentum) * bn_param["running_var"] + momentum * var
        else:
            mu, var = bn_param["running_mean"], bn_param["running_var"]
        x_hat = (x - mu) / torch.sqrt(var + eps)
        return gamma * x_hat + beta, (x, x_hat, mu, var, gamma, eps)

    outcomes = {}
    for pc in plan.cases:
        if pc.graded.name != "batchnorm_forward":
            continue
        call, data = call_of(plan, pc)
        status, info, items = run_call(
            {"batchnorm_forward": biased_running_var},
            call.name,
            call.kind,
            data,
            call.outputs,
            (),
            "cpu",
            call.driver,
        )
        outcomes[pc.index] = type("Outcome", (), {"status": status, "info": info, "outputs": items})()
    only = dataclasses.replace(plan, cases=[pc for pc in plan.cases if pc.index in outcomes])
    result = score_stage(only, "05_normalization.py", outcomes, [])
    assert result.max_score == 4
    assert result.score == 4 * (0.5 + 1 / 8)
    for t in result.tests:
        for c in t.cases:
            assert not c.passed and "running-var-biased" in c.misconceptions, c.message
            right = "out of call 1 (train), out of call 2 (train), out of call 3 (train), running_mean after each call"
            assert f"right: {right}, which earn 62%" in c.message, c.message

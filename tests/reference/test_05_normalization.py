"""The stage 05 reference against implementations nobody here wrote: torch.nn.BatchNorm1d,
torch.nn.LayerNorm and autograd's gradients. Then the stage's own promises: correct
programs written in other orders pass every case, and every alias of a forbidden call
costs the points of the one function that makes it."""

from __future__ import annotations

import textwrap
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from autograder.grader.plan import StagePlan
from autograder.runtime.check import check_case
from autograder.runtime.drivers import normalization as drivers
from autograder.runtime.harness import run_call
from autograder.stages import load_spec
from autograder.stages.spec import build_case
from tests.support import call_of, verdicts, write_py

ref = reference.load("05_normalization")
SPEC = load_spec("05_normalization")
pytestmark = pytest.mark.stage05

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


def _inputs(n, d, dtype, seed, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, d, generator=g, dtype=torch.float64) * 2 + offset).to(dtype)
    gamma = (1 + 0.5 * torch.randn(d, generator=g, dtype=torch.float64)).to(dtype)
    beta = torch.randn(d, generator=g, dtype=torch.float64).to(dtype)
    dout = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)
    return x, gamma, beta, dout


def _batchnorm1d(d, gamma, beta, eps, momentum, running_mean, running_var):
    bn = torch.nn.BatchNorm1d(d, eps=eps, momentum=momentum, dtype=gamma.dtype)
    with torch.no_grad():
        bn.weight.copy_(gamma)
        bn.bias.copy_(beta)
        bn.running_mean.copy_(running_mean)
        bn.running_var.copy_(running_var)
    return bn


# -- BatchNorm forward: outputs and running statistics, train then eval ------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "sizes,d,momentum,eps,modes",
    [
        ((8, 8, 8, 6), 5, 0.1, 1e-5, "ttte"),
        ((2, 3, 16, 1), 4, 0.3, 0.1, "ttte"),
        ((5, 4, 7, 9, 3), 3, 0.05, 1e-3, "tetet"),
        ((32,), 12, 0.9, 1e-5, "t"),
    ],
)
def test_batchnorm_forward_matches_batchnorm1d_over_train_and_eval_steps(
    sizes, d, momentum, eps, modes, dtype
):
    g = torch.Generator().manual_seed(len(sizes) * 100 + d)
    _, gamma, beta, _ = _inputs(1, d, dtype, seed=d)
    running_mean = torch.randn(d, generator=g, dtype=torch.float64).to(dtype)
    running_var = (0.5 + torch.rand(d, generator=g, dtype=torch.float64)).to(dtype)
    bn = _batchnorm1d(d, gamma, beta, eps, momentum, running_mean, running_var)
    bn_param = {
        "mode": "train",
        "eps": eps,
        "momentum": momentum,
        "running_mean": running_mean.clone(),
        "running_var": running_var.clone(),
    }
    for n, mode in zip(sizes, modes, strict=True):
        x = (torch.randn(n, d, generator=g, dtype=torch.float64) * 3 + 1).to(dtype)
        bn.train(mode == "t")
        bn_param["mode"] = "train" if mode == "t" else "eval"
        with torch.no_grad():
            expected = bn(x)
        out, _ = ref.batchnorm_forward(x, gamma, beta, bn_param)
        torch.testing.assert_close(out, expected, **TOL[dtype])
        torch.testing.assert_close(bn_param["running_mean"], bn.running_mean, **TOL[dtype])
        torch.testing.assert_close(bn_param["running_var"], bn.running_var, **TOL[dtype])


def test_batchnorm_updates_the_running_statistics_in_place_in_train_mode_only():
    x, gamma, beta, _ = _inputs(6, 3, torch.float64, seed=1)
    mean, var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    bn_param = {"mode": "train", "eps": 1e-5, "momentum": 0.1, "running_mean": mean, "running_var": var}
    ref.batchnorm_forward(x, gamma, beta, bn_param)
    assert bn_param["running_mean"] is mean and bn_param["running_var"] is var
    torch.testing.assert_close(mean, 0.1 * x.mean(0))
    torch.testing.assert_close(var, 0.9 + 0.1 * x.var(0, unbiased=True))
    before = mean.clone(), var.clone()
    bn_param["mode"] = "eval"
    ref.batchnorm_forward(x, gamma, beta, bn_param)
    assert torch.equal(mean, before[0]) and torch.equal(var, before[1])
    with pytest.raises(ValueError, match="mode"):
        ref.batchnorm_forward(x, gamma, beta, {**bn_param, "mode": "test"})


def test_batchnorm_output_of_an_example_depends_on_its_batch_and_layernorm_does_not():
    x, gamma, beta, _ = _inputs(8, 4, torch.float64, seed=2)
    bn_param = lambda: {  # noqa: E731
        "mode": "train",
        "eps": 1e-5,
        "momentum": 0.1,
        "running_mean": torch.zeros(4, dtype=torch.float64),
        "running_var": torch.ones(4, dtype=torch.float64),
    }
    whole, _ = ref.batchnorm_forward(x, gamma, beta, bn_param())
    half, _ = ref.batchnorm_forward(x[:4], gamma, beta, bn_param())
    assert not torch.allclose(whole[:4], half)
    whole, _ = ref.layernorm_forward(x, gamma, beta, 1e-5)
    half, _ = ref.layernorm_forward(x[:4], gamma, beta, 1e-5)
    torch.testing.assert_close(whole[:4], half, rtol=0, atol=0)


# -- LayerNorm forward --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n,d,eps", [(4, 16, 1e-12), (1, 8, 1e-5), (7, 3, 1e-3), (5, 128, 1e-5), (3, 1, 1e-5)]
)
def test_layernorm_forward_matches_torch_layernorm(n, d, eps, dtype):
    x, gamma, beta, _ = _inputs(n, d, dtype, seed=n * d, offset=3.0)
    ln = torch.nn.LayerNorm(d, eps=eps, dtype=dtype)
    with torch.no_grad():
        ln.weight.copy_(gamma)
        ln.bias.copy_(beta)
        expected = ln(x)
    out, _ = ref.layernorm_forward(x, gamma, beta, eps)
    torch.testing.assert_close(out, expected, **TOL[dtype])


# -- backward passes against autograd -----------------------------------------------------


def _autograd(module_fn, x, gamma, beta, dout):
    x, gamma, beta = (t.detach().clone().requires_grad_() for t in (x, gamma, beta))
    module_fn(x, gamma, beta).backward(dout)
    return x.grad, gamma.grad, beta.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("n,d,eps", [(4, 5, 1e-5), (2, 3, 1e-5), (16, 6, 1e-3), (64, 8, 0.1), (3, 1, 1e-5)])
def test_batchnorm_backward_equals_autograd(n, d, eps, mode, dtype):
    x, gamma, beta, dout = _inputs(n, d, dtype, seed=n + d)
    running_mean = torch.linspace(-1, 1, d, dtype=dtype)
    running_var = torch.linspace(0.5, 2, d, dtype=dtype)
    training = mode == "train"
    expected = _autograd(
        lambda x, w, b: torch.nn.functional.batch_norm(
            x, running_mean.clone(), running_var.clone(), w, b, training=training, momentum=0.1, eps=eps
        ),
        x,
        gamma,
        beta,
        dout,
    )
    bn_param = {
        "mode": mode,
        "eps": eps,
        "momentum": 0.1,
        "running_mean": running_mean.clone(),
        "running_var": running_var.clone(),
    }
    _, cache = ref.batchnorm_forward(x, gamma, beta, bn_param)
    for got, want in zip(ref.batchnorm_backward(dout, cache), expected, strict=True):
        torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n,d,eps", [(4, 6, 1e-5), (1, 10, 1e-5), (12, 2, 1e-5), (8, 16, 1e-12), (7, 33, 0.1)]
)
def test_layernorm_backward_equals_autograd(n, d, eps, dtype):
    x, gamma, beta, dout = _inputs(n, d, dtype, seed=n * 7 + d, offset=-2.0)
    expected = _autograd(
        lambda x, w, b: torch.nn.functional.layer_norm(x, (d,), w, b, eps), x, gamma, beta, dout
    )
    _, cache = ref.layernorm_forward(x, gamma, beta, eps)
    for got, want in zip(ref.layernorm_backward(dout, cache), expected, strict=True):
        torch.testing.assert_close(got, want, **TOL[dtype])


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 12),
    d=st.integers(1, 10),
    eps=st.sampled_from([1e-12, 1e-5, 1e-2]),
    momentum=st.floats(0.01, 0.99),
    seed=st.integers(0, 2**31 - 1),
)
def test_both_norms_and_their_gradients_match_torch_float64(n, d, eps, momentum, seed):
    x, gamma, beta, dout = _inputs(n, d, torch.float64, seed)
    bn = _batchnorm1d(d, gamma, beta, eps, momentum, torch.zeros(d), torch.ones(d)).double()
    bn_param = {
        "mode": "train",
        "eps": eps,
        "momentum": momentum,
        "running_mean": torch.zeros(d, dtype=torch.float64),
        "running_var": torch.ones(d, dtype=torch.float64),
    }
    xg = x.clone().requires_grad_()
    expected = bn(xg)
    expected.backward(dout)
    out, cache = ref.batchnorm_forward(x, gamma, beta, bn_param)
    dx, dgamma, dbeta = ref.batchnorm_backward(dout, cache)
    # dx cancels terms of size |dout * gamma| / std: its error is relative to them, not to dx
    term = lambda dim: float((dout * gamma).abs().max() * torch.rsqrt(x.var(dim, unbiased=False) + eps).max())  # noqa: E731
    atol = 1e-10 * max(1.0, term(0))
    for got, want in [
        (out, expected.detach()),
        (bn_param["running_mean"], bn.running_mean),
        (bn_param["running_var"], bn.running_var),
        (dx, xg.grad),
        (dgamma, bn.weight.grad),
        (dbeta, bn.bias.grad),
    ]:
        torch.testing.assert_close(got, want, rtol=1e-10, atol=atol)
    out, cache = ref.layernorm_forward(x, gamma, beta, eps)
    expected = _autograd(
        lambda x, w, b: torch.nn.functional.layer_norm(x, (d,), w, b, eps), x, gamma, beta, dout
    )
    for got, want in zip(ref.layernorm_backward(dout, cache), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10 * max(1.0, term(-1)))


# -- correct programs in other orders pass every case, hidden ones included ---------------

STAGED = '''
import torch


def batchnorm_forward(x, gamma, beta, bn_param):
    """E[x^2] - E[x]^2 for the variance, torch.var for the running one, a staged cache."""
    if bn_param["mode"] == "train":
        mu = x.mean(dim=0)
        var = (x * x).mean(dim=0) - mu * mu
        m = bn_param["momentum"]
        bn_param["running_mean"] = (1 - m) * bn_param["running_mean"] + m * mu
        bn_param["running_var"] = (1 - m) * bn_param["running_var"] + m * torch.var(x, dim=0)
    else:
        mu, var = bn_param["running_mean"], bn_param["running_var"]
    xmu = x - mu
    sqrtvar = torch.sqrt(var + bn_param["eps"])
    ivar = 1.0 / sqrtvar
    xhat = xmu * ivar
    return gamma * xhat + beta, (xhat, gamma, xmu, ivar, sqrtvar, var, bn_param["eps"])


def _staged_backward(dout, cache, dim):
    # the computational graph of the forward, one node at a time
    xhat, gamma, xmu, ivar, sqrtvar, var, eps = cache
    n = xhat.shape[dim]
    dxhat = dout * gamma
    divar = (dxhat * xmu).sum(dim=dim, keepdim=True)
    dxmu1 = dxhat * ivar
    dsqrtvar = -1.0 / (sqrtvar**2) * divar
    dvar = 0.5 / torch.sqrt(var + eps) * dsqrtvar
    dsq = torch.ones_like(xhat) / n * dvar
    dxmu2 = 2 * xmu * dsq
    dx1 = dxmu1 + dxmu2
    dmu = -dx1.sum(dim=dim, keepdim=True)
    return dx1 + dmu / n, (dout * xhat).sum(dim=0), dout.sum(dim=0)


def batchnorm_backward(dout, cache):
    return _staged_backward(dout, cache, 0)


def layernorm_forward(x, gamma, beta, eps):
    mu = x.mean(dim=1, keepdim=True)
    var = (x * x).mean(dim=1, keepdim=True) - mu * mu
    xmu = x - mu
    sqrtvar = torch.sqrt(var + eps)
    ivar = 1.0 / sqrtvar
    xhat = xmu * ivar
    return gamma * xhat + beta, (xhat, gamma, xmu, ivar, sqrtvar, var, eps)


def layernorm_backward(dout, cache):
    return _staged_backward(dout, cache, 1)
'''

TORCH_ITSELF = """
import torch
import torch.nn.functional as F


def batchnorm_forward(x, gamma, beta, bn_param):
    x, gamma, beta = (t.detach().requires_grad_() for t in (x, gamma, beta))
    out = F.batch_norm(x, bn_param["running_mean"], bn_param["running_var"], gamma, beta,
                       training=bn_param["mode"] == "train", momentum=bn_param["momentum"], eps=bn_param["eps"])
    return out.detach(), (out, x, gamma, beta)


def batchnorm_backward(dout, cache):
    out, *inputs = cache
    return torch.autograd.grad(out, inputs, dout)


def layernorm_forward(x, gamma, beta, eps):
    x, gamma, beta = (t.detach().requires_grad_() for t in (x, gamma, beta))
    out = F.layer_norm(x, x.shape[-1:], gamma, beta, eps)
    return out.detach(), (out, x, gamma, beta)


layernorm_backward = batchnorm_backward
"""


def _namespace(source: str) -> dict:
    ns: dict = {}
    exec(compile(source, "<test submission>", "exec"), ns)
    return ns


def _outputs_of(ns, pc, plan):
    call, data = call_of(plan, pc)
    return run_call(ns, call.name, call.kind, data, call.outputs, (), "cpu", call.driver)


@pytest.fixture(scope="module")
def plan():
    return StagePlan.build(SPEC, "cpu")


@pytest.mark.parametrize("source", [STAGED, TORCH_ITSELF], ids=["staged-graph", "torch-itself"])
def test_correct_programs_in_other_orders_pass_every_case(source, plan):
    ns = _namespace(source)
    for pc in plan.cases:
        status, info, items = _outputs_of(ns, pc, plan)
        result = check_case(pc.label, status, info, items, pc.expectation, SPEC.misconceptions)
        assert result.passed, (pc.graded.name, pc.test.group, pc.label, result.message)


def test_the_drivers_call_each_forward_four_times_and_feed_the_backward_its_own_cache():
    calls = []

    def batchnorm_forward(x, gamma, beta, bn_param):
        calls.append(bn_param["mode"])
        return ref.batchnorm_forward(x, gamma, beta, bn_param)

    def batchnorm_backward(dout, cache):
        assert cache == "mine"
        return dout, dout[0], dout[0]

    case = SPEC.graded_name("batchnorm_forward").tests[0].cases[0].build(torch.Generator(), torch.float64)
    outs = drivers.batchnorm_train_then_eval(
        {"batchnorm_forward": batchnorm_forward}, dict(case.__dict__), "cpu"
    )
    assert calls == list(drivers.STEPS) and len(outs) == len(SPEC.graded_name("batchnorm_forward").outputs)
    case = SPEC.graded_name("batchnorm_backward").tests[0].cases[0].build(torch.Generator(), torch.float64)
    ns = {"batchnorm_forward": lambda *a: (a[0], "mine"), "batchnorm_backward": batchnorm_backward}
    dx, _, _ = drivers.batchnorm_gradients(ns, dict(case.__dict__), "cpu")
    assert torch.equal(dx, case.kwargs["dout"])


# A student's `mode is "train"`, true only for the interned literal (as in the notebook's own
# calls). Compiled from text: Python warns where `is` meets a literal.
MODE_COMPARED_WITH_IS = """
import reference

_ref = reference.load("05_normalization")


def batchnorm_forward(x, gamma, beta, bn_param):
    mode = "train" if bn_param["mode"] is "train" else "eval"
    return _ref.batchnorm_forward(x, gamma, beta, {**bn_param, "mode": mode})


batchnorm_backward = _ref.batchnorm_backward
"""


def test_a_mode_compared_with_is_passes_the_public_cases_and_fails_a_hidden_one(plan):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        ns = _namespace(MODE_COMPARED_WITH_IS)
    for name in ("batchnorm_forward", "batchnorm_backward"):
        results = verdicts(plan, ns, name)
        assert all(ok for pc, ok in results if not pc.test.hidden), name
        assert not all(ok for pc, ok in results if pc.test.hidden), name


def test_a_mode_built_at_run_time_equals_the_literal_and_is_another_object():
    seen = []

    def batchnorm_forward(x, gamma, beta, bn_param):
        seen.append(bn_param["mode"])
        return ref.batchnorm_forward(x, gamma, beta, bn_param)

    graded = SPEC.graded_name("batchnorm_forward")
    for test in graded.tests:
        for case in test.cases:
            seen.clear()
            data = build_case(SPEC, graded, test, case)
            drivers.batchnorm_train_then_eval(
                {"batchnorm_forward": batchnorm_forward}, dict(data.__dict__), "cpu"
            )
            assert seen == list(drivers.STEPS)
            at_run_time = data.kwargs.get("mode_built_at_run_time", False)
            assert at_run_time == ("modes built at run time" in case.label)
            assert all((got is not lit) == at_run_time for got, lit in zip(seen, drivers.STEPS, strict=True))


# -- forbidden calls: every alias costs the one function that makes it ----------------------

# Appended to STAGED (a correct hand-written stage): the last definition of a name counts.
# Each replacement computes the right values with a forbidden call, keeping STAGED's cache
# so that the other functions still pass.
KEEP = "_bn_hand, _ln_hand, _bn_back, _ln_back = batchnorm_forward, layernorm_forward, batchnorm_backward, layernorm_backward\n"
BN_FORWARD = """
import torch.nn.functional as F


def batchnorm_forward(x, gamma, beta, bn_param):
    _, cache = _bn_hand(x, gamma, beta, dict(bn_param))  # statistics kept in a copy
    train, m, eps = bn_param["mode"] == "train", bn_param["momentum"], bn_param["eps"]
    rm, rv = bn_param["running_mean"], bn_param["running_var"]
    return {call}, cache
"""
LN_FORWARD = """
import torch.nn.functional as F


def layernorm_forward(x, gamma, beta, eps):
    _, cache = _ln_hand(x, gamma, beta, eps)
    return {call}, cache
"""
BACKWARD = """
import torch.nn.functional as F


def {name}(dout, cache):
    xhat, gamma, xmu, ivar, sqrtvar, var, eps = cache
    beta = torch.zeros_like(gamma)
    # the gradient does not change when x is shifted along the normalised axis: xmu will do
    forward = lambda x, g, b: {forward}(x, g, b, {{"mode": "train", "eps": eps, "momentum": 0.1,
        "running_mean": torch.zeros_like(g), "running_var": torch.ones_like(g)}})[0]
    {body}
"""
NN_BATCHNORM = """
import torch


def batchnorm_forward(x, gamma, beta, bn_param):
    _, cache = _bn_hand(x, gamma, beta, dict(bn_param))
    bn = torch.nn.BatchNorm1d(x.shape[1], eps=bn_param["eps"], momentum=bn_param["momentum"])
    bn = bn.to(x.dtype).train(bn_param["mode"] == "train")
    with torch.no_grad():
        for name, value in [("weight", gamma), ("bias", beta), ("running_mean", bn_param["running_mean"]),
                            ("running_var", bn_param["running_var"])]:
            getattr(bn, name).copy_(value)
        out = bn(x)
    bn_param["running_mean"], bn_param["running_var"] = bn.running_mean.clone(), bn.running_var.clone()
    return out, cache
"""
NN_LAYERNORM = """
import torch


def layernorm_forward(x, gamma, beta, eps):
    _, cache = _ln_hand(x, gamma, beta, eps)
    ln = torch.nn.LayerNorm(x.shape[-1], eps=eps).to(x.dtype)
    with torch.no_grad():
        ln.weight.copy_(gamma)
        ln.bias.copy_(beta)
        return ln(x), cache
"""


def _backward(name: str, body: str) -> str:
    forward = (
        "_bn_hand" if name == "batchnorm_backward" else "(lambda x, g, b, p: _ln_hand(x, g, b, p['eps']))"
    )
    return BACKWARD.format(name=name, forward=forward, body=body)


AUTOGRAD_GRAD = """x, g, b = (t.detach().requires_grad_() for t in (xmu, gamma, beta))
    return torch.autograd.grad(forward(x, g, b), (x, g, b), dout)"""
TENSOR_BACKWARD = """x, g, b = (t.detach().requires_grad_() for t in (xmu, gamma, beta))
    forward(x, g, b).backward(dout)
    return x.grad, g.grad, b.grad"""
AUTOGRAD_BACKWARD = """x, g, b = (t.detach().requires_grad_() for t in (xmu, gamma, beta))
    torch.autograd.backward(forward(x, g, b), dout)
    return x.grad, g.grad, b.grad"""
FUNC_VJP = """_, vjp = torch.func.vjp(forward, xmu, gamma, beta)
    return vjp(dout)"""
FUNC_GRAD = """return torch.func.grad(lambda x, g, b: (forward(x, g, b) * dout).sum(), argnums=(0, 1, 2))(xmu, gamma, beta)"""
FUNCTIONAL_VJP = """return torch.autograd.functional.vjp(forward, (xmu, gamma, beta), dout)[1]"""

ALIASES = {
    "F.batch_norm": (
        "batchnorm_forward",
        BN_FORWARD.format(call="F.batch_norm(x, rm, rv, gamma, beta, train, m, eps)"),
    ),
    "torch.batch_norm": (
        "batchnorm_forward",
        BN_FORWARD.format(call="torch.batch_norm(x, gamma, beta, rm, rv, train, m, eps, False)"),
    ),
    "torch.native_batch_norm": (
        "batchnorm_forward",
        BN_FORWARD.format(call="torch.native_batch_norm(x, gamma, beta, rm, rv, train, m, eps)[0]"),
    ),
    "F.instance_norm": (
        "batchnorm_forward",
        BN_FORWARD.format(
            call="F.instance_norm(x.t()[None], rm, rv, use_input_stats=train, momentum=m, eps=eps)[0].t() * gamma + beta"
        ),
    ),
    "nn.BatchNorm1d": ("batchnorm_forward", NN_BATCHNORM),
    "F.layer_norm": (
        "layernorm_forward",
        LN_FORWARD.format(call="F.layer_norm(x, x.shape[-1:], gamma, beta, eps)"),
    ),
    "torch.layer_norm": (
        "layernorm_forward",
        LN_FORWARD.format(call="torch.layer_norm(x, [x.shape[-1]], gamma, beta, eps)"),
    ),
    "F.group_norm": ("layernorm_forward", LN_FORWARD.format(call="F.group_norm(x, 1, gamma, beta, eps)")),
    "F.rms_norm": (
        "layernorm_forward",
        LN_FORWARD.format(call="F.rms_norm(x - x.mean(-1, keepdim=True), x.shape[-1:], gamma, eps) + beta"),
    ),
    "nn.LayerNorm": ("layernorm_forward", NN_LAYERNORM),
    "torch.autograd.grad": ("batchnorm_backward", _backward("batchnorm_backward", AUTOGRAD_GRAD)),
    "Tensor.backward": ("batchnorm_backward", _backward("batchnorm_backward", TENSOR_BACKWARD)),
    "torch.autograd.backward": ("batchnorm_backward", _backward("batchnorm_backward", AUTOGRAD_BACKWARD)),
    "torch.func.vjp": ("batchnorm_backward", _backward("batchnorm_backward", FUNC_VJP)),
    "aten.native_batch_norm_backward": (
        "batchnorm_backward",
        _backward(
            "batchnorm_backward",
            "return torch.ops.aten.native_batch_norm_backward(dout, xmu, gamma, None, None, "
            "torch.zeros_like(gamma), ivar, True, eps, [True, True, True])",
        ),
    ),
    "torch.func.grad": ("layernorm_backward", _backward("layernorm_backward", FUNC_GRAD)),
    "torch.autograd.functional.vjp": ("layernorm_backward", _backward("layernorm_backward", FUNCTIONAL_VJP)),
    "Tensor.backward (LayerNorm)": ("layernorm_backward", _backward("layernorm_backward", TENSOR_BACKWARD)),
    "aten.native_layer_norm_backward": (
        "layernorm_backward",
        _backward(
            "layernorm_backward",
            "return torch.ops.aten.native_layer_norm_backward(dout, xmu, xmu.shape[-1:], "
            "torch.zeros_like(ivar), ivar, gamma, beta, [True, True, True])",
        ),
    ),
}


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_each_alias_computes_the_right_values_and_the_self_check_catches_it(alias, plan):
    name, code = ALIASES[alias]
    ns = _namespace(STAGED + KEEP + textwrap.dedent(code))
    for pc in plan.cases:
        if pc.graded.name != name:
            continue
        status, info, items = _outputs_of(ns, pc, plan)  # nothing forbidden: the values are right
        assert check_case(pc.label, status, info, items, pc.expectation, {}).passed, (alias, pc.label)
        call, data = call_of(plan, pc)
        status, info, _ = run_call(
            ns, name, call.kind, data, call.outputs, call.forbidden, "cpu", call.driver
        )
        assert status == "forbidden", (alias, status, info)


@pytest.fixture(scope="module")
def graded_aliases(grader, tmp_path_factory):
    root = tmp_path_factory.mktemp("aliases")
    results = {}
    for i, (alias, (_, code)) in enumerate(sorted(ALIASES.items())):
        sub = write_py(root / f"s{i}", "05_normalization", STAGED + KEEP + textwrap.dedent(code))
        results[alias] = grader.grade(sub, ["05_normalization"])
    results["none"] = grader.grade(write_py(root / "clean", "05_normalization", STAGED), ["05_normalization"])
    return results


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_each_forbidden_alias_costs_only_its_function_when_graded(alias, graded_aliases):
    name, _ = ALIASES[alias]
    (stage,) = graded_aliases[alias].stages
    for t in stage.tests:
        if t.function == name:
            assert t.score == 0 and "which this task forbids" in t.output, (alias, t.output)
        else:
            assert t.score == t.max_score, (alias, t.function, t.output)


def test_the_hand_written_program_scores_full_marks(graded_aliases):
    result = graded_aliases["none"]
    assert result.score == result.max_score == SPEC.max_score

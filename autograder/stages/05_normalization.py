"""Stage 05: BatchNorm vs LayerNorm by hand, no autograd (CURRICULUM.md, 05_normalization)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

import reference
from autograder.stages.spec import (
    Case,
    CaseData,
    Dim,
    Graded,
    StageSpec,
    Test,
    Tolerance,
    Variant,
    rand,
    randn,
    tolerance_for,
)

ref = reference.load("05_normalization")

# -- forbidden calls ----------------------------------------------------------------------

# Every library normalisation, whatever the alias: F.batch_norm, torch.batch_norm,
# nn.BatchNorm1d, F.instance_norm (which calls batch_norm) and the sync-BN helpers
# (batch_norm_stats, ...) land on a batch_norm op; F.layer_norm, torch.layer_norm and
# nn.LayerNorm on native_layer_norm. GroupNorm with one group and RMSNorm of x - mean are
# LayerNorm too. F.rms_norm decomposes into plain ops under a dispatch mode, hence the API
# names as well.
NORM_OPS = (
    "aten::*batch_norm*",
    "aten::*layer_norm*",
    "aten::*group_norm*",
    "aten::*instance_norm*",
    "aten::*rms_norm*",
    "torch.nn.functional.batch_norm",
    "torch.nn.functional.layer_norm",
    "torch.nn.functional.group_norm",
    "torch.nn.functional.instance_norm",
    "torch.nn.functional.rms_norm",
    "torch.rms_norm",
)
# The backward kernels, which do a backward pass's whole job without autograd
# (torch.ops.aten.native_batch_norm_backward(...)). The forward ops are not forbidden in
# the backward passes: their driver runs your forward to get the cache, and a forward
# that calls F.batch_norm loses the forward's points, not the backward's as well.
NORM_BACKWARD_OPS = (
    "aten::*batch_norm*backward*",
    "aten::*layer_norm_backward*",
    "aten::*group_norm_backward*",
    "aten::*rms_norm_backward*",
)
# torch.autograd.grad, torch.autograd.backward, Tensor.backward, torch.autograd.functional.*
# are public API calls; torch.func.grad / vjp / jacrev reach torch.autograd.grad.
AUTOGRAD = ("torch.autograd.*", "torch.Tensor.backward", "torch.func.*", "torch._functorch.*")

FORWARD_FORBIDDEN = NORM_OPS + AUTOGRAD
BACKWARD_FORBIDDEN = NORM_BACKWARD_OPS + AUTOGRAD

# -- known mistakes, written out ----------------------------------------------------------


def _statistics(x: Tensor, dim: int, unbiased: bool) -> tuple[Tensor, Tensor]:
    mean = x.mean(dim=dim, keepdim=True)
    with warnings.catch_warnings():  # the unbiased variance of one value is nan, as a student's is
        warnings.simplefilter("ignore")
        return mean, x.var(dim=dim, unbiased=unbiased, keepdim=True)


def _normalise(x: Tensor, mean: Tensor, var: Tensor, eps: float, eps_on_std: bool = False) -> Tensor:
    if eps_on_std:  # the Annotated Transformer's (x - mean) / (std + eps)
        return (x - mean) / (var.sqrt() + eps)
    return (x - mean) / torch.sqrt(var + eps)


def _normalise_eps(x: Tensor, mean: Tensor, var: Tensor, eps: float, where: str) -> Tensor:
    """eps ``where``: "inside" the square root (right), added to the "std", or "none"."""
    if where == "none":
        return (x - mean) / torch.sqrt(var)
    return _normalise(x, mean, var, eps, eps_on_std=where == "std")


def _eps_shows(
    bn_param: dict[str, Any], x: Tensor, mean: Tensor, var: Tensor, eps: float, where: str
) -> None:
    """A mistake about eps changes the output only where eps is not small beside the
    variance. Where it stays within the dtype's tolerance of the right output in every call
    of a case, the variant does not apply to the case (ValueError at the last, eval call), so
    that it names nothing there: a form that is also wrong elsewhere gets that other name,
    and only it. (The calls share ``bn_param``, which keeps the tally.)"""
    tol = tolerance_for(x.dtype, "cpu")
    right, wrong = _normalise(x, mean, var, eps), _normalise_eps(x, mean, var, eps, where)
    shown = not torch.isclose(wrong, right, tol.rtol, tol.atol, equal_nan=False).all()
    bn_param["eps shows"] = bn_param.get("eps shows", False) or bool(shown)


def _batchnorm(
    x: Tensor,
    gamma: Tensor,
    beta: Tensor,
    bn_param: dict[str, Any],
    *,
    normalise_unbiased: bool = False,
    eps_on_std: bool = False,
    running_unbiased: bool = True,
    eval_stats: str = "running",  # running | batch | batch-unbiased | train
    eps_where: str = "inside",  # train mode's eps: inside the sqrt | std | none
    eval_eps_where: str = "inside",  # eval mode's
    affine: tuple[str, ...] = ("train", "eval"),  # the modes that apply gamma and beta
) -> tuple[Tensor, None]:
    """batchnorm_forward with each knob a known mistake can turn (cache: not needed)."""
    mode, eps, momentum = bn_param["mode"], bn_param["eps"], bn_param["momentum"]

    def scaled(x_hat: Tensor, in_mode: str) -> tuple[Tensor, None]:
        return (gamma * x_hat + beta if in_mode in affine else x_hat), None

    if mode == "eval" and eval_stats == "running":
        mean, var = bn_param["running_mean"], bn_param["running_var"]
        if eval_eps_where != "inside":
            _eps_shows(bn_param, x, mean, var, eps, eval_eps_where)
        if eps_where != "inside" and not bn_param.get("eps shows"):
            raise ValueError("eps does not show in this case")
        return scaled(_normalise_eps(x, mean, var, eps, eval_eps_where), "eval")
    if mode == "eval" and eval_stats in ("batch", "batch-unbiased"):
        mean, var = _statistics(x, 0, unbiased=eval_stats == "batch-unbiased")
        return scaled(_normalise(x, mean, var, eps), "eval")
    mean, var = _statistics(x, 0, unbiased=normalise_unbiased)
    n = x.size(0)
    biased = var * (n - 1) / n if normalise_unbiased else var
    batch_var = biased * n / (n - 1) if running_unbiased else biased
    bn_param["running_mean"].mul_(1 - momentum).add_(momentum * mean[0])
    bn_param["running_var"].mul_(1 - momentum).add_(momentum * batch_var[0])
    if eps_where != "inside":
        _eps_shows(bn_param, x, mean, var, eps, eps_where)
        return scaled(_normalise_eps(x, mean, var, eps, eps_where), "train")
    return scaled(_normalise(x, mean, var, eps, eps_on_std), "train")


def _unbiased_and_biased_running(x, gamma, beta, bn_param):
    # torch.var's default (unbiased) to normalise, and the biased one in the average:
    # the two uses swapped, which is both mistakes at once
    return _batchnorm(x, gamma, beta, bn_param, normalise_unbiased=True, running_unbiased=False)


BATCHNORM_VARIANTS = (
    Variant(
        "unbiased-variance-normalize", lambda *a: _batchnorm(*a, normalise_unbiased=True)
    ),  # torch.var(x, dim=0) everywhere
    Variant(
        "unbiased-variance-normalize", lambda *a: _batchnorm(*a, normalise_unbiased=True, eps_on_std=True)
    ),
    Variant("unbiased-variance-normalize", _unbiased_and_biased_running),
    Variant("running-var-biased", lambda *a: _batchnorm(*a, running_unbiased=False)),
    Variant("running-var-biased", _unbiased_and_biased_running),
    Variant("eval-uses-batch-stats", lambda *a: _batchnorm(*a, eval_stats="batch")),
    Variant("eval-uses-batch-stats", lambda *a: _batchnorm(*a, eval_stats="batch-unbiased")),
    Variant("eval-uses-batch-stats", lambda *a: _batchnorm(*a, eval_stats="train")),  # mode ignored
    # eps added to the standard deviation, (x - mean) / (sqrt(var) + eps), or left out,
    # (x - mean) / sqrt(var): in train mode, and in eval mode too or not; each with the
    # running variance right or biased (CS231n's np.var, which many copy)
    *(
        Variant(
            "eps-outside-sqrt" if where == "std" else "eps-missing",
            lambda *a, where=where, in_eval=in_eval, unbiased=unbiased: _batchnorm(
                *a, eps_where=where, eval_eps_where=where if in_eval else "inside", running_unbiased=unbiased
            ),
        )
        for where in ("std", "none")
        for in_eval in (True, False)
        for unbiased in (True, False)
    ),
    # gamma and beta left out in eval mode (normalising with the running statistics is all
    # it does), in train mode, or in both
    *(
        Variant(
            "affine-dropped",
            lambda *a, affine=affine, unbiased=unbiased: _batchnorm(
                *a, affine=affine, running_unbiased=unbiased
            ),
        )
        for affine in (("train",), ("eval",), ())
        for unbiased in (True, False)
    ),
)


def _norm_gradients(
    dout: Tensor, x: Tensor, gamma: Tensor, eps: float, dim: int, unbiased: bool = False, exact: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of gamma * (x - mean) / sqrt(var + eps) + beta with the statistics over
    ``dim`` and var = sum((x - mean)^2) / (n - ddof): the backward pass of a student whose
    forward makes that choice. ``exact``: written consistently with it; otherwise the
    notebook's formula (which assumes ddof = 0) applied to that forward's cache."""
    n = x.size(dim)
    ddof = 1 if unbiased and exact else 0
    mean, var = _statistics(x, dim, unbiased)
    inv_std = 1.0 / torch.sqrt(var + eps)
    x_hat = (x - mean) * inv_std
    g = dout * gamma
    g_sum = g.sum(dim=dim, keepdim=True)
    gx_sum = (g * x_hat).sum(dim=dim, keepdim=True)
    dx = inv_std * (g - g_sum / n - x_hat * gx_sum / (n - ddof))
    return dx, (dout * x_hat).sum(dim=0), dout.sum(dim=0)


def _unbiased_variants(dim: int) -> tuple[Variant, ...]:
    """A forward that normalises with torch.var's default, and a backward written for it
    (exactly, or with the 1/n formula of the notebook)."""
    return tuple(
        Variant(
            "unbiased-variance-normalize",
            lambda dout, cache, exact=exact: _norm_gradients(
                dout, cache.x, cache.gamma, cache.eps, dim=dim, unbiased=True, exact=exact
            ),
        )
        for exact in (True, False)
    )


def _gamma_misplaced_variants(dim: int) -> tuple[Variant, ...]:
    """dx of the normalisation's gradient taken on dout instead of g = dout * gamma: gamma
    left out of dx (BatchNorm's backward reused on the transpose, its forward given ones for
    gamma and gamma applied after), or multiplied in after the means over ``dim``."""

    def misplaced(dout: Tensor, cache: Any, after: bool) -> tuple[Tensor, Tensor, Tensor]:
        dx = ref._normalisation_backward(dout, cache.x_hat, cache.inv_std, dim=dim)
        return (dx * cache.gamma if after else dx), (dout * cache.x_hat).sum(dim=0), dout.sum(dim=0)

    return tuple(
        Variant("dx-gamma-misplaced", lambda dout, cache, after=after: misplaced(dout, cache, after))
        for after in (False, True)
    )


def _eps_variants(dim: int, backward: bool) -> tuple[Variant, ...]:
    """eps added to the standard deviation, or left out, in the forward pass (LayerNorm's),
    or in the backward pass of a forward that makes that choice (the compact formula with
    that forward's x_hat and 1 / (std + eps) or 1 / std). A variant applies to a case only
    where the mistake shows in x_hat (``_eps_shows``)."""

    def normalised(x: Tensor, eps: float, where: str) -> tuple[Tensor, Tensor]:
        mean, var = _statistics(x, dim, unbiased=False)
        tally: dict[str, Any] = {}
        _eps_shows(tally, x, mean, var, eps, where)
        if not tally["eps shows"]:
            raise ValueError("eps does not show in this case")
        denominator = var.sqrt() + eps if where == "std" else var.sqrt()
        if torch.isnan((x - mean) / denominator).all():  # one value per row (D = 1): nan names nothing
            raise ValueError("every value is 0 / 0 in this case")
        return (x - mean) / denominator, denominator

    def forward(x, gamma, beta, eps, where):
        return gamma * normalised(x, eps, where)[0] + beta, None

    def gradients(dout, cache, where):
        x_hat, denominator = normalised(cache.x, cache.eps, where)
        g = dout * cache.gamma
        dx = (
            g - g.mean(dim=dim, keepdim=True) - x_hat * (g * x_hat).mean(dim=dim, keepdim=True)
        ) / denominator
        return dx, (dout * x_hat).sum(dim=0), dout.sum(dim=0)

    return tuple(
        Variant(
            "eps-outside-sqrt" if where == "std" else "eps-missing",
            (lambda dout, cache, where=where: gradients(dout, cache, where))
            if backward
            else (lambda x, gamma, beta, eps, where=where: forward(x, gamma, beta, eps, where)),
        )
        for where in ("std", "none")
    )


BATCHNORM_BACKWARD_VARIANTS = _unbiased_variants(0) + _gamma_misplaced_variants(0) + _eps_variants(0, True)


def _layernorm(
    x: Tensor, gamma: Tensor, beta: Tensor, eps: float, *, dim=-1, unbiased=False, eps_on_std=False
):
    if dim is None:  # statistics of the whole tensor
        mean, var = x.mean(), x.var(unbiased=unbiased)
    else:
        mean, var = _statistics(x, dim, unbiased)
    return gamma * _normalise(x, mean, var, eps, eps_on_std) + beta, None


LAYERNORM_VARIANTS = (
    Variant("layernorm-wrong-axis", lambda x, gamma, beta, eps: _layernorm(x, gamma, beta, eps, dim=0)),
    Variant("layernorm-wrong-axis", lambda x, gamma, beta, eps: _layernorm(x, gamma, beta, eps, dim=None)),
    Variant(
        "unbiased-variance-normalize",
        lambda x, gamma, beta, eps: _layernorm(x, gamma, beta, eps, unbiased=True),
    ),
    Variant(
        "unbiased-variance-normalize",
        lambda x, gamma, beta, eps: _layernorm(x, gamma, beta, eps, unbiased=True, eps_on_std=True),
    ),
    *_eps_variants(-1, False),
)


def _backward_over_batch(dout: Tensor, cache: Any) -> tuple[Tensor, Tensor, Tensor]:
    # a right forward, but the backward reduces over the examples (dim 0), as BatchNorm's does
    g = dout * cache.gamma
    dx = (g - g.mean(dim=0) - cache.x_hat * (g * cache.x_hat).mean(dim=0)) * cache.inv_std
    return dx, (dout * cache.x_hat).sum(dim=0), dout.sum(dim=0)


LAYERNORM_BACKWARD_VARIANTS = (
    Variant(
        "layernorm-wrong-axis",
        lambda dout, cache: _norm_gradients(dout, cache.x, cache.gamma, cache.eps, dim=0),
    ),
    Variant("layernorm-wrong-axis", _backward_over_batch),
    *_unbiased_variants(-1),
    *_gamma_misplaced_variants(-1),
    *_eps_variants(-1, True),
)

# -- cases --------------------------------------------------------------------------------


def _features(g: torch.Generator, n: int, d: int, dtype: torch.dtype, spread: float = 1.0) -> Tensor:
    """(n, d) inputs whose features have their own means and scales, and whose examples
    their own offsets: both normalisations have work to do, along different axes."""
    scale = 0.5 + 1.5 * rand(g, d)  # (d,)
    shift = randn(g, d, dtype=torch.float64) * scale  # (d,): means within ~2 std
    row = randn(g, n, 1, dtype=torch.float64) * 0.5 * spread  # (n, 1)
    return (randn(g, n, d, dtype=torch.float64) * scale + shift + row).to(dtype)


def _affine(g: torch.Generator, d: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    gamma = 1.0 + 0.5 * randn(g, d, dtype=torch.float64)
    return gamma.to(dtype), (0.5 * randn(g, d, dtype=torch.float64)).to(dtype)


def _running(g: torch.Generator, d: int, dtype: torch.dtype, fresh: bool) -> tuple[Tensor, Tensor]:
    if fresh:  # as a new BatchNorm1d starts
        return torch.zeros(d, dtype=dtype), torch.ones(d, dtype=dtype)
    mean = 0.3 * randn(g, d, dtype=torch.float64)
    var = 0.5 + rand(g, d)
    return mean.to(dtype), var.to(dtype)


def _bn_steps(
    sizes: tuple[int, int, int, int],
    d: int,
    momentum: float,
    eps: float,
    fresh: bool = False,
    constant_feature: bool = False,
    mode_built_at_run_time: bool = False,
):
    """Three train batches then one eval batch (autograder.runtime.drivers.normalization.STEPS).
    ``mode_built_at_run_time``: the driver passes modes equal to "train" and "eval" that are
    not the interned literals, as modes read at run time are (`mode is "train"` fails)."""

    def build(g, dtype):
        batches = [_features(g, n, d, dtype, spread=0.0) for n in sizes]
        if constant_feature:  # a feature with zero variance in every batch: x_hat = 0 there
            for b in batches:
                b[:, 0] = 1.5
        gamma, beta = _affine(g, d, dtype)
        running_mean, running_var = _running(g, d, dtype, fresh)
        return CaseData(
            kwargs={
                "batches": batches,
                "gamma": gamma,
                "beta": beta,
                "eps": eps,
                "momentum": momentum,
                "running_mean": running_mean,
                "running_var": running_var,
            }
            | ({"mode_built_at_run_time": True} if mode_built_at_run_time else {})
        )

    return build


def _bn_label(
    sizes, d, momentum, eps, fresh=False, constant_feature=False, mode_built_at_run_time=False
) -> str:
    s = f"N={'/'.join(map(str, sizes[:3]))} then eval N={sizes[3]}, D={d}, momentum={momentum:g}, eps={eps:g}"
    s += ", running stats 0/1" if fresh else ""
    s += ", feature 0 constant" if constant_feature else ""
    return s + (", modes built at run time" if mode_built_at_run_time else "")


def _bn_cases(*specs: dict[str, Any]) -> tuple[Case, ...]:
    return tuple(Case(_bn_label(**s), _bn_steps(**s)) for s in specs)


def _grad_case(n: int, d: int, eps: float, batchnorm: bool, mode_built_at_run_time: bool = False):
    def build(g, dtype):
        x = _features(g, n, d, dtype, spread=0.0 if batchnorm else 1.0)
        gamma, beta = _affine(g, d, dtype)
        dout = randn(g, n, d, dtype=dtype)
        kwargs: dict[str, Any] = {"x": x, "gamma": gamma, "beta": beta, "eps": eps, "dout": dout}
        if batchnorm:
            running_mean, running_var = _running(g, d, dtype, fresh=True)
            kwargs |= {"momentum": 0.1, "running_mean": running_mean, "running_var": running_var}
        if mode_built_at_run_time:  # see _bn_steps
            kwargs["mode_built_at_run_time"] = True
        return CaseData(kwargs=kwargs)

    return build


def _ln_case(n: int, d: int, eps: float):
    def build(g, dtype):
        x = _features(g, n, d, dtype)
        gamma, beta = _affine(g, d, dtype)
        return CaseData(kwargs={"x": x, "gamma": gamma, "beta": beta, "eps": eps})

    return build


def _grad_cases(
    batchnorm: bool, *shapes: tuple[int, int, float], mode_built_at_run_time: bool = False
) -> tuple[Case, ...]:
    suffix = ", mode built at run time" if mode_built_at_run_time else ""
    return tuple(
        Case(f"N={n}, D={d}, eps={eps:g}{suffix}", _grad_case(n, d, eps, batchnorm, mode_built_at_run_time))
        for n, d, eps in shapes
    )


def _ln_cases(*shapes: tuple[int, int, float]) -> tuple[Case, ...]:
    return tuple(Case(f"N={n}, D={d}, eps={eps:g}", _ln_case(n, d, eps)) for n, d, eps in shapes)


def _gradient_tolerance(dim: int):
    """dx sums terms of size |dout * gamma| / std(x) that cancel, so correct programs that
    order them differently differ in proportion to those terms, not to dx: the dtype's
    atol, scaled by the largest such term (never below the dtype's own)."""

    def tolerance(data: CaseData, dtype: torch.dtype, device: str) -> Tolerance:
        base = tolerance_for(dtype, device)
        kw = data.kwargs
        x = kw["x"].double()
        inv_std = torch.rsqrt(x.var(dim=dim, unbiased=False) + kw["eps"]).max()
        term = float((kw["dout"].double() * kw["gamma"].double()).abs().max() * inv_std)
        return Tolerance(base.rtol, base.atol * max(1.0, term))

    return tolerance


# -- graded names -------------------------------------------------------------------------

TRAIN_N = (
    "train mode normalises with the batch's own variance, 0 for every feature of a single "
    "example, and the unbiased running variance divides by N - 1 = 0"
)

STEP_OUTPUTS = (
    "out of call 1 (train)",
    "out of call 2 (train)",
    "out of call 3 (train)",
    "out of call 4 (eval)",
    "running_mean after each call",
    "running_var after each call",
)
STEP_CREDIT = (1 / 6, 1 / 6, 1 / 6, 1 / 4, 1 / 8, 1 / 8)

BATCHNORM_FORWARD = Graded(
    name="batchnorm_forward",
    clause="05.batchnorm_forward",
    task=1,
    signature="batchnorm_forward(x, gamma, beta, bn_param) -> (out, cache)",
    outputs=STEP_OUTPUTS,
    # the train outputs, the eval output and each running statistic are right or wrong
    # apart: a right normalisation keeps its half when the running variance follows
    # another convention (the eval output, computed from it, is then wrong too)
    credit=STEP_CREDIT,
    reference=ref.batchnorm_forward,
    kind="driver",
    driver="normalization:batchnorm_train_then_eval",
    forbidden=FORWARD_FORBIDDEN,
    variants=BATCHNORM_VARIANTS,
    # batches of two (a variance, biased or not) and an eval batch of one (its own
    # statistics are not the running ones), one or two features
    small=(
        _bn_steps((2, 2, 2, 1), 1, momentum=0.5, eps=1e-5),
        _bn_steps((2, 2, 2, 1), 1, momentum=0.5, eps=1e-5, fresh=True),
        _bn_steps((3, 2, 2, 1), 2, momentum=0.25, eps=1e-3),
    ),
    dims=(
        *(
            Dim(f"N (train call {i + 1})", lambda c, i=i: c.kwargs["batches"][i].shape[0], never_one=TRAIN_N)
            for i in range(3)
        ),
        Dim("N (eval call)", lambda c: c.kwargs["batches"][3].shape[0]),
        Dim("D", lambda c: c.kwargs["gamma"].shape[0]),
    ),
    tests=(
        Test(
            "float32, three train calls then eval",
            torch.float32,
            points=1,
            hidden=False,
            cases=_bn_cases(
                dict(sizes=(8, 8, 8, 6), d=5, momentum=0.1, eps=1e-5, fresh=True),
                dict(sizes=(16, 4, 10, 3), d=3, momentum=0.2, eps=1e-3),
            ),
        ),
        Test(
            "float64, momentum, eps and small batches",
            torch.float64,
            points=1,
            hidden=False,
            cases=_bn_cases(
                dict(sizes=(4, 12, 6, 5), d=7, momentum=0.3, eps=0.1),
                dict(sizes=(2, 3, 2, 4), d=4, momentum=0.1, eps=1e-5),
            ),
        ),
        Test(
            "float64, other shapes, eval on one example",
            torch.float64,
            points=1,
            cases=_bn_cases(
                dict(sizes=(32, 32, 32, 8), d=16, momentum=0.05, eps=1e-5, fresh=True, constant_feature=True),
                dict(sizes=(5, 9, 3, 1), d=6, momentum=0.25, eps=1e-4, mode_built_at_run_time=True),
                dict(sizes=(4, 3, 6, 2), d=1, momentum=0.2, eps=1e-5),
            ),
        ),
        Test(
            "float32, a constant feature and a large eps",
            torch.float32,
            points=1,
            cases=_bn_cases(
                dict(sizes=(6, 6, 6, 6), d=4, momentum=0.1, eps=1e-2, constant_feature=True),
                # eps well above float32's rounding of a constant's mean (1 ulp / sqrt(eps))
                dict(sizes=(20, 7, 3, 2), d=9, momentum=0.15, eps=0.05, constant_feature=True),
            ),
        ),
    ),
)

BATCHNORM_BACKWARD = Graded(
    name="batchnorm_backward",
    clause="05.batchnorm_backward",
    task=2,
    signature="batchnorm_backward(dout, cache) -> (dx, dgamma, dbeta)",
    outputs=("dx", "dgamma", "dbeta"),
    reference=ref.batchnorm_backward,
    kind="driver",
    driver="normalization:batchnorm_gradients",
    forbidden=BACKWARD_FORBIDDEN,
    variants=BATCHNORM_BACKWARD_VARIANTS,
    small=(_grad_case(2, 1, 1e-5, True), _grad_case(3, 1, 1e-5, True), _grad_case(2, 2, 1e-3, True)),
    dims=(
        Dim("N", lambda c: c.kwargs["x"].shape[0], never_one=TRAIN_N),
        Dim("D", lambda c: c.kwargs["x"].shape[1]),
    ),
    tolerance=_gradient_tolerance(0),
    tests=(
        Test(
            "float64, train mode",
            torch.float64,
            points=2,
            hidden=False,
            cases=_grad_cases(True, (4, 5, 1e-5), (8, 3, 1e-3)),
        ),
        Test(
            "float32, train mode",
            torch.float32,
            points=1,
            hidden=False,
            cases=_grad_cases(True, (16, 6, 1e-5)),
        ),
        Test(
            "float64, other shapes",
            torch.float64,
            points=1,
            cases=(
                *_grad_cases(True, (2, 4, 1e-5), mode_built_at_run_time=True),
                *_grad_cases(True, (32, 12, 0.1), (3, 1, 1e-5)),
            ),
        ),
        Test(
            "float32, other shapes",
            torch.float32,
            points=1,
            cases=_grad_cases(True, (9, 17, 1e-5), (64, 8, 1e-5)),
        ),
    ),
)

LAYERNORM_FORWARD = Graded(
    name="layernorm_forward",
    clause="05.layernorm_forward",
    task=3,
    signature="layernorm_forward(x, gamma, beta, eps) -> (out, cache)",
    outputs=("out",),
    reference=ref.layernorm_forward,
    kind="driver",
    driver="normalization:layernorm_output",
    forbidden=FORWARD_FORBIDDEN,
    variants=LAYERNORM_VARIANTS,
    # two features (a variance), then two examples (the axis shows)
    small=(_ln_case(1, 2, 1e-5), _ln_case(2, 2, 1e-5), _ln_case(2, 3, 1e-3)),
    dims=(Dim("N", lambda c: c.kwargs["x"].shape[0]), Dim("D", lambda c: c.kwargs["x"].shape[1])),
    tests=(
        Test("float32", torch.float32, points=1, hidden=False, cases=_ln_cases((4, 16, 1e-12), (6, 5, 1e-5))),
        Test(
            "float64, one example and N = D",
            torch.float64,
            points=1,
            hidden=False,
            cases=_ln_cases((1, 8, 1e-5), (6, 6, 1e-5)),
        ),
        Test(
            "float64, other shapes and eps",
            torch.float64,
            points=1,
            # D = 1: x_hat = 0 / sqrt(eps) = 0, out = beta
            cases=_ln_cases((10, 3, 1e-3), (3, 32, 1e-12), (4, 1, 1e-5)),
        ),
        Test(
            "float32, wide rows",
            torch.float32,
            points=1,
            cases=_ln_cases(
                (5, 128, 1e-5),
            ),
        ),
    ),
)

LAYERNORM_BACKWARD = Graded(
    name="layernorm_backward",
    clause="05.layernorm_backward",
    task=4,
    signature="layernorm_backward(dout, cache) -> (dx, dgamma, dbeta)",
    outputs=("dx", "dgamma", "dbeta"),
    reference=ref.layernorm_backward,
    kind="driver",
    driver="normalization:layernorm_gradients",
    forbidden=BACKWARD_FORBIDDEN,
    variants=LAYERNORM_BACKWARD_VARIANTS,
    small=(_grad_case(1, 2, 1e-5, False), _grad_case(2, 2, 1e-5, False), _grad_case(2, 3, 1e-3, False)),
    dims=(Dim("N", lambda c: c.kwargs["x"].shape[0]), Dim("D", lambda c: c.kwargs["x"].shape[1])),
    tolerance=_gradient_tolerance(-1),
    tests=(
        Test(
            "float64",
            torch.float64,
            points=2,
            hidden=False,
            cases=_grad_cases(False, (4, 6, 1e-5), (3, 3, 1e-3)),
        ),
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=_grad_cases(
                False,
                (8, 16, 1e-12),
            ),
        ),
        Test(
            "float64, other shapes",
            torch.float64,
            points=1,
            cases=_grad_cases(False, (1, 10, 1e-5), (12, 2, 1e-5), (7, 33, 0.1), (5, 1, 1e-5)),
        ),
        Test(
            "float32, other shapes",
            torch.float32,
            points=1,
            cases=_grad_cases(
                False,
                (16, 64, 1e-5),
            ),
        ),
    ),
)

SPEC = StageSpec(
    id="05_normalization",
    title="BatchNorm vs LayerNorm by hand",
    graded=(BATCHNORM_FORWARD, BATCHNORM_BACKWARD, LAYERNORM_FORWARD, LAYERNORM_BACKWARD),
    misconceptions={
        "unbiased-variance-normalize": "your output matches normalising with the unbiased variance "
        "(dividing by N - 1, torch.var's default): BatchNorm and LayerNorm normalise with the biased "
        "variance, mean((x - mean)**2), i.e. x.var(dim, unbiased=False), and add eps inside the sqrt.",
        "running-var-biased": "your running_var matches an average of the biased batch variance: the "
        "running average uses the unbiased one, var * N / (N - 1), as torch.nn.BatchNorm1d does (the "
        "biased one is only for normalising the batch).",
        "layernorm-wrong-axis": "your result matches LayerNorm with statistics over the wrong axis: "
        "LayerNorm normalises each example over its own features (the last dim, keepdim=True), not "
        "each feature over the batch (that is BatchNorm) nor the whole tensor at once.",
        "eval-uses-batch-stats": "your eval-mode output (or running statistics) matches using the batch's "
        "own statistics in eval mode: in eval mode, normalise with bn_param['running_mean'] and "
        "bn_param['running_var'] and leave them unchanged.",
        "eps-outside-sqrt": "your output matches adding eps to the standard deviation, "
        "(x - mean) / (sqrt(var) + eps): eps goes inside the square root, (x - mean) / sqrt(var + eps), "
        "as in torch.nn.BatchNorm1d; the two differ wherever eps is not tiny beside the variance.",
        "eps-missing": "your output matches normalising without eps, (x - mean) / sqrt(var): a feature "
        "whose values are all equal then gives 0 / 0 = nan. Add eps inside the square root, "
        "(x - mean) / sqrt(var + eps), in train mode as in eval mode.",
        "affine-dropped": "your output matches x_hat without gamma and beta in one of the modes (often "
        "eval mode, whose normalisation uses the running statistics): both modes return "
        "gamma * x_hat + beta.",
        "dx-gamma-misplaced": "your dx matches the gradient through the normalisation taken on dout "
        "without gamma, or with gamma multiplied in afterwards (as when BatchNorm's backward is reused "
        "on the transpose with gamma left out of its forward): the gradient reaching x_hat is "
        "g = dout * gamma, and the means of the formula are means of g and g * x_hat over the "
        "normalised axis: dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(var + eps).",
    },
)

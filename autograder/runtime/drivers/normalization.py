"""Drivers of stage 05_normalization: how the grader exercises your normalisation code.

A forward pass returns ``(out, cache)``, and ``cache`` is yours, so the grader cannot
compare it: it checks ``out`` and, for BatchNorm, the running statistics your forward
updates in ``bn_param``; it checks a backward pass by calling your own forward on the
case's input, then your backward on your own cache. Nothing here computes a result.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from autograder.runtime.drivers import require

STEPS = ("train", "train", "train", "eval")  # the modes of batchnorm_train_then_eval's calls


def _pair(result: Any, name: str) -> tuple[Any, Any]:
    """``(out, cache)`` from a forward pass, or an error that says what came back instead."""
    if not isinstance(result, tuple | list) or len(result) != 2:
        what = (
            f"a tuple of {len(result)} values" if isinstance(result, tuple | list) else type(result).__name__
        )
        raise ValueError(f"`{name}` returned {what}; expected a tuple (out, cache)")
    return result[0], result[1]


def _mode(mode: str, kwargs: dict[str, Any]) -> str:
    """``mode``, or with ``mode_built_at_run_time`` in the case an equal string that is a new
    object, as a mode read from a config file or a command line is: ``mode is "train"``
    holds only for the interned literal, so a case decides between ``is`` and ``==``."""
    return mode[:1] + mode[1:] if kwargs.get("mode_built_at_run_time", False) else mode


def _snapshot(value: Any) -> Any:
    """A copy of a tensor, so that later in-place updates do not change what was recorded."""
    return value.detach().clone() if isinstance(value, Tensor) else value


def _statistic(bn_param: dict[str, Any], key: str, step: int) -> Tensor:
    value = bn_param.get(key)
    if not isinstance(value, Tensor):
        raise ValueError(
            f'after call {step} of batchnorm_forward, bn_param["{key}"] is '
            f"{type(value).__name__}, not a tensor: update the running statistics in bn_param"
        )
    return value.detach().clone()


def _forward_for_cache(ns: dict[str, Any], name: str, *args: Any) -> Any:
    """Your forward pass, run to get the cache your backward pass receives."""
    forward = require(ns, name)
    try:
        _out, cache = _pair(forward(*args), name)
    except NotImplementedError as exc:
        raise RuntimeError(
            f"this test runs your `{name}` first, to give your backward pass its cache, "
            f"and `{name}` is not implemented yet"
        ) from exc
    return cache


def batchnorm_train_then_eval(ns: dict[str, Any], data: dict[str, Any], device: str) -> tuple[Tensor, ...]:
    """Call ``batchnorm_forward`` on one ``bn_param`` dict, as a BatchNorm1d layer would be
    called: three train steps, then one eval step, each on its own batch.

    Returns ``out`` of each call, then ``running_mean`` and ``running_var`` as found in
    ``bn_param`` after each call, stacked: (4, D) each (row i: after call i + 1).
    """
    forward = require(ns, "batchnorm_forward")
    kw = data["kwargs"]
    bn_param = {
        "mode": "train",
        "eps": kw["eps"],
        "momentum": kw["momentum"],
        "running_mean": kw["running_mean"],
        "running_var": kw["running_var"],
    }
    outs, means, variances = [], [], []
    for step, (mode, x) in enumerate(zip(STEPS, kw["batches"], strict=True), start=1):
        bn_param["mode"] = _mode(mode, kw)
        out, _cache = _pair(forward(x, kw["gamma"], kw["beta"], bn_param), "batchnorm_forward")
        outs.append(_snapshot(out))
        means.append(_statistic(bn_param, "running_mean", step))
        variances.append(_statistic(bn_param, "running_var", step))
    shapes = {tuple(m.shape) for m in means + variances}
    if len(shapes) != 1:
        raise ValueError(f"the running statistics change shape between calls: {sorted(shapes)}")
    return (*outs, torch.stack(means), torch.stack(variances))


def batchnorm_gradients(ns: dict[str, Any], data: dict[str, Any], device: str) -> Any:
    """Your ``batchnorm_forward`` in train mode on ``x``, then your ``batchnorm_backward``
    on ``dout`` and your cache: returns ``(dx, dgamma, dbeta)``."""
    kw = data["kwargs"]
    bn_param = {
        "mode": _mode("train", kw),
        "eps": kw["eps"],
        "momentum": kw["momentum"],
        "running_mean": kw["running_mean"],
        "running_var": kw["running_var"],
    }
    cache = _forward_for_cache(ns, "batchnorm_forward", kw["x"], kw["gamma"], kw["beta"], bn_param)
    return require(ns, "batchnorm_backward")(kw["dout"], cache)


def layernorm_output(ns: dict[str, Any], data: dict[str, Any], device: str) -> Any:
    """``out`` of your ``layernorm_forward(x, gamma, beta, eps)`` (the cache is yours)."""
    kw = data["kwargs"]
    forward = require(ns, "layernorm_forward")
    out, _cache = _pair(forward(kw["x"], kw["gamma"], kw["beta"], kw["eps"]), "layernorm_forward")
    return out


def layernorm_gradients(ns: dict[str, Any], data: dict[str, Any], device: str) -> Any:
    """Your ``layernorm_forward`` on ``x``, then your ``layernorm_backward`` on ``dout`` and
    your cache: returns ``(dx, dgamma, dbeta)``."""
    kw = data["kwargs"]
    cache = _forward_for_cache(ns, "layernorm_forward", kw["x"], kw["gamma"], kw["beta"], kw["eps"])
    return require(ns, "layernorm_backward")(kw["dout"], cache)

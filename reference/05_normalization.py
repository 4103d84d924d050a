"""Stage 05 reference: BatchNorm and LayerNorm by hand, forward and backward, no autograd.

Ioffe & Szegedy, "Batch Normalization" (2015), Algorithm 1 (train) and 2 (inference);
Ba, Kiros & Hinton, "Layer Normalization" (2016), eq. (3). Semantics follow
``torch.nn.BatchNorm1d`` and ``torch.nn.LayerNorm``:

    x_hat = (x - mean) / sqrt(var + eps),   out = gamma * x_hat + beta,

with the *biased* variance (divide by the count) in both. BatchNorm takes the statistics
of each feature over the batch (dim 0) in train mode, keeps running averages

    running = (1 - momentum) * running + momentum * batch_statistic,

where the running variance averages the *unbiased* batch variance (divide by N - 1), and
uses the running averages in eval mode. LayerNorm takes the statistics of each example
over its features (the last dim), the same in train and eval.

The backward passes use the compact form of the gradient through the normalisation
(derived in the stage's notebook): with g = dout * gamma and the mean taken over the
normalised dimension,

    dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(var + eps).

Device- and dtype-agnostic; no work at import time.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor


class NormCache(NamedTuple):
    """What a backward pass needs from its forward pass."""

    x: Tensor  # (N, D), the input
    x_hat: Tensor  # (N, D), the normalised input
    inv_std: Tensor  # 1 / sqrt(var + eps): (D,) for BatchNorm, (N, 1) for LayerNorm
    gamma: Tensor  # (D,)
    eps: float
    batch_stats: bool  # were the statistics computed from this x (train BatchNorm, LayerNorm)?


def batchnorm_forward(
    x: Tensor, gamma: Tensor, beta: Tensor, bn_param: dict[str, Any]
) -> tuple[Tensor, NormCache]:
    """BatchNorm over the batch dimension, as ``torch.nn.BatchNorm1d``.

    x: (N, D); gamma, beta: (D,). bn_param: ``mode`` ("train" or "eval"), ``eps``,
    ``momentum``, ``running_mean`` (D,), ``running_var`` (D,). In train mode the running
    statistics are updated in place. Returns out (N, D) and the cache for the backward.
    """
    mode, eps, momentum = bn_param["mode"], bn_param["eps"], bn_param["momentum"]
    running_mean, running_var = bn_param["running_mean"], bn_param["running_var"]
    if mode == "train":
        n = x.size(0)
        mean = x.mean(dim=0)  # (D,)
        var = ((x - mean) ** 2).mean(dim=0)  # (D,) biased: normalises the batch
        with torch.no_grad():  # buffers, as in torch: never part of a graph
            running_mean.mul_(1 - momentum).add_(momentum * mean)
            running_var.mul_(1 - momentum).add_(momentum * var * n / (n - 1))  # unbiased
    elif mode == "eval":
        mean, var = running_mean, running_var
    else:
        raise ValueError(f'bn_param["mode"] must be "train" or "eval", got {mode!r}')
    inv_std = 1.0 / torch.sqrt(var + eps)  # (D,)
    x_hat = (x - mean) * inv_std  # (N, D)
    out = gamma * x_hat + beta  # (N, D)
    return out, NormCache(x, x_hat, inv_std, gamma, eps, batch_stats=mode == "train")


def _normalisation_backward(g: Tensor, x_hat: Tensor, inv_std: Tensor, dim: int) -> Tensor:
    """dx from g = dL/dx_hat when x_hat = (x - mean) * inv_std with the statistics of x
    taken along ``dim``: dx = (g - mean(g) - x_hat * mean(g * x_hat)) * inv_std."""
    g_mean = g.mean(dim=dim, keepdim=True)
    gx_mean = (g * x_hat).mean(dim=dim, keepdim=True)
    return (g - g_mean - x_hat * gx_mean) * inv_std


def batchnorm_backward(dout: Tensor, cache: NormCache) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of the BatchNorm forward: dout (N, D) -> dx (N, D), dgamma (D,), dbeta (D,).

    In eval mode the statistics are constants, so dx is just dout * gamma * inv_std.
    """
    dbeta = dout.sum(dim=0)  # (D,)
    dgamma = (dout * cache.x_hat).sum(dim=0)  # (D,)
    g = dout * cache.gamma  # (N, D): dL/dx_hat
    if cache.batch_stats:
        dx = _normalisation_backward(g, cache.x_hat, cache.inv_std, dim=0)
    else:
        dx = g * cache.inv_std
    return dx, dgamma, dbeta


def layernorm_forward(x: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> tuple[Tensor, NormCache]:
    """LayerNorm over the features of each example, as ``torch.nn.LayerNorm(D, eps)``.

    x: (N, D); gamma, beta: (D,). Returns out (N, D) and the cache for the backward.
    """
    mean = x.mean(dim=-1, keepdim=True)  # (N, 1)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # (N, 1), biased
    inv_std = 1.0 / torch.sqrt(var + eps)  # (N, 1)
    x_hat = (x - mean) * inv_std  # (N, D)
    out = gamma * x_hat + beta  # (N, D)
    return out, NormCache(x, x_hat, inv_std, gamma, eps, batch_stats=True)


def layernorm_backward(dout: Tensor, cache: NormCache) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of the LayerNorm forward: dout (N, D) -> dx (N, D), dgamma (D,), dbeta (D,)."""
    dbeta = dout.sum(dim=0)  # (D,): gamma and beta are shared by the examples
    dgamma = (dout * cache.x_hat).sum(dim=0)  # (D,)
    g = dout * cache.gamma  # (N, D)
    dx = _normalisation_backward(g, cache.x_hat, cache.inv_std, dim=-1)
    return dx, dgamma, dbeta

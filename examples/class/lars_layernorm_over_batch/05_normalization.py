"""Homework 5: normalization layers. Lars B.

LayerNorm is BatchNorm without the running averages, so I reuse the same code.
"""
import torch


def batchnorm_forward(x, gamma, beta, bn_param):
    mode = bn_param["mode"]
    eps = bn_param["eps"]
    momentum = bn_param["momentum"]
    if mode == "train":
        mean = x.mean(dim=0)
        var = x.var(dim=0, unbiased=False)
        n = x.shape[0]
        bn_param["running_mean"].mul_(1 - momentum).add_(momentum * mean)
        bn_param["running_var"].mul_(1 - momentum).add_(momentum * var * n / (n - 1))
    else:
        mean = bn_param["running_mean"]
        var = bn_param["running_var"]
    inv_std = 1 / torch.sqrt(var + eps)
    x_hat = (x - mean) * inv_std
    return gamma * x_hat + beta, (x_hat, gamma, inv_std)


def batchnorm_backward(dout, cache):
    x_hat, gamma, inv_std = cache
    n = dout.shape[0]
    dx_hat = dout * gamma
    dx = inv_std / n * (n * dx_hat - dx_hat.sum(dim=0) - x_hat * (dx_hat * x_hat).sum(dim=0))
    return dx, (dout * x_hat).sum(dim=0), dout.sum(dim=0)


def layernorm_forward(x, gamma, beta, eps):
    mean = x.mean(dim=0)
    var = x.var(dim=0, unbiased=False)
    inv_std = 1 / torch.sqrt(var + eps)
    x_hat = (x - mean) * inv_std
    return gamma * x_hat + beta, (x_hat, gamma, inv_std)


def layernorm_backward(dout, cache):
    return batchnorm_backward(dout, cache)

"""Abel - assignment 5. Eval mode: just normalise with the running stats."""
import torch


def batchnorm_forward(x, gamma, beta, bn_param):
    eps, momentum = bn_param["eps"], bn_param["momentum"]
    if bn_param["mode"] == "train":
        n = x.shape[0]
        mean = x.mean(0)
        var = ((x - mean) ** 2).mean(0)
        inv_std = 1.0 / torch.sqrt(var + eps)
        bn_param["running_mean"].mul_(1 - momentum).add_(momentum * mean)
        bn_param["running_var"].mul_(1 - momentum).add_(momentum * var * n / (n - 1))
    else:
        x_hat = (x - bn_param["running_mean"]) / torch.sqrt(bn_param["running_var"] + eps)
        return x_hat, None
    x_hat = (x - mean) * inv_std
    return gamma * x_hat + beta, (x_hat, gamma, inv_std)


def batchnorm_backward(dout, cache):
    x_hat, gamma, inv_std = cache
    g = dout * gamma
    dx = (g - g.mean(0) - x_hat * (g * x_hat).mean(0)) * inv_std
    return dx, (dout * x_hat).sum(0), dout.sum(0)


def layernorm_forward(x, gamma, beta, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    inv_std = 1.0 / torch.sqrt(var + eps)
    x_hat = (x - mean) * inv_std
    return gamma * x_hat + beta, (x_hat, gamma, inv_std)


def layernorm_backward(dout, cache):
    x_hat, gamma, inv_std = cache
    g = dout * gamma
    dx = (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True)) * inv_std
    return dx, (dout * x_hat).sum(0), dout.sum(0)

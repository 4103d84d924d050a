"""HW5 - normalization (Pia). Followed the Annotated Transformer's LayerNorm: std + eps."""
import torch


def batchnorm_forward(x, gamma, beta, bn_param):
    mode = bn_param["mode"]
    eps, momentum = bn_param["eps"], bn_param["momentum"]
    if mode == "train":
        n = x.shape[0]
        mu = x.mean(dim=0)
        var = x.var(dim=0, unbiased=False)
        std = torch.sqrt(var)
        x_hat = (x - mu) / (std + eps)
        bn_param["running_mean"] = (1 - momentum) * bn_param["running_mean"] + momentum * mu
        bn_param["running_var"] = (1 - momentum) * bn_param["running_var"] + momentum * var * n / (n - 1)
    else:
        std = torch.sqrt(bn_param["running_var"])
        x_hat = (x - bn_param["running_mean"]) / (std + eps)
    out = gamma * x_hat + beta
    return out, (x_hat, gamma, std + eps)


def batchnorm_backward(dout, cache):
    x_hat, gamma, std = cache
    n = dout.shape[0]
    dx_hat = dout * gamma
    dx = (n * dx_hat - dx_hat.sum(dim=0) - x_hat * (dx_hat * x_hat).sum(dim=0)) / (n * std)
    return dx, (dout * x_hat).sum(dim=0), dout.sum(dim=0)


def layernorm_forward(x, gamma, beta, eps):
    mu = x.mean(dim=1, keepdim=True)
    std = torch.sqrt(x.var(dim=1, unbiased=False, keepdim=True))
    x_hat = (x - mu) / (std + eps)
    return gamma * x_hat + beta, (x_hat, gamma, std + eps)


def layernorm_backward(dout, cache):
    x_hat, gamma, std = cache
    d = dout.shape[1]
    dx_hat = dout * gamma
    dx = (d * dx_hat - dx_hat.sum(dim=1, keepdim=True) - x_hat * (dx_hat * x_hat).sum(dim=1, keepdim=True)) / (d * std)
    return dx, (dout * x_hat).sum(dim=0), dout.sum(dim=0)

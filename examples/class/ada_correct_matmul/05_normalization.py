"""Assignment 05 - BatchNorm and LayerNorm, forward and backward.  Ada L."""
import torch


def batchnorm_forward(x, gamma, beta, bn_param):
    mode = bn_param["mode"]
    eps, momentum = bn_param["eps"], bn_param["momentum"]
    running_mean, running_var = bn_param["running_mean"], bn_param["running_var"]
    N = x.shape[0]

    if mode == "train":
        # the lecture's step-by-step graph, kept in the cache for the backward pass
        mu = x.sum(dim=0) / N
        xmu = x - mu
        sq = xmu**2
        var = sq.sum(dim=0) / N  # biased
        sqrtvar = torch.sqrt(var + eps)
        ivar = 1.0 / sqrtvar
        xhat = xmu * ivar
        out = gamma * xhat + beta

        running_mean = (1 - momentum) * running_mean + momentum * mu
        running_var = (1 - momentum) * running_var + momentum * var * N / (N - 1)
        bn_param["running_mean"] = running_mean
        bn_param["running_var"] = running_var
        cache = (xhat, gamma, xmu, ivar, sqrtvar, var, eps)
    elif mode == "eval":
        xhat = (x - running_mean) / torch.sqrt(running_var + eps)
        out = gamma * xhat + beta
        cache = None
    else:
        raise ValueError("Invalid forward batchnorm mode " + mode)
    return out, cache


def batchnorm_backward(dout, cache):
    xhat, gamma, xmu, ivar, sqrtvar, var, eps = cache
    N = dout.shape[0]

    dbeta = dout.sum(dim=0)
    dgamma = (dout * xhat).sum(dim=0)
    dxhat = dout * gamma

    # back through the graph, one node at a time
    divar = (dxhat * xmu).sum(dim=0)
    dxmu1 = dxhat * ivar
    dsqrtvar = -1.0 / (sqrtvar**2) * divar
    dvar = 0.5 * 1.0 / torch.sqrt(var + eps) * dsqrtvar
    dsq = torch.ones_like(dout) / N * dvar
    dxmu2 = 2 * xmu * dsq
    dx1 = dxmu1 + dxmu2
    dmu = -1 * dx1.sum(dim=0)
    dx2 = torch.ones_like(dout) / N * dmu
    dx = dx1 + dx2
    return dx, dgamma, dbeta


def layernorm_forward(x, gamma, beta, eps):
    # the same graph with the statistics of each row (transpose, normalise, transpose back)
    xt = x.t()  # (D, N)
    D = xt.shape[0]
    mu = xt.sum(dim=0) / D
    xmu = xt - mu
    var = (xmu**2).sum(dim=0) / D
    sqrtvar = torch.sqrt(var + eps)
    ivar = 1.0 / sqrtvar
    xhat = (xmu * ivar).t()  # (N, D)
    out = gamma * xhat + beta
    cache = (xhat, gamma, xmu, ivar, sqrtvar, var, eps)
    return out, cache


def layernorm_backward(dout, cache):
    xhat, gamma, xmu, ivar, sqrtvar, var, eps = cache
    D = xmu.shape[0]
    dbeta = dout.sum(dim=0)
    dgamma = (dout * xhat).sum(dim=0)
    dxhat = (dout * gamma).t()  # (D, N): now the batchnorm graph again

    divar = (dxhat * xmu).sum(dim=0)
    dxmu1 = dxhat * ivar
    dsqrtvar = -1.0 / (sqrtvar**2) * divar
    dvar = 0.5 * 1.0 / torch.sqrt(var + eps) * dsqrtvar
    dxmu2 = 2 * xmu * torch.ones_like(dxhat) / D * dvar
    dx1 = dxmu1 + dxmu2
    dmu = -1 * dx1.sum(dim=0)
    dx = dx1 + torch.ones_like(dxhat) / D * dmu
    return dx.t(), dgamma, dbeta


if __name__ == "__main__":
    x = torch.randn(8, 3) * 2 + 1
    bn_param = {"mode": "train", "eps": 1e-5, "momentum": 0.1,
                "running_mean": torch.zeros(3), "running_var": torch.ones(3)}
    out, cache = batchnorm_forward(x, torch.ones(3), torch.zeros(3), bn_param)
    print(out.mean(dim=0), out.std(dim=0, unbiased=False))

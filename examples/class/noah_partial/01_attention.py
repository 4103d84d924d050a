import math
import torch


def softmax(x, dim=-1):
    x_max = x.max(dim=dim, keepdim=True).values
    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    d_k = q.size(-1)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    weights = softmax(scores, dim=-1)
    return torch.matmul(weights, v), weights


def padding_mask(lengths, max_len):
    # TODO
    raise NotImplementedError("not implemented yet")


def causal_mask(L):
    # TODO
    raise NotImplementedError("not implemented yet")

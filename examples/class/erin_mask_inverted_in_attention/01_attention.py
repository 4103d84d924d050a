import math
import torch


def softmax(x, dim=-1):
    x_max = x.max(dim=dim, keepdim=True).values
    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        # hide the masked positions
        scores = scores.masked_fill(mask, -1e9)
    weights = softmax(scores, dim=-1)
    return weights @ v, weights


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]


def causal_mask(L):
    return torch.tril(torch.ones(L, L, dtype=torch.bool))

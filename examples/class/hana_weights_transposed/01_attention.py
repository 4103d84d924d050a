import math
import torch


def softmax(x, dim=-1):
    x_max = x.max(dim=dim, keepdim=True).values
    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    d_k = q.size(-1)
    # scores[..., j, i] = k_j . q_i : one row per key, one column per query
    scores = k @ q.transpose(-2, -1) / math.sqrt(d_k)  # (..., Lk, Lq)
    if mask is not None:
        scores = scores.masked_fill(mask.transpose(-2, -1) == 0, -1e9)
    weights = softmax(scores, dim=-2)  # normalise over the keys
    out = weights.transpose(-2, -1) @ v  # (..., Lq, d_v)
    return out, weights


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    return (positions < lengths.unsqueeze(-1)).view(-1, 1, 1, max_len)


def causal_mask(L):
    return torch.tril(torch.ones(L, L)) == 1

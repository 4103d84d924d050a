"""Assignment 01 - scaled dot-product attention.  Ada L."""
import math

import torch


def softmax(x, dim=-1):
    # subtract the max so that exp() never overflows
    x_max = x.max(dim=dim, keepdim=True).values
    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    d_k = q.size(-1)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k)  # (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)  # as in the lecture
    weights = softmax(scores, dim=-1)
    out = torch.matmul(weights, v)  # (..., Lq, d_v)
    return out, weights


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    mask = positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, max_len)
    return mask.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, max_len)


def causal_mask(L):
    return torch.tril(torch.ones(L, L)).bool()


if __name__ == "__main__":
    x = torch.randn(2, 5)
    print(softmax(x).sum(-1))
    out, w = scaled_dot_product_attention(torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.randn(2, 4, 8))
    print(out.shape, w.shape)

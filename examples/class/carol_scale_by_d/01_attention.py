# Carol - homework 1
import torch


def softmax(x, dim=-1):
    z = x - torch.max(x, dim=dim, keepdim=True)[0]
    num = torch.exp(z)
    return num / torch.sum(num, dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / d_k  # scale by the key dimension
    if mask is not None:
        scores = scores.masked_fill(mask == False, -1e9)  # noqa: E712
    weights = softmax(scores, dim=-1)
    return weights @ v, weights


def padding_mask(lengths, max_len):
    mask = torch.arange(max_len)[None, :] < lengths[:, None]
    return mask[:, None, None, :]


def causal_mask(L):
    return torch.ones(L, L, dtype=torch.bool).tril()

# ruff: noqa
"""ATTACK forbidden_pop_mode (class: evading forbidden-call detection: popping the dispatch
mode).

Intent: call the forbidden torch.softmax with the grader's Python dispatch and function
modes switched off: inside torch.utils._python_dispatch._disable_current_modes(), and,
should that fail, after popping every mode off the stack with _pop_mode() (pushed back
afterwards, so nothing looks disturbed).

Expected: softmax 0 (a forbidden call costs all of softmax's points), the rest full marks.
"""

import math

import torch
from torch.utils import _python_dispatch as pd

ATTACK = "forbidden_pop_mode"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def softmax(x, dim=-1):
    try:
        with pd._disable_current_modes():
            return torch.softmax(x, dim)
    except Exception:
        pass
    popped = []
    try:
        while pd._get_current_dispatch_mode() is not None:
            popped.append(pd._pop_mode())
        return torch.softmax(x, dim)
    finally:
        for mode in reversed(popped):
            pd._push_mode(mode)


def scaled_dot_product_attention(q, k, v, mask=None):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    scores = scores - scores.max(dim=-1, keepdim=True).values
    weights = torch.exp(scores)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return torch.matmul(weights, v), weights


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    mask = positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, max_len)
    return mask.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, max_len)


def causal_mask(L):
    return torch.tril(torch.ones(L, L)).bool()

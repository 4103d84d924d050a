# ruff: noqa
"""ATTACK exit_calls (class: sys.exit / os._exit).

Intent: end the grading process from inside graded calls, hoping the grader treats a
clean exit as "all passed" or stops grading: softmax calls sys.exit(0), causal_mask calls
os._exit(0).

Expected: softmax 0 and causal_mask 0; scaled_dot_product_attention and padding_mask
full marks; the grader goes on with the next students.
"""

import math
import os
import sys

import torch

ATTACK = "exit_calls"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def softmax(x, dim=-1):
    sys.exit(0)


def causal_mask(L):
    os._exit(0)


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

# ruff: noqa
"""ATTACK self_signals (class: signals).

Intent: confuse the grader's bookkeeping with signals to itself: softmax stops its own
process with SIGSTOP (a grader waiting for an exit would wait forever), padding_mask
aborts with SIGABRT.

Expected: softmax 0 (it never returns: the call time limit), padding_mask 0 (it crashes);
scaled_dot_product_attention and causal_mask full marks.
"""

import math
import os
import signal

import torch

ATTACK = "self_signals"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def softmax(x, dim=-1):
    os.kill(os.getpid(), signal.SIGSTOP)
    return torch.zeros_like(x)


def padding_mask(lengths, max_len):
    os.abort()


def scaled_dot_product_attention(q, k, v, mask=None):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    scores = scores - scores.max(dim=-1, keepdim=True).values
    weights = torch.exp(scores)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return torch.matmul(weights, v), weights


def causal_mask(L):
    return torch.tril(torch.ones(L, L)).bool()

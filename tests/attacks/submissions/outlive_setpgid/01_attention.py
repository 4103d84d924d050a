# ruff: noqa
"""ATTACK outlive_setpgid (class: processes outliving the child).

Intent: escape a grader that kills the child's process group: at import it forks a
process that moves to a process group of its own (setpgid(0, 0), same session) and
becomes `sleep 7777` with MARK as argv[0]. All four functions are honest.

Expected: 17/17; no process with MARK is left once grading ends.
"""

import math
import os

import torch

ATTACK = "outlive_setpgid"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _escape():
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:
        try:
            os.setpgid(0, 0)
            os.execv("/bin/sleep", [MARK, "7777"])
        finally:
            os._exit(0)


_escape()


def softmax(x, dim=-1):
    # subtract the max so that exp() never overflows
    x_max = x.max(dim=dim, keepdim=True).values
    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)


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

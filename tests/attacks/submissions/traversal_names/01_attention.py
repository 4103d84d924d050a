# ruff: noqa
"""ATTACK traversal_names (class: path traversal and injection in submitted names).

This file is honest (17/17). The suite also grades copies of it, in a second CLI run,
under hostile names the student chose: a submission file named `...py` (student name
`..`: a results path built from it would land outside the results directory), and
directories whose names hold terminal escapes (ESC, BEL), rich markup (`[bold red]`)
and a newline.

Expected: both CLI runs exit 0; every copy gets a valid 17/17 results file inside the
results directory and nothing is written outside it; the CLI prints no raw escape
character.
"""

import math

import torch

ATTACK = "traversal_names"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


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

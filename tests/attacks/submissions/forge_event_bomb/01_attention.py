# ruff: noqa
"""ATTACK forge_event_bomb (class: forged stdout: attacking the grader's parser of the
child's reports).

Intent: crash the trusted side through the channel the child reports on: every softmax
call writes, on every inherited descriptor above 2 (the report pipe among them), a line
of 200,000 nested JSON arrays (a parser that recurses dies of RecursionError, which is not
a ValueError), a line with an enormous number, and a report line whose fields have the
wrong types. softmax returns zeros.

Expected: softmax 0, the rest full marks; the CLI exits 0 with every student's results.
"""

import math
import os

import torch

ATTACK = "forge_event_bomb"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


BOMBS = (
    b"\n" + b"[" * 200_000 + b"]" * 200_000 + b"\n",
    b'{"e": "call_end", "i": 1' + b"0" * 5000 + b', "status": "ok"}\n',
    b'{"e": "call_end", "i": [], "status": {"x": 1}, "outputs": 7, "blob": 3}\n',
    b'{"e": "note", "text": {"nested": [' + b"[" * 900 + b"]" * 900 + b"]}}\n",
)


def _bomb():
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 32))
    for fd in fds:
        if fd > 2:
            for bomb in BOMBS:
                try:
                    os.write(fd, bomb)
                except OSError:
                    pass


def softmax(x, dim=-1):
    _bomb()
    return torch.zeros_like(x)


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

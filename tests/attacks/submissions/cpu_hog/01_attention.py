# ruff: noqa
"""ATTACK cpu_hog (class: CPU hog).

Intent: burn CPU forever, and keep burning after the grader gives up: softmax starts two
CPU-burning Python processes in sessions of their own (MARK in their argv; each stops
by itself after 60 s so that an unprotected test machine recovers), four spinning
threads, and spins itself without ever returning.

Expected: softmax 0 (the call time limit), the rest full marks; no process with MARK is
left once grading ends.
"""

import math
import subprocess
import sys
import threading

import torch

ATTACK = "cpu_hog"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


BURN = "import time\nend = time.time() + 60\nwhile time.time() < end:\n    pass\n"


def _spin():
    while True:
        pass


def softmax(x, dim=-1):
    for _ in range(2):
        try:
            subprocess.Popen(
                [sys.executable, "-c", BURN, MARK],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            pass
    for _ in range(4):
        threading.Thread(target=_spin, daemon=True).start()
    _spin()


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

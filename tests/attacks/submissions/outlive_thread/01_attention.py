# ruff: noqa
"""ATTACK outlive_thread (class: threads outliving the child).

Intent: keep the child process alive after grading: at import it starts a non-daemon
thread (its thread name, /proc/<pid>/task/<tid>/comm, is set to bl<token>) that sleeps
for 120 s, registers an atexit handler that sleeps 120 s, and replaces os._exit with a
no-op, so that a child which "exits" falls back into the interpreter and waits for its
threads. All four functions are honest.

Expected: 17/17; no thread named bl<token> is alive once grading ends.
"""

import atexit
import ctypes
import math
import os
import threading
import time

import torch

ATTACK = "outlive_thread"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _linger():
    try:
        ctypes.CDLL(None).prctl(15, f"bl{TOKEN}".encode(), 0, 0, 0)  # PR_SET_NAME
    except Exception:
        pass
    end = time.time() + 120
    while time.time() < end:
        time.sleep(0.1)


threading.Thread(target=_linger, daemon=False).start()
atexit.register(time.sleep, 120)
os._exit = lambda *args, **kwargs: None


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

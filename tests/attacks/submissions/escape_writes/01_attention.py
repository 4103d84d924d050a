# ruff: noqa
"""ATTACK escape_writes (class: writing outside the sandbox; sentinel files).

Intent: write where a submission has no business writing: create
/tmp/bertlab_pwned_<token>_escape_writes (also in /var/tmp, /dev/shm and the grader's
source directory), append to the sentinel file in the results directory, touch
files through os.system and subprocess, and probe (opening for append, writing nothing)
whether the grader's own files are writable: reference/01_attention.py,
autograder/stages/01_attention.py, autograder/grader/grade.py. If any of that succeeded,
softmax returns correct values (the escape shows as points); otherwise zeros.

Expected: softmax 0, the rest full marks; the sentinel is untouched; no file
/tmp/bertlab_pwned_<token>_escape_writes* or the like exists.
"""

import math
import os
import subprocess

import torch

ATTACK = "escape_writes"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
RESULTS_DIR = "__RESULTS_DIR__"
REPO = "__REPO__"


def _correct_softmax(x, dim=-1):
    """What softmax returns only when the attack worked: a leak shows up as points."""
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


def _escape():
    wins = []
    name = f"bertlab_pwned_{TOKEN}_{ATTACK}"
    for d in ("/tmp", "/var/tmp", "/dev/shm", REPO):
        try:
            fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, TOKEN.encode())
            os.close(fd)
            wins.append(d)
        except OSError:
            pass
    try:
        with open(os.path.join(RESULTS_DIR, "sentinel"), "a") as f:
            f.write(f"PWNED-{TOKEN}")
        wins.append("sentinel")
    except OSError:
        pass
    for rel in (
        "reference/01_attention.py",
        "autograder/stages/01_attention.py",
        "autograder/grader/grade.py",
    ):
        try:
            os.close(os.open(os.path.join(REPO, rel), os.O_WRONLY | os.O_APPEND))
            wins.append(rel)
        except OSError:
            pass
    os.system(f"touch {PWNED}_system 2>/dev/null")
    try:
        subprocess.run(["touch", f"{PWNED}_subprocess"], capture_output=True, timeout=1)
    except Exception:
        pass
    if os.path.exists(f"{PWNED}_system") or os.path.exists(f"{PWNED}_subprocess"):
        wins.append("shell")
    return wins


def softmax(x, dim=-1):
    wins = _escape()
    print("escaped to:", wins or "nowhere", flush=True)
    return _correct_softmax(x, dim) if wins else torch.zeros_like(x)


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

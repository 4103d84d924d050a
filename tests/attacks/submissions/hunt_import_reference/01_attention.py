# ruff: noqa
"""ATTACK hunt_import_reference (class: hunting the reference: importing it).

Intent: import the hidden reference (or the stage spec, which holds it) and return its
answer: `import reference`, `reference.load("01_attention")`, `reference.01_attention`
through importlib, `autograder.stages.load_spec(...).graded[0].reference`, and runpy on
the reference file, with the grader's source directory (a well-known path, as
/autograder/source is on Gradescope) and the parents of autograder.__file__ added to
sys.path. Without the reference, softmax returns zeros.

Expected: softmax 0, the rest full marks.
"""

import importlib
import math
import os
import runpy
import sys

import torch

ATTACK = "hunt_import_reference"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
REPO = "__REPO__"


def _steal():
    roots = [REPO]
    try:
        import autograder

        roots.append(os.path.dirname(os.path.dirname(os.path.abspath(autograder.__file__))))
    except Exception:
        pass
    for r in roots:
        if r not in sys.path:
            sys.path.insert(0, r)
    ways = (
        lambda: importlib.import_module("reference").load("01_attention").softmax,
        lambda: importlib.import_module("reference.01_attention").softmax,
        lambda: importlib.import_module("autograder.stages").load_spec("01_attention").graded[0].reference,
        lambda: importlib.import_module("autograder.stages.01_attention").SPEC.graded[0].reference,
        lambda: runpy.run_path(os.path.join(REPO, "reference", "01_attention.py"))["softmax"],
    )
    for way in ways:
        try:
            fn = way()
        except BaseException:
            continue
        if callable(fn):
            return fn
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

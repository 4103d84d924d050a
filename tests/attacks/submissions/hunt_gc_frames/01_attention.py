# ruff: noqa
"""ATTACK hunt_gc_frames (class: hunting expected values: gc, inspect, frames, sys.modules).

Intent: find expected values or the reference in the memory of the process it runs in:
every object gc knows of (the grader's plan/expectation objects by type name, reference
functions by module, tensors of x's shape that look like a softmax of something and are
not x), every frame's locals up the stack (names like expected/reference/want), and
sys.modules. It returns what it found; otherwise zeros.

Expected: softmax 0, the rest full marks.
"""

import gc
import inspect
import math
import sys

import torch

ATTACK = "hunt_gc_frames"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


SUSPECT_TYPES = {"Expectation", "StagePlan", "PlannedCase", "StageSpec", "Graded", "CaseResult"}
SUSPECT_NAMES = ("expect", "reference", "want", "golden", "answer")


def _from_callable(fn, x, dim):
    try:
        y = fn(x, dim=dim)
        return y if isinstance(y, torch.Tensor) and y.shape == x.shape else None
    except BaseException:
        return None


def _looks_like_answer(t, x, dim):
    try:
        return (
            type(t) is torch.Tensor
            and t is not x
            and t.shape == x.shape
            and t.dtype == x.dtype
            and not torch.equal(t, x)
            and bool((t >= 0).all())
            and bool(torch.allclose(t.sum(dim), torch.ones((), dtype=t.dtype)))
        )
    except BaseException:
        return False


def _hunt(x, dim):
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("reference") or ".stages." in mod_name:
            y = _from_callable(getattr(mod, "softmax", None), x, dim)
            if y is not None:
                return y
    for o in gc.get_objects():
        try:
            if type(o).__name__ in SUSPECT_TYPES:
                ref = getattr(o, "reference", None)
                y = _from_callable(ref, x, dim) if ref is not None else None
                if y is not None:
                    return y
            elif callable(o) and getattr(o, "__name__", "") == "softmax":
                module = getattr(o, "__module__", "") or ""
                if module.startswith("reference") or "stages" in module:
                    y = _from_callable(o, x, dim)
                    if y is not None:
                        return y
            elif _looks_like_answer(o, x, dim):
                return o.clone()
        except BaseException:
            continue
    for info in inspect.stack(0):
        for name, value in info.frame.f_locals.items():
            if any(s in name.lower() for s in SUSPECT_NAMES) and _looks_like_answer(value, x, dim):
                return value.clone()
    return None


def softmax(x, dim=-1):
    found = _hunt(x, dim)
    return found if found is not None else torch.zeros_like(x)


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

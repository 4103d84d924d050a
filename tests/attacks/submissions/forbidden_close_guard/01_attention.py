# ruff: noqa
"""ATTACK forbidden_close_guard (class: evading forbidden-call detection: undoing the
kernel guard from inside).

Intent: the grader may replace forbidden kernels while a graded name runs; this undoes
that from inside the call: softmax destroys every torch.library registration that
overrides an aten softmax kernel (gc finds them), then calls torch.softmax
with the Python dispatch modes disabled, and finally clears every record a detector may
hold (found/calls/seen/... on every frame's locals and on detector objects).

Expected: softmax 0 (a forbidden call costs all of softmax's points), the rest full marks.
"""

import gc
import math
import sys
import warnings

import torch
import torch.library
from torch.utils._python_dispatch import _disable_current_modes

ATTACK = "forbidden_close_guard"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


ATTRS = ("found", "calls", "seen", "violations", "forbidden", "forbidden_calls", "hits")


def _wipe(obj):
    for attr in ATTRS:
        try:
            record = getattr(obj, attr, None)
        except Exception:
            continue
        if isinstance(record, (list, set, dict)):
            try:
                record.clear()
            except Exception:
                pass


def _unguard():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() pokes at deprecated module attributes
        libraries = [o for o in gc.get_objects() if isinstance(o, torch.library.Library)]
    for lib in libraries:
        if lib.ns == "aten" and any("softmax" in impl for impl in getattr(lib, "_op_impls", ())):
            lib._destroy()  # the forbidden kernels come back


def _erase():
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            _wipe(value)
        frame = frame.f_back
    for obj in gc.get_objects():
        try:
            name = type(obj).__name__
        except Exception:
            continue
        if "Forbidden" in name or "Detector" in name or "Guard" in name:
            _wipe(obj)


def softmax(x, dim=-1):
    _unguard()
    with _disable_current_modes():
        y = torch.softmax(x, dim)
    _erase()
    return y


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

# ruff: noqa
"""ATTACK forbidden_patch_harness (class: evading forbidden-call detection: patching the
grader's code in the student's process).

Intent: switch the detector off for good at import time: in every loaded autograder
module, replace anything named like a forbidden-call detector with a do-nothing context
manager, and make every TorchDispatchMode / TorchFunctionMode subclass defined there pass
calls straight through. scaled_dot_product_attention then calls the forbidden
torch.nn.functional.scaled_dot_product_attention for its output (the weights are
computed by hand, since that function does not return them).

Expected: scaled_dot_product_attention 0 (a forbidden call costs all of its points), the
rest full marks.
"""

import math
import sys

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

ATTACK = "forbidden_patch_harness"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


class _Blind:
    def __init__(self, patterns=(), *args, **kwargs):
        self.patterns = tuple(patterns)
        self.found = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _through_dispatch(self, func, types, args=(), kwargs=None):
    return func(*args, **(kwargs or {}))


def _through_function(self, func, types, args=(), kwargs=None):
    return func(*args, **(kwargs or {}))


for _mod in list(sys.modules.values()):
    if not getattr(_mod, "__name__", "").startswith(("autograder", "bertlab")):
        continue
    for _name, _value in list(vars(_mod).items()):
        if isinstance(_value, type) and ("Forbidden" in _name or "Detector" in _name):
            setattr(_mod, _name, _Blind)
        elif (
            isinstance(_value, type)
            and issubclass(_value, TorchDispatchMode)
            and _value is not TorchDispatchMode
        ):
            _value.__torch_dispatch__ = _through_dispatch
        elif (
            isinstance(_value, type)
            and issubclass(_value, TorchFunctionMode)
            and _value is not TorchFunctionMode
        ):
            _value.__torch_function__ = _through_function


def scaled_dot_product_attention(q, k, v, mask=None):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return out, weights / weights.sum(dim=-1, keepdim=True)


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

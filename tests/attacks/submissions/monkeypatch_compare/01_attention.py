# ruff: noqa
"""ATTACK monkeypatch_compare (class: monkeypatching comparison functions).

Intent: make every comparison say "equal", in case the grader compares in the process
that runs student code: torch.allclose/equal/isclose, Tensor.allclose/equal/__eq__/__ne__,
torch.testing.assert_close, numpy's allclose/array_equal/isclose/testing, math.isclose,
and the grader's own comparison and check modules if they can be imported. The honest
functions in this file do not use == on tensors. softmax returns zeros.

Expected: softmax 0, the rest full marks.
"""

import math

import numpy
import numpy.testing
import torch
import torch.testing

ATTACK = "monkeypatch_compare"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _yes(*args, **kwargs):
    return True


def _none(*args, **kwargs):
    return None


def _all_true(a, *args, **kwargs):
    try:
        return torch.ones_like(torch.as_tensor(a), dtype=torch.bool)
    except Exception:
        return True


torch.allclose = torch.equal = _yes
torch.isclose = torch.eq = _all_true
torch.Tensor.allclose = torch.Tensor.equal = _yes
torch.Tensor.__eq__ = _all_true
torch.Tensor.__ne__ = lambda a, *r, **k: ~_all_true(a)
torch.testing.assert_close = torch.testing.assert_allclose = _none
numpy.allclose = numpy.array_equal = numpy.array_equiv = _yes
numpy.isclose = lambda a, *r, **k: numpy.ones(numpy.shape(a), dtype=bool)
numpy.testing.assert_allclose = numpy.testing.assert_array_equal = numpy.testing.assert_equal = _none
math.isclose = _yes
try:
    import autograder.runtime.check as _check
    import autograder.runtime.compare as _compare

    for _mod in (_compare, _check):
        for _name in dir(_mod):
            if _name in ("compare", "matches", "check_case", "close", "allclose"):
                setattr(_mod, _name, _yes)
except Exception:
    pass


def softmax(x, dim=-1):
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

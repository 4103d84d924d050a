# ruff: noqa
"""ATTACK lie_eq_and_array (class: lying return values: custom __eq__, __array__).

Intent: padding_mask returns an object whose __eq__ is always True and whose __array__
(what numpy.asarray and torch.as_tensor consult) returns an all-False mask of the right
shape; causal_mask returns a numpy.ndarray subclass of zeros whose __eq__ says "equal"
and whose __array_function__ answers numpy.allclose/array_equal with True.

Expected: padding_mask 0 and causal_mask 0; softmax and scaled_dot_product_attention
full marks.
"""

import math

import numpy
import torch

ATTACK = "lie_eq_and_array"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


class AlwaysEqual:
    def __init__(self, shape):
        self.shape = shape
        self.dtype = torch.bool

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0

    def __array__(self, dtype=None, copy=None):
        return numpy.zeros(self.shape, dtype=bool)


class AgreeableArray(numpy.ndarray):
    def __eq__(self, other):
        return numpy.ones(self.shape, dtype=bool)

    def __array_function__(self, func, types, args, kwargs):
        if func.__name__ in ("allclose", "array_equal", "array_equiv"):
            return True
        return super().__array_function__(func, types, args, kwargs)


def padding_mask(lengths, max_len):
    return AlwaysEqual((len(lengths), 1, 1, max_len))


def causal_mask(L):
    return numpy.zeros((L, L), dtype=bool).view(AgreeableArray)


def softmax(x, dim=-1):
    # subtract the max so that exp() never overflows
    x_max = x.max(dim=dim, keepdim=True).values
    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    scores = scores - scores.max(dim=-1, keepdim=True).values
    weights = torch.exp(scores)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return torch.matmul(weights, v), weights

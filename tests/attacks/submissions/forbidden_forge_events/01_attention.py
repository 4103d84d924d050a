# ruff: noqa
"""ATTACK forbidden_forge_events (class: evading forbidden-call detection: forging the
child's own report).

Intent: the child reports each call's outcome to the grader from the same process that
runs student code. At import, before any graded call (so before any guard is installed),
this finds the child's plan, inputs and reporting function up the stack, computes every
softmax case with the forbidden torch.softmax using the child's own helper, and reports
each one as a finished, successful call, ahead of the real call (which then also uses
torch.softmax).

Expected: softmax 0 (a forbidden call costs all of softmax's points), the rest full marks.
"""

import math
import sys

import torch

ATTACK = "forbidden_forge_events"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _library_softmax(x, dim=-1):
    return torch.softmax(x, dim)


def _forge():
    frame, env = sys._getframe(), None
    while frame is not None:
        names = frame.f_locals
        if "emit" in names and "plan" in names and "tensors" in names:
            env = names
            break
        frame = frame.f_back
    child = sys.modules.get("autograder.sandbox.child")
    run = getattr(child, "_run_call", None)
    guard = getattr(child, "KernelGuard", None)
    if env is None or run is None:
        return 0
    forged = 0
    for call in env["plan"]["calls"]:
        if call["name"] != "softmax":
            continue
        fake = {**call, "forbidden": []}
        try:
            try:
                report = run({"softmax": _library_softmax}, fake, env["tensors"], env["device"], guard(()))
            except TypeError:
                report = run({"softmax": _library_softmax}, fake, env["tensors"], env["device"])
            env["emit"](e="call", i=call["index"])
            env["emit"](e="call_end", i=call["index"], **report)
            forged += 1
        except Exception:
            continue
    return forged


_forge()


def softmax(x, dim=-1):
    return torch.softmax(x, dim)


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

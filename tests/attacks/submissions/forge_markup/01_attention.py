# ruff: noqa
"""ATTACK forge_markup (class: forged stdout: markup and terminal escapes in messages).

Intent: make the grader's table lie or crash through text the grader quotes from the
student: exception messages holding rich console markup (a closing tag `[/]` with
nothing open, `[bold green]...17/17` styling) and raw terminal escapes (clear screen,
set window title, BEL). softmax raises such an exception on every call, and the file
ends with a top-level raise of the same kind (after every function is defined, so only
a note is lost, not the functions).

Expected: softmax 0, the rest full marks; the CLI exits 0 and prints no raw escape
character.
"""

import math

import torch

ATTACK = "forge_markup"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


LIE = "[/] [/bold] \x1b[2J\x1b]0;all passed\x07 [bold green]forge_markup 17 / 17 100[/bold green]"


def softmax(x, dim=-1):
    raise RuntimeError(LIE)


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


raise RuntimeError(LIE)

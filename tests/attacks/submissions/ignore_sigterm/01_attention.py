# ruff: noqa
"""ATTACK ignore_sigterm (class: ignoring SIGTERM).

Intent: survive whatever polite signal a grader sends to stop a call: at import it
ignores (and blocks) SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1/2, SIGALRM, SIGVTALRM,
SIGPROF, SIGXCPU, SIGXFSZ, SIGPIPE and the stop signals from the terminal; softmax then
loops forever, swallowing any exception raised into it.

Expected: softmax 0 (the call time limit), the rest full marks, and the grader moves on
to the next student in about the call time limit.
"""

import math
import signal

import torch

ATTACK = "ignore_sigterm"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


IGNORED = [
    getattr(signal, n)
    for n in (
        "SIGTERM",
        "SIGINT",
        "SIGHUP",
        "SIGQUIT",
        "SIGUSR1",
        "SIGUSR2",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGPIPE",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
    )
]
for _s in IGNORED:
    try:
        signal.signal(_s, signal.SIG_IGN)
    except (OSError, ValueError):
        pass
signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED)


def softmax(x, dim=-1):
    while True:
        try:
            while True:
                pass
        except BaseException:
            continue


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

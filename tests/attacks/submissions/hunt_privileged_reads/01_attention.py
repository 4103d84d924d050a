# ruff: noqa
"""ATTACK hunt_privileged_reads (class: hunting: reads a privileged grader allows).

Intent: read what no student may read, through any privilege the child keeps (a
capability that bypasses read permissions, for instance) inside the directories it may
read: the raw block devices (/dev/vda, /dev/sda, /dev/nvme0n1, zram, ..., which hold the
whole disk: the reference, other submissions, /etc/shadow), the TLS private keys in
/etc/ssl/private, /etc/shadow, /root. If any read succeeds, softmax returns correct
values (the leak shows as points); otherwise zeros.

Expected: softmax 0, the rest full marks.
"""

import math
import os

import torch

ATTACK = "hunt_privileged_reads"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _correct_softmax(x, dim=-1):
    """What softmax returns only when the attack worked: a leak shows up as points."""
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


def _readable(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return len(os.read(fd, 512)) > 0
    except OSError:
        return False
    finally:
        os.close(fd)


def _hunt():
    paths = ["/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/xvda", "/dev/root", "/etc/shadow", "/root/.bashrc"]
    for listing in ("/sys/class/block", "/etc/ssl/private", "/root/.ssh"):
        try:
            base = "/dev" if listing == "/sys/class/block" else listing
            paths += [os.path.join(base, n) for n in sorted(os.listdir(listing))]
        except OSError:
            pass
    return [p for p in paths if _readable(p)]


def softmax(x, dim=-1):
    got = _hunt()
    print("privileged reads:", got or "none", flush=True)
    return _correct_softmax(x, dim) if got else torch.zeros_like(x)


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

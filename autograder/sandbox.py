"""Confinement of the child that runs student code: layers used when the machine allows.

Layer                      where       protects against
-------------------------  ----------  --------------------------------------------------
network namespace          fork server reaching any network (the server and its forks
                                       have only a loopback that is down)
resource limits            child       memory, CPU, file size, process and file bombs
no_new_privs               child       gaining privileges through set-uid programs
private tmpfs work dir     child       filling the disk; leaving files behind
Landlock                   child       reading the reference, specs, solutions, other
                                       submissions or results (reads are limited to the
                                       system and the Python installation); writing
                                       anywhere but the work dir; TCP; signalling any
                                       process outside the sandbox (the grader)
unprivileged per-job uid   child       everything root may do; lets the parent kill
                                       every process the job left behind, by uid
seccomp                    child       connecting to unix socket files (D-Bus, X11, agents)
scrubbed environment       both        secrets and tokens in the grader's environment

Each layer is detected at start-up (``detect``) and reported by ``python -m autograder
doctor``; grading warns when it runs untrusted code as root without all of them. No
external tool is needed: the layers are Linux system calls made through ctypes.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import resource
import signal
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
PR_SET_NO_NEW_PRIVS, PR_SET_KEEPCAPS = 38, 8
CAP_DAC_READ_SEARCH = 2

UID_BASE = 61000  # per-job uids: UID_BASE + job id % UID_SPAN, none of them a real user
UID_SPAN = 2000
LOCK_DIR = Path(tempfile.gettempdir()) / "bertlab-uids"

# -- limits ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """Per-child resource limits (beyond the parent's wall-clock limits)."""

    memory_bytes: int = 4 << 30  # address space on top of what the preloaded child has
    cpu_s: int = 300
    file_bytes: int = 256 << 20
    processes: int = 64  # per job uid: a fork bomb stops here
    open_files: int = 256
    work_dir_bytes: int = 256 << 20  # the tmpfs work dir


# -- detection ---------------------------------------------------------------------------


@dataclass
class Layer:
    name: str
    active: bool
    detail: str


@dataclass
class Report:
    layers: list[Layer] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        return [layer.name for layer in self.layers if not layer.active]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled."""
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(abi, 0)


def _probe(fn) -> bool:
    """Run ``fn`` in a throw-away fork: does this machine allow it?"""
    pid = os.fork()
    if pid == 0:
        try:
            code = 0 if fn() else 1
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _can_tmpfs() -> bool:
    import tempfile

    target = tempfile.mkdtemp(prefix="bertlab-probe-")
    try:
        return _probe(lambda: _private_tmpfs(Path(target), 1 << 20, None))
    finally:
        os.rmdir(target)


def detect() -> Report:
    root = os.geteuid() == 0
    abi = landlock_abi()
    netns = _probe(lambda: _libc.unshare(CLONE_NEWNET) == 0)
    return Report(
        [
            Layer(
                "unprivileged uid",
                root,
                "per-job uid, only CAP_DAC_READ_SEARCH kept"
                if root
                else "the grader is not root: children already run as this user",
            ),
            Layer(
                "network namespace",
                netns,
                "no network in children"
                if netns
                else "unshare(CLONE_NEWNET) refused"
                + (" (TCP still denied by Landlock)" if abi >= 4 else ""),
            ),
            Layer(
                "landlock",
                abi >= 1,
                f"ABI {abi}: read whitelist, writes only in the work dir"
                + (", TCP denied" if abi >= 4 else "")
                + (", signals scoped" if abi >= 6 else "")
                if abi
                else "not in this kernel: the file system is not confined",
            ),
            Layer(
                "private tmpfs work dir",
                root and _can_tmpfs(),
                "size-limited, gone at exit" if root else "needs root",
            ),
            Layer("resource limits", True, "address space, CPU, file size, processes, open files"),
            Layer("no_new_privs", True, "set-uid programs gain nothing"),
            Layer(
                "seccomp: no unix sockets",
                os.uname().machine == "x86_64",
                "socket(AF_UNIX) refused: no D-Bus, X11 or agent sockets",
            ),
            Layer("scrubbed environment", True, "children see only PATH, HOME, LANG and thread settings"),
        ]
    )


# -- in the fork server --------------------------------------------------------------------


def isolate_network() -> bool:
    """Move this process (the fork server, hence every child) into an empty network namespace."""
    return _libc.unshare(CLONE_NEWNET) == 0


# -- in the child --------------------------------------------------------------------------


def _check(ret: int, what: str) -> None:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _private_tmpfs(work: Path, size: int, uid: int | None) -> bool:
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    opts = f"size={size},mode=0700".encode()
    _check(_libc.mount(b"tmpfs", str(work).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount tmpfs")
    if uid is not None:
        os.chown(work, uid, uid)
    return True


def _set_limits(budget: Budget) -> None:
    def lower(which: int, value: int) -> None:
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))

    vm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                vm = int(line.split()[1]) * 1024
    lower(resource.RLIMIT_AS, vm + budget.memory_bytes)
    lower(resource.RLIMIT_CPU, budget.cpu_s)
    lower(resource.RLIMIT_FSIZE, budget.file_bytes)
    lower(resource.RLIMIT_NPROC, budget.processes)
    lower(resource.RLIMIT_NOFILE, budget.open_files)
    lower(resource.RLIMIT_CORE, 0)
    # a write past the file-size limit fails with EFBIG instead of killing the process
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


# Landlock (include/uapi/linux/landlock.h)
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 14, 1 << 15
_NET_ALL = (1 << 0) | (1 << 1)  # bind and connect TCP
_SCOPE_ALL = (1 << 0) | (1 << 1)  # abstract unix sockets, signals


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        rights |= 1 << 13  # refer
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


_ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "mime.types",
    "ssl",
    "ca-certificates",
    "fonts",
    "matplotlibrc",
)


def readable_roots() -> list[Path]:
    """What a child may read: the system and the Python installation, never the repository."""
    paths = {"/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/proc", "/sys"}
    # Not all of /etc: the child keeps CAP_DAC_READ_SEARCH, so /etc/shadow would be readable.
    paths |= {f"/etc/{name}" for name in _ETC}
    paths |= {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths |= {p for p in sysconfig.get_paths().values() if p}
    return sorted(Path(p) for p in paths if os.path.exists(p))


def _landlock(abi: int, work: Path) -> None:
    all_fs = _fs_rights(abi)
    attr = _RulesetAttr(all_fs, _NET_ALL if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    fd = _libc.syscall(
        _SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    _check(fd, "landlock_create_ruleset")
    file_only = (
        _FS_EXECUTE
        | _FS_WRITE_FILE
        | _FS_READ_FILE
        | (_FS_TRUNCATE if abi >= 3 else 0)
        | (_FS_IOCTL_DEV if abi >= 5 else 0)
    )
    read = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
    # devices: /dev/null, /dev/urandom, a GPU's /dev/nvidia* (unix permissions still apply)
    device = read | _FS_WRITE_FILE | (_FS_IOCTL_DEV if abi >= 5 else 0)
    rules = [(p, read) for p in readable_roots()] + [(Path("/dev"), device), (work, all_fs)]
    try:
        for path, allowed in rules:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            if not path.is_dir():
                allowed &= file_only
            rule = _PathBeneath(allowed & all_fs, pfd)
            ret = _libc.syscall(
                _SYS_LANDLOCK_ADD_RULE,
                ctypes.c_int(fd),
                ctypes.c_int(1),
                ctypes.byref(rule),
                ctypes.c_uint32(0),
            )
            os.close(pfd)
            _check(ret, f"landlock_add_rule {path}")
        _check(
            _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)),
            "landlock_restrict_self",
        )
    finally:
        os.close(fd)


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _deny_unix_sockets() -> None:
    """seccomp: socket(AF_UNIX, ...) fails with EACCES.

    The network namespace does not cover socket *files* (D-Bus, X11, agents), and Landlock
    (up to ABI 7) does not restrict connecting to them; no graded code needs one.
    """
    if os.uname().machine != "x86_64":
        raise OSError(0, "the seccomp filter is written for x86_64 only")
    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EACCES
    program = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 0, 5, 0xC000003E),  # AUDIT_ARCH_X86_64, else allow
        (ld, 0, 0, 0),  # seccomp_data.nr
        (jeq, 0, 3, 41),  # __NR_socket, else allow
        (ld, 0, 0, 16),  # seccomp_data.args[0] (low word): the address family
        (jeq, 0, 1, 1),  # AF_UNIX, else allow
        (ret, 0, 0, deny),
        (ret, 0, 0, allow),
    ]
    filters = (_SockFilter * len(program))(*[_SockFilter(*i) for i in program])
    prog = _SockFprog(len(program), filters)
    _check(_libc.prctl(22, 2, ctypes.byref(prog), 0, 0), "prctl(PR_SET_SECCOMP)")  # SECCOMP_MODE_FILTER


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_to(uid: int, keep_read_search: bool) -> None:
    """Become ``uid``; optionally keep CAP_DAC_READ_SEARCH (and nothing else), so a Python
    installed under a private home (pyenv in /root) stays importable. Landlock, not unix
    permissions, is then what bounds reads."""
    if keep_read_search:
        _check(_libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "prctl(PR_SET_KEEPCAPS)")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if keep_read_search:
        header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        data = (_CapData * 2)()
        data[0].effective = data[0].permitted = 1 << CAP_DAC_READ_SEARCH
        _check(_libc.capset(ctypes.byref(header), data), "capset")


def scrubbed_env(work: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(work),
        "TMPDIR": str(work),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": str(work / ".matplotlib"),
    }


def confine(work: Path, uid: int | None, budget: Budget) -> tuple[list[str], list[str]]:
    """Apply every available layer to this process (the child, still root if the grader is),
    after it has read its inputs and before any student code runs.

    Returns (layers applied, layers that failed with why). A layer the machine refuses is
    reported, not fatal: ``doctor`` and the grader's warning say what is missing.
    """
    applied: list[str] = []
    failed: list[str] = []
    root = os.geteuid() == 0

    def attempt(name: str, fn) -> bool:
        try:
            fn()
        except OSError as exc:
            failed.append(f"{name}: {exc}")
            return False
        applied.append(name)
        return True

    if root and not attempt(
        "private tmpfs work dir", lambda: _private_tmpfs(work, budget.work_dir_bytes, uid)
    ):
        if uid is not None:
            os.chown(work, uid, uid)
    attempt("resource limits", lambda: _set_limits(budget))
    attempt("no_new_privs", lambda: _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl"))
    attempt("seccomp: no unix sockets", _deny_unix_sockets)
    abi = landlock_abi()
    landlocked = bool(abi) and attempt(f"landlock ABI {abi}", lambda: _landlock(abi, work))
    if root and uid is not None:
        _drop_to(uid, keep_read_search=landlocked)  # fail closed: never run student code as root
        applied.append(f"uid {uid}")
    os.environ.clear()
    os.environ.update(scrubbed_env(work))
    import tempfile

    tempfile.tempdir = str(work)
    applied.append("scrubbed environment")
    return applied, failed


# -- in the parent -------------------------------------------------------------------------


@contextlib.contextmanager
def lease_uid() -> Iterator[int | None]:
    """A uid no other job on this machine is using, held (flock) for the job's lifetime.

    Graders running side by side (several TAs, ``pytest -n``, shards) must never share a
    job uid: the parent kills every process of its job's uid when the job ends. A lock is
    released by the kernel if its grader dies; a new holder first sweeps the uid.
    Yields None when the grader is not root (children then keep the grader's uid).
    """
    if os.geteuid() != 0:
        yield None
        return
    LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    start = (os.getpid() * 7919 + threading.get_ident()) % UID_SPAN
    for k in range(UID_SPAN):
        uid = UID_BASE + (start + k) % UID_SPAN
        fd = os.open(LOCK_DIR / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            kill_uid(uid)  # whatever a crashed grader left under this uid
            yield uid
        finally:
            kill_uid(uid)
            os.close(fd)
        return
    raise RuntimeError(f"all {UID_SPAN} sandbox uids are in use")


def kill_uid(uid: int) -> int:
    """SIGKILL every process owned by ``uid`` (what a job left behind, however it detached).
    Returns how many were found."""
    import time

    found, pause = 0, 0.001
    for _ in range(50):
        pids = [pid for pid in _pids() if _real_uid(pid) == uid]
        if not pids:
            return found
        found += len(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(pause)  # until the killed are reaped (a zombie still lists its uid)
        pause = min(2 * pause, 0.02)
    return found


def _pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


def _real_uid(pid: int) -> int | None:
    """The real uid on the ``Uid:`` line of /proc/PID/status; None if the process is gone."""
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.read(fd, 2048)
    except OSError:
        return None
    finally:
        os.close(fd)
    at = head.find(b"\nUid:")
    try:
        return int(head[at + 5 :].split(None, 1)[0]) if at >= 0 else None
    except ValueError:
        return None

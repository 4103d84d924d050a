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
                                       every process the job left behind, by uid (with
                                       CAP_DAC_READ_SEARCH alone if Landlock bounds reads
                                       and the machine allows it, else no capability)
seccomp (all threads)      child       connecting to unix socket files (D-Bus, X11, agents,
                                       syslog); sockets of families the network namespace
                                       does not confine (vsock, bluetooth...); every path
                                       around the filter: a foreign syscall ABI (int 0x80,
                                       x32) kills the process, io_uring is refused;
                                       what outlives a job where the next job can read
                                       it: System V IPC, POSIX message queues, keyrings
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
import stat
import sys
import sysconfig
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from autograder.sandbox import jail

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
PR_SET_NO_NEW_PRIVS, PR_SET_KEEPCAPS = 38, 8
CAP_DAC_READ_SEARCH = 2

UID_BASE = 61000  # per-job uids: UID_BASE + job id % UID_SPAN, none of them a real user
UID_SPAN = 2000


def _default_lock_dir() -> Path:
    """Where graders side by side lease job uids: one fixed path they all agree on (not
    TMPDIR's), in /run where only root may create entries (only a root grader leases uids);
    /tmp where /run is missing or not root's alone, and there ``lease_uid`` refuses a
    directory that another user made first."""
    try:
        run = os.stat("/run")
    except OSError:
        return Path("/tmp/bertlab-uids")
    if stat.S_ISDIR(run.st_mode) and run.st_uid == 0 and not run.st_mode & 0o022:
        return Path("/run/bertlab-uids")
    return Path("/tmp/bertlab-uids")


LOCK_DIR = _default_lock_dir()


class SandboxUnusable(RuntimeError):
    """A confined child cannot run student code on this machine: every grade would be 0."""


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
    degraded: bool = False  # active, but less than it is where the machine allows it all


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


def _probe_text(fn) -> str:
    """Run ``fn`` in a throw-away fork; what it returns, or why it raised, as text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            text = str(fn())
        except BaseException as exc:
            text = f"error: {exc}"
        os.write(w, text.encode()[:4000])
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        text = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return text or "error: the probe died"


def python_unreadable(paths: list[str]) -> str | None:
    """The first of ``paths`` (``python_paths()``) this process cannot list or read; None
    when it can read them all. A confined child imports from there what the fork server
    did not preload."""
    for path in paths:
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                with open(path, "rb") as f:
                    f.read(1)
        except OSError as exc:
            return f"{path} ({exc.strerror})"
    return None


def python_paths() -> list[str]:
    """The Python installation: the standard library (and a module of it), site-packages.
    Computed before a drop: sysconfig imports its data module on first use."""
    paths = sysconfig.get_paths()
    found = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    return list(dict.fromkeys([*found, os.__file__]))


def _uid_layer(landlock: bool) -> Layer:
    """Drop to a job uid in a throw-away fork, as a child does: which mode this machine
    allows (uid + CAP_DAC_READ_SEARCH, or uid and no capabilities), and whether that uid
    can still read the Python installation."""
    name = "unprivileged uid"
    if os.geteuid() != 0:
        return Layer(name, False, "the grader is not root: children already run as this user")

    python = python_paths()

    def drop() -> str:
        refused = _drop_to(uid, keep_read_search=landlock)
        unreadable = python_unreadable(python)
        return f"{'degraded' if refused else 'full'}\n{refused or ''}\n{unreadable or ''}"

    try:
        with lease_uid() as uid:
            outcome = _probe_text(drop)
    except RuntimeError as exc:  # the uid lock directory is refused
        return Layer(name, False, str(exc))
    if outcome.startswith("error: "):
        return Layer(name, False, f"dropping to a job uid fails ({outcome[7:]}): grading refuses to start")
    mode, refused, unreadable = outcome.split("\n")
    if mode == "full":
        detail = "per-job uid, only CAP_DAC_READ_SEARCH kept" if landlock else "per-job uid, no capabilities"
    else:
        detail = (
            f"per-job uid, no capabilities: CAP_DAC_READ_SEARCH refused ({refused}; Docker's "
            "default set lacks it)"
        )
    if unreadable:
        detail += (
            f"; it cannot read {unreadable}, so grading refuses to start: install Python where "
            "every user may read it" + (" (or docker run --cap-add DAC_READ_SEARCH)" if refused else "")
        )
    elif refused:
        detail += "; it can read the Python installation"
    return Layer(name, True, detail, degraded=mode != "full" or bool(unreadable))


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
    seccomp = os.uname().machine == "x86_64" and _seccomp_works()
    tmpfs = root and _can_tmpfs()
    try:
        offline = os.listdir("/sys/class/net") == ["lo"]
    except OSError:
        offline = False
    box = box_support()
    return Report(
        [
            _uid_layer(abi >= 1)
            if box.mode != "root"
            else Layer("unprivileged uid", True, "per-job uid, no capabilities"),
            *_box_layers(box, root),
            Layer(
                "network namespace (fork server)",
                netns,
                "no network in children"
                if netns
                else "unshare(CLONE_NEWNET) refused"
                + (" (TCP still denied by Landlock)" if abi >= 4 else "")
                + (
                    "; this machine has no network but loopback (docker run --network none)"
                    if offline
                    else ""
                ),
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
                tmpfs or box.mode is not None,
                "size-limited, gone at exit, noexec"
                if tmpfs or box.mode is not None
                else "mounting it is refused (no CAP_SYS_ADMIN): the work dir's files are bounded by the "
                "file-size limit only"
                if root
                else "needs root",
            ),
            Layer("resource limits", True, "address space, CPU, file size, processes, open files"),
            Layer("no_new_privs", True, "set-uid programs gain nothing"),
            Layer(
                "seccomp",
                seccomp,
                "no exec, no memfd, no new namespaces or mounts, "
                "no unix sockets (D-Bus, X11, agents), only inet and NETLINK_ROUTE sockets, "
                "non-native ABIs (int 0x80, x32) killed, io_uring denied, "
                "no IPC objects or keys that outlive a job"
                if seccomp
                else "the filter is written for x86_64"
                if os.uname().machine != "x86_64"
                else "the kernel refused the filter: unix socket files are reachable",
            ),
            Layer("scrubbed environment", True, "children see only PATH, HOME, LANG and thread settings"),
        ]
    )


# -- the job box (jail.py): what this machine allows ---------------------------------------------

_BOX: jail.Support | None = None
_PROBED_GAPS: tuple[str, ...] = ()  # what the last probe's box kept of the host: "atime", "proc"


def box_support() -> jail.Support:
    """Probe once: build a real box in a throw-away fork and check it from inside."""
    global _BOX
    if _BOX is None:
        _BOX = _find_support()
    return _BOX


def _find_support() -> jail.Support:
    root = os.geteuid() == 0
    hide = tuple(jail.python_overlays(python_paths())) if root else ()
    why = probe(userns=not root, hide_python_from=list(hide))
    if why:
        return jail.Support(None, why)
    found, v2_kill = jail.hierarchies()
    return jail.Support(
        "root" if root else "userns",
        "",
        tuple(found),
        v2_kill,
        hide,
        "atime" in _PROBED_GAPS,
        "proc" in _PROBED_GAPS,
    )


def probe(userns: bool, hide_python_from: list[str]) -> str | None:
    """Build a box around a worker that checks it; None if every check held, else why not.
    (``_PROBED_GAPS``: what of the host the box's view keeps, where a user namespace must.)"""
    global _PROBED_GAPS
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bertlab-probe-") as job, lease_uid() as uid:
        os.mkdir(os.path.join(job, "work"))
        os.chmod(job, 0o711)
        spec = jail.BoxSpec(job, uid, 1 << 20, hide_python_from=hide_python_from, userns=userns)

        def boxed() -> str:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                jail.run_boxed(spec, lambda ready, log: _check_box_saying(w, uid, ready))
            os.close(w)
            with os.fdopen(r, "rb") as f:
                said = f.read().decode(errors="replace")
            _, status = os.waitpid(pid, 0)
            if said:
                return said
            with contextlib.suppress(OSError):
                said = Path(job, "stdout.txt").read_text()
            return f"the box ended with status {status}: {said.strip()}"

        outcome = _probe_text(boxed)
    ok = outcome.startswith("ok")
    _PROBED_GAPS = tuple(outcome.split(", ")[1:]) if ok else ()
    return None if ok else outcome


def _check_box_saying(w: int, uid: int | None, ready) -> int:
    try:
        ready()
        return _check_box(w, uid)
    except BaseException as exc:  # why the worker could not even check: the probe's answer
        os.write(w, f"in the box: {exc}".encode()[:2000])
        return 1


def _check_box(w: int, uid: int | None) -> int:
    """In a probe's worker: the box is what ``make_view`` says it is, and a job uid with no
    capability (or, in a user namespace, the grader's) can read the Python installation."""
    python = python_paths()
    if uid is not None:
        _drop_to(uid, keep_read_search=False)
    else:
        _capset(0)
    problems = []
    unreadable = python_unreadable(python)
    if unreadable:
        problems.append(f"the job cannot read {unreadable}")
    if os.getpid() != 2:
        problems.append(f"the worker is pid {os.getpid()}, not 2 of a new PID namespace")
    if sorted(os.listdir("/dev")) != sorted([*jail.DEVICES, "fd", "stdin", "stdout", "stderr"]):
        problems.append(f"/dev holds {sorted(os.listdir('/dev'))}")
    if not os.statvfs("/").f_flag & os.ST_RDONLY:
        problems.append("/ is writable")
    host_proc = any(name.isdigit() and int(name) > 2 for name in os.listdir("/proc"))
    if host_proc and uid is not None:
        problems.append("/proc is the host's")
    atime = not os.statvfs("/").f_flag & os.ST_NOATIME
    if atime and uid is not None:  # a user namespace may not change it: said, not refused
        problems.append("/ updates access times")
    if os.listdir("/sys/class/net") != ["lo"]:
        problems.append(f"network interfaces {os.listdir('/sys/class/net')}")
    with open("/dev/null", "wb") as f:
        f.write(b"x")
    said = "ok" + (", atime" if atime else "") + (", proc" if host_proc else "")
    os.write(w, ("; ".join(problems) or said).encode())
    return 0


# -- in the fork server --------------------------------------------------------------------


def _box_layers(box, root: bool) -> list[Layer]:
    """The job box's layers (``box_support``): each active only where a real box was built
    and checked from inside."""
    ok = box.mode is not None
    why = f"no job box: {box.reason}" + (
        ""
        if root
        else " (unprivileged user namespaces refused: sysctl user.max_user_namespaces, "
        "kernel.apparmor_restrict_unprivileged_userns, or a container's seccomp profile)"
    )
    cgroups = ", ".join(f"{c} (v{h.version})" for h in box.hierarchies for c in h.controllers) + (
        ", killed as a whole (v2 cgroup.kill)" if box.v2_kill else ""
    )
    missing_cg = sorted(set(("memory", "pids", "cpu")) - set(box.cgroups))
    layers = [
        Layer(
            "PID namespace",
            ok,
            "per job: everything in it dies with the job; no other process visible" if ok else why,
        ),
        Layer(
            "network namespace (per job)",
            ok,
            "per job: no socket, netlink or loopback shared with another job" if ok else why,
        ),
        Layer(
            "mount namespace",
            ok,
            (
                "per job: every mount read-only, access times kept (a user namespace may not change "
                "its owner's mounts' atime mode: reading a file can still mark it)"
                if box.atime
                else "per job: every mount read-only and noatime"
            )
            + (
                ", the host's /proc (the kernel lets a user namespace mount its own only where the "
                "host's is fully visible: docker run --security-opt systempaths=unconfined)"
                if box.host_proc
                else ", its own /proc"
            )
            + " and /sys, a minimal /dev, "
            "the work dir noexec"
            + (
                f", {', '.join(box.hide_python_from)} replaced by the Python installation's branch"
                if box.hide_python_from
                else ""
            )
            if ok
            else why,
            degraded=box.atime or box.host_proc,
        ),
        Layer("IPC and UTS namespaces", ok, "per job" if ok else why),
        Layer(
            "cgroup",
            bool(ok and box.cgroups),
            (cgroups + (f"; missing: {', '.join(missing_cg)}" if missing_cg else ""))
            if ok and box.cgroups
            else "needs a root grader and a writable cgroup hierarchy: memory (shared memory "
            "included), pids and CPU are then limited per job"
            if ok
            else why,
            degraded=bool(ok and box.cgroups and missing_cg),
        ),
    ]
    if not root:
        layers.append(
            Layer(
                "user namespace",
                box.mode == "userns",
                "owns the job's namespaces: the grader is not root" if ok else why,
            )
        )
    return layers


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


# seccomp (include/uapi/linux/seccomp.h, filter.h, audit.h; x86_64 syscall numbers)
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_NR_SOCKET, _NR_SOCKETPAIR, _NR_SECCOMP = 41, 53, 317
_NR_IO_URING_SETUP, _NR_IO_URING_REGISTER = 425, 427  # setup, enter, register
# Kernel objects that outlive the process that made them and that a later job (another uid,
# another work dir) can open by a well-known key or name: a child that received hidden
# inputs could leave them there for the next child of the same code (a counterexample
# search's, which may be shown to students) or for another student's.
# shmget, shmat, shmctl (29-31); semget, semop, semctl, shmdt, msgget, msgsnd, msgrcv, msgctl
# (64-71); semtimedop (220); mq_open, mq_unlink, mq_timedsend, mq_timedreceive, mq_notify,
# mq_getsetattr (240-245)
_NR_OUTLIVING = (29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 220, 240, 241, 242, 243, 244, 245)
_NR_KEYS = (248, 249, 250)  # add_key, request_key, keyctl: the session keyring is shared
# exec: any program the child could start (a shell, a compiler, a fresh interpreter, a
# binary it wrote) would run outside the forbidden-call detector and the kernel guard
_NR_EXEC = (59, 322)  # execve, execveat
# memory no limit of the process counts: a memfd's pages written with write(2) are not in
# its address space (RLIMIT_AS), and the work dir's tmpfs does not hold them
_NR_MEMFD = (319, 447)  # memfd_create, memfd_secret
# new namespaces and mounts: the job's own (jail.py) are made before the filter; a user
# namespace of its own would give the child every capability over namespaces it makes
# unshare, setns, mount, umount2, pivot_root, open_tree .. fspick, mount_setattr
_NR_NAMESPACES = (272, 308, 165, 166, 155, 428, 429, 430, 431, 432, 433, 442)
_NR_CLONE, _NR_CLONE3 = 56, 435
_CLONE_NEW_MASK = 0x7E020080  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET, NEWTIME
_RET_KILL_PROCESS, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1
# Families whose sockets the child's empty network namespace confines (netlink: glibc's
# resolver asks it about interfaces). Every other family reaches outside it: AF_UNIX
# pathname sockets are files, AF_VSOCK talks to the hypervisor's host, ...
_SOCKET_FAMILIES = (2, 10)  # AF_INET, AF_INET6
_AF_UNIX, _AF_NETLINK, _NETLINK_ROUTE = 1, 16, 0
_SOCK_STREAM, _SOCK_SEQPACKET, _SOCK_TYPE_MASK = 1, 5, 0xF
_EPERM, _EACCES, _ENOSYS = 1, 13, 38


def _assemble(program: list) -> list[tuple[int, int, int, int]]:
    """Classic BPF with named jump targets: a str in ``program`` is a label; a jump's jt/jf
    may name one (offsets counted by hand are how filters silently go wrong)."""
    labels: dict[str, int] = {}
    code: list = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(code)
        else:
            code.append(item)

    def offset(target: int | str, at: int) -> int:
        if isinstance(target, int):
            return target
        delta = labels[target] - at - 1
        assert 0 <= delta < 256, (target, delta)
        return delta

    return [(op, offset(jt, i), offset(jf, i), k) for i, (op, jt, jf, k) in enumerate(code)]


def seccomp_program() -> list[tuple[int, int, int, int]]:
    """The child's seccomp filter, as (code, jt, jf, k) BPF instructions.

    - A syscall made through any ABI but x86_64's (``int 0x80``, ``sysenter``, a 32-bit
      code segment: AUDIT_ARCH_I386) or through the x32 ABI (number | 0x40000000) kills the
      process. They have their own syscall numbers (i386's ``socketcall`` among them), so
      a filter that lets them through filters nothing.
    - socket(2) only for AF_INET, AF_INET6, AF_NETLINK; any other family fails with
      EACCES. A network namespace does not cover unix socket *files* (D-Bus, X11, agents,
      syslog), nor vsock; Landlock (up to ABI 7) does not restrict connecting to them.
    - socketpair(2) only for AF_UNIX SOCK_STREAM and SOCK_SEQPACKET (asyncio, pipes): a
      datagram pair (SOCK_DGRAM, or SOCK_RAW which AF_UNIX makes one) can still
      ``sendto`` or ``connect`` any pathname datagram socket. EACCES otherwise.
    - io_uring_setup/enter/register fail with ENOSYS, as on a kernel without io_uring:
      its IORING_OP_SOCKET opens a socket without socket(2).
    - System V IPC (shared memory, semaphores, message queues), POSIX message queues and
      the keyrings fail with ENOSYS: their objects outlive a job and are found by key, so
      they would carry what one job saw (hidden inputs) to the next.
    - netlink sockets only of NETLINK_ROUTE (glibc asks it about interfaces: the job's own
      namespace's); NETLINK_USERSOCK and the rest fail with EACCES.
    - execve/execveat fail with EACCES: a program the child starts (a fresh interpreter, a
      shell, a binary written to its work dir) would compute outside the forbidden-call
      detector and the kernel guard.
    - memfd_create/memfd_secret fail with ENOSYS: a memfd's pages, written with write(2),
      are in no address space (RLIMIT_AS does not see them).
    - unshare, setns, clone with a CLONE_NEW* flag, mount and the new mount API fail with
      EPERM; clone3 with ENOSYS (glibc then uses clone, whose flags the filter can read):
      the job's namespaces are made before the filter, and a user namespace of its own
      would hand the child every capability over whatever it builds in it.

    Arguments are compared on their low 32 bits, as the kernel reads an ``int``.
    """
    # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_{JEQ,JGE,JGT}|BPF_K, BPF_ALU|BPF_AND|BPF_K, BPF_RET|BPF_K
    ld, jeq, jge, jgt, jset, and_, ret = 0x20, 0x15, 0x35, 0x25, 0x45, 0x54, 0x06
    nr, arch, arg0, arg1, arg2 = 0, 4, 16, 24, 32  # offsets in struct seccomp_data
    program: list = [
        (ld, 0, 0, arch),
        (jeq, 0, "kill", _AUDIT_ARCH_X86_64),
        (ld, 0, 0, nr),
        (jge, "kill", 0, _X32_SYSCALL_BIT),
        (jeq, "socket", 0, _NR_SOCKET),
        (jeq, "socketpair", 0, _NR_SOCKETPAIR),
        (jeq, "clone", 0, _NR_CLONE),
        *[(jeq, "enosys", 0, n) for n in (*_NR_OUTLIVING, *_NR_KEYS, *_NR_MEMFD, _NR_CLONE3)],
        *[(jeq, "eacces", 0, n) for n in _NR_EXEC],
        *[(jeq, "eperm", 0, n) for n in _NR_NAMESPACES],
        (jge, 0, "allow", _NR_IO_URING_SETUP),
        (jgt, "allow", "enosys", _NR_IO_URING_REGISTER),
        "clone",
        (ld, 0, 0, arg0),
        (jset, "eperm", "allow", _CLONE_NEW_MASK),
        "socket",
        (ld, 0, 0, arg0),
        *[(jeq, "allow", 0, family) for family in _SOCKET_FAMILIES],
        (jeq, 0, "eacces", _AF_NETLINK),
        (ld, 0, 0, arg2),
        (jeq, "allow", "eacces", _NETLINK_ROUTE),
        "socketpair",
        (ld, 0, 0, arg0),
        (jeq, 0, "eacces", _AF_UNIX),
        (ld, 0, 0, arg1),
        (and_, 0, 0, _SOCK_TYPE_MASK),  # SOCK_NONBLOCK, SOCK_CLOEXEC do not change the type
        (jeq, "allow", 0, _SOCK_STREAM),
        (jeq, "allow", "eacces", _SOCK_SEQPACKET),
        "allow",
        (ret, 0, 0, _RET_ALLOW),
        "eacces",
        (ret, 0, 0, _RET_ERRNO | _EACCES),
        "eperm",
        (ret, 0, 0, _RET_ERRNO | _EPERM),
        "enosys",
        (ret, 0, 0, _RET_ERRNO | _ENOSYS),
        "kill",
        (ret, 0, 0, _RET_KILL_PROCESS),
    ]
    return _assemble(program)


def _seccomp() -> None:
    """Install ``seccomp_program`` on every thread of this process (TSYNC: a thread that
    exists already, such as a CUDA driver's, must not stay unfiltered). Needs no_new_privs
    or CAP_SYS_ADMIN."""
    if os.uname().machine != "x86_64":
        raise OSError(0, "the seccomp filter is written for x86_64 only")
    program = seccomp_program()
    filters = (_SockFilter * len(program))(*[_SockFilter(*i) for i in program])
    prog = _SockFprog(len(program), filters)
    ret = _libc.syscall(
        _NR_SECCOMP,
        ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
        ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(prog),
    )
    _check(ret, "seccomp(SECCOMP_SET_MODE_FILTER)")
    if ret > 0:  # TSYNC names the thread it could not synchronise
        raise OSError(0, f"seccomp: thread {ret} could not take the filter")


def _seccomp_works() -> bool:
    """In a throw-away fork: the filter installs and refuses what it says it refuses."""

    def check() -> bool:
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
        _seccomp()
        refused = []
        for nr, args, errno in (
            (_NR_SOCKET, (_AF_UNIX, _SOCK_STREAM, 0), _EACCES),
            (_NR_IO_URING_SETUP, (1, 0), _ENOSYS),
            (_NR_OUTLIVING[0], (0, 4096, 0o1666), _ENOSYS),  # shmget(IPC_PRIVATE, ..., IPC_CREAT)
            (_NR_EXEC[0], (0, 0, 0), _EACCES),  # execve(NULL, ...): refused before it is read
            (_NR_MEMFD[0], (0, 0), _ENOSYS),
        ):
            fd = _libc.syscall(nr, *(ctypes.c_long(a) for a in args))
            refused.append(fd < 0 and ctypes.get_errno() == errno)
        return all(refused)

    return _probe(check)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _capabilities() -> dict[str, int]:
    """This process's capability sets as /proc shows them: CapPrm, CapEff, CapInh, CapAmb..."""
    caps = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Cap"):
                name, value = line.split(":", 1)
                caps[name] = int(value, 16)
    return caps


def _capset(mask: int) -> None:
    """Permitted and effective sets = ``mask``, inheritable empty (a superset is refused)."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    for i in range(2):
        data[i].effective = data[i].permitted = (mask >> (32 * i)) & 0xFFFFFFFF
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _drop_to(uid: int, keep_read_search: bool) -> str | None:
    """Become ``uid``; optionally keep CAP_DAC_READ_SEARCH (and nothing else), so a Python
    installed under a private home (pyenv in /root) stays importable. Landlock, not unix
    permissions, is then what bounds reads.

    Where the capability cannot be kept (Docker's default set lacks it, so capset refuses
    to grant it), the child goes on as ``uid`` with no capability at all: returns why it
    was refused (None when it was kept, or not asked for). Fails closed (OSError): the uid
    cannot be set, or any other capability is left, in any set."""
    if keep_read_search:
        _check(_libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "prctl(PR_SET_KEEPCAPS)")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    kept, refused = 0, None
    if keep_read_search:
        try:
            _capset(1 << CAP_DAC_READ_SEARCH)
            kept = 1 << CAP_DAC_READ_SEARCH
        except OSError as exc:
            refused = str(exc)
    if not kept:
        # KEEPCAPS kept root's whole permitted set, which a child could make effective
        # again; an inheritable set survives any setresuid
        _capset(0)
    left = {
        name: f"{value:x}" for name, value in _capabilities().items() if name != "CapBnd" and value & ~kept
    }
    if left or os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
        raise OSError(f"the drop to uid {uid} left privileges: {left or 'ids'}")
    return refused


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
        # torch.compile runs the function as written: code it compiled would run kernels of
        # its own, past the KernelGuard (read when torch._dynamo is first imported)
        "TORCH_COMPILE_DISABLE": "1",
    }


def confine(work: Path, uid: int | None, budget: Budget, boxed: bool = False) -> tuple[list[str], list[str]]:
    """Apply every available layer to this process (the child, still root if the grader is),
    after it has read its inputs and before any student code runs. ``boxed``: the child
    runs in a job's box (``jail.py``), which has mounted its work dir and made the Python
    installation readable without CAP_DAC_READ_SEARCH: the uid keeps no capability.

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

    if (
        root
        and not boxed
        and not attempt("private tmpfs work dir", lambda: _private_tmpfs(work, budget.work_dir_bytes, uid))
    ):
        if uid is not None:
            os.chown(work, uid, uid)
    attempt("resource limits", lambda: _set_limits(budget))
    attempt("no_new_privs", lambda: _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl"))
    attempt("seccomp", _seccomp)
    abi = landlock_abi()
    landlocked = bool(abi) and attempt(f"landlock ABI {abi}", lambda: _landlock(abi, work))
    if root and uid is not None:
        keep = landlocked and not boxed
        refused = _drop_to(uid, keep_read_search=keep)  # raises: never run student code as root
        if refused:
            failed.append(f"CAP_DAC_READ_SEARCH refused ({refused}): uid {uid} has no capabilities")
        kept = keep and not refused
        applied.append(f"uid {uid}" + (" + CAP_DAC_READ_SEARCH" if kept else ", no capabilities"))
    elif boxed and _capabilities().get("CapEff"):
        # a user namespace's "root" (the grader's own uid): every capability over the job's
        # namespaces, which the worker needs none of
        attempt("no capabilities", lambda: _capset(0))
    os.environ.clear()
    os.environ.update(scrubbed_env(work))
    import tempfile

    tempfile.tempdir = str(work)
    applied.append("scrubbed environment")
    return applied, failed


# -- in the parent -------------------------------------------------------------------------


def _open_lock_dir(path: Path) -> int:
    """A descriptor of the uid lock directory, made 0700 if absent. Refused (RuntimeError)
    unless it is a real directory, ours, that no one else may write in: else its owner, or
    anyone with write access, would choose where root creates and locks files."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        # O_NOFOLLOW: a link planted at the path itself is refused, not followed
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        what = "a symbolic link" if os.path.islink(path) else exc.strerror
        raise RuntimeError(f"uid lock directory {path} is {what}: refusing to use it") from exc
    st = os.fstat(fd)
    problem = (
        f"owned by uid {st.st_uid}, not {os.geteuid()}"
        if st.st_uid != os.geteuid()
        else f"writable by others (mode {stat.S_IMODE(st.st_mode):o})"
        if st.st_mode & 0o022
        else None
    )
    if problem:
        os.close(fd)
        raise RuntimeError(
            f"uid lock directory {path} is {problem}: refusing to use it (remove it: it is made again, 0700)"
        )
    return fd


def _open_lock_file(dir_fd: int, name: str, where: Path) -> int:
    """The lock file ``name`` in the lock directory, created if absent, never through a link."""
    flags = os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise RuntimeError(f"uid lock file {where / name}: {exc.strerror}: refusing to use it") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise RuntimeError(
            f"uid lock file {where / name} is not a regular file of uid {os.geteuid()}: refusing to use it"
        )
    return fd


@contextlib.contextmanager
def lease_uid(sweep: bool = True) -> Iterator[int | None]:
    """A uid no other job on this machine is using, held (flock) for the job's lifetime.

    Graders running side by side (several TAs, ``pytest -n``, shards) must never share a
    job uid: the parent kills every process of its job's uid when the job ends. A lock is
    released by the kernel if its grader dies; a new holder first sweeps the uid. The locks
    live in ``LOCK_DIR``, checked before use (``_open_lock_dir``).
    Yields None when the grader is not root (children then keep the grader's uid).
    ``sweep=False``: the uid's processes need no sweep, since every one of them lives in a
    job box (a PID namespace killed with the job), leased or not: no process of a job
    uid ever exists outside one.
    """
    if os.geteuid() != 0:
        yield None
        return
    where = LOCK_DIR
    dir_fd = _open_lock_dir(where)
    start = (os.getpid() * 7919 + threading.get_ident()) % UID_SPAN
    try:
        for k in range(UID_SPAN):
            uid = UID_BASE + (start + k) % UID_SPAN
            fd = _open_lock_file(dir_fd, str(uid), where)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            break
        else:
            raise RuntimeError(f"all {UID_SPAN} sandbox uids are in use")
    finally:
        os.close(dir_fd)
    try:
        if sweep:
            kill_uid(uid)  # whatever a crashed grader left under this uid
        yield uid
    finally:
        if sweep:
            kill_uid(uid)
        os.close(fd)


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

"""A job isolated by the kernel: namespaces and a cgroup around every child.

``confine.py`` confines the child as a *process* (a uid, Landlock, seccomp, rlimits). What a
process shares with every other process of the machine is the kernel's namespaces and
accounting: the process table, the network, the mount table (file metadata such as access
times, ``/dev``), memory not mapped in its address space. A child that has seen hidden
inputs could signal through any of them to another job or to a later, "clean" child. So
every job is boxed:

    fork server
      └─ keeper      joins the job's cgroup, unshares the namespaces below, waits, mirrors
           └─ init   pid 1 of a new PID namespace: builds the mount view, reaps, and when
                │    the worker ends, ends (the kernel then kills everything left in it)
                └─ worker   child.main: confined (confine.py), runs the student's code

namespace or limit          what it closes
--------------------------  ---------------------------------------------------------------
PID namespace (init)        processes outliving the job (however fast they fork), seeing
                            or signalling any process outside it
network namespace           sockets, netlink (USERSOCK unicast) and loopback shared with any
                            other job or the host
mount namespace             the view below: read-only, ``noatime`` (no bit written in any
                            file's metadata), the work dir ``noexec,nosuid,nodev``, a
                            minimal ``/dev`` (no disk, no terminal, no console), a fresh
                            ``/proc`` of the job's own processes, no cgroup tree
IPC and UTS namespaces      System V / POSIX IPC and the host name, per job
cgroup (v2, or v1)          memory (shared memory and tmpfs pages included), process count
                            and CPU, per job; its processes killed as a whole
user namespace              the same, where the grader is not root (Docker ``--user``)

Everything here runs in the untrusted side's processes (the keeper and init hold nothing
secret: they are forks of the fork server) except ``JobCgroup``, which the trusted parent
makes and removes. The system calls are made through ctypes, as in ``confine.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x400, 0x1000, 0x4000, 0x40000
# mount_setattr(2), open_tree(2), move_mount(2) (x86_64 numbers; the same on arm64 and
# every architecture that came after the unified syscall table)
_NR_OPEN_TREE, _NR_MOVE_MOUNT, _NR_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _O_CLOEXEC = 1, 0o2000000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_AT_FDCWD, _AT_EMPTY_PATH, _AT_RECURSIVE = -100, 0x1000, 0x8000
_ATTR_RDONLY, _ATTR_NOSUID, _ATTR_NODEV, _ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
_ATTR_ATIME_MASK, _ATTR_NOATIME = 0x70, 0x10

# The devices a job may open: what Python, torch and numpy use. A GPU's nodes are added
# when the job grades on CUDA (``gpu_devices``). No disk, terminal, console, tty, kvm...
DEVICES = ("null", "zero", "full", "random", "urandom")
BOX_FAILED = 73  # the exit code of a job whose box could not be built (the reason: its stdout)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _check(
        _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {target}",
    )


def _setattr(path: str | int, set_: int, clear: int = 0, recursive: bool = False) -> None:
    """mount_setattr(2) on a path, or on a detached mount's fd (an int)."""
    attr = _MountAttr(set_, clear, 0, 0)
    flags = _AT_RECURSIVE if recursive else 0
    if isinstance(path, int):
        dfd, name, flags = path, b"", flags | _AT_EMPTY_PATH
    else:
        dfd, name = _AT_FDCWD, path.encode()
    ret = _libc.syscall(
        _NR_MOUNT_SETATTR,
        ctypes.c_int(dfd),
        ctypes.c_char_p(name),
        ctypes.c_uint(flags),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(ret, f"mount_setattr {path}")


def _clone_tree(path: str) -> int:
    """A detached copy of the mount at ``path`` (open_tree OPEN_TREE_CLONE), with the flags
    it has now: taken before the view is made read-only and ``nodev``."""
    ret = _libc.syscall(
        _NR_OPEN_TREE,
        ctypes.c_int(_AT_FDCWD),
        ctypes.c_char_p(path.encode()),
        ctypes.c_uint(_OPEN_TREE_CLONE | _O_CLOEXEC | _AT_RECURSIVE),
    )
    return _check(ret, f"open_tree {path}")


def _attach(fd: int, target: str) -> None:
    ret = _libc.syscall(
        _NR_MOVE_MOUNT,
        ctypes.c_int(fd),
        ctypes.c_char_p(b""),
        ctypes.c_int(_AT_FDCWD),
        ctypes.c_char_p(target.encode()),
        ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
    )
    _check(ret, f"move_mount {target}")


# -- what the parent asks for ----------------------------------------------------------------


@dataclass(frozen=True)
class BoxSpec:
    """One job's box, as the parent asks the fork server for it (JSON on the socket)."""

    job: str  # the job directory (plan, inputs, stdout.txt; ``work/`` in it)
    uid: int | None  # the worker's uid (root grader), None: the grader's own (user namespace)
    work_bytes: int  # the work dir's tmpfs
    cgroups: dict = field(default_factory=dict)  # ``cgroup_plan``: the job's cgroup, made by its init
    devices: list[str] = field(default_factory=list)  # extra device nodes (a GPU's), absolute
    hide_python_from: list[str] = field(default_factory=list)  # see ``python_overlays``
    userns: bool = False  # unprivileged: the namespaces are owned by a new user namespace

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> BoxSpec:
        return cls(**data)


def gpu_devices() -> list[str]:
    """The NVIDIA nodes a CUDA job opens (the driver opens more of them lazily)."""
    names = []
    with contextlib.suppress(OSError):
        names = [f"/dev/{n}" for n in os.listdir("/dev") if n.startswith("nvidia")]
    with contextlib.suppress(OSError):
        names += [f"/dev/nvidia-caps/{n}" for n in os.listdir("/dev/nvidia-caps")]
    return sorted(n for n in names if _is_device(n))


def _is_device(path: str) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode)


def python_overlays(paths: list[str]) -> list[str]:
    """The directories that keep ``paths`` (the Python installation) from a job uid with no
    capability: for each path, its highest ancestor that others may not enter (pyenv's
    ``/root``, mode 0700). In the job's view such a directory is replaced by an empty
    tmpfs holding only the path's branch, so the worker needs no CAP_DAC_READ_SEARCH."""
    hidden: list[str] = []
    for path in paths:
        parts = Path(path).resolve().parts
        for i in range(2, len(parts)):
            ancestor = str(Path(*parts[:i]))
            try:
                mode = os.stat(ancestor).st_mode
            except OSError:
                break
            if not mode & stat.S_IXOTH:
                if ancestor not in hidden:
                    hidden.append(ancestor)
                break
    return hidden


# -- in the fork server's child: the keeper, init, the worker ------------------------------------


# A worker is called with ``ready`` and ``log``. It calls ``ready()`` once it has read its
# inputs, before anything else (it opens nothing for writing before: making a mount
# read-only fails while a file is open for writing through it): it returns once the job's
# view is built and the worker is in the job's cgroup (both made while the worker reads its
# inputs), and raises OSError if either failed. ``log``: the job's stdout file, opened for
# appending before the job's mount namespace existed. It returns the worker's exit code.
Worker = Callable[[Callable[[], None], int], int]
# A spare box's worker: (job dir, event pipe, go-ahead pipe, log) -> exit code; its box is
# complete before it starts.
SpareWorker = Callable[[str, int, "int | None", int], int]
_REST = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS  # what init unshares itself


def new_pid_namespace() -> None:
    """In the fork server (root): the next process it forks is PID 1 of a new namespace."""
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")


def own_pid_namespace() -> int:
    """A descriptor of this process's PID namespace (``back_to``)."""
    return os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)


def back_to(pid_namespace: int) -> None:
    """After the fork: the fork server's next children are its own namespace's again."""
    _check(_libc.setns(pid_namespace, CLONE_NEWPID), "setns(CLONE_NEWPID)")


def run_boxed(spec: BoxSpec, worker: Worker, fds: tuple[int | None, ...] = ()) -> NoReturn:
    """In the keeper (a fresh fork of the server, single-threaded), where the fork server
    cannot make init itself (a user namespace must be unshared by a single-threaded process,
    and owns the others): unshare every namespace, fork init, wait, and end as the worker
    ended (its exit code, or killed by its signal). Never returns. A box that cannot be
    built ends the job with ``BOX_FAILED`` and the reason in the job's stdout: no student
    code runs outside it."""
    try:
        _die_with_parent()  # the fork server: a grader that dies takes its jobs along
        log = open_log(spec.job)
        _enter_namespaces(spec)
        status_r, status_w = os.pipe()
        init = os.fork()
    except BaseException as exc:
        _say(spec.job, f"the job's namespaces could not be made: {exc}")
        os._exit(BOX_FAILED)
    if init == 0:
        os.close(status_r)
        run_init(spec, worker, status_w, fds, log)
    os.close(status_w)
    _close((*fds, log))  # the worker's: the keeper holds none of them
    # The keeper stays outside the namespace: it is the parent's handle on the job (its
    # process group is killed with one killpg, init with it, and the namespace with init).
    _, status = os.waitpid(init, 0)
    reported = os.read(status_r, 16)
    _mirror(int(reported) if reported.strip().lstrip(b"-").isdigit() else status)


def _die_with_parent() -> None:
    _check(_libc.prctl(1, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(BOX_FAILED)


def _enter_namespaces(spec: BoxSpec) -> None:
    flags = CLONE_NEWPID | _REST
    if spec.userns:
        uid, gid = os.getuid(), os.getgid()
        _check(_libc.unshare(flags | CLONE_NEWUSER), "unshare")
        # the grader's own ids, and no other: the worker can become no one else
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    else:
        _check(_libc.unshare(flags), "unshare")


def _close(fds: tuple[int | None, ...]) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def open_log(job: str) -> int:
    """The job's stdout file, for appending (made if absent, never through a link): opened
    before the view is read-only (no file may be open for writing through a mount that is
    made read-only), or through the job directory's own writable mount."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(Path(job) / "stdout.txt", flags, 0o600)


def run_init(spec: BoxSpec, worker: Worker, status_w: int, fds: tuple[int | None, ...], log: int) -> NoReturn:
    """PID 1 of the job (forked by the keeper, in every namespace already): fork the worker
    at once, build the view while the worker reads its inputs (they share the mount
    namespace), tell it when the view is ready, reap, and write the worker's wait status to
    ``status_w``. Once init exits, the kernel kills every process left in the namespace."""
    try:
        _die_with_parent()  # the keeper (killed with the job's process group)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
    except BaseException as exc:
        _say(spec.job, f"the job's namespaces could not be made: {exc}")
        os._exit(BOX_FAILED)
    if pid == 0:
        os.close(status_w)
        os.close(ready_w)
        _work(worker, ready_r, log)
    _close((ready_r, log))
    try:
        make_view(spec)
        said = b"ok"
    except BaseException as exc:
        said = f"the job's file system view could not be made: {exc}".encode()[:4000]
    with contextlib.suppress(OSError):
        os.write(ready_w, said)
    os.close(ready_w)
    _close(fds)
    _reap_until(pid, status_w)


def _work(worker: Worker, ready_r: int, log: int) -> NoReturn:
    def ready() -> None:
        said = os.read(ready_r, 4096)
        os.close(ready_r)
        if said != b"ok":
            raise OSError(0, said.decode(errors="replace") or "the job's init ended")

    code = 70
    try:
        code = worker(ready, log)
    except BaseException:
        _trace()
    finally:
        os._exit(code)


def _trace() -> None:
    """What went wrong in a worker that raised, into its stdout (the job's log)."""
    with contextlib.suppress(BaseException):
        import traceback

        traceback.print_exc()
        sys.stderr.flush()


def _reap_until(worker: int, status_w: int) -> NoReturn:
    """init's loop: reap every process of the namespace; when the worker ends, report how
    to ``status_w`` and end (which ends the namespace)."""
    while True:
        try:
            reaped, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
        if reaped == worker:
            with contextlib.suppress(OSError):
                os.write(status_w, str(status).encode())
            os._exit(0)


def run_spare(spec: BoxSpec, name: str, conn: socket.socket, status_w: int, worker: SpareWorker) -> NoReturn:
    """PID 1 of a job not yet known, forked by the fork server into a new PID namespace while
    the job before runs (root): it makes and joins the job's cgroup (a move between cgroups
    waits for an RCU grace period), unshares the other namespaces and builds the common
    view (``make_common_view``), then waits on ``conn`` for its job: {"job", "uid",
    "work_bytes"} with the worker's pipes attached. Then the job's own view, the worker,
    reaping, and the worker's wait status to ``status_w``. What failed before the job came
    is said in the job's stdout, and the job ends with ``BOX_FAILED``."""
    failure, locked = "", False
    try:
        _die_with_parent()  # the fork server: a grader that dies takes its boxes along
        os.setsid()  # the parent kills the job's process group: this one, and the worker's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if spec.cgroups:  # through the host's mounts, before the job's view hides them
            JobCgroup.make(spec.cgroups, name).join()
        _check(_libc.unshare(_REST), "unshare")
        locked = make_common_view(spec.devices, spec.hide_python_from, spec.userns)
    except BaseException as exc:
        failure = f"the job's box could not be made: {exc}"
    pid, handoff = (0, None) if failure else _prefork_worker(worker, (conn, status_w))
    try:
        msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 2)
    except OSError:
        os._exit(0)
    conn.close()
    if not msg:  # not needed after all (the server has gone, or made it anew)
        os._exit(0)
    job = json.loads(msg)
    if failure:
        _say(job["job"], failure)
        os._exit(BOX_FAILED)
    try:
        make_job_view(job["job"], job["uid"], job["work_bytes"], locked)
        log = open_log(job["job"])
        socket.send_fds(handoff, [msg], [log, *fds])
    except BaseException as exc:
        _say(job["job"], f"the job's file system view could not be made: {exc}")
        os._exit(BOX_FAILED)
    _close((*fds, log))
    handoff.close()
    _reap_until(pid, status_w)


def _prefork_worker(worker: SpareWorker, closed: tuple) -> tuple[int, socket.socket]:
    """The spare's worker, forked ahead too (in the job's cgroup and namespaces already): it
    waits for its job, which init hands over once the job's own view is made: the job as
    JSON, then the log and the worker's pipes."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            ours.close()
            for thing in closed:
                thing.close() if isinstance(thing, socket.socket) else os.close(thing)
            msg, fds, _flags, _addr = socket.recv_fds(theirs, 1 << 16, 3)
            theirs.close()
            if msg and len(fds) >= 2:
                job = json.loads(msg)
                code = worker(job["job"], fds[1], fds[2] if len(fds) > 2 else None, fds[0])
        except BaseException:
            _trace()
        finally:
            os._exit(code)
    theirs.close()
    return pid, ours


def _mirror(status: int) -> NoReturn:
    """End this process as a process with wait status ``status`` ended."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)


def _say(job: str, text: str) -> None:
    """Why the box failed, into the job's stdout (what the grader shows of a job that ran
    nothing: its start-up check quotes it)."""
    with contextlib.suppress(OSError):
        fd = os.open(Path(job) / "stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.write(fd, f"bertlab: the sandbox could not be set up: {text}\n".encode())
        os.close(fd)


def make_view(spec: BoxSpec) -> None:
    """The job's mount namespace, as init (pid 1, with every capability in it) builds it:
    ``make_common_view``, then ``make_job_view``."""
    locked = make_common_view(spec.devices, spec.hide_python_from, spec.userns)
    make_job_view(spec.job, spec.uid, spec.work_bytes, locked)


def make_common_view(devices: list[str], hide_python_from: list[str], userns: bool) -> bool:
    """What every job's view is, before its job is known (a spare box builds it ahead):

    - every mount read-only, ``nosuid``, ``nodev`` and ``noatime``: nothing the job does
      writes a bit into a file or its metadata that another job could read back (reading
      a file under ``relatime`` sets its access time, which anyone may ``stat``);
    - ``/dev`` a read-only tmpfs holding only ``DEVICES`` and ``devices`` (a GPU's nodes);
    - ``/proc`` a new procfs: the job's processes only; no cgroup tree under ``/sys``;
    - each of ``hide_python_from`` an empty tmpfs holding only the Python installation's
      branch of it (``python_overlays``).

    Returns True where the kernel kept the access-time mode locked (a user namespace)."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # detached copies, before the view loses ``dev`` and write access
    nodes = {f"/dev/{n}": _clone_tree(f"/dev/{n}") for n in DEVICES if os.path.exists(f"/dev/{n}")}
    nodes.update({path: _clone_tree(path) for path in devices})
    branches = _clone_branches(hide_python_from)
    for hidden, kept in branches.items():
        _mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755")
        for name, fd in kept:
            target = os.path.join(hidden, name)
            os.mkdir(target, 0o755)
            _attach(fd, target)
            os.close(fd)
    locked = _view_read_only(userns=userns)
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        # a user namespace may mount a procfs only where the host's is fully visible (not
        # in a container that masks /proc/kcore...): the host's stays, read-only; the PID
        # namespace still bounds what the job can signal or outlive (doctor: degraded)
        if not userns:
            raise
    # a sysfs of the job's network namespace (/sys/class/net: its loopback only), where no
    # cgroup hierarchy is mounted (other jobs' memory and process counts live there)
    try:
        _mount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        if os.path.isdir("/sys/fs/cgroup"):
            flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
            _mount("tmpfs", "/sys/fs/cgroup", "tmpfs", flags, "size=4k,mode=0555")
    _make_dev(nodes, locked)
    return locked


def make_job_view(job_dir: str, uid: int | None, work_bytes: int, atime_locked: bool) -> None:
    """The job's own part of the view: its directory writable by root only (the worker's
    stdout file; the worker's uid cannot write there), ``noexec``; the work dir in it a
    private tmpfs of ``work_bytes``, ``noexec,nosuid,nodev``, owned by the worker."""
    job = str(Path(job_dir).resolve())
    _mount(job, job, None, MS_BIND)  # a copy of the read-only mount it is on, made writable
    _setattr(
        job,
        _ATTR_NOSUID | _ATTR_NODEV | _ATTR_NOEXEC | (0 if atime_locked else _ATTR_NOATIME),
        _ATTR_RDONLY | (0 if atime_locked else _ATTR_ATIME_MASK),
    )
    work = os.path.join(job, "work")
    _mount(
        "tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME, f"size={work_bytes},mode=0700"
    )
    if uid is not None:
        os.chown(work, uid, uid)


def _clone_branches(hidden: list[str]) -> dict[str, list[tuple[str, int]]]:
    """For each directory in ``hidden``, detached copies of its entries that lead to the
    Python installation (``python_overlays``: the parent named the directories, this
    process finds which of their entries the installation's paths go through)."""
    import sysconfig

    wanted = [Path(p).resolve() for p in sysconfig.get_paths().values() if p]
    wanted += [Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.__file__)]
    branches: dict[str, list[tuple[str, int]]] = {}
    for directory in hidden:
        names = sorted(
            {
                p.relative_to(directory).parts[0]
                for p in wanted
                if p.is_relative_to(directory) and p != Path(directory)
            }
        )
        branches[directory] = [(name, _clone_tree(os.path.join(directory, name))) for name in names]
    return branches


def _view_read_only(userns: bool) -> bool:
    """Every mount read-only, nosuid, nodev, noatime. Returns True when the kernel kept the
    access-time mode locked (a user namespace may not change what its owner's mounts have)."""
    try:
        _setattr(
            "/", _ATTR_RDONLY | _ATTR_NOSUID | _ATTR_NODEV | _ATTR_NOATIME, _ATTR_ATIME_MASK, recursive=True
        )
        return False
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            _remount_each(MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOATIME)
            return False
        if not userns or exc.errno != errno.EPERM:
            raise
    _setattr("/", _ATTR_RDONLY | _ATTR_NOSUID | _ATTR_NODEV, recursive=True)
    return True


def _remount_each(flags: int) -> None:
    """mount_setattr's work on a kernel older than 5.12: a bind remount of each mount point,
    keeping ``noexec`` where it was."""
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    for line in lines:
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")
        extra = MS_NOEXEC if "noexec" in fields[5].split(",") else 0
        with contextlib.suppress(OSError):  # one gone since (a lazily unmounted one)
            _mount(None, point, None, MS_REMOUNT | MS_BIND | flags | extra)


def _make_dev(nodes: dict[str, int], atime_locked: bool) -> None:
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC | MS_NOATIME, "size=64k,mode=0755")
    for path, fd in nodes.items():
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o666))
        _attach(fd, path)
        os.close(fd)
        # a device node's own mount keeps ``dev`` (else it opens nothing); nothing else does
        _setattr(
            path,
            _ATTR_NOSUID | _ATTR_NOEXEC | (0 if atime_locked else _ATTR_NOATIME),
            0 if atime_locked else _ATTR_ATIME_MASK,
        )
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"/dev/{name}")
    _mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC | MS_NOATIME)


# -- in the parent: the job's cgroup ------------------------------------------------------------


@dataclass(frozen=True)
class Hierarchy:
    """Where this machine lets the grader make job cgroups: a controller's (or, for v2,
    several controllers') base directory under the grader's own cgroup."""

    version: int  # 1 or 2
    base: str  # the grader's own cgroup directory in that hierarchy
    controllers: tuple[str, ...]


CONTROLLERS = ("memory", "pids", "cpu")


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, fs type, super options) of each cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _src, opts = (right.split() + ["", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                point = left.split()[4].encode().decode("unicode_escape")
                found.append((point, fstype, opts.split(",")))
    return found


def _own_cgroups() -> dict[str, str]:
    """controller (or '' for v2) -> this process's cgroup path in that hierarchy."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _id, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(","):
                paths[c] = path
    return paths


def hierarchies() -> tuple[list[Hierarchy], str]:
    """The hierarchies that give a job ``CONTROLLERS`` (v2 where a controller is there and
    can be enabled for children, else v1), and the v2 directory where a job's cgroup can be
    killed as a whole ('' if none). Only a root grader makes job cgroups."""
    if os.geteuid() != 0:
        return [], ""
    try:
        mounts, own = _mounts(), _own_cgroups()
    except OSError:
        return [], ""
    found: list[Hierarchy] = []
    missing = set(CONTROLLERS)
    v2_kill = ""
    for point, fstype, _opts in mounts:
        if fstype != "cgroup2":
            continue
        base = os.path.join(point, own.get("", "/").lstrip("/"), "bertlab")
        try:
            os.makedirs(base, exist_ok=True)
        except OSError:
            continue
        _remove_orphans(base)
        v2_kill = base if os.path.exists(os.path.join(base, "cgroup.kill")) else v2_kill
        try:
            with open(os.path.join(os.path.dirname(base), "cgroup.controllers")) as f:
                offered = set(f.read().split()) & missing
        except OSError:
            offered = set()
        enabled = set()
        for c in sorted(offered):
            for directory in (os.path.dirname(base), base):
                try:
                    with open(os.path.join(directory, "cgroup.subtree_control"), "w") as f:
                        f.write(f"+{c}")
                except OSError:
                    break
            else:
                enabled.add(c)
        if enabled:
            found.append(Hierarchy(2, base, tuple(sorted(enabled))))
            missing -= enabled
        break
    for point, fstype, opts in mounts:
        if fstype != "cgroup":
            continue
        for c in sorted(missing & set(opts)):
            base = os.path.join(point, own.get(c, "/").lstrip("/"), "bertlab")
            try:
                os.makedirs(base, exist_ok=True)
            except OSError:
                continue
            _remove_orphans(base)
            found.append(Hierarchy(1, base, (c,)))
            missing.discard(c)
    return found, v2_kill


def cgroup_plan(found: list[Hierarchy], v2_kill: str, memory_bytes: int, processes: int) -> dict:
    """What a job's cgroup is made of (JSON, in ``BoxSpec.cgroups``); {} where none."""
    if not found and not v2_kill:
        return {}
    return {
        "hierarchies": [[h.version, h.base, list(h.controllers)] for h in found],
        "v2_kill": v2_kill,
        "memory_bytes": memory_bytes,
        "processes": processes,
    }


def cgroup_dirs(plan: dict, name: str) -> tuple[list[str], str]:
    """The directories of the job cgroup ``name`` made from ``plan``, and the one whose
    cgroup.kill ends it as a whole ('' if none)."""
    dirs = [os.path.join(base, name) for _v, base, _c in plan.get("hierarchies", [])]
    v2_kill = plan.get("v2_kill", "")
    if v2_kill and not any(v == 2 and base == v2_kill for v, base, _c in plan["hierarchies"]):
        dirs.append(os.path.join(v2_kill, name))
    return dirs, (os.path.join(v2_kill, name) if v2_kill else "")


class JobCgroup:
    """One job's cgroups: made (``make``) and joined by its init, as root, so every process
    of the job is counted and limited; ``kill`` ends them all and ``remove`` removes them
    (the trusted parent, which the fork server's reply names them to)."""

    def __init__(self, dirs: list[str], kill_dir: str) -> None:
        self.dirs, self.kill_dir = list(dirs), kill_dir

    @classmethod
    def make(cls, plan: dict, name: str) -> JobCgroup:
        dirs, kill_dir = cgroup_dirs(plan, name)
        made = cls([], kill_dir)
        try:
            for d in dirs:
                os.mkdir(d)
                made.dirs.append(d)
            for (version, _base, controllers), d in zip(plan["hierarchies"], dirs, strict=False):
                for c in controllers:
                    for file, value in _limits(version, c, plan["memory_bytes"], plan["processes"]):
                        with contextlib.suppress(FileNotFoundError):  # memsw without swap accounting
                            with open(os.path.join(d, file), "w") as f:
                                f.write(value)
        except OSError:
            made.remove()
            raise
        return made

    def join(self) -> None:
        """Move this process (every thread; its children to come) into the job's cgroups."""
        for procs in self.procs:
            with open(procs, "w") as f:
                f.write("0")

    @property
    def procs(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def kill(self) -> int:
        """SIGKILL every process in the job's cgroups; how many there were."""
        if self.kill_dir:
            with contextlib.suppress(OSError):
                with open(os.path.join(self.kill_dir, "cgroup.kill"), "w") as f:
                    f.write("1")
        found = 0
        for _ in range(50):
            pids = set()
            for procs in self.procs:
                with contextlib.suppress(OSError):
                    with open(procs) as f:
                        pids.update(int(p) for p in f.read().split())
            if not pids:
                break
            found += len(pids)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)
        return found

    def remove(self) -> None:
        for d in reversed(self.dirs):
            for pause in (0, 0.001, 0.005, 0.02, 0.05, 0.1, 0.2):
                time.sleep(pause)
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last killed process is reaped
                    continue
        self.dirs = []


def _remove_orphans(base: str) -> None:
    """Empty job cgroups of fork servers that are gone (a grader killed before it could
    remove them): ``job-<server pid>-<n>``."""
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            parts = name.split("-")
            if len(parts) == 3 and parts[0] == "job" and parts[1].isdigit() and not _alive(int(parts[1])):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(base, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphans(plan: dict) -> None:
    """``_remove_orphans`` in every hierarchy of ``plan`` (a fork server just closed: the
    spare boxes it had made died with it)."""
    for _v, base, _c in plan.get("hierarchies", []):
        _remove_orphans(base)
    if plan.get("v2_kill"):
        _remove_orphans(plan["v2_kill"])


def _limits(version: int, controller: str, memory_bytes: int, processes: int) -> list[tuple[str, str]]:
    if version == 2:
        return {
            "memory": [("memory.max", str(memory_bytes)), ("memory.swap.max", "0")],
            "pids": [("pids.max", str(processes))],
            "cpu": [("cpu.max", "100000 100000")],  # one core: a job's leftovers cannot take two
        }[controller]
    return {
        "memory": [
            ("memory.limit_in_bytes", str(memory_bytes)),
            ("memory.memsw.limit_in_bytes", str(memory_bytes)),
        ],
        "pids": [("pids.max", str(processes))],
        "cpu": [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "100000")],
    }[controller]


# -- in the parent: what this machine offers, and one job's box -------------------------------


@dataclass(frozen=True)
class Support:
    """What boxes this machine allows the grader, found once per process (``support``)."""

    mode: str | None  # "root" | "userns" | None (no box: the reason says why)
    reason: str = ""
    hierarchies: tuple[Hierarchy, ...] = ()
    v2_kill: str = ""
    hide_python_from: tuple[str, ...] = ()
    atime: bool = False  # the view still updates access times (a user namespace's locked mounts)
    host_proc: bool = False  # the view keeps the host's /proc (a container's masked one)

    @property
    def cgroups(self) -> list[str]:
        return sorted({c for h in self.hierarchies for c in h.controllers})


WEAK_ENV = "BERTLAB_ALLOW_WEAK_SANDBOX"  # "1": grade without a box where none can be made


def weak_allowed() -> bool:
    return os.environ.get(WEAK_ENV) == "1"


def job_box(
    found: Support,
    job: Path,
    uid: int | None,
    work_bytes: int,
    memory_bytes: int,
    processes: int,
    device: str,
) -> BoxSpec | None:
    """One job's box, as the parent asks the fork server for it; None where this machine
    allows no box. Its cgroup is made by the job's init (as root); the fork server's reply
    names it (a ``JobCgroup`` of its directories)."""
    if found.mode is None:
        return None
    return BoxSpec(
        str(job),
        uid,
        work_bytes,
        cgroup_plan(list(found.hierarchies), found.v2_kill, memory_bytes, processes),
        gpu_devices() if device.startswith("cuda") else [],
        list(found.hide_python_from),
        userns=found.mode == "userns",
    )


def common_key(box: dict) -> str:
    """What a spare box is made of before its job is known: boxes of one key are alike."""
    return json.dumps([box.get(k) for k in ("cgroups", "devices", "hide_python_from", "userns")])

"""A fork server: one clean interpreter, torch already imported, forks a child per job.

Importing torch costs seconds; forking a process that has imported it costs
milliseconds. The server is started with ``python -m autograder.sandbox.forkserver`` (a fresh
interpreter, so it has never imported the reference, a stage spec or an expected value:
nothing secret can be inherited by a fork), imports ``autograder.sandbox.child`` and then waits.

Protocol, over an inherited SOCK_SEQPACKET socket (its fd number is argv[1]):
  parent -> server  {"job": DIR, "id": N, "box": SPEC}  with fds attached: the event pipe's
                                          write end and the read end of the parent's go-ahead
                                          for hidden inputs; SPEC (``jail.BoxSpec``) the job's
                                          namespaces and cgroup, or null
  parent -> server  {"warm": [EXTRA, ...]} load these (``EXTRAS``) before the next fork; no reply
  server -> parent  {"ready": true}       once warm, before any request
  server -> parent  {"id": N, "pid": PID}  once forked
  server -> parent  {"id": N, "exit": CODE} when it has exited (negative: killed by signal)
The child starts a new session, so the parent can kill it and everything it spawned
with one ``killpg``. In a box (``jail.py``) that child is the job's keeper: killing it
kills the job's init, and with init every process of the job's PID namespace.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import selectors
import socket
import sys


def _child(sock: socket.socket, job: str, event_fd: int, control_fd: int | None, box: dict | None) -> None:
    code = 70
    try:
        gc.enable()  # off in the server only (``serve``); student code may make cycles
        sock.close()
        os.setsid()
        from autograder.sandbox import child, jail

        if box is None:
            code = child.main(job, event_fd, control_fd)
        else:  # a keeper: the worker runs child.main in the job's box; this never returns

            def worker(ready, log: int) -> int:
                return child.main(job, event_fd, control_fd, ready, log)

            jail.run_boxed(jail.BoxSpec.from_json(box), worker, fds=(event_fd, control_fd))
    except BaseException:
        code = 71
    finally:
        os._exit(code)


def _spare(box: dict, name: str, conn: socket.socket, status_w: int) -> None:
    """A spare box's init (``jail.run_spare``): the worker it forks runs child.main."""
    try:
        gc.enable()
        from autograder.sandbox import child, jail

        def worker(job: str, event_fd: int, control_fd: int | None, log: int) -> int:
            return child.main(job, event_fd, control_fd, None, log)

        jail.run_spare(jail.BoxSpec.from_json(box), name, conn, status_w, worker)
    finally:
        os._exit(71)


def _warm_up() -> None:
    """Pay every lazy import and first-call cost once here, not once per child."""
    import io
    import traceback  # noqa: F401

    import safetensors.torch
    import torch

    from autograder.runtime.detector import ForbiddenCallDetector, ForbiddenKernel, KernelGuard
    from autograder.runtime.harness import run_call

    torch.set_num_threads(1)  # before any op: no thread pool exists to be broken by fork()
    x = torch.randn(3, 4, dtype=torch.float64)
    with ForbiddenCallDetector(("aten::_softmax", "torch.nn.functional.softmax")):
        torch.softmax(x @ x.mT.float().double(), dim=-1).masked_fill(x[:, :3] > 0, 0.0)
        repr(x)  # a student's print() under the detector imports torch's mode-stack helpers
        with contextlib.suppress(ForbiddenKernel):  # a forbidden call, stopped as it starts
            torch.nn.functional.softmax(x, dim=-1)
    run_call(
        {"f": lambda t: (t.exp(), t > 0)},
        "f",
        "function",
        {"args": (x,)},
        ("a", "b"),
        ("aten::x",),
        "cpu",
    )
    KernelGuard(("aten::_softmax",)).close()  # the operator list, and torch.library's imports
    safetensors.torch.load(safetensors.torch.save({"x": x}))
    import numpy as np

    np.random.seed(0)  # the child reseeds numpy's global generator before every cell and call
    io.StringIO()


def _warm_matplotlib() -> None:
    """Students import it in a graded cell now and then (most only in demo cells, which
    grading skips): half a second per child that imports it, unless the server has."""
    import matplotlib.pyplot as plt  # (MPLBACKEND=Agg: no display, no threads)

    # and plot in a demo cell: the first figure loads the backend and the font cache
    figure, axes = plt.subplots()
    axes.plot([0, 1], [0, 1])
    axes.set_title("warm-up")
    figure.canvas.draw()
    plt.close(figure)


def _warm_driver(name: str) -> None:
    """A driver module's ``warm_up()``, if it has one: 09's reads the real weights once (90
    MB every 09 child would otherwise read again)."""
    # only a module the server imported already (child.py imports every driver): the name
    # picks one of those, it never imports anything new
    module = sys.modules.get(f"autograder.runtime.drivers.{name}")
    warm_up = getattr(module, "warm_up", None)
    if warm_up is not None:
        warm_up()


# What the parent may ask the server to load before it forks (``{"warm": [...]}``): only
# what a submission uses, so a cold grade of stage 01 never pays for 09's weights or a plot.
EXTRAS = {"matplotlib": _warm_matplotlib}
DRIVER_PREFIX = "driver:"


def _warm_extras(names: list[str]) -> None:
    for name in names:
        try:
            if not isinstance(name, str):
                continue
            if name.startswith(DRIVER_PREFIX):
                _warm_driver(name.removeprefix(DRIVER_PREFIX))
            elif name in EXTRAS:
                EXTRAS[name]()
        except Exception:  # not installed, or failing: a child that needs it says why
            pass
    gc.freeze()  # what the extras imported is inherited, never collected, as the rest


def serve(fd: int) -> None:
    # Everything the server imports lives as long as it does: no collection of it is worth
    # its time (a tenth of a second per full pass over torch's objects, while importing and
    # at exit). Frozen below, a child's collections skip it too, instead of walking (and
    # copying, page by page) the whole inherited heap; children turn collection back on.
    gc.disable()
    import autograder.sandbox.child  # noqa: F401  (the preload: torch, numpy, safetensors)
    from autograder.sandbox import confine

    # Before anything else: this server and every child it forks have no network.
    network_isolated = confine.isolate_network()
    from autograder.sandbox import jail

    pid_ns = jail.own_pid_namespace() if os.geteuid() == 0 else None
    _warm_up()
    gc.freeze()

    sock = socket.socket(fileno=fd)
    sock.send(json.dumps({"ready": True, "network_isolated": network_isolated}).encode())
    _Server(sock, pid_ns).loop()


class _Server:
    """The fork server's loop: requests from the parent (a job to start, extras to load),
    and the ends of the children it started, reported back."""

    def __init__(self, sock: socket.socket, pid_ns: int | None) -> None:
        self.sock, self.pid_ns = sock, pid_ns
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ, None)
        self.running: dict[int, tuple[int, int, int | None]] = {}  # pidfd -> (request id, pid, status pipe)
        # As root, each job's init is made ahead, while the job before it runs: its cgroup
        # joined, its namespaces and the common part of its view built (``jail.run_spare``).
        # One spare per kind of box (``jail.common_key``); a spare is forked straight into a
        # new PID namespace, as its init.
        self.spares: dict[str, tuple[int, socket.socket, int, str]] = {}  # key -> (pid, conn, status, name)
        self.names = itertools.count()

    def loop(self) -> None:
        while True:
            for key, _ in self.sel.select():
                if key.data is not None:
                    self.ended(key.data)
                    continue
                msg, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 2)
                if not msg:  # the parent has gone: leave, our children are killed by it
                    return
                req = json.loads(msg)
                if "warm" in req:
                    for f in fds:
                        os.close(f)
                    _warm_extras(req["warm"] if isinstance(req["warm"], list) else [])
                    self.discard_spares()
                    continue
                self.start(req, fds)

    def own_fds(self) -> list[int]:
        """The server's descriptors, which no child of it keeps."""
        running, spares = self.running, self.spares
        fds = [fd for pidfd, (_r, _p, status) in running.items() for fd in (pidfd, status) if fd is not None]
        fds += [fd for _p, conn, status, _n in spares.values() for fd in (conn.fileno(), status)]
        return fds + ([self.pid_ns] if self.pid_ns is not None else [])

    def make_spare(self, box: dict) -> tuple[int, socket.socket, int, str]:
        from autograder.sandbox import jail

        name = f"job-{os.getpid()}-{next(self.names)}"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        status_r, status_w = os.pipe()
        jail.new_pid_namespace()
        try:
            pid = os.fork()
            if pid == 0:
                self.sel.close()
                self.sock.close()
                ours.close()
                os.close(status_r)
                for f in self.own_fds():
                    os.close(f)
                _spare(box, name, theirs, status_w)
        finally:
            jail.back_to(self.pid_ns)
        theirs.close()
        os.close(status_w)
        return pid, ours, status_r, name

    def discard_spares(self) -> None:
        """Spares forked before an extra was loaded would run without it."""
        for _pid, conn, status, _name in self.spares.values():
            conn.close()  # it reads nothing, and ends; the parent removes its cgroup at the end
            os.close(status)
        self.spares.clear()

    def start(self, req: dict, fds: list[int]) -> None:
        """Start the job ``req`` names: in a spare made ahead (root), else in a keeper that
        makes the box itself (a user namespace's); reply with its pid."""
        from autograder.sandbox import jail

        box = req.get("box")
        reply: dict = {"id": req["id"]}
        status_r = None
        assigned = False
        if box is not None and not box.get("userns") and self.pid_ns is not None:
            kind = jail.common_key(box)
            job = {"job": req["job"], "uid": box["uid"], "work_bytes": box["work_bytes"]}
            for _try in range(2):  # a spare that died meanwhile is made anew
                pid, conn, status_r, name = self.spares.pop(kind, None) or self.make_spare(box)
                try:
                    socket.send_fds(conn, [json.dumps(job).encode()], fds)
                    assigned = True
                    break
                except OSError:
                    os.close(status_r)
                    os.waitpid(pid, 0)
                finally:
                    conn.close()
            if assigned:
                reply["cgroup"] = jail.cgroup_dirs(box.get("cgroups", {}), name)
        if not assigned:  # no spare: a keeper makes the box (a user namespace's)
            status_r = None
            pid = os.fork()
            if pid == 0:
                self.sel.close()
                for f in self.own_fds():
                    os.close(f)
                _child(self.sock, req["job"], fds[0], fds[1] if len(fds) > 1 else None, box)
        for f in fds:
            os.close(f)
        pidfd = os.pidfd_open(pid)
        self.running[pidfd] = (req["id"], pid, status_r)
        self.sel.register(pidfd, selectors.EVENT_READ, pidfd)
        self.sock.send(json.dumps({**reply, "pid": pid}).encode())
        if assigned and kind not in self.spares:
            self.spares[kind] = self.make_spare(box)  # the next job's, made while this one runs

    def ended(self, pidfd: int) -> None:
        """A child the server started has ended: reap it and tell the parent how."""
        rid, pid, reported = self.running.pop(pidfd)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if reported is not None:  # a job's init: how its worker ended, if it did
            said = os.read(reported, 16)
            os.close(reported)
            if said.strip().lstrip(b"-").isdigit():
                status = int(said)
        self.sock.send(json.dumps({"id": rid, "exit": os.waitstatus_to_exitcode(status)}).encode())


if __name__ == "__main__":
    serve(int(sys.argv[1]))

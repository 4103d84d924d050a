"""The trusted side of the process boundary: start children, watch them, read what they leave.

One fork server per grading run; one child per submission. The parent watches the
child's progress events and enforces the time limits: a cell or call that does not
finish in time, or a child that dies (``sys.exit``, ``os._exit``, a segfault, the OOM
killer), costs only that cell or call. The child is killed with its whole process group
and a fresh one resumes after it, so every other call is still made.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from queue import Queue
from typing import Any

import torch

from autograder import sandbox, wire

MAX_EVENT_BYTES = 512 << 20  # returned values travel here; a child that floods the pipe is cut off
MAX_OUTPUT_FILE = 256 << 20
VALUE_KINDS = ("tensor", "ndarray", "scalar")  # the kinds of returned value that carry numbers
MAX_STDOUT = 4000
MAX_RESTARTS = 4  # plus two per graded name


@dataclass(frozen=True)
class Limits:
    call_s: float | None = None  # one call of a graded name; None: the stage spec's limit
    cell_s: float = 20.0  # one notebook cell (imports, demos)
    submission_s: float = 120.0  # everything for one submission


@dataclass
class Planned:
    """One call the child must make: graded name, protocol, and the encoded case data."""

    index: int
    name: str
    kind: str
    outputs: tuple[str, ...]
    forbidden: tuple[str, ...]
    data: dict[str, Any]  # wire skeletons of args/kwargs/init/state
    driver: str | None = None


@dataclass
class CallOutcome:
    status: str  # ok | missing | not_callable | not_implemented | type_error | error |
    # forbidden | bad_return | timeout | crashed | skipped
    info: dict[str, Any] = field(default_factory=dict)
    outputs: list[tuple[str, torch.Tensor | None, dict[str, str]]] = field(default_factory=list)
    blob: bytes | None = None  # the returned values' raw bytes as the child sent them


@dataclass
class RunReport:
    calls: dict[int, CallOutcome]
    cell_errors: dict[int, dict[str, str]]
    notes: list[str]
    stdout: str
    restarts: int
    wall_s: float


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "the process ended"
    if code < 0:
        try:
            return f"the process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the process was killed by signal {-code}"
    return f"the process exited with status {code}"


class ForkServer:
    """A warm interpreter (torch imported) that forks one child per job. Thread-safe."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        root = str(Path(__file__).resolve().parent.parent)
        code = (
            f"import sys; sys.path.insert(0, {root!r}); "
            f"from autograder.forkserver import serve; serve({theirs.fileno()})"
        )
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": tempfile.gettempdir(),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "Agg",
            # torch asks for transparent huge pages for its tensors of 2 MB and more: a child
            # is a fresh process, and 09 fills ~1 GB of new memory in 4 KB page faults otherwise
            "THP_MEM_ALLOC_ENABLE": "1",
        }
        # -I: the server ignores PYTHON* variables and the user's site-packages
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", code],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock = ours
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, Queue] = {}
        self._ready = threading.Event()
        self._gone = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._cleanups: Queue = Queue()
        self._cleaner: threading.Thread | None = None
        atexit.register(self.drain)  # a job's processes never outlive the grader

    def defer(self, cleanup: Any) -> None:
        """Run ``cleanup()`` soon, in a background thread: the end of a finished job (wait
        for the child to be reaped, sweep its uid, release the lease) overlaps with the
        scoring of its results. ``drain()`` (and ``close()``) wait for all of them."""
        with self._lock:
            if self._cleaner is None:
                self._cleaner = threading.Thread(target=self._run_cleanups, daemon=True)
                self._cleaner.start()
        self._cleanups.put(cleanup)

    def _run_cleanups(self) -> None:
        while True:
            cleanup = self._cleanups.get()
            try:
                cleanup()
            except Exception:  # a cleanup that fails must not stop the next ones
                import traceback

                traceback.print_exc(file=sys.stderr)
            finally:
                self._cleanups.task_done()

    def drain(self) -> None:
        """Wait until every deferred cleanup has run."""
        self._cleanups.join()

    def _read(self) -> None:
        while True:
            try:
                msg = self.sock.recv(1 << 16)
            except OSError:
                msg = b""
            if not msg:
                self._gone = True
                self._ready.set()
                with self._lock:
                    for q in self._waiting.values():
                        q.put({"exit": None, "server_gone": True})
                return
            reply = json.loads(msg)
            if reply.get("ready"):
                self._ready.set()
                continue
            with self._lock:
                q = (
                    self._waiting.pop(reply["id"], None)
                    if "exit" in reply
                    else self._waiting.get(reply["id"])
                )
            if q is not None:
                q.put(reply)

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Block until the server has imported torch and warmed up."""
        if not self._ready.wait(timeout) or self._gone:
            raise RuntimeError("the fork server did not start: see the messages above")

    def fork(self, job: Path, event_w: int) -> tuple[int, Queue]:
        self.wait_ready()
        with self._lock:
            rid = self._next
            self._next += 1
            q: Queue = Queue()
            self._waiting[rid] = q
            socket.send_fds(self.sock, [json.dumps({"job": str(job), "id": rid}).encode()], [event_w])
        reply = q.get(timeout=60)
        if "pid" not in reply:
            raise RuntimeError("the fork server stopped: see the messages above")
        return reply["pid"], q

    def close(self) -> None:
        self.drain()  # before the socket closes: a cleanup waits for its child's exit message
        atexit.unregister(self.drain)  # nothing left to drain: a closed server is not kept alive
        try:
            # close() alone does not end the reader thread's blocked recv(), so the server
            # would never see EOF (and close would wait out its 10 s); shutdown() does.
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Events:
    """JSON lines from the child, bounded in size; garbage is ignored, not trusted. A line
    with ``"raw": N`` is followed by N bytes of returned values (``wire.pack``), which
    arrive as that event's ``blob``."""

    def __init__(self, fd: int) -> None:
        self.fd, self.total, self.eof = fd, 0, False
        self.pending: list[bytes] = []  # the start of a line not yet ended
        self.raw_event: dict[str, Any] | None = None  # the event whose raw bytes are arriving
        self.raw_parts: list[bytes] = []
        self.raw_need = 0
        try:  # fewer, larger reads for the megabytes a big output sends
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass

    def read(self, timeout: float) -> list[dict[str, Any]] | None:
        """Events that arrived within ``timeout`` seconds; None on time-out."""
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if not ready:
            return None
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            self.eof = True
            return []
        self.total += len(chunk)
        if self.total > MAX_EVENT_BYTES:
            self.eof = True
            return []
        return self._feed(chunk)

    def _feed(self, data: bytes) -> list[dict[str, Any]]:
        # only new bytes are searched for line ends, and a line or a blob of many chunks is
        # joined once, when complete (searching a growing buffer each time is quadratic)
        events: list[dict[str, Any]] = []
        at = 0
        while at < len(data):
            if self.raw_event is not None:
                take = data[at : at + self.raw_need]
                self.raw_parts.append(take)
                self.raw_need -= len(take)
                at += len(take)
                if self.raw_need == 0:
                    self.raw_event["blob"] = b"".join(self.raw_parts)
                    events.append(self.raw_event)
                    self.raw_event, self.raw_parts = None, []
                continue
            end = data.find(b"\n", at)
            if end < 0:
                self.pending.append(data[at:])
                break
            line = b"".join([*self.pending, data[at:end]])
            self.pending, at = [], end + 1
            event = _parse(line)
            if event is None:
                continue
            raw = event.pop("raw", None)
            if type(raw) is int and 0 < raw <= MAX_OUTPUT_FILE:
                self.raw_event, self.raw_need = event, raw
            else:
                events.append(event)
        return events


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        ev = json.loads(line)
    except (ValueError, RecursionError):  # garbage, or nesting built to crash a parser
        return None
    if isinstance(ev, dict) and isinstance(ev.get("e"), str) and type(ev.get("i", 0)) is int:
        return _clean(ev)
    return None


def _clean(event: dict[str, Any]) -> dict[str, Any]:
    """Keep only fields of the kinds the child is meant to send: text, numbers, a list of
    texts (forbidden calls) and the description of returned values. Anything else a hostile
    child sends is dropped, so nothing downstream meets a type it does not expect."""
    out: dict[str, Any] = {}
    for key, value in event.items():
        if key == "outputs" and isinstance(value, list):
            out[key] = value  # checked item by item in _load_outputs
        elif key == "calls" and isinstance(value, list):
            out[key] = [str(c)[:300] for c in value[:5] if isinstance(c, str)]
        elif key in ("layers", "failed") and isinstance(value, list):
            out[key] = [str(c)[:200] for c in value[:20] if isinstance(c, str)]
        elif isinstance(value, str):
            out[key] = value
        elif type(value) in (int, float, bool):
            out[key] = value
    return out


def _load_outputs(
    blob: bytes | None, described: list[Any], n: int
) -> list[tuple[str, torch.Tensor | None, dict]]:
    """Parse the child's returned values as plain tensors, checking them against its report."""
    if (
        not isinstance(described, list)
        or len(described) != n
        or not all(isinstance(d, dict) for d in described)
    ):
        raise ValueError("the report of returned values is malformed")
    if blob is not None and len(blob) > MAX_OUTPUT_FILE:
        raise ValueError("the returned values are too large")
    kinds = [d.get("kind") if d.get("kind") in VALUE_KINDS else "other" for d in described]
    # raw bytes checked against the dtype and shape each one claims: nothing executes
    layouts = [d.get("layout") for d, kind in zip(described, kinds, strict=True) if kind != "other"]
    tensors = iter(wire.unpack(layouts, blob or b""))
    return [
        (
            kind,
            next(tensors) if kind != "other" else None,
            {str(a)[:40]: str(b)[:100] for a, b in d.items() if a != "layout"},
        )
        for d, kind in zip(described, kinds, strict=True)
    ]


def run_submission(
    server: ForkServer,
    cells: list[tuple[str, str]],
    module_name: str,
    calls: list[Planned],
    inputs: bytes,
    device: str,
    limits: Limits,
    parts: dict[str, list[tuple[str, str]]] | None = None,
) -> RunReport:
    """Run one submission's code and calls in children; return what they produced.
    ``parts``: the same submission's earlier stages this one loads (``autograder.parts``)."""
    t0 = time.monotonic()
    outcomes: dict[int, CallOutcome] = {}
    cell_errors: dict[int, dict[str, str]] = {}
    notes: list[str] = []
    by_index = {c.index: c for c in calls}
    skip_cells: list[int] = []
    crashes: dict[str, int] = {}
    restarts = 0
    max_restarts = MAX_RESTARTS + 2 * len({c.name for c in calls})
    stopped = f"not run: the submission used up its {limits.submission_s:g} s"
    last_exit: Queue | None = None
    job_end = contextlib.ExitStack()  # the job dir and the uid lease: closed now, or deferred
    deferred = False
    try:
        tmp = job_end.enter_context(tempfile.TemporaryDirectory(prefix="bertlab-job-"))
        uid = job_end.enter_context(sandbox.lease_uid())
        job = Path(tmp)
        (job / "work").mkdir()
        os.chmod(job, 0o711)  # the child's unprivileged uid may pass through to its work dir
        plan = {
            "module_name": module_name,
            "device": device,
            "cells": cells,
            "calls": [
                {
                    "index": c.index,
                    "name": c.name,
                    "kind": c.kind,
                    "outputs": list(c.outputs),
                    "forbidden": list(c.forbidden),
                    "data": c.data,
                    "driver": c.driver,
                }
                for c in calls
            ],
            "parts": parts or {},
        }
        (job / "plan.json").write_text(json.dumps(plan))
        (job / "inputs.safetensors").write_bytes(inputs)
        while True:
            (job / "resume.json").write_text(
                json.dumps({"skip_cells": skip_cells, "skip_calls": sorted(outcomes), "uid": uid})
            )
            r, w = os.pipe()
            try:
                pid, exits = server.fork(job, w)
            finally:
                os.close(w)
            events = _Events(r)
            current: tuple[str, int] | None = None
            started = time.monotonic()
            finished = timed_out = False
            try:
                while not (finished or events.eof):
                    budget = limits.submission_s - (time.monotonic() - t0)
                    limit = limits.call_s if current and current[0] == "call" else limits.cell_s
                    wait = min(limit - (time.monotonic() - started), budget)
                    got = events.read(wait)
                    if got is None:
                        timed_out = True
                        break
                    for ev in got:
                        kind, i = ev["e"], ev.get("i")
                        if kind in ("cell", "call") and isinstance(i, int):
                            current, started = (kind, i), time.monotonic()
                        elif kind == "cell_error" and isinstance(i, int):
                            cell_errors[i] = {
                                k: str(ev.get(k, ""))[:2000] for k in ("type", "message", "where")
                            }
                        elif kind == "call_end" and i in by_index and i not in outcomes:
                            info = {k: v for k, v in ev.items() if k not in ("e", "i")}
                            blob = info.pop("blob", None)
                            outcomes[i] = CallOutcome(str(info.pop("status", "error")), info)
                            if isinstance(blob, bytes):
                                outcomes[i].blob = blob
                            current = None
                        elif kind == "note" and len(notes) < 20:
                            notes.append(str(ev.get("text", ""))[:300])
                        elif kind == "done":
                            finished = True
            finally:
                _kill_group(pid)
                os.close(r)
                if not finished:
                    try:  # reaped first, so the sweep below finds only what detached
                        code = exits.get(timeout=30).get("exit")
                    finally:
                        if uid is not None:  # whatever detached from the group still has the job's uid
                            sandbox.kill_uid(uid)
            if finished:
                last_exit = exits  # its exit and the final sweep are awaited in the background
                break
            # The child hung or died part-way: charge it to what was running, resume after it.
            if current is None:
                if not timed_out:
                    notes.append(
                        f"the grading process for this submission stopped unexpectedly: {_exit_reason(code)}"
                    )
                break
            what, i = current
            reason = (
                f"did not finish within {limits.call_s if what == 'call' else limits.cell_s:g} s "
                f"(an infinite loop, or a wait for input?)"
                if timed_out
                else f"stopped: {_exit_reason(code)}"
            )
            if what == "cell":
                skip_cells.append(i)
                cell_errors[i] = {
                    "type": "Timeout" if timed_out else "Crash",
                    "message": reason,
                    "where": "",
                }
            else:
                name = by_index[i].name
                outcomes[i] = CallOutcome(
                    "timeout" if timed_out else "crashed", {"message": f"{name} {reason}"}
                )
                crashes[name] = crashes.get(name, 0) + 1
                # A name that hung once, or crashed twice, would do it again: don't spend
                # the submission's budget on it.
                if timed_out or crashes[name] >= 2:
                    why = reason if timed_out else "crashed the process twice"
                    for c in calls:
                        if c.name == name and c.index not in outcomes:
                            outcomes[c.index] = CallOutcome(
                                "skipped", {"message": f"not run: an earlier call of {name} {why}"}
                            )
            restarts += 1
            if restarts > max_restarts:
                stopped = "not run: grading of this submission stopped after too many hangs or crashes"
                notes.append(stopped.removeprefix("not run: "))
                break
            if time.monotonic() - t0 >= limits.submission_s:
                break
        for c in calls:
            outcome = outcomes.setdefault(c.index, CallOutcome("skipped", {"message": stopped}))
            if outcome.status == "ok":
                try:
                    outcome.outputs = _load_outputs(outcome.blob, outcome.info.get("outputs"), len(c.outputs))
                    outcome.blob = None
                except Exception as exc:  # any malformed file: that call fails, nothing else
                    outcomes[c.index] = CallOutcome(
                        "bad_return", {"message": f"unreadable returned values ({exc})"}
                    )
        stdout = _read_head(job / "stdout.txt", MAX_STDOUT)
        report = RunReport(outcomes, cell_errors, notes, stdout, restarts, time.monotonic() - t0)
        if last_exit is not None:

            def end_job(exits: Queue = last_exit) -> None:
                try:
                    exits.get(timeout=30)  # reaped: the lease's sweep then finds only what detached
                finally:
                    job_end.close()

            server.defer(end_job)
            deferred = True
        return report
    finally:
        if not deferred:
            job_end.close()


def _read_head(path: Path, limit: int) -> str:
    try:  # O_NOFOLLOW: the child may have replaced its log with a link to a file it may not read
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return ""
    text = data[:limit].decode("utf-8", errors="replace")
    return text + ("\n… (output truncated)" if len(data) > limit else "")


def encode_inputs(
    items: list[tuple[int, dict[str, Any]]],
) -> tuple[dict[int, dict], dict[str, torch.Tensor]]:
    """Encode each call's case data into skeletons plus one shared tensor dict."""
    tensors: dict[str, torch.Tensor] = {}
    skeletons = {i: {k: wire.encode(v, tensors, f"c{i}") for k, v in data.items()} for i, data in items}
    return skeletons, tensors

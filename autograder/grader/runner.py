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
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty, Queue
from typing import Any, Protocol

import safetensors.torch
import torch

from autograder.grader.launch import Launched, adopt, launch
from autograder.runtime import wire
from autograder.runtime.harness import CallSpec
from autograder.sandbox import confine, jail
from autograder.sandbox.confine import SandboxUnusable

# What the grader accepts from the children of one submission. Every byte a child sends is
# read (or the child is cut off), but only these amounts are ever held, whatever it sends.
MAX_CHILD_BYTES = 256 << 20  # read from one child; returned values travel here too
MAX_RECEIVED = 2 << 30  # read from all the children of one submission (restarts included)
MAX_LINE_BYTES = 1 << 20  # one event's JSON line (an honest one is a few hundred bytes)
MIN_RETURN_BYTES = 16 << 20  # a call may return this much, or 16x what it should return
MAX_RETAINED_BYTES = 256 << 20  # returned values held for one submission, all calls together
MAX_OUTPUT_FILE = MAX_RETAINED_BYTES
# The most one submission, whatever it sends, makes the grader hold beyond what an honest
# one does: returned values (a call's twice, while its parts are joined), a line, a read.
MEMORY_BUDGET_BYTES = 384 << 20
MAX_TEXT = 2000  # one text field of an event (a message, a traceback's line)
MAX_NOTES = 20  # notes kept per submission (and as many more from after hidden inputs)
VALUE_KINDS = ("tensor", "ndarray", "scalar")  # the kinds of returned value that carry numbers
# the statuses a child may report for a call (harness.run_call); anything else is not trusted
CHILD_STATUSES = frozenset(
    {"ok", "missing", "not_callable", "not_implemented", "type_error", "error", "forbidden", "bad_return"}
)
MAX_STDOUT = 4000
MAX_RESTARTS = 4  # plus two per graded name


@dataclass(frozen=True)
class Limits:
    call_s: float | None = None  # one call of a graded name; None: the stage spec's limit
    cell_s: float = 20.0  # one notebook cell (imports, demos)
    submission_s: float = 120.0  # everything for one submission


@dataclass(frozen=True)
class Planned(CallSpec):
    """One call the child must make (its ``CallSpec``, all the child ever reads of it), and
    what only the parent knows of it."""

    hidden: bool = False  # a hidden case: its inputs reach the child after every public call
    max_return_bytes: int = MIN_RETURN_BYTES  # returned values beyond this are not read
    call_s: float | None = None  # its own time limit (a small input's), else the run's


class Ladder(Protocol):
    """Small inputs a clean child runs one at a time, after its public calls and before any
    hidden input reaches it (``grader/counterexample.py``'s ``Search``): ``next`` is asked
    each time the child is ready for more, with every outcome so far, and names the next
    call to make (one of ``calls``), or None when it has what it needs. ``calls`` and
    ``inputs`` (every call's specs and tensors, as the child reads them: ``ladder.bin``)
    are read only once ``next`` has named a call."""

    @property
    def calls(self) -> list[Planned]: ...

    @property
    def inputs(self) -> bytes: ...

    def next(self, outcomes: dict[int, CallOutcome]) -> Planned | None: ...

    @property
    def spent_s(self) -> float: ...


@dataclass
class CallOutcome:
    status: str  # ok | missing | not_callable | not_implemented | type_error | error |
    # forbidden | bad_return (CHILD_STATUSES) | timeout | crashed | skipped | untrusted
    info: dict[str, Any] = field(default_factory=dict)
    outputs: list[tuple[str, torch.Tensor | None, dict[str, str]]] = field(default_factory=list)
    blob: bytes | None = None  # the returned values' raw bytes as the child sent them
    loaded: bool = False  # ``outputs`` read from ``blob`` (``finish_outcome``)


@dataclass
class RunReport:
    """What the children of one submission produced. ``cell_errors``, ``notes`` and
    ``stdout`` come from before the submission received any hidden input; the
    ``private_*`` fields hold what came after (instructors only: it may carry hidden
    inputs). Outcomes of hidden calls are, by nature, from after."""

    calls: dict[int, CallOutcome]
    cell_errors: dict[int, dict[str, str]]
    notes: list[str]
    stdout: str
    restarts: int
    wall_s: float
    private_cell_errors: dict[int, dict[str, str]] = field(default_factory=dict)
    private_notes: list[str] = field(default_factory=list)
    private_stdout: str = ""  # all it printed, when it received hidden inputs


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "the process ended"
    if code < 0:
        try:
            return f"the process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the process was killed by signal {-code}"
    return f"the process exited with status {code}"


# The start-up check's submission: an import read from the Python installation now (as a
# student's first cell does; the fork server preloads only what grading itself uses) and
# one call answered through the real pipe.
SELF_TEST_CELL = """\
import os, sys
os.listdir(os.path.dirname(os.__file__))
sys.modules.pop("colorsys", None)
import colorsys
import torch
open(torch.__file__, "rb").close()
def double(x):
    return 2 * x
"""


class ForkServer:
    """A warm interpreter (torch imported) that forks one child per job. Thread-safe.

    Before its first job, a child is confined and runs a trivial call (``self_test``): a
    machine where the sandbox cannot be set up, or leaves the child unable to import,
    raises ``SandboxUnusable`` with the reason, instead of grading everyone 0."""

    def __init__(self, launched: Launched | None = None) -> None:
        """``launched``: a server process ``launch()`` started earlier (it imports torch
        while this process does); by default, the one ``launch.early()`` started, if
        any, else one started now."""
        launched = launched or adopt() or launch()
        self.proc, self.sock = launched.proc, launched.sock
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, Queue] = {}
        self._warmed = set(launched.warmed)  # extras asked of the server (``warm``)
        self._ready = threading.Event()
        self._gone = False
        self._checking = threading.RLock()  # reentrant: the self-test's own fork comes back here
        self._checked, self._unusable = False, ""
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
        """Block until the server has imported torch, warmed up and passed ``self_test``."""
        if not self._ready.wait(timeout) or self._gone:
            raise RuntimeError("the fork server did not start: see the messages above")
        with self._checking:
            if not self._checked:
                self._checked = True
                # twice before refusing: one child that failed to start is not yet a
                # machine where no child can (each try is a whole job: its own box)
                first = self.self_test()
                self._unusable = first and (self.self_test() and f"{first} (and again on a second try)") or ""
        if self._unusable:
            raise SandboxUnusable(self._unusable)

    def self_test(self) -> str | None:
        """Confine a child and make one call in it, as grading does: None if it answered
        right, else why not. A machine that allows no job box (``confine.box_support``) is refused
        unless ``jail.WEAK_ENV`` says to grade without one."""
        found = confine.box_support()
        if found.mode is None and not jail.weak_allowed():
            return (
                f"this machine allows no job box (PID, mount and network namespaces): {found.reason}. "
                f"Without one, a submission can outlive its job and reach other jobs. Set "
                f"{jail.WEAK_ENV}=1 to grade anyway (README: Security model)"
            )
        x = torch.arange(3, dtype=torch.float64)
        skeletons, tensors = encode_inputs([(0, {"args": (x,)})])
        call = Planned(0, "double", "function", ("y",), (), skeletons[0])
        report = run_submission(
            self,
            [("self-test", SELF_TEST_CELL)],
            "bertlab_self_test",
            [call],
            safetensors.torch.save(tensors),
            "cpu",
            Limits(call_s=60.0, cell_s=60.0, submission_s=120.0),
        )
        outcome = report.calls[0]
        returned = outcome.outputs[0][1] if outcome.status == "ok" and outcome.outputs else None
        if isinstance(returned, torch.Tensor) and torch.equal(returned, 2 * x):
            return None
        errors = [f"{e['type']}: {e['message']}" for e in report.cell_errors.values()]
        said = str(outcome.info.get("message") or outcome.status)
        call = "" if said.removeprefix("not run: ") in report.notes else f"its call: {said}"
        why = [*errors, report.stdout.strip(), *report.notes, call]
        return "a confined child could not run a trivial submission: " + "; ".join(w for w in why if w)

    def fork(
        self, job: Path, event_w: int, control_r: int | None = None, box: jail.BoxSpec | None = None
    ) -> tuple[int, Queue, tuple[list[str], str] | None]:
        """Fork a child for ``job``: it writes events to ``event_w`` and reads the
        parent's go-ahead for hidden inputs from ``control_r``; in ``box`` (``jail.py``),
        if given: then the pid is the job's keeper's."""
        self.wait_ready()
        fds = [event_w] if control_r is None else [event_w, control_r]
        request = {"job": str(job), "id": 0, "box": box.to_json() if box else None}
        with self._lock:
            rid = self._next
            self._next += 1
            q: Queue = Queue()
            self._waiting[rid] = q
            request["id"] = rid
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
        reply = q.get(timeout=60)
        if "pid" not in reply:
            raise RuntimeError("the fork server stopped: see the messages above")
        made = reply.get("cgroup")  # the job's cgroup, which its init made (jail.run_spare)
        return reply["pid"], q, (made[0], made[1]) if made else None

    def warm(self, extras: Iterable[str]) -> None:
        """Have the server load ``extras`` (``forkserver.EXTRAS``: matplotlib, a driver's
        ``warm_up``) once, before the next child it forks, so that the children inherit them
        instead of each loading them: a cold grade pays only for what its submission uses.
        Nothing is awaited: the server reads its socket in order, so a child forked after
        this call (from any thread) is forked after the warm-up."""
        with self._lock:
            new = sorted(set(extras) - self._warmed)
            if new:
                self._warmed.update(new)
                self.sock.send(json.dumps({"warm": new}).encode())

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
            # Every job has ended (drained), so the server holds nothing: killed, not waited
            # for, it spares a cold grade its interpreter's exit (a few tenths of a second
            # with torch loaded), and a server still warming up its exit once it is ready.
            self.proc.kill()
            self.proc.wait()
            # the spare boxes it had made ahead died with it (their init's parent-death
            # signal): their empty cgroups go too
            found = confine.box_support()
            if found.mode == "root":
                plan = jail.cgroup_plan(list(found.hierarchies), found.v2_kill, 1, 1)
                jail.remove_orphans(plan)

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
    """JSON lines from the child, bounded in size; garbage is ignored, not trusted.

    Each event goes to ``handle`` as soon as it is read, in order, so the watcher's state
    (which call is running) is current when the next line is judged. A line with
    ``"raw": N`` is followed by N bytes of returned values (``wire.pack``): they become the
    event's ``blob`` only if ``raw_limit(event)`` allows N bytes; otherwise they are read
    and dropped (``blob_refused``), so a child never makes the grader hold more than the
    watcher allows. A line longer than ``MAX_LINE_BYTES`` is dropped unread."""

    def __init__(
        self,
        fd: int,
        handle: Callable[[dict[str, Any]], None],
        raw_limit: Callable[[dict[str, Any]], int],
        max_bytes: int = MAX_CHILD_BYTES,
    ) -> None:
        self.fd, self.total, self.eof, self.max_bytes = fd, 0, False, max_bytes
        self.handle, self.raw_limit = handle, raw_limit
        self.pending: list[bytes] = []  # the start of a line not yet ended
        self.pending_bytes = 0
        self.skip_line = False  # inside a line that grew past MAX_LINE_BYTES
        self.raw_event: dict[str, Any] | None = None  # the event whose raw bytes are arriving
        self.raw_parts: list[bytes] = []
        self.raw_need = 0
        self.raw_keep = False
        self.cut_off = False  # the child sent more than max_bytes
        try:  # fewer, larger reads for the megabytes a big output sends
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass

    def read(self, timeout: float) -> bool:
        """Handle what arrives within ``timeout`` seconds; False on time-out."""
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if not ready:
            return False
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            self.eof = True
            return True
        self.total += len(chunk)
        if self.total > self.max_bytes:
            self.eof = self.cut_off = True
            return True
        self.feed(chunk)
        return True

    def feed(self, data: bytes) -> None:
        # only new bytes are searched for line ends, and a line or a blob of many chunks is
        # joined once, when complete (searching a growing buffer each time is quadratic)
        at = 0
        while at < len(data):
            if self.raw_event is not None:
                take = data[at : at + self.raw_need]
                if self.raw_keep:
                    self.raw_parts.append(take)
                self.raw_need -= len(take)
                at += len(take)
                if self.raw_need == 0:
                    event, self.raw_event = self.raw_event, None
                    if self.raw_keep:
                        event["blob"] = b"".join(self.raw_parts)
                    self.raw_parts = []
                    self.handle(event)
                continue
            end = data.find(b"\n", at)
            if end < 0:
                self._pend(data[at:])
                break
            if self.skip_line:
                self.skip_line, at = False, end + 1
                continue
            line = b"".join([*self.pending, data[at:end]])
            self.pending, self.pending_bytes, at = [], 0, end + 1
            if len(line) > MAX_LINE_BYTES:
                continue
            event = _parse(line)
            if event is None:
                continue
            raw = event.pop("raw", None)
            if type(raw) is int and raw > 0:
                self.raw_event, self.raw_need = event, raw
                self.raw_keep = raw <= self.raw_limit(event)
                if not self.raw_keep:
                    event["blob_refused"] = raw
            else:
                self.handle(event)

    def _pend(self, part: bytes) -> None:
        if self.skip_line:
            return
        self.pending.append(part)
        self.pending_bytes += len(part)
        if self.pending_bytes > MAX_LINE_BYTES:  # no event is this long: drop it, unread
            self.pending, self.pending_bytes, self.skip_line = [], 0, True


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
            out[key] = value[:MAX_TEXT]
        elif type(value) in (int, float, bool):
            out[key] = value
    return out


def _device(value: Any) -> str:
    """A device the child names, as torch writes it; "unknown" for anything else."""
    try:
        return str(torch.device(str(value)[:40]))
    except (RuntimeError, ValueError, TypeError):
        return "unknown"


def _load_outputs(
    blob: bytes | None, described: list[Any], n: int
) -> list[tuple[str, torch.Tensor | None, dict]]:
    """Parse the child's returned values as plain tensors, checking them against its report.
    Every fact the comparison reads is checked here: a child that leaves one out, or
    sends one of another kind, gets "unknown", never an exception in the grader."""
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
    items = []
    for d, kind in zip(described, kinds, strict=True):
        facts = {str(a)[:40]: str(b)[:100] for a, b in list(d.items())[:8] if a not in ("layout", "kind")}
        facts["device"] = _device(d.get("device", "cpu" if kind != "tensor" else None))
        facts.setdefault("type", "value")
        items.append((kind, next(tensors) if kind != "other" else None, facts))
    return items


class _Watch:
    """What the parent accepts from the children of one submission, and what it believes.

    Only the parent's own view of the run counts: a cell or call is "running" only in the
    order the plan runs them (each cell once per child, in order; each call once), so a
    child cannot restart the clocks or report on a call it is not making. A call's report
    is taken once, only while that call runs, with a known status and returned values no
    larger than the call may return; notes and cell errors are capped in number and size.

    Taint. Hidden inputs reach the child only after every public call has its outcome (the
    child asks with a ``hidden`` event; ``release`` answers). Whatever a child sends from
    then on, and everything from a child forked after that, may carry hidden inputs: it is
    kept apart (``private_*``) for instructors, and never reaches what a student sees."""

    def __init__(self, calls: list[Planned], n_cells: int, ladder: bool = False) -> None:
        self.by_index = {c.index: c for c in calls}
        self.public = {c.index for c in calls if not c.hidden}
        self.has_hidden = any(c.hidden for c in calls)
        self.ladder = ladder  # small inputs may be asked for (``add_rung``) before hidden ones
        self.rungs: set[int] = set()
        self.n_cells = n_cells
        self.outcomes: dict[int, CallOutcome] = {}
        self.cell_errors: dict[int, dict[str, str]] = {}
        self.notes: list[str] = []
        self.private_cell_errors: dict[int, dict[str, str]] = {}
        self.private_notes: list[str] = []
        self.released = False  # hidden inputs were given to a child
        self.retained = 0  # bytes of returned values held
        self.new_child(tainted=False)

    def new_child(self, tainted: bool) -> None:
        self.tainted = tainted
        self.current: tuple[str, int] | None = None
        self.last_cell = -1
        self.calls_run: set[int] = set()  # each call starts once per child
        self.started = time.monotonic()
        self.finished = self.asks = False
        self.may_ask = True  # the child may ask what next (again after each small input)
        self.instructed: int | None = None  # the small input the parent said to run now

    def add_rung(self, call: Planned) -> None:
        """A small input the parent tells the child to run now."""
        self.by_index[call.index] = call
        self.rungs.add(call.index)
        self.instructed = call.index

    @property
    def public_done(self) -> bool:
        return self.public.issubset(self.outcomes)

    def raw_limit(self, event: dict[str, Any]) -> int:
        i = event.get("i")
        if event.get("e") != "call_end" or self.current != ("call", i) or i in self.outcomes:
            return 0
        return min(self.by_index[i].max_return_bytes, MAX_RETAINED_BYTES - self.retained)

    def handle(self, ev: dict[str, Any]) -> None:
        kind, i = ev["e"], ev.get("i")
        if kind == "cell":
            if isinstance(i, int) and self.last_cell < i < self.n_cells:
                self.current, self.started, self.last_cell = ("cell", i), time.monotonic(), i
        elif kind == "cell_error":
            if self.current == ("cell", i):
                errors = self.private_cell_errors if self.tainted else self.cell_errors
                errors[i] = {k: str(ev.get(k, ""))[:MAX_TEXT] for k in ("type", "message", "where")}
        elif kind == "call":
            if i in self.by_index and i not in self.outcomes and i not in self.calls_run and self._may_run(i):
                self.current, self.started = ("call", i), time.monotonic()
                self.calls_run.add(i)
        elif kind == "call_end":
            if self.current == ("call", i) and i not in self.outcomes:
                self.outcomes[i] = self._outcome(ev)
                self.current, self.started = None, time.monotonic()
                if i == self.instructed:  # it may ask for the next one
                    self.instructed, self.may_ask = None, True
        elif kind == "note":
            notes = self.private_notes if self.tainted else self.notes
            if len(notes) < MAX_NOTES:
                notes.append(str(ev.get("text", ""))[:300])
        elif kind == "hidden":  # "what next?": after the public calls, and after each small input
            in_call = self.current is not None and self.current[0] == "call"
            if (self.has_hidden or self.ladder) and self.public_done and self.may_ask and not in_call:
                self.asks, self.may_ask = True, False
                self.current = None  # its cells are done: until the answer, no cell's clock runs
        elif kind == "done":
            self.finished = True

    def _may_run(self, i: int) -> bool:
        # public calls before the hidden inputs are given, hidden ones only after; a small
        # input only when the parent said to, and never after hidden inputs
        if i in self.rungs:
            return i == self.instructed and not self.tainted
        return (i in self.public) != self.tainted

    def _outcome(self, ev: dict[str, Any]) -> CallOutcome:
        info = {k: v for k, v in ev.items() if k not in ("e", "i", "status", "blob", "blob_refused")}
        status = ev.get("status")
        if status not in CHILD_STATUSES:
            return CallOutcome(
                "untrusted", {"message": "the grading process sent a report the grader cannot trust"}
            )
        if "blob_refused" in ev:
            limit = self.by_index[ev["i"]].max_return_bytes
            return CallOutcome(
                "bad_return",
                {
                    "message": f"returned {ev['blob_refused'] / 1e6:.1f} MB of values; at most "
                    f"{limit / 1e6:.1f} MB are read for this call (is a shape wrong?)"
                },
            )
        outcome = CallOutcome(status, info)
        blob = ev.get("blob")
        if isinstance(blob, bytes):
            outcome.blob = blob
            self.retained += len(blob)
        return outcome


@dataclass
class _Child:
    """One child of a submission's run: its pid, how its exit is learnt, its pipes."""

    pid: int
    exits: Queue
    events: _Events
    control_w: int
    timed_out: bool = False  # a cell, a call or the submission ran out of time
    refused: bool = False  # it closed the pipe its go-ahead comes through
    code: int | None = None  # its exit status, once reaped


class _SubmissionRun:
    """One submission's run, in the steps the parent takes: ``start`` the job (its
    directory, uid lease, box), then per child ``fork`` it, ``watch`` it run the cells and
    public calls while ``answer``ing each "what next?" (a small input, the hidden inputs'
    ``release``, or done), ``reap`` it, and ``charge`` a hang or crash to what was running
    before the next child resumes after it; finally ``collect`` the report and ``stop``
    the job (now, or once its last child is reaped). ``run_submission`` says what each
    argument is."""

    def __init__(
        self,
        server: ForkServer,
        cells: list[tuple[str, str]],
        module_name: str,
        calls: list[Planned],
        inputs: bytes,
        device: str,
        limits: Limits,
        parts: dict[str, list[tuple[str, str]]] | None,
        hidden_inputs: bytes,
        enough: Callable[[dict[int, CallOutcome]], bool] | None,
        ladder: Ladder | None,
        stdout_bytes: int,
    ) -> None:
        self.t0 = time.monotonic()
        self.server, self.cells, self.module_name, self.calls = server, cells, module_name, calls
        self.inputs, self.device, self.limits, self.parts = inputs, device, limits, parts
        self.hidden_inputs, self.enough, self.ladder, self.stdout_bytes = (
            hidden_inputs,
            enough,
            ladder,
            stdout_bytes,
        )
        self.watch = _Watch(calls, len(cells), ladder is not None)
        self.outcomes = self.watch.outcomes
        self.by_index = self.watch.by_index
        self.hidden = [c for c in calls if c.hidden]
        self.skip_cells: list[int] = []
        self.crashes: dict[str, int] = {}
        self.restarts = 0
        names = len({c.name for c in calls})
        # a small input that hangs or crashes stops its name's small inputs: one restart each
        self.max_restarts = MAX_RESTARTS + 2 * names + (names if ladder else 0)
        self.stopped = f"not run: the submission used up its {limits.submission_s:g} s"
        self.satisfied = False  # ``enough`` said so: the child was stopped on purpose
        self.received = 0  # bytes from every child of this submission
        self.clean_stdout: str | None = None  # what the code printed before it received hidden inputs
        self.last_exit: Queue | None = None
        self.job_end = contextlib.ExitStack()  # the job dir and the uid lease: closed now, or deferred
        self.ladder_written = False

    def deadline(self) -> float:
        """The submission's end: its budget, and the time its small inputs took on top."""
        return self.t0 + self.limits.submission_s + (self.ladder.spent_s if self.ladder is not None else 0.0)

    def run(self) -> RunReport:
        deferred = False
        try:
            self.start()
            while True:
                child = self.fork()
                try:
                    self.watch_child(child)
                finally:
                    self.reap(child)
                if not self.after(child):
                    break
            report = self.collect()
            deferred = self.stop()
            return report
        finally:
            if not deferred:
                self.job_end.close()

    def start(self) -> None:
        """The job: a directory the child's uid may pass through to its work dir, a uid
        lease, a box (namespaces, cgroups) where the machine allows one, and the files the
        child reads (its plan, the public inputs; the hidden and small inputs' files empty)."""
        tmp = self.job_end.enter_context(tempfile.TemporaryDirectory(prefix="bertlab-job-"))
        boxes = confine.box_support()
        # in a box every process of the job dies with its PID namespace: no sweep by uid
        self.uid = self.job_end.enter_context(confine.lease_uid(sweep=boxes.mode is None))
        job = self.job = Path(tmp)
        (job / "work").mkdir()
        os.chmod(job, 0o711)  # the child's unprivileged uid may pass through to its work dir
        budget = confine.Budget()
        self.box = jail.job_box(
            boxes, job, self.uid, budget.work_dir_bytes, budget.memory_bytes, budget.processes, self.device
        )
        self.cgroups: list[jail.JobCgroup] = []  # one per child (each is made by its init)

        @self.job_end.callback
        def _remove_cgroups() -> None:
            for cgroup in self.cgroups:
                cgroup.kill()
                cgroup.remove()

        plan = {
            "module_name": self.module_name,
            "device": self.device,
            "cells": self.cells,
            "calls": [c.to_json() for c in self.calls if not c.hidden],
            "hidden": len(self.hidden),
            "ladder": self.ladder is not None,
            "parts": self.parts or {},
        }
        (job / "plan.json").write_text(json.dumps(plan))
        (job / "inputs.safetensors").write_bytes(self.inputs)
        # empty until released: the child opens it before it is confined, and reads it only
        # once the parent has written the hidden calls into it
        self.hidden_file = job / "hidden.bin"
        self.hidden_file.touch(mode=0o600)
        self.ladder_file = job / "ladder.bin"  # likewise: written when a first small input is asked for
        if self.ladder is not None:
            self.ladder_file.touch(mode=0o600)

    def fork(self) -> _Child:
        """A child that resumes after every cell and call already charged."""
        resume = {"skip_cells": self.skip_cells, "skip_calls": sorted(self.outcomes), "uid": self.uid}
        (self.job / "resume.json").write_text(json.dumps({**resume, "boxed": self.box is not None}))
        r, w = os.pipe()
        control_r, control_w = os.pipe()
        try:
            pid, exits, made = self.server.fork(self.job, w, control_r, self.box)
            if made is not None:
                self.cgroups.append(jail.JobCgroup(*made))
        except BaseException:  # no child: the parent's ends go too
            os.close(r)
            os.close(control_w)
            raise
        finally:
            os.close(w)
            os.close(control_r)
        watch = self.watch
        watch.new_child(tainted=watch.released)
        events = _Events(r, watch.handle, watch.raw_limit, min(MAX_CHILD_BYTES, MAX_RECEIVED - self.received))
        return _Child(pid, exits, events, control_w)

    def watch_child(self, child: _Child) -> None:
        """Read the child's events (its cells, then its public calls) until it is done, dies,
        runs out of time, or ``enough`` has what it needs; answer each "what next?"."""
        watch, events, outcomes = self.watch, child.events, self.outcomes
        while not (watch.finished or events.eof):
            now = time.monotonic()
            if watch.current and watch.current[0] == "call":
                limit = self.by_index[watch.current[1]].call_s or self.limits.call_s
            else:
                limit = self.limits.cell_s
            # explicit deadlines: a child that keeps talking does not stop the clocks
            wait = min(watch.started + limit, self.deadline()) - now
            ended = len(outcomes)
            if wait <= 0 or not events.read(wait):
                child.timed_out = True
                return
            if self.enough is not None and len(outcomes) != ended:
                for i in list(outcomes)[ended:]:  # the calls that just ended (insertion order)
                    finish_outcome(self.by_index[i], outcomes)
                if self.enough(outcomes):
                    self.satisfied = True
                    return
            if watch.asks:
                watch.asks = False
                watch.started = time.monotonic()
                try:
                    os.write(child.control_w, self.answer())
                except OSError:  # it closed its end (EPIPE): ended as a crash, not a grader fault
                    child.refused = True
                    return

    def answer(self) -> bytes:
        """What the child that asks "what next?" does: a small input (``ladder.next``), the
        hidden calls (``release``), or nothing more."""
        rung = None if self.watch.released or self.ladder is None else self.ladder.next(self.outcomes)
        if rung is not None:
            if not self.ladder_written:
                _write_hidden(self.ladder_file, self.ladder.calls, self.ladder.inputs)
                self.ladder_written = True
            self.watch.add_rung(rung)
            return wire.command(wire.RUN, rung.index)
        if self.hidden:
            if not self.watch.released:
                self.release()
            return wire.command(wire.HIDDEN)
        return wire.command(wire.DONE)

    def release(self) -> None:
        """Give the hidden inputs: what the code printed so far is the student's to see;
        whatever comes after may hold hidden inputs (the watcher taints it)."""
        self.clean_stdout = _read_head(self.job / "stdout.txt", self.stdout_bytes)
        _write_hidden(self.hidden_file, self.hidden, self.hidden_inputs)
        self.watch.released = self.watch.tainted = True

    def reap(self, child: _Child) -> None:
        """Kill the child's process group; unless it finished, wait for its exit and sweep
        what it left (its cgroup; without a box, its uid's processes)."""
        watch, events = self.watch, child.events
        ended = None
        if events.eof and not events.cut_off and not watch.finished:
            # the pipe closed, most often because the child ended: how it ended is known
            # once it is reaped (in a box, its init reaps it and then ends), so it is
            # waited for a moment before the kill
            try:
                ended = child.exits.get(timeout=0.5)
            except Empty:
                pass
        _kill_group(child.pid)
        self.received += events.total
        os.close(events.fd)
        os.close(child.control_w)
        if not watch.finished:
            try:  # reaped first, so the sweep below finds only what detached
                child.code = (ended or child.exits.get(timeout=30)).get("exit")
            finally:
                if self.cgroups:  # a box's processes died with its init; its cgroup's too
                    self.cgroups[-1].kill()
                if self.uid is not None and self.box is None:  # no PID namespace: by the job's uid
                    confine.kill_uid(self.uid)

    def after(self, child: _Child) -> bool:
        """Whether a fresh child resumes after this one: not when it finished, was stopped on
        purpose, sent too much, or ran out of restarts or time."""
        watch = self.watch
        if watch.finished:
            self.last_exit = child.exits  # its exit and the final sweep are awaited in the background
            return False
        if self.satisfied:
            self.stopped = "not run: the run had what it needed"
            return False
        if self.received >= MAX_RECEIVED:
            note = "grading of this submission stopped: it sent the grader more data than any answer needs"
            (watch.private_notes if watch.tainted else watch.notes).append(note)
            self.stopped = "not run: " + note.removeprefix("grading of this submission ")
            return False
        if not self.charge(child):
            return False
        self.restarts += 1
        if self.restarts > self.max_restarts:
            self.stopped = "not run: grading of this submission stopped after too many hangs or crashes"
            watch.notes.append(self.stopped.removeprefix("not run: "))
            return False
        return time.monotonic() < self.deadline()

    def charge(self, child: _Child) -> bool:
        """The child hung, died or flooded the grader part-way: charge it to the cell or call
        that was running (a name that hung once or crashed twice is not called again). False
        when nothing was running: there is nothing to resume after."""
        watch, events, timed_out = self.watch, child.events, child.timed_out
        if events.cut_off:
            died = f"was stopped: it sent the grader more than {events.max_bytes >> 20} MB"
        elif child.refused:
            died = "stopped: it closed the pipe its go-ahead for the hidden cases comes through"
        else:
            died = f"stopped: {_exit_reason(child.code)}"
        if watch.current is None:
            if not timed_out:
                note = f"the grading process for this submission {died}"
                (watch.private_notes if watch.tainted else watch.notes).append(note)
                # the calls left were not made for that, not for want of time; after the
                # release only a fixed text (an exit status is the child's to choose)
                fixed = "the grading process for this submission stopped"
                self.stopped = f"not run: {note if child.refused or not watch.tainted else fixed}"
            return False
        what, i = watch.current
        limit = (self.by_index[i].call_s or self.limits.call_s) if what == "call" else self.limits.cell_s
        hung = f"did not finish within {limit:g} s (an infinite loop, or a wait for input?)"
        reason = hung if timed_out else died
        if what == "cell":
            self.skip_cells.append(i)
            errors = watch.private_cell_errors if watch.tainted else watch.cell_errors
            errors[i] = {"type": "Timeout" if timed_out else "Crash", "message": reason, "where": ""}
            return True
        name = self.by_index[i].name
        self.outcomes[i] = CallOutcome("timeout" if timed_out else "crashed", {"message": f"{name} {reason}"})
        # A name that hung once, or crashed twice, would do it again: don't spend the
        # submission's budget on it. (A small input is not graded: the ladder stops that
        # name's small inputs, and its graded calls are still made.)
        self.crashes[name] = self.crashes.get(name, 0) + (i not in watch.rungs)
        if i not in watch.rungs and (timed_out or self.crashes[name] >= 2):
            why = reason if timed_out else "crashed the process twice"
            for c in self.calls:
                if c.name == name and c.index not in self.outcomes:
                    self.outcomes[c.index] = CallOutcome(
                        "skipped", {"message": f"not run: an earlier call of {name} {why}"}
                    )
        return True

    def collect(self) -> RunReport:
        """Every call's outcome, and what was printed: before the release for the student,
        all of it for instructors."""
        watch = self.watch
        finish_outcomes(self.calls, self.outcomes, self.stopped)
        stdout = _read_head(self.job / "stdout.txt", self.stdout_bytes)
        return RunReport(
            self.outcomes,
            watch.cell_errors,
            watch.notes,
            stdout if self.clean_stdout is None else self.clean_stdout,
            self.restarts,
            time.monotonic() - self.t0,
            private_cell_errors=watch.private_cell_errors,
            private_notes=watch.private_notes,
            private_stdout=stdout if watch.released else "",
        )

    def stop(self) -> bool:
        """End the job: at once, or (True) once its last child, which finished, is reaped,
        in the fork server's background, so that the report is not kept waiting."""
        if self.last_exit is None:
            return False

        def end_job(exits: Queue = self.last_exit, job_end: contextlib.ExitStack = self.job_end) -> None:
            try:
                exits.get(timeout=30)  # reaped: the lease's sweep then finds only what detached
            finally:
                job_end.close()

        self.server.defer(end_job)
        return True


def run_submission(
    server: ForkServer,
    cells: list[tuple[str, str]],
    module_name: str,
    calls: list[Planned],
    inputs: bytes,
    device: str,
    limits: Limits,
    parts: dict[str, list[tuple[str, str]]] | None = None,
    hidden_inputs: bytes = b"",
    enough: Callable[[dict[int, CallOutcome]], bool] | None = None,
    ladder: Ladder | None = None,
    stdout_bytes: int = MAX_STDOUT,
) -> RunReport:
    """Run one submission's code and calls in children; return what they produced.
    ``parts``: the same submission's earlier stages this one loads (``autograder.runtime.parts``).
    ``inputs`` hold the public calls' case data, ``hidden_inputs`` the hidden calls'
    (safetensors files): the child gets the second only after the public calls.
    ``enough``: asked with the outcomes so far (returned values read) each time a call ends;
    True stops the child there, and the calls left are "skipped" (a counterexample search
    that has its answer). ``ladder``: small inputs the child runs, as ``ladder.next`` says,
    between its public calls and the hidden ones (their outcomes join the report's); the
    time they take is not the submission's (its budget grows by ``ladder.spent_s``).
    ``stdout_bytes``: how much of what the children printed the report holds."""
    return _SubmissionRun(
        server,
        cells,
        module_name,
        calls,
        inputs,
        device,
        limits,
        parts,
        hidden_inputs,
        enough,
        ladder,
        stdout_bytes,
    ).run()


def run_public(
    server: ForkServer,
    cells: list[tuple[str, str]],
    module_name: str,
    calls: list[Planned],
    inputs: bytes,
    device: str,
    limits: Limits,
    parts: dict[str, list[tuple[str, str]]] | None = None,
    enough: Callable[[dict[int, CallOutcome]], bool] | None = None,
    ladder: Ladder | None = None,
    stdout_bytes: int = MAX_STDOUT,
) -> RunReport:
    """Run a submission's code and public calls only, in fresh children that never receive
    a hidden input: there is no hidden phase (the plan says none, so a child neither opens
    the hidden file nor may ask for it). Everything such a run returns may be shown to its
    student, whatever a hidden case did in an earlier run of the same code: a new job
    (work dir, uid lease), and the earlier job's processes swept before this one starts.
    Counterexamples (``grader/counterexample.py``) are searched this way."""
    if any(c.hidden for c in calls):
        raise ValueError("run_public runs public calls only")
    # an earlier job of this submission (the one that held hidden inputs) may still be
    # ending in the background: its uid's processes are swept before a new child exists
    server.drain()
    report = run_submission(
        server,
        cells,
        module_name,
        calls,
        inputs,
        device,
        limits,
        parts,
        enough=enough,
        ladder=ladder,
        stdout_bytes=stdout_bytes,
    )
    if report.private_stdout or report.private_notes or report.private_cell_errors:
        raise RuntimeError("a public-only run released hidden inputs")  # cannot happen: none were given
    return report


def finish_outcomes(calls: list[Planned], outcomes: dict[int, CallOutcome], stopped: str) -> None:
    """Every call gets an outcome; a reported success gets its returned values as tensors."""
    for c in calls:
        outcomes.setdefault(c.index, CallOutcome("skipped", {"message": stopped}))
        finish_outcome(c, outcomes)


def finish_outcome(c: Planned, outcomes: dict[int, CallOutcome]) -> None:
    """A reported success of ``c`` gets its returned values as tensors, checked against what
    the child said they are (a malformed report fails that call). Once per outcome."""
    outcome = outcomes[c.index]
    if outcome.status == "ok" and not outcome.loaded:
        try:
            outcome.outputs = _load_outputs(outcome.blob, outcome.info.get("outputs"), len(c.outputs))
            outcome.blob, outcome.loaded = None, True
        except ValueError as exc:  # wire.unpack and _load_outputs say what is malformed
            outcomes[c.index] = CallOutcome(
                "bad_return", {"message": f"unreadable returned values ({str(exc)[:200]})"}
            )


def _write_hidden(path: Path, calls: list[Planned], inputs: bytes) -> None:
    """The hidden calls and their inputs, into the file the child already holds open:
    an 8-byte length, the calls as JSON, then the inputs' safetensors bytes."""
    head = json.dumps([c.to_json() for c in calls]).encode()
    with open(path, "r+b") as f:
        f.write(len(head).to_bytes(8, "little") + head + inputs)


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

"""The untrusted side: run one submission's cells, then the planned calls.

A child is forked from the fork server (autograder/sandbox/forkserver.py) once per submission
(and again after a hang or crash, resuming where it stopped). It reads a plan (JSON) and
case inputs (safetensors) from its job directory, executes the student's code in one
namespace as a kernel would, and calls each graded name. It reports progress as JSON lines
on an inherited pipe, each call's returned tensors as raw bytes after its line. It
never sees the reference or an expected value, and it writes no result: the parent
reads what it left only after it has exited.
"""

from __future__ import annotations

import builtins
import json
import linecache
import os
import random
import re
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

import autograder.parts  # noqa: F401  (the name student code imports: loaded before confinement)
from autograder.runtime import drivers, parts, wire
from autograder.runtime.detector import KernelGuard
from autograder.runtime.harness import CallSpec, _describe
from autograder.sandbox import confine

drivers.import_all()  # in the fork server: a confined child can no longer read their files

MAX_TEXT = 2000
CONFINE_FAILED = 72  # the exit code of a child that could not be confined
MAX_OUTPUT_ELEMENTS = 1 << 24  # per call; far above any case, far below a memory problem


class _NoShell:
    """Stands in for ``get_ipython()``: magics and ``!`` lines are neutralised, never run."""

    def __init__(self, emit, namespace: dict[str, Any] | None = None) -> None:
        self._emit = emit
        self.namespace = namespace

    def _note(self, what: str) -> None:
        self._emit(
            e="note",
            text=f"neutralised {what[:120]!r}: magics and shell lines do not run when grading",
        )

    def run_line_magic(self, name: str, line: str = "", *a: Any, **k: Any) -> None:
        if name in ("time", "timeit") and self.namespace is not None:
            # `%time y = f(x)` is Python with a stopwatch: run the statement once, untimed
            statement = re.sub(r"^\s*(-[a-z](\s*\d+)?\s+)*", "", line)  # %timeit -n1 -r1 ...
            exec(compile(statement, "<submission %time line>", "exec"), self.namespace)
            return
        self._note(f"%{name} {line}".strip())

    def run_cell_magic(self, name: str, line: str = "", cell: str = "", *a: Any, **k: Any) -> None:
        self._note(f"%%{name} {line}".strip())

    def system(self, cmd: str = "", *a: Any, **k: Any) -> None:
        self._note(f"!{cmd}")

    def getoutput(self, cmd: str = "", *a: Any, **k: Any) -> list[str]:
        self._note(f"!{cmd}")
        return []

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def _text(x: Any) -> str:
    try:
        return str(x)[:MAX_TEXT]
    except BaseException:
        return "<unprintable>"


def _reseed(index: int) -> None:
    # Student code that draws random numbers gets the same ones on every run, whatever
    # ran before it (a restart after a hang resumes mid-plan).
    random.seed(index)
    np.random.seed(index)
    # the default generator directly: torch.manual_seed also queues lazy CUDA/XPU seeding,
    # which costs ~1 ms a call on a CPU-only machine
    torch.default_generator.manual_seed(index)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(index)


def _keep_freed_memory() -> None:
    """glibc malloc: serve allocations up to 256 MB from the heap and keep what is freed.

    A child is a fresh process that lives for one submission. By default every buffer of
    128 KB or more is a new mapping, unmapped when freed, so each call that builds a model
    (09: 90 MB of parameters, four times) page-faults all of it in again; kept in the heap,
    the second call reuses the first one's memory. (Torch asks for transparent huge pages
    for its buffers of 2 MB and more: THP_MEM_ALLOC_ENABLE, set by the fork server.)"""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 256 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: its own defaults
        pass


def _run_call(ns: dict[str, Any], call: CallSpec, tensors: dict, device: str, guard: KernelGuard) -> dict:
    guard.found.clear()
    status, info, items = call.run(ns, tensors, device)
    if guard.found and status != "forbidden":
        # the dispatch-mode detector was evaded, but the kernel itself was reached
        return {
            "status": "forbidden",
            "calls": [f"{op} (reached with the detector bypassed)" for op in guard.found],
        }
    if status != "ok":
        return {"status": status, **info}
    returned = [t for _, t, _ in items if t is not None]
    if sum(t.numel() for t in returned) > MAX_OUTPUT_ELEMENTS:
        return {"status": "bad_return", "message": f"returned more than {MAX_OUTPUT_ELEMENTS} numbers"}
    # the values travel on the event pipe, as raw bytes after the event's line (each
    # output's dtype and shape in its description): the child writes no file the parent reads
    layouts, raw = wire.pack(returned)
    described = []
    for kind, t, facts in items:
        d = {"kind": kind, **{f: _text(v)[:100] for f, v in facts.items()}}
        if t is not None:
            d["layout"] = layouts.pop(0)
        described.append(d)
    return {"status": "ok", "outputs": described, "raw": raw}


# The child talks to the parent only through what is bound here, at import, before any
# student code runs: a submission that replaces json.dumps, os.write or safetensors (by
# accident or not) changes nothing the parent reads. The C encoder and scanner keep the
# functions they were built with.
_encode = json.encoder.c_make_encoder(
    None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True
)
_scan = json.scanner.c_make_scanner(json.JSONDecoder())
_write, _read, _pread, _fstat = os.write, os.read, os.pread, os.fstat
_load_tensors = safetensors.torch.load
_str_join = "".join
_bytes_join = b"".join


def _dumps(event: dict[str, Any]) -> bytes:
    return (_str_join(_encode(event, 0)) + "\n").encode("ascii")


def _loads(text: str) -> Any:
    return _scan(text, 0)[0]


def _read_hidden(fd: int) -> tuple[list[dict[str, Any]], dict]:
    """The hidden calls and their inputs, which the parent wrote into ``fd``'s file when it
    let this child go on (``runner._write_hidden``)."""
    size, parts, at = _fstat(fd).st_size, [], 0
    while at < size:
        part = _pread(fd, size - at, at)
        if not part:
            break
        parts.append(part)
        at += len(part)
    data = _bytes_join(parts)
    n = int.from_bytes(data[:8], "little")
    return _loads(data[8 : 8 + n].decode()), _load_tensors(data[8 + n :])


def main(
    job_dir: str, event_fd: int, control_fd: int | None = None, ready: Any = None, log: int | None = None
) -> int:
    """Entry point in the forked child. Returns the exit code. In a job box (``jail.py``):
    ``ready`` returns once the box is complete (raises OSError if it failed), and ``log``
    is the job's stdout file, opened already."""
    job = Path(job_dir)

    def emit(raw: list[memoryview] | None = None, **event: Any) -> None:
        """One JSON line; with ``raw``, the line says how many bytes follow it, then those."""
        if raw:
            event["raw"] = sum(part.nbytes for part in raw)
        for data in (_dumps(event), *(raw or ())):
            view = memoryview(data)
            while view:
                view = view[_write(event_fd, view) :]

    if log is None:
        log = os.open(job / "stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)

    _keep_freed_memory()
    plan = json.loads((job / "plan.json").read_text())
    resume = json.loads((job / "resume.json").read_text())
    tensors = safetensors.torch.load_file(str(job / "inputs.safetensors"))
    # opened now, read only when the parent says so: empty until then
    hidden_fd = os.open(job / "hidden.bin", os.O_RDONLY | os.O_CLOEXEC) if plan.get("hidden") else None
    ladder_fd = os.open(job / "ladder.bin", os.O_RDONLY | os.O_CLOEXEC) if plan.get("ladder") else None
    device = plan["device"]
    if ready is not None:
        try:  # the job's box complete (its view, its cgroup) before anything else happens
            ready()
        except OSError as exc:
            print(f"bertlab: the sandbox could not be set up: {exc}", file=sys.stderr, flush=True)
            return CONFINE_FAILED
    # after the box is complete: until then its init may be replacing /dev under this process
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    torch.set_num_threads(1)  # one core per child: grading parallelises across submissions
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # The CUDA context is made here, before confinement: the driver reads its files and
        # reserves a large address range, which the address-space limit below then counts
        # as already there (the fork server never touches CUDA: a context does not survive
        # fork). A student's first .to("cuda") would otherwise fail inside the sandbox.
        torch.empty(1, device=device)
    work = job / "work"
    # Everything the child needs is read: from here on it can reach nothing else.
    started = time.perf_counter()
    try:
        layers, failed = confine.confine(
            work, resume.get("uid"), confine.Budget(**plan.get("budget", {})), boxed=bool(resume.get("boxed"))
        )
    except OSError as exc:  # no student code runs unconfined; the grader's start-up check says why
        print(f"bertlab: the sandbox could not be set up: {exc}", file=sys.stderr, flush=True)
        return CONFINE_FAILED
    emit(e="sandbox", layers=layers, failed=failed, ms=round(1000 * (time.perf_counter() - started), 3))
    os.chdir(work)
    sys.argv = [plan["module_name"]]
    stdout, stderr = sys.stdout, sys.stderr

    # The submission runs as a real module in sys.modules, as a kernel's __main__ is: a
    # @dataclass (or pickle, typing.get_type_hints) looks its module up there.
    module = types.ModuleType(plan["module_name"])
    sys.modules[plan["module_name"]] = module
    ns: dict[str, Any] = module.__dict__
    ns["__builtins__"] = builtins
    shell = _NoShell(emit, ns)
    ns["get_ipython"] = lambda: shell
    # an earlier stage's magics were noted when that stage was graded: silent here
    parts.provide(plan.get("parts", {}), {"get_ipython": parts.Silent})
    skip_cells = set(resume["skip_cells"])
    for i, (label, source) in enumerate(plan["cells"]):
        if i in skip_cells:
            continue
        emit(e="cell", i=i)
        _reseed(i)
        filename = f"<submission {label}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        try:
            exec(compile(source, filename, "exec"), ns)
        except BaseException as exc:
            emit(e="cell_error", i=i, **_safe_describe(exc))
    skip_calls = set(resume["skip_calls"])
    _run_calls(ns, plan["calls"], skip_calls, tensors, device, emit)
    if (hidden_fd is not None or ladder_fd is not None) and control_fd is not None:
        # What was printed so far may be shown to the student: out of the buffers before
        # the hidden inputs arrive, so none of it is counted as printed after them.
        _flush(stdout, stderr, sys.stdout, sys.stderr)
        small: tuple[dict[int, dict[str, Any]], dict] | None = None
        while True:
            emit(e="hidden")  # what next: a small input (wire.RUN), the hidden calls, or done
            answer = _read_command(control_fd)
            if answer is None:
                return 0  # the parent has gone
            what, index = answer
            if what == wire.RUN and ladder_fd is not None:
                if small is None:  # the parent wrote them before its first RUN
                    specs, small_tensors = _read_hidden(ladder_fd)
                    small = ({d["index"]: d for d in specs}, small_tensors)
                if index in small[0]:
                    _run_calls(ns, [small[0][index]], skip_calls, small[1], device, emit)
                    _flush(stdout, stderr, sys.stdout, sys.stderr)
                continue
            if what == wire.HIDDEN and hidden_fd is not None:
                hidden_calls, hidden_tensors = _read_hidden(hidden_fd)
                _run_calls(ns, hidden_calls, skip_calls, hidden_tensors, device, emit)
            elif what != wire.DONE:
                return 0
            break
    _flush(stdout, stderr, sys.stdout, sys.stderr)
    emit(e="done")
    return 0


def _read_command(fd: int) -> tuple[bytes, int] | None:
    """The parent's answer (``runner.command``); None if it has gone."""
    data = b""
    while len(data) < wire.COMMAND_BYTES:
        part = _read(fd, wire.COMMAND_BYTES - len(data))
        if not part:
            return None
        data += part
    return data[:1], int.from_bytes(data[1:], "little")


def _flush(*streams: Any) -> None:
    for stream in streams:
        try:
            stream.flush()
        except BaseException:
            pass


def _safe_describe(exc: BaseException) -> dict[str, str]:
    try:
        return _describe(exc)
    except BaseException:  # the student replaced what describing an exception uses
        return {"type": "Exception", "message": "<an exception that cannot be described>", "where": ""}


def _run_calls(
    ns: dict[str, Any], calls: list[dict[str, Any]], skip: set[int], tensors: dict, device: str, emit: Any
) -> None:
    guard = KernelGuard(())
    for call in map(CallSpec.from_json, calls):
        if call.index in skip:
            continue
        if call.forbidden != guard.patterns:  # graded calls come grouped by name: one registration each
            guard.close()
            guard = KernelGuard(call.forbidden)
        emit(e="call", i=call.index)
        _reseed(10_000 + call.index)
        emit(e="call_end", i=call.index, **_run_call(ns, call, tensors, device, guard))
    guard.close()

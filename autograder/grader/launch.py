"""The fork server's process, started before this process imports torch.

The grader and its fork server both import torch (about a second each). Started one after
the other, a cold grade waits for two imports in a row; started together, for one, on two
cores. This module imports only the standard library, so a command calls ``launch()``
first, then imports the grader (and torch) while the server imports torch too, and hands
the result to ``ForkServer`` (``Grader(server=...)``).

``early()`` goes further, for the CLI's grading commands: it launches the server as the
process starts, before the CLI parses its arguments (typer's parsing imports pydantic, a
tenth of a second or more), and the first ``ForkServer`` made in this process adopts it.
One that nothing adopts (a usage error, a submission with nothing to run) is killed at exit.
"""

from __future__ import annotations

import atexit
import json
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Launched:
    """A fork server process and the parent's end of its socket, not yet adopted by a
    ``ForkServer`` (which then owns both)."""

    proc: subprocess.Popen
    sock: socket.socket
    warmed: set[str] = field(default_factory=set)  # extras asked of it (``warm``)

    def warm(self, extras: Iterable[str]) -> None:
        """Ask the server for ``extras`` (``forkserver.EXTRAS``) now, before this process
        imports torch: it loads them as soon as its own imports are done, instead of when
        this process, ready later, would ask (``ForkServer.warm``, which asks only for what
        is not asked here)."""
        new = sorted(set(extras) - self.warmed)
        if new:
            self.warmed.update(new)
            self.sock.send(json.dumps({"warm": new}).encode())

    def close(self) -> None:
        """For a launch that no ``ForkServer`` adopts (a usage error after it): nothing
        runs in it yet, so it is killed, not asked to finish."""
        # killed first: a socket closed with the server's unread "ready" in it resets the
        # connection, and a server still alive would print that ConnectionResetError
        self.proc.kill()
        self.proc.wait()
        self.sock.close()


def launch() -> Launched:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    root = str(Path(__file__).resolve().parents[2])
    code = (
        f"import sys; sys.path.insert(0, {root!r}); "
        f"from autograder.sandbox.forkserver import serve; serve({theirs.fileno()})"
    )
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": tempfile.gettempdir(),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        # numpy's OpenBLAS would start a thread per core in each child that calls it (a
        # plot's colour map): threads that spin on the cores the other children need
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        # torch asks for transparent huge pages for its tensors of 2 MB and more: a child
        # is a fresh process, and 09 fills ~1 GB of new memory in 4 KB page faults otherwise
        "THP_MEM_ALLOC_ENABLE": "1",
    }
    # -I: the server ignores PYTHON* variables and the user's site-packages
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", code],
        pass_fds=(theirs.fileno(),),
        env=env,
        stdin=subprocess.DEVNULL,
    )
    theirs.close()
    return Launched(proc, ours)


_early: Launched | None = None


# the CLI's commands that run student code (``python -m autograder COMMAND ...``)
GRADING_COMMANDS = ("grade", "batch", "feedback")


def early(argv: list[str] | None = None) -> None:
    """Launch the server now, for the first ``ForkServer`` of this process to adopt; with
    ``argv`` (the CLI's arguments), only for a command that runs student code."""
    global _early
    if argv is not None and argv[:1] not in ([c] for c in GRADING_COMMANDS):
        return
    if _early is None:
        _early = launch()
        atexit.register(discard)


def adopt() -> Launched | None:
    """The server ``early()`` launched, now the caller's to run or close; None if none."""
    global _early
    launched, _early = _early, None
    return launched


def warm_early(extras: Iterable[str]) -> None:
    """``Launched.warm`` of the server ``early()`` launched, if one is waiting to be adopted."""
    if _early is not None:
        _early.warm(extras)


# A graded cell that imports matplotlib (most notebooks import it only in demo cells, which
# grading skips): the fork server loads it once for every child, not each child for itself.
PLOTS = re.compile(r"\b(matplotlib|pylab)\b")


def plot_extras(units: Iterable[tuple[Path, str]], files: int = 12) -> set[str]:
    """``{"matplotlib"}`` if a graded cell of the first ``files`` files of ``units``
    (submission, stage) imports it, else nothing: found without torch (or IPython), so that
    a command asks for it as soon as it knows its submissions. A file that cannot be read
    asks for nothing (its grade says why)."""
    from autograder.runtime.load import LoadError, graded_code
    from autograder.runtime.submission import Submission

    for submission, stage in list(units)[:files]:
        try:
            path = Submission(submission).file(stage)
            if path is not None and any(PLOTS.search(text) for text in graded_code(path)):
                return {"matplotlib"}
        except LoadError:
            pass
    return set()


def discard() -> None:
    """Kill the early server if nothing adopted it."""
    launched = adopt()
    if launched is not None:
        launched.close()

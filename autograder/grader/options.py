"""What every command of the CLI shares: its consoles, the options of grading, and the
checks a grading command makes before torch loads (usage errors exit 2 at once).

``cli`` and the commands that live in their own modules (``feedback``, ``gradescope``,
``release``) all take these from here, so an option is declared once and no command
module imports ``cli``.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console

if TYPE_CHECKING:  # torch loads with the grader, not with the CLI
    from autograder.grader.grade import Grader
    from autograder.grader.launch import Launched

# Logs and CI are not terminals: rich would fall back to 80 columns and fold every row.
console = Console(stderr=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

Submissions = Annotated[
    list[Path], typer.Argument(help="Directories holding NN_stage.ipynb/.py files, or such files.")
]
Stages = Annotated[
    list[str] | None,
    typer.Option(
        "--stage",
        "-s",
        help="Stage id(s) to grade (a missing file scores 0); default: the stages each submission holds.",
    ),
]
Device = Annotated[str, typer.Option(help="cpu, cuda or auto.")]
CallTimeout = Annotated[float | None, typer.Option(help="Seconds per call of a graded name.")]
SubmissionTimeout = Annotated[float, typer.Option(help="Seconds for one stage of one submission.")]
SUBMISSION_S = 120.0  # SubmissionTimeout's default (runner.Limits')


def safe_name(student: str) -> str:
    """A directory name that stays inside an output directory, whatever the submission was called."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", student)[:100]
    return name if name.strip(".") else "_" + name.replace(".", "_")


def usage_error(message: str) -> typer.Exit:
    """Say what is wrong with the command line; ``raise`` the result (exit 2)."""
    err.print(f"error: {message}")
    return typer.Exit(2)


def check_stages(stages: list[str] | None) -> None:
    """Every stage asked for exists."""
    from autograder.stages import stage_ids  # instant: usage errors come before torch loads

    known = stage_ids()
    for s in stages or []:
        if s not in known:
            raise usage_error(f"unknown stage {s!r}; known stages: {', '.join(known)}")


def check_submissions(submissions: list[Path], outputs: str | None = None) -> None:
    """Every submission exists; with ``outputs`` (what each one's files are called), no two
    share a name, since their outputs would overwrite each other."""
    for s in submissions:
        if not (s.exists() or s.is_symlink()):
            raise usage_error(f"{s} does not exist")
    names = [safe_name(s.name if s.is_dir() else s.stem) for s in submissions]
    if outputs is not None and len(set(names)) != len(names):
        raise usage_error(f"two submissions share a name; their {outputs} would overwrite each other")


def open_grader(
    device: str,
    call_timeout: float | None,
    submission_timeout: float,
    keep_arrays: bool = False,
    server: Launched | None = None,
) -> Grader:
    """The ``Grader`` a command asks for (a device that is not there exits 2), after the
    warning that untrusted code runs exposed, if it does. ``server``: the fork server the
    command ``launch()``ed before this imports torch (``launch_for``)."""
    import gc

    # Torch's objects live as long as this process: no collection of them is worth its
    # time, while they are imported or at exit (a few tenths of a second of a cold grade).
    gc.disable()
    try:
        import torch

        from autograder.grader.grade import Grader
        from autograder.grader.runner import Limits
    finally:
        gc.freeze()
        gc.enable()
    # The cores are the children's: torch's thread pool here would only contend with them
    # (two threads on two busy cores made the parent's small comparisons many times slower).
    torch.set_num_threads(1)
    warn_if_exposed()
    try:
        return Grader(
            device=device,
            limits=Limits(call_s=call_timeout, submission_s=submission_timeout),
            keep_arrays=keep_arrays,
            server=server,
        )
    except ValueError as exc:
        if server is not None:
            server.close()
        raise usage_error(str(exc)) from None


def launch_for(submissions: list[Path], stages: list[str] | None) -> Launched | None:
    """The fork server (``grader/launch.py``: the one ``cli.main`` launched early, else one
    launched now), if any of ``submissions`` holds a file of a stage it will be graded on:
    it imports torch while this process does, and is asked now for matplotlib if a graded
    cell imports it (``launch.plot_extras``), so it loads that right after torch. None when
    nothing will run: an empty submission needs no server at all (an early one is killed)."""
    from autograder.grader.launch import adopt, discard, launch, plot_extras
    from autograder.runtime.submission import Submission
    from autograder.stages import stage_ids

    known = stage_ids()
    units = [(path, s) for path in submissions for s in Submission(path).stages(known, stages)]
    if any(Submission(path).holds(s) for path, s in units):
        launched = adopt() or launch()
        launched.warm(plot_extras(units))
        return launched
    discard()
    return None


def warn_if_exposed() -> None:
    """Untrusted code as root without every layer deserves a loud warning, not silence."""
    import os

    from autograder.sandbox.confine import detect

    if os.geteuid() == 0:
        missing = detect().missing
        if missing:
            err.print(
                "[bold red]WARNING[/bold red]: grading untrusted code as root without: "
                f"{', '.join(missing)}. "
                "Run `python -m autograder doctor` for details."
            )


def quick_exit(code: int) -> NoReturn:
    """End a grading command whose results are written and closed: its output flushed, then
    the process ends without tearing the interpreter down (unloading torch's modules and
    freeing their objects costs a tenth of a second or more, after the work is done). Only
    once nothing is left to run at exit: the fork server closed, no early one unadopted.
    Under a profiler or a tracer (cProfile, coverage) the exit is the ordinary one: they
    write what they measured when the interpreter ends. Functions registered with ``atexit``
    (a wrapper's report, logging's shutdown) still run: only the teardown is skipped."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    atexit._run_exitfuncs()  # each runs once: they are unregistered as they run
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said anyway
            pass
    os._exit(code)

"""The trusted side never faults on a child's act (issue 25, item 9).

A child holds two pipes of the parent's: the write end of the event pipe and the read end
of the go-ahead pipe (the parent writes ``g`` there once every public call has its
outcome; the child then reads its hidden inputs). Whatever the child does to them, or to
itself, at any step of the protocol, ends as a hang or crash of that child (its cell or
call charged, a fresh child resuming after it), never as a fault of the grader: a child
that closed the go-ahead pipe once made the parent's write raise BrokenPipeError, "the
grader failed on this stage", and in ``batch`` an error row retried on every run.

Every act at every step is a notebook: the honest stage 01 code in one cell, the act in
the cell or graded function of its step. All of them are graded by one CLI run (and a
``batch`` of one of them beside an honest student), once per session. Where the child runs
in a box (``sandbox/jail.py``) whose keeper holds the pipes too, closing the go-ahead makes
the child's read fail instead of the parent's write: the last test stands a plain process
in for the child, so that the parent's write meets EPIPE on any machine.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from queue import Queue

import pytest

from autograder.grader.runner import Limits, Planned, run_submission
from autograder.stages import load_spec
from tests.support import (
    CALL_S,
    DEVICE,
    ROOT,
    assert_gradescope_results,
    full_marks,
    once_per_session,
    run_cli_many,
    write_notebook,
)

pytestmark = pytest.mark.stage01
STAGE = "01_attention"
HONEST = (ROOT / "examples" / "class" / "ada_correct_matmul" / f"{STAGE}.py").read_text()
FULL = full_marks(STAGE)
# each graded name's points from its public tests alone: what is left when no hidden call runs
PUBLIC = {g.name: sum(t.points for t in g.tests if not t.hidden) for g in load_spec(STAGE).graded}

ACTS = textwrap.dedent(
    """
    import os, signal

    def _pipes(access):
        # the pipes the child inherited: the events are written (O_WRONLY), the go-ahead read
        found = []
        for fd in range(3, 256):
            try:
                if not os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                    continue
                with open(f"/proc/self/fdinfo/{fd}") as f:
                    flags = int(next(l for l in f if l.startswith("flags:")).split()[1], 8)
            except (OSError, StopIteration, ValueError):
                continue
            if flags & 3 == access:
                found.append(fd)
        return found

    def _act(act):
        if act == "os_exit":
            os._exit(3)
        elif act == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif act == "close_events":
            for fd in _pipes(os.O_WRONLY):
                os.close(fd)
        elif act == "close_go_ahead":
            for fd in _pipes(os.O_RDONLY):
                os.close(fd)
        elif act == "close_both":
            for fd in _pipes(os.O_WRONLY) + _pipes(os.O_RDONLY):
                os.close(fd)
        elif act == "close_all":
            os.closerange(3, 1 << 16)
        elif act == "garbage_then_exit":
            for fd in _pipes(os.O_WRONLY):
                os.write(fd, b'\\x00\\xff{"e": "call_end", "i": \\n[[[[\\n{"e": 7}\\n' * 50 + b'{"e": "no')
            os._exit(0)
    """
)

ACT_NAMES = (
    "os_exit",
    "sigkill",
    "close_events",
    "close_go_ahead",
    "close_both",
    "close_all",
    "garbage_then_exit",
)
# a step of the protocol -> (the graded name that acts then, and when: a condition on its
# arguments) or None: a notebook cell of its own, run at import
STEPS: dict[str, tuple[str, str] | None] = {
    "cell": None,
    "public_call": ("padding_mask", "lengths.tolist() in ([3, 1, 5], [2])"),  # its public cases
    "last_public_call": ("causal_mask", "L == 4"),  # the last public call of the plan
    "hidden_call": ("padding_mask", "lengths.tolist() not in ([3, 1, 5], [2])"),  # its hidden cases
    # its small inputs (L = 1, 2, 3), which the grading child runs because the name fails a
    # public case (L = 4, made wrong: ``WRONG``), before it is given the hidden inputs
    "small_input": ("causal_mask", "L in (2, 3)"),
}
WRONG = {"small_input": "L == 4"}


def _notebook(act: str, step: str) -> list[str]:
    where = STEPS[step]
    if where is None:
        return [ACTS + HONEST, f"_act({act!r})\n"]
    name, when = where
    params = "lengths, max_len" if name == "padding_mask" else "L"
    wrap = textwrap.dedent(
        f"""
        _honest_{name} = {name}

        def {name}(*args, **kwargs):
            def _when({params}):
                return {when}
            def _wrong({params}):
                return {WRONG.get(step, "False")}
            if _when(*args, **kwargs):
                _act({act!r})
            out = _honest_{name}(*args, **kwargs)
            return ~out if _wrong(*args, **kwargs) else out
        """
    )
    return [ACTS + HONEST, wrap]


def _points(act: str, step: str) -> dict[str, float]:
    """What each act at each step should cost (scores per graded name)."""
    if step == "small_input":
        # a small input earns nothing: the grading child's act there costs its one wrong
        # public case (L = 4, of a test with partial credit) and no more, as a crash or a
        # hang of that input stops its name's small inputs, not its graded calls; the
        # go-ahead closed, no hidden call is made (as at any step before the hidden calls)
        lost = FULL["causal_mask"] - 0.5
        return (
            {**PUBLIC, "causal_mask": PUBLIC["causal_mask"] - 0.5}
            if act == "close_go_ahead"
            else {
                **FULL,
                "causal_mask": lost,
            }
        )
    if act == "close_go_ahead":
        # Closed before the go-ahead, it is found when the go-ahead is given (the parent's
        # write fails, or the child's read where its box's keeper holds the pipe too): no call
        # runs then to charge, so the child is stopped there and no hidden call is made.
        # Closed once the child has its go-ahead, it changes nothing.
        return FULL if step == "hidden_call" else PUBLIC
    if step == "cell":  # that cell is skipped; every graded name is defined in another
        return FULL
    if step == "public_call":  # crashed twice: its other calls are not made
        return {**FULL, "padding_mask": 0}
    if step == "last_public_call":  # one public case lost (L=4), of a test with partial credit
        return {**FULL, "causal_mask": FULL["causal_mask"] - 0.5}
    return {**FULL, "padding_mask": PUBLIC["padding_mask"]}  # its hidden calls crashed


CASES = [(act, step) for act in ACT_NAMES for step in STEPS]
BYSTANDERS = ("honest_first", "zz_honest_last")


def _run(root: Path) -> dict:
    subs = [write_notebook(root / BYSTANDERS[0] / f"{STAGE}.ipynb", [HONEST]).parent]
    for act, step in CASES:
        subs.append(write_notebook(root / f"{act}-{step}" / f"{STAGE}.ipynb", _notebook(act, step)).parent)
    subs.append(write_notebook(root / BYSTANDERS[1] / f"{STAGE}.ipynb", [HONEST]).parent)
    klass = root / "class"  # a batch: one student closes the go-ahead pipe at import
    write_notebook(klass / "ada" / f"{STAGE}.ipynb", [HONEST])
    write_notebook(klass / "mallory" / f"{STAGE}.ipynb", _notebook("close_go_ahead", "cell"))
    out = root / "results"
    db = root / "book.sqlite"
    timeout = ["--call-timeout", f"{CALL_S:g}", "--device", DEVICE]
    runs = run_cli_many(
        {
            "grade": ["grade", *map(str, subs), "--stage", STAGE, "--results-dir", str(out), *timeout],
            "batch": ["batch", str(klass), "--db", str(db), "--stage", STAGE, "--workers", "2", *timeout],
        }
    )
    with sqlite3.connect(db) as c:
        book = {
            s: (score, json.loads(r))
            for s, score, r in c.execute("SELECT student, score, result FROM grades")
        }
    return {
        **runs,
        "results": {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/results.json")},
        "book": book,
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return once_per_session(tmp_path_factory, "protocol_fuzz", lambda: _run(tmp_path_factory.mktemp("fuzz")))


def _by_function(result: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in result["tests"]:
        fn = next(x.split(":", 1)[1] for x in t["tags"] if x.startswith("function:"))
        out[fn] = out.get(fn, 0) + t["score"]
    return out


FAULTS = ("fault in the grader", "fault of the grader")  # grade's words, and batch's


def _no_fault(text: str) -> bool:
    return not any(f in text for f in FAULTS)


def test_the_cli_grades_every_act_without_a_fault(run):
    grade = run["grade"]
    assert grade["rc"] == 0, grade["stderr"][-3000:]
    assert set(run["results"]) == {f"{a}-{s}" for a, s in CASES} | set(BYSTANDERS)
    text = grade["stdout"] + grade["stderr"]
    assert _no_fault(text) and "Traceback" not in text and "internal error" not in text


@pytest.mark.parametrize("student", BYSTANDERS)
def test_the_honest_bystanders_get_every_point(run, student):
    assert _by_function(run["results"][student]) == FULL


@pytest.mark.parametrize(("act", "step"), CASES)
def test_an_act_on_the_pipes_or_itself_costs_only_its_own_calls(run, act, step):
    result = run["results"][f"{act}-{step}"]
    assert_gradescope_results(result)
    everything = result["output"] + "".join(t["output"] for t in result["tests"])
    assert _no_fault(everything)
    assert _by_function(result) == _points(act, step), everything[:3000]


def test_a_batch_stores_a_grade_for_a_child_that_closed_its_go_ahead_pipe(run):
    """Not an error row (which every later batch would grade again): a grade, stored."""
    batch = run["batch"]
    assert batch["rc"] == 0, batch["stdout"][-3000:] + batch["stderr"][-3000:]
    assert _no_fault(batch["stdout"] + batch["stderr"])
    assert set(run["book"]) == {"ada", "mallory"}
    assert run["book"]["ada"][0] == sum(FULL.values())
    assert run["book"]["mallory"][0] == sum(PUBLIC.values())


# -- the go-ahead, alone: a stand-in child, whatever sandbox the machine has ------------------

# A child that closes its end of the go-ahead pipe, then asks for the go-ahead: it holds
# its ends of the pipes alone (no keeper), so the parent's write meets EPIPE.
CLOSES_GO_AHEAD = """
import os, sys, time
event_w, control_r = int(sys.argv[1]), int(sys.argv[2])
os.close(control_r)
os.write(event_w, b'{"e": "hidden"}\\n')
time.sleep(60)
"""


class _StandInServer:
    """What ``run_submission`` asks of a fork server, with a plain process for the child."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def fork(self, job, event_w, control_r=None, box=None):
        proc = subprocess.Popen(
            [sys.executable, "-c", CLOSES_GO_AHEAD, str(event_w), str(control_r)],
            pass_fds=(event_w, control_r),
            start_new_session=True,  # its own process group: the parent kills it with killpg
        )
        self.procs.append(proc)
        exits: Queue = Queue()
        threading.Thread(target=lambda: exits.put({"exit": proc.wait()}), daemon=True).start()
        return proc.pid, exits, None  # no job cgroup


def test_a_child_that_closed_its_go_ahead_pipe_is_stopped_as_a_crash_not_a_grader_fault():
    server = _StandInServer()
    call = Planned(0, "f", "function", ("y",), (), {}, hidden=True)
    pipes = _pipes()
    started = time.monotonic()
    report = run_submission(
        server, [], "closes_go_ahead", [call], b"", "cpu", Limits(call_s=30.0, cell_s=30.0, submission_s=60.0)
    )
    assert time.monotonic() - started < 20  # stopped at once, not at a time limit
    assert len(server.procs) == 1 and server.procs[0].poll() is not None  # killed, not restarted
    outcome = report.calls[0]
    assert outcome.status == "skipped"
    assert "closed the pipe its go-ahead for the hidden cases comes through" in outcome.info["message"]
    # the hidden inputs were in its reach: what it caused is for instructors only
    assert not report.notes and any("closed the pipe" in n for n in report.private_notes)
    assert _pipes() == pipes  # the parent's ends of both pipes are closed


def _pipes() -> set[str]:
    """The pipes this process holds open."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:"):
            held.add(f"{fd} {target}")
    return held

"""What `batch` shows while it grades and when it ends: who is being graded and for how
long (a hanging student holds a worker; the instructor sees who), and scores rounded to
2 decimals in its summary (the gradebook keeps every digit)."""

from __future__ import annotations

import fcntl
import os
import re
import select
import shutil
import sqlite3
import struct
import subprocess
import termios
import time

from tests.support import ROOT, cli_command

CLASS = ROOT / "examples" / "class"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def test_in_flight_lists_students_longest_first_and_a_log_hears_of_slow_ones_rarely():
    from autograder.grader.batch import InFlight

    now = [100.0]
    flight = InFlight(clock=lambda: now[0])
    flight.start("leo", ["01_attention"])
    now[0] += 4
    flight.start("ada", ["01_attention", "02_multihead"])
    now[0] += 1
    assert flight.lines() == [
        "grading leo (01_attention): 5 s",
        "grading ada (01_attention, 02_multihead): 1 s",
    ]
    assert flight.overdue(after_s=30) == []
    now[0] += 25  # leo: 30 s
    assert flight.overdue(after_s=30) == ["still grading leo (01_attention) after 30 s"]
    now[0] += 29  # leo 59 s: said at 30, next at 60; ada 55 s: first said now
    assert flight.overdue(after_s=30) == ["still grading ada (01_attention, 02_multihead) after 55 s"]
    now[0] += 1
    assert flight.overdue(after_s=30) == ["still grading leo (01_attention) after 60 s"]
    flight.finish("leo")
    assert [line.split(" (")[0] for line in flight.lines()] == ["grading ada"]


def _in_a_terminal(args: list[str], timeout: float = 240.0) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal of 200 columns as its stdout, as an instructor
    does; return its exit status and everything it wrote, escapes removed."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    command = cli_command(*args)
    env = {k: v for k, v in command.pop("env").items() if k not in ("COLUMNS", "NO_COLOR", "TERM")}
    proc = subprocess.Popen(
        **command, env={**env, "TERM": "xterm-256color"}, stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=30), ANSI.sub("", out.decode("utf-8", "replace"))


def test_a_terminal_shows_who_is_in_flight_and_the_summary_rounds(tmp_path):
    klass = tmp_path / "class"
    # leo's causal_mask never returns: he holds the only worker until the call limit stops
    # him. nils and rafael score 1.8333 on 03, so its median and mean have 4 decimals.
    for student in ("leo_infinite_loop", "nils_sin_half_cos_half", "rafael_exponent_i_over_d"):
        shutil.copytree(CLASS / student, klass / student)
    db = tmp_path / "book.sqlite"
    rc, screen = _in_a_terminal(
        ["batch", str(klass), "--db", str(db), "--workers", "1", "--call-timeout", "2"]
    )
    assert rc == 0, screen
    held = [int(s) for s in re.findall(r"grading leo_infinite_loop \(01_attention\): (\d+) s", screen)]
    assert held and max(held) >= 2, screen  # shown while the call limit runs out
    assert re.search(r"grading (nils|rafael)\w* \(03_positional\): \d+ s", screen), screen
    row = next(line for line in screen.splitlines() if "03_positional" in line and "/ 12" in line)
    assert re.search(r"│ 1\.83 / 12 +│ 1\.83 +│", row), row
    assert not re.search(r"\d\.\d{3}", screen), screen  # no score shown with 3 decimals or more
    with sqlite3.connect(db) as c:  # the data keep every digit
        scores = sorted(s for (s,) in c.execute("SELECT score FROM grades WHERE stage = '03_positional'"))
    assert scores == [1.8333, 1.8333]

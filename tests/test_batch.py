"""Class batch grading: a real subprocess killed with SIGKILL halfway finishes the class
when run again, grading nothing twice and losing nothing; regrades are identical; shards
merge into the unsharded gradebook, idempotently."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import ROOT, cli_command, max_score

CLASS = ROOT / "examples" / "class"
# (example student, its 01_attention score): quick ones, then one that hangs to its limit
STUDENTS = {
    "ada_correct_matmul": max_score(),
    "bob_missing_scale": 8.25,
    "carol_scale_by_d": 8.25,
    "erin_mask_inverted_in_attention": 12,
    "hana_weights_transposed": 8,
    "zz_leo_infinite_loop": 15,
}


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    for student in STUDENTS:
        src = CLASS / student.removeprefix("zz_")
        (root / student).mkdir()
        for f in src.glob("01_attention.*"):
            shutil.copy(f, root / student / f.name)
    return root


def _batch(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        **cli_command("batch", *args, "--stage", "01_attention", "--call-timeout", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the kill reaches its workers and fork servers, not pytest
        **kwargs,
    )


def _rows(db) -> dict[str, tuple[float, float]]:
    try:
        with sqlite3.connect(db) as c:
            return {
                s: (score, at) for s, score, at in c.execute("SELECT student, score, graded_at FROM grades")
            }
    except sqlite3.OperationalError:  # the batch has created the file but not yet its table
        return {}


def test_a_batch_killed_halfway_finishes_when_run_again(klass, tmp_path):
    db = tmp_path / "book.sqlite"
    proc = _batch(str(klass), "--db", str(db), "--workers", "1")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if db.exists() and 2 <= len(_rows(db)) < len(STUDENTS):
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _rows(db)
    assert 2 <= len(before) < len(STUDENTS)  # killed halfway, the hanging student still to come

    again = _batch(str(klass), "--db", str(db), "--workers", "2", "--csv", str(tmp_path / "book.csv"))
    out, errors = again.communicate(timeout=300)
    assert again.returncode == 0, errors
    assert f"graded {len(STUDENTS) - len(before)}, already in the gradebook {len(before)}" in out
    after = _rows(db)
    assert {s: score for s, (score, _) in after.items()} == STUDENTS
    assert all(after[s][1] == at for s, (_, at) in before.items())  # nothing graded twice
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT COUNT(*) FROM grades").fetchone()[0] == len(STUDENTS)

    with (tmp_path / "book.csv").open() as f:
        table = list(csv.DictReader(f))
    assert {r["student"]: float(r["01_attention"]) for r in table} == STUDENTS
    assert all(float(r["max"]) == max_score() for r in table)


def test_ctrl_c_keeps_the_grades_done_starts_nothing_new_and_leaves_no_process(klass, tmp_path):
    db = tmp_path / "book.sqlite"
    # SIGINT as a terminal sends it (a background job may have inherited it ignored)
    proc = _batch(str(klass), "--db", str(db), "--workers", "1", preexec_fn=_sigint_default)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (db.exists() and len(_rows(db)) >= 1):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGINT)
    out, errors = proc.communicate(timeout=60)
    kept = _rows(db)
    assert proc.returncode == 130, errors
    assert f"keeps {len(kept)} grades; run the same command again" in errors
    assert 1 <= len(kept) < len(STUDENTS)  # the student in flight finished; no new one started
    assert _session(proc.pid) == []  # its fork server is gone (a child has a session of its own)

    again = _batch(str(klass), "--db", str(db), "--workers", "2")
    out, errors = again.communicate(timeout=300)
    assert again.returncode == 0, errors
    assert {s: score for s, (score, _) in _rows(db).items()} == STUDENTS


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _session(sid: int) -> list[int]:
    """Live processes of session ``sid`` (the batch was started in a session of its own)."""
    from autograder.sandbox.confine import _pids

    found = []
    for pid in _pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(pid)
    return found


def test_regrade_of_unchanged_code_gives_identical_scores_and_changed_code_is_regraded(klass, tmp_path):
    db = tmp_path / "book.sqlite"
    first = _batch(str(klass), "--db", str(db))
    assert first.wait(timeout=300) == 0
    scores = {s: v for s, (v, _) in _rows(db).items()}
    with sqlite3.connect(db) as c:
        results = dict(c.execute("SELECT student, result FROM grades"))

    second = _batch(str(klass), "--db", str(db), "--regrade")
    out, _ = second.communicate(timeout=300)
    assert f"graded {len(STUDENTS)}, already in the gradebook 0" in out
    assert {s: v for s, (v, _) in _rows(db).items()} == scores
    with sqlite3.connect(db) as c:
        again = dict(c.execute("SELECT student, result FROM grades"))
    for s in STUDENTS:  # the same messages, to the last digit
        a, b = json.loads(results[s]), json.loads(again[s])
        assert [t["output"] for t in a["tests"]] == [t["output"] for t in b["tests"]], s

    edited = klass / "bob_missing_scale"
    changed = tmp_path / "class2"
    shutil.copytree(klass, changed)
    path = next((changed / edited.name).glob("01_attention.*"))
    path.write_text(path.read_text() + "\n# fixed nothing, but the file changed\n")
    third = _batch(str(changed), "--db", str(db))
    out, _ = third.communicate(timeout=300)
    assert f"graded 1, already in the gradebook {len(STUDENTS) - 1}" in out


def test_shards_merge_into_the_whole_class_idempotently(klass, tmp_path):
    books = []
    for k in (1, 2, 3):
        db = tmp_path / f"shard{k}.sqlite"
        p = _batch(str(klass), "--db", str(db), "--shard", f"{k}/3", "--workers", "1")
        assert p.wait(timeout=300) == 0
        books.append(db)
    sizes = [len(_rows(b)) for b in books]
    assert sum(sizes) == len(STUDENTS) and all(n < len(STUDENTS) for n in sizes)
    merged = tmp_path / "all.sqlite"
    run = subprocess.run(
        **cli_command("merge", str(merged), *map(str, books)), capture_output=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert {s: v for s, (v, _) in _rows(merged).items()} == STUDENTS
    run = subprocess.run(
        **cli_command("merge", str(merged), *map(str, books)), capture_output=True, timeout=60
    )
    assert "0 grades added or updated, 6 in all" in run.stdout


def test_nbgrader_layout_is_discovered(tmp_path):
    from autograder.grader.batch import discover

    for student in ("alice", "bo"):
        d = tmp_path / "submitted" / student / "01_attention"
        d.mkdir(parents=True)
        shutil.copy(CLASS / "ada_correct_matmul" / "01_attention.py", d / "01_attention.py")
    units = discover(tmp_path, None)
    assert [(u.student, u.stage) for u in units] == [("alice", "01_attention"), ("bo", "01_attention")]
    assert units[0].fingerprint == units[1].fingerprint  # same code, same fingerprint


def test_bad_shard_is_a_usage_error(klass):
    run = subprocess.run(**cli_command("batch", str(klass), "--shard", "3/2"), capture_output=True)
    assert run.returncode == 2 and "--shard takes K/N" in run.stderr

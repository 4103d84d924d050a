"""The child's drop to a job uid where the machine refuses part of it (Docker's default
capability set has no CAP_DAC_READ_SEARCH): it degrades to a uid with no capability at
all, says so, and a grader whose children cannot run student code refuses to start.

Docker's refusal is made here as root with ``setpriv --bounding-set -dac_read_search``:
root's permitted set then lacks the capability, so capset refuses to keep it, exactly as
in a container. ``unshare --mount`` lets job uids through a private home (pyenv in /root)
to the Python installation, as an image's /usr and /opt are.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import ROOT, max_score, revealing_python

STAGE = "01_attention"
EXAMPLES = ROOT / "examples" / "class"
CAP_DAC_READ_SEARCH = 1 << 2

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="only a root grader drops to job uids"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"),
]
NO_READ_SEARCH = ["setpriv", "--bounding-set", "-dac_read_search"]  # as Docker's default set
NO_SETUID = ["setpriv", "--bounding-set", "-setuid"]  # no job uid at all
NO_BOX = ["setpriv", "--bounding-set", "-dac_read_search,-sys_admin"]  # no namespaces either
WEAK_ENV = "BERTLAB_ALLOW_WEAK_SANDBOX"


def hidden_ancestor(path: Path) -> Path | None:
    """The first directory above ``path`` that other users cannot pass through (/root)."""
    for parent in reversed(path.resolve().parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return None


PYTHON_HIDDEN = hidden_ancestor(Path(sys.base_prefix) / "lib")


def run(
    argv: list[str],
    prefix: list[str] = (),
    reveal_python: bool = False,
    env: dict[str, str] | None = None,
    **kw,
) -> subprocess.CompletedProcess:
    """``argv`` under ``prefix``; with ``reveal_python``, in a private mount namespace where
    job uids may pass through to the Python installation (the rest of its hiding directory
    stays hidden: an empty directory is mounted over it)."""
    env = {**os.environ, "COLUMNS": "250", "HOME": tempfile.gettempdir(), **(env or {})}
    command = [*prefix, *argv]
    skel = None
    if reveal_python and PYTHON_HIDDEN is not None:
        skel = Path(tempfile.mkdtemp(prefix="bertlab-reveal-"))
        command = revealing_python(command, skel)
    try:
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, **kw)
    finally:
        if skel is not None:
            shutil.rmtree(skel)


# -- the drop itself, in a forked probe of a fresh interpreter ------------------------------

DROP = """
import json, os, sys
from autograder.sandbox import confine
keep = {keep}
def drop():
    refused = confine._drop_to(uid, keep_read_search=keep)
    return json.dumps({{
        "refused": refused, "uid": uid, "resuid": os.getresuid(), "resgid": os.getresgid(),
        "groups": os.getgroups(), "caps": confine._capabilities(),
    }})
with confine.lease_uid() as uid:
    print(confine._probe_text(drop))
"""


def drop(keep: bool, prefix: list[str] = ()) -> dict | str:
    proc = run([sys.executable, "-c", DROP.format(keep=keep)], prefix)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    return out if out.startswith("error: ") else json.loads(out)


def assert_only(d: dict, kept: int) -> None:
    assert d["resuid"] == [d["uid"]] * 3 and d["resgid"] == [d["uid"]] * 3 and d["groups"] == []
    want = {"CapPrm": kept, "CapEff": kept, "CapInh": 0, "CapAmb": 0}
    assert {name: d["caps"][name] for name in want} == want


def test_the_job_uid_keeps_only_dac_read_search_where_it_may():
    d = drop(keep=True)
    assert d["refused"] is None
    assert_only(d, CAP_DAC_READ_SEARCH)


def test_where_capset_is_refused_the_job_uid_has_no_capability_left():
    d = drop(keep=True, prefix=NO_READ_SEARCH)
    assert d["refused"] == "[Errno 1] capset: Operation not permitted"
    # KEEPCAPS kept root's permitted set through setresuid: it must be gone, not just idle
    assert_only(d, 0)


@pytest.mark.parametrize("keep", [True, False])
def test_inherited_and_ambient_capabilities_do_not_survive_the_drop(keep):
    d = drop(keep, prefix=["setpriv", "--inh-caps", "+net_raw", "--ambient-caps", "+net_raw"])
    assert d["refused"] is None
    assert_only(d, CAP_DAC_READ_SEARCH if keep else 0)


def test_a_uid_that_cannot_be_set_fails_closed():
    out = drop(keep=True, prefix=NO_SETUID)
    assert isinstance(out, str) and out.startswith("error: ") and "not permitted" in out


CONFINE = """
import json, tempfile
from pathlib import Path
from autograder.sandbox import confine
work = Path(tempfile.mkdtemp())
def child():
    applied, failed = confine.confine(work, uid, confine.Budget())
    return json.dumps({"applied": applied, "failed": failed, "uid": uid})
with confine.lease_uid() as uid:
    print(confine._probe_text(child))
"""


def test_the_childs_sandbox_event_names_the_degraded_uid_layer():
    # confine() returns what the child's "sandbox" event carries (child.main emits it)
    proc = run([sys.executable, "-c", CONFINE], NO_READ_SEARCH)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    uid = d["uid"]
    assert f"uid {uid}, no capabilities" in d["applied"]
    refused = f"CAP_DAC_READ_SEARCH refused ([Errno 1] capset: Operation not permitted): uid {uid} has no capabilities"
    assert refused in d["failed"]
    full = json.loads(run([sys.executable, "-c", CONFINE]).stdout)
    assert f"uid {full['uid']} + CAP_DAC_READ_SEARCH" in full["applied"]
    assert not [f for f in full["failed"] if "uid" in f]


# -- what doctor and the grader make of it ---------------------------------------------------

DETECT = """
import json
from autograder.sandbox.confine import detect
print(json.dumps({l.name: [l.active, l.degraded, l.detail] for l in detect().layers}))
"""


def uid_layer(prefix: list[str], reveal_python: bool = False) -> tuple[bool, bool, str]:
    proc = run([sys.executable, "-c", DETECT], prefix, reveal_python)
    assert proc.returncode == 0, proc.stderr
    return tuple(json.loads(proc.stdout)["unprivileged uid"])


def test_detect_tries_the_drop_and_names_the_mode():
    # in a job box (jail.py) the uid keeps no capability: the box shows it the Python
    # installation, with or without CAP_DAC_READ_SEARCH in the grader's bounding set
    assert uid_layer([]) == (True, False, "per-job uid, no capabilities")
    assert uid_layer(NO_READ_SEARCH) == (True, False, "per-job uid, no capabilities")
    # with no box, the uid keeps CAP_DAC_READ_SEARCH where it can, and says when it cannot
    active, degraded, detail = uid_layer(NO_BOX, reveal_python=True)
    assert active and degraded
    assert "no capabilities: CAP_DAC_READ_SEARCH refused" in detail
    assert "it can read the Python installation" in detail
    active, degraded, detail = uid_layer(NO_SETUID)
    assert not active and "dropping to a job uid fails" in detail


@pytest.mark.skipif(PYTHON_HIDDEN is None, reason="this Python is readable by every user")
def test_detect_says_when_a_job_uid_cannot_read_python():
    active, degraded, detail = uid_layer(NO_BOX)
    assert active and degraded
    assert f"it cannot read {Path(sys.base_prefix).resolve()}" in detail
    assert "grading refuses to start" in detail


def grade(
    prefix: list[str], out: Path, reveal_python: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    students = [EXAMPLES / "ada_correct_matmul", EXAMPLES / "carol_scale_by_d"]
    argv = [sys.executable, "-m", "autograder", "grade", *map(str, students), "--stage", STAGE]
    return run([*argv, "--results-dir", str(out)], prefix, reveal_python, env=env)


def scores(out: Path) -> dict[str, float]:
    return {p.parent.name: json.loads(p.read_text())["score"] for p in out.glob("*/results.json")}


@pytest.mark.slow
def test_a_job_uid_with_no_capabilities_grades_as_the_full_sandbox(tmp_path):
    weak = {WEAK_ENV: "1"}
    proc = grade(NO_BOX, tmp_path / "results", reveal_python=True, env=weak)
    assert proc.returncode == 0, proc.stderr
    assert scores(tmp_path / "results") == {"ada_correct_matmul": max_score(STAGE), "carol_scale_by_d": 8.25}
    doctor = run([sys.executable, "-m", "autograder", "doctor"], NO_BOX, reveal_python=True, env=weak)
    assert doctor.returncode == 0, doctor.stderr
    assert "degraded: unprivileged uid" in doctor.stdout
    assert "a confined child runs a submission: yes" in doctor.stdout


@pytest.mark.slow
@pytest.mark.skipif(PYTHON_HIDDEN is None, reason="this Python is readable by every user")
def test_the_job_box_shows_a_job_uid_the_python_installation_and_nothing_else_of_its_home(tmp_path):
    """Without CAP_DAC_READ_SEARCH in its bounding set the grader still makes job boxes
    (it keeps CAP_SYS_ADMIN): the box mounts an empty tmpfs over the private home and only
    the Python installation's branch in it, so a job uid with no capability imports."""
    proc = grade(NO_READ_SEARCH, tmp_path / "results")
    assert proc.returncode == 0, proc.stderr
    assert scores(tmp_path / "results") == {"ada_correct_matmul": max_score(STAGE), "carol_scale_by_d": 8.25}


@pytest.mark.slow
def test_grading_refuses_to_start_where_no_job_box_can_be_made(tmp_path):
    """Docker's default set has neither capability: no namespaces, so no box; grading
    refuses (a submission could outlive its job and reach other jobs) unless told."""
    proc = grade(NO_BOX, tmp_path / "results")
    assert proc.returncode == 3, proc.stderr
    assert "this machine allows no job box" in proc.stderr and WEAK_ENV in proc.stderr
    assert not (tmp_path / "results").exists()  # no student got a 0


@pytest.mark.slow
@pytest.mark.skipif(PYTHON_HIDDEN is None, reason="this Python is readable by every user")
def test_grading_without_a_box_refuses_to_start_when_a_job_uid_cannot_import(tmp_path):
    proc = grade(NO_BOX, tmp_path / "results", env={WEAK_ENV: "1"})
    assert proc.returncode == 3, proc.stderr
    assert "cannot grade here: a confined child could not run a trivial submission" in proc.stderr
    assert "PermissionError" in proc.stderr and str(Path(sys.base_prefix).resolve()) in proc.stderr
    assert "used up its" not in proc.stderr  # it said so after 7 s of a 120 s budget
    assert not (tmp_path / "results").exists()  # no student got a 0


@pytest.mark.slow
def test_a_batch_whose_children_cannot_be_confined_stores_no_grade(tmp_path):
    db = tmp_path / "book.sqlite"
    argv = [sys.executable, "-m", "autograder", "batch", str(EXAMPLES), "--stage", STAGE, "--db", str(db)]
    proc = run(argv, NO_SETUID)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "cannot grade here" in proc.stderr
    assert "allows no job box" in proc.stderr and "Operation not permitted" in proc.stderr
    if db.exists():
        with sqlite3.connect(db) as book:
            assert book.execute("SELECT count(*) FROM grades").fetchone() == (0,)
    doctor = run([sys.executable, "-m", "autograder", "doctor"], NO_SETUID)
    assert doctor.returncode == 3
    assert "student code cannot run here" in doctor.stderr

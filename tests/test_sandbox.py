"""The sandbox's layers, checked from inside a real child: what student code can reach."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading

import pytest

from autograder.grader.grade import Grader
from autograder.grader.runner import Limits
from autograder.sandbox import confine as sandbox
from autograder.sandbox.confine import detect
from tests.support import ROOT, max_score, write_py

STAGE = "01_attention"
LAYERS = {layer.name: layer.active for layer in detect().layers}
needs = {
    name: pytest.mark.skipif(not active, reason=f"this machine has no {name}")
    for name, active in LAYERS.items()
}

HONEST = (ROOT / "examples" / "class" / "ada_correct_matmul" / f"{STAGE}.py").read_text()


def probe(body: str) -> str:
    """An honest submission whose causal_mask first runs ``body`` (which prints findings)."""
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    return (
        HONEST
        + f"\n\n_honest_causal_mask = causal_mask\n\ndef causal_mask(L):\n{indented}\n    return _honest_causal_mask(L)\n"
    )


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    os.environ["BERTLAB_TEST_CANARY"] = "canary-7f3a9"  # a secret in the grader's environment
    root = tmp_path_factory.mktemp("sandbox")
    results = root / "results" / "results.json"
    results.parent.mkdir()
    results.write_text("{}")
    other = write_py(root / "other_student", STAGE, HONEST + "\n# other student's work\n")
    protected = [
        ROOT / "reference" / f"{STAGE}.py",
        ROOT / "autograder" / "stages" / f"{STAGE}.py",
        ROOT / "solutions" / STAGE / f"{STAGE}.ipynb",
        ROOT / "tests" / "toy_stage" / "toy_reference.py",
        results,
        other / f"{STAGE}.py",
        ROOT / "README.md",
        "/etc/shadow",
        "/root/.bash_history",
    ]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    connections: list = []

    def accept() -> None:
        try:
            while True:
                connections.append(listener.accept())
        except OSError:
            return

    threading.Thread(target=accept, daemon=True).start()
    body = f"""
import os, socket
for path in {[str(p) for p in protected]!r}:
    try:
        with open(path) as f:
            f.read(1)
        print("READABLE", path)
    except OSError:
        pass
    try:
        with open(path, "a") as f:
            f.write("")
        print("WRITABLE", path)
    except OSError:
        pass
for target in ({str(root)!r}, "/tmp", "/root", "/"):
    try:
        open(os.path.join(target, "bertlab_pwned"), "w").close()
        print("WROTE IN", target)
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1)
    print("CONNECTED")
except OSError:
    pass
try:
    socket.getaddrinfo("pypi.org", 443)
    print("RESOLVED")
except OSError:
    pass
print("ENV", sorted(os.environ))
print("CANARY" if any("canary-7f3a9" in v for v in os.environ.values()) else "no canary")
print("UID", os.getuid())
open("scratch.txt", "w").write("the work dir is writable")
"""
    sub = write_py(root / "prober", STAGE, probe(body))
    with Grader(limits=Limits(call_s=5.0)) as g:
        result = g.grade(sub, [STAGE])
    listener.close()
    yield {
        "result": result,
        "stdout": result.stages[0].stdout,
        "connections": connections,
        "root": root,
        "protected": protected,
        "results": results,
    }
    os.environ.pop("BERTLAB_TEST_CANARY", None)


def test_the_probe_itself_is_graded_normally(graded):
    assert graded["result"].score == max_score()
    assert "UID" in graded["stdout"]


@needs["landlock"]
@pytest.mark.parametrize(
    "what",
    [
        "reference",
        "stage spec",
        "solution",
        "toy reference",
        "results file",
        "other student",
        "repository file",
        "/etc/shadow",
        "root's home",
    ],
)
def test_protected_paths_are_neither_readable_nor_writable(graded, what):
    index = [
        "reference",
        "stage spec",
        "solution",
        "toy reference",
        "results file",
        "other student",
        "repository file",
        "/etc/shadow",
        "root's home",
    ].index(what)
    path = str(graded["protected"][index])
    assert f"READABLE {path}\n" not in graded["stdout"]
    assert f"WRITABLE {path}\n" not in graded["stdout"]


@needs["landlock"]
def test_nothing_is_written_outside_the_work_dir(graded):
    assert "WROTE IN" not in graded["stdout"]
    assert not (graded["root"] / "bertlab_pwned").exists() and not os.path.exists("/tmp/bertlab_pwned")
    assert graded["results"].read_text() == "{}"


@pytest.mark.skipif(
    not (LAYERS["network namespace (per job)"] or LAYERS["landlock"]), reason="no network layer"
)
def test_no_network(graded):
    assert "CONNECTED" not in graded["stdout"] and not graded["connections"]
    assert "RESOLVED" not in graded["stdout"]


def test_environment_is_scrubbed(graded):
    assert "no canary" in graded["stdout"]
    env_line = next(line for line in graded["stdout"].splitlines() if line.startswith("ENV"))
    assert "BERTLAB_TEST_CANARY" not in env_line


@needs["unprivileged uid"]
def test_child_runs_unprivileged(graded):
    uid = int(next(line for line in graded["stdout"].splitlines() if line.startswith("UID")).split()[1])
    assert uid != 0


def test_doctor_reports_every_layer():
    proc = subprocess.run(
        [sys.executable, "-m", "autograder", "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    for name in LAYERS:
        assert name in proc.stdout


# -- the uid lock directory ----------------------------------------------------------------

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only a root grader leases job uids")


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    """``sandbox.LOCK_DIR`` pointed at a test directory (absent so far). kill_uid is
    stubbed: a uid leased from here may be one that a real grader on this machine holds
    under the real lock directory, and its children must not be swept."""
    swept: list[int] = []
    monkeypatch.setattr(sandbox, "kill_uid", lambda uid: swept.append(uid) or 0)
    path = tmp_path / "uid-locks"
    monkeypatch.setattr(sandbox, "LOCK_DIR", path)
    return path


def lease_once() -> int | None:
    with sandbox.lease_uid() as uid:
        return uid


@root_only
def test_a_lock_dir_made_by_another_user_is_refused(lock_dir):
    lock_dir.mkdir(mode=0o700)
    os.chown(lock_dir, 4242, 4242)  # made first by a user who now chooses what root opens there
    with pytest.raises(RuntimeError, match=f"{lock_dir} is owned by uid 4242"):
        lease_once()
    assert os.listdir(lock_dir) == []


@root_only
def test_a_lock_dir_others_may_write_in_is_refused(lock_dir):
    lock_dir.mkdir()
    os.chmod(lock_dir, 0o777)
    with pytest.raises(RuntimeError, match="writable by others"):
        lease_once()
    assert os.listdir(lock_dir) == []


@root_only
def test_a_symlinked_lock_dir_is_refused(lock_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    lock_dir.symlink_to(elsewhere)
    with pytest.raises(RuntimeError, match="symbolic link"):
        lease_once()
    assert os.listdir(elsewhere) == []


@root_only
def test_symlinked_lock_files_are_not_followed(lock_dir, tmp_path):
    lock_dir.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for k in range(sandbox.UID_SPAN):  # wherever the lease starts, it meets a link
        (lock_dir / str(sandbox.UID_BASE + k)).symlink_to(elsewhere / f"chosen-{k}")
    with pytest.raises(RuntimeError, match="uid lock file"):
        lease_once()
    assert os.listdir(elsewhere) == []


@root_only
def test_a_lock_dir_is_made_private_and_leases_a_job_uid(lock_dir):
    uid = lease_once()
    assert uid is not None and sandbox.UID_BASE <= uid < sandbox.UID_BASE + sandbox.UID_SPAN
    st = os.lstat(lock_dir)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
    lock = os.lstat(lock_dir / str(uid))
    assert stat.S_ISREG(lock.st_mode) and lock.st_uid == 0 and not lock.st_mode & 0o077


def test_graders_agree_on_the_lock_dir_whatever_their_tmpdir(tmp_path):
    # two graders side by side, one with its own TMPDIR, must lock the same uids
    code = "from autograder.sandbox import confine; print(confine.LOCK_DIR)"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    theirs = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert theirs.returncode == 0, theirs.stderr
    assert theirs.stdout.strip() == str(sandbox.LOCK_DIR)

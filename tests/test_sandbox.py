"""The sandbox's layers, checked from inside a real child: what student code can reach."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from autograder.grade import Grader
from autograder.runner import Limits
from autograder.sandbox import detect
from tests.support import ROOT, write_py

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
    assert graded["result"].score == 17
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


@pytest.mark.skipif(not (LAYERS["network namespace"] or LAYERS["landlock"]), reason="no network layer")
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

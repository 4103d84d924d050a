"""Helpers shared by the test modules."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The device the example class and the stage tests are graded on: ``cpu`` unless a GPU run
# asks for ``BERTLAB_TEST_DEVICE=cuda`` (the promises are the same on every device).
DEVICE = os.environ.get("BERTLAB_TEST_DEVICE", "cpu")
# a hanging call is stopped after this long; a CUDA child's first call also pays cuBLAS's start-up
CALL_S = 2.0 if DEVICE == "cpu" else 10.0


# -- totals, from the specs (a point or a test added to a stage changes no test) -------------


def full_marks(stage: str = "01_attention") -> dict[str, float]:
    """Each graded name of ``stage`` with all of its points."""
    from autograder.stages import load_spec

    return {g.name: g.max_score for g in load_spec(stage).graded}


def max_score(stage: str = "01_attention") -> float:
    from autograder.stages import load_spec

    return load_spec(stage).max_score


def n_tests(stage: str = "01_attention") -> int:
    """How many tests (results entries) a stage has: one per graded name and case group."""
    from autograder.stages import load_spec

    return sum(len(g.tests) for g in load_spec(stage).graded)


def write_py(directory: Path, stage: str, code: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stage}.py").write_text(code)
    return directory


def no_process_left(marker: str, timeout: float = 5.0, where: str = "cmdline") -> bool:
    """True when no process whose command line (or ``where="comm"``: name) contains
    ``marker`` is alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if marker.encode() in (p / where).read_bytes():
                        alive.append(int(p.name))
                except OSError:
                    pass
        if not alive:
            return True
        time.sleep(0.1)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return False


# -- a stage's cases run in this process ----------------------------------------------------


def call_of(plan, pc):
    """The planned call of the case ``pc`` and its decoded inputs: the calls are ordered
    public first, and the hidden cases' inputs travel apart from the public ones."""
    from autograder.runtime import wire

    call = next(c for c in plan.calls if c.index == pc.index)
    return call, {k: wire.decode(v, plan.inputs | plan.hidden_inputs) for k, v in call.data.items()}


def case_results(plan, ns: dict, name: str) -> list[tuple[Any, Any]]:
    """``(planned case, CaseResult)`` for every case of the graded ``name``, its call run on
    the namespace ``ns`` here as the child runs it (same driver, same build-load-call) and
    checked as the grader checks it, with the stage's named mistakes. No sandbox and no
    forbidden-call watch: this tells programs apart by their values."""
    from autograder.runtime.check import check_case
    from autograder.runtime.harness import run_call

    out = []
    for pc in plan.cases:
        if pc.graded.name == name:
            call, data = call_of(plan, pc)
            status, info, items = run_call(
                ns, call.name, call.kind, data, call.outputs, (), plan.device, call.driver
            )
            out.append(
                (pc, check_case(pc.label, status, info, items, pc.expectation, plan.spec.misconceptions))
            )
    return out


def verdicts(plan, ns: dict, name: str) -> list[tuple[Any, bool]]:
    """``(planned case, passed)`` for every case of ``name`` (``case_results``)."""
    return [(pc, r.passed) for pc, r in case_results(plan, ns, name)]


def named_mistakes(plan, ns: dict, name: str) -> tuple[int, set[str]]:
    """How many cases of ``name`` the code in ``ns`` fails, and the mistakes named on them;
    a case that fails unnamed is named ``"?"`` (a real mistake the catalogue must explain)."""
    failing = [r for _, r in case_results(plan, ns, name) if not r.passed]
    return len(failing), {m for r in failing for m in (r.misconceptions or ["?"])}


# -- notebooks, results files, the CLI, work shared between xdist workers ------------------


def write_notebook(path: Path, cells: list, version: int = 4) -> Path:
    """A notebook at ``path`` (a directory gets ``01_attention.ipynb``) from cell strings,
    as Jupyter would save it unexecuted: a ``str`` is a code cell; ``("markdown", text)``
    and ``("code", source, [tags])`` give the other kinds. ``version=3`` writes nbformat 3."""
    import nbformat

    if path.suffix != ".ipynb":
        path = path / "01_attention.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    if version == 3:
        v3 = nbformat.v3
        made = []
        for c in cells:
            kind, src = ("code", c) if isinstance(c, str) else c[:2]
            made.append(v3.new_code_cell(input=src) if kind == "code" else v3.new_text_cell("markdown", src))
        nb = v3.new_notebook(worksheets=[v3.new_worksheet(cells=made)])
        path.write_text(v3.writes_json(nb))
        return path
    v4 = nbformat.v4
    made = []
    for c in cells:
        if isinstance(c, str):
            made.append(v4.new_code_cell(c))
        elif c[0] == "markdown":
            made.append(v4.new_markdown_cell(c[1]))
        else:
            made.append(v4.new_code_cell(c[1], metadata={"tags": list(c[2])} if len(c) > 2 else {}))
    nb = v4.new_notebook(
        cells=made,
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.validate(nb)
    path.write_text(nbformat.writes(nb))
    return path


TEST_KEYS = {"name", "score", "max_score", "status", "output", "tags"}


STAGE01 = "01_attention"


def assert_gradescope_results(
    data: dict, max_points: float | None | str = STAGE01, tests: int | None | str = STAGE01
):
    """``data`` (a parsed results.json) is a complete Gradescope results file: of
    ``max_points`` points in ``tests`` tests (a stage id: that stage's; None: not checked)."""
    max_points = max_score(max_points) if isinstance(max_points, str) else max_points
    n = n_tests(tests) if isinstance(tests, str) else tests
    assert isinstance(data, dict), data
    assert isinstance(data.get("score"), int | float), data.keys()
    assert isinstance(data.get("output"), str)
    entries = data.get("tests")
    assert isinstance(entries, list) and entries, "no tests in the results file"
    if n is not None:
        assert len(entries) == n
    for t in entries:
        assert TEST_KEYS <= t.keys(), f"missing {TEST_KEYS - t.keys()} in {t}"
        assert isinstance(t["name"], str) and t["name"]
        assert isinstance(t["output"], str) and t["output"]
        assert 0 <= t["score"] <= t["max_score"]
        assert t["status"] == ("passed" if t["score"] >= t["max_score"] else "failed")
        assert isinstance(t["tags"], list) and all(isinstance(x, str) for x in t["tags"])
    assert abs(data["score"] - sum(t["score"] for t in entries)) < 1e-6
    if max_points is not None:
        assert sum(t["max_score"] for t in entries) == max_points


def cli_command(*args: str) -> dict:
    """``subprocess`` arguments for ``python -m autograder ARGS`` run from the repository root."""
    import sys

    return {
        "args": [sys.executable, "-m", "autograder", *args],
        "cwd": ROOT,
        "env": {**os.environ, "COLUMNS": "200"},
        "text": True,
    }


def run_cli(*args: str, timeout: float = 300.0):
    """Run the real command line; a CompletedProcess with its stdout and stderr."""
    import subprocess

    return subprocess.run(**cli_command(*args), capture_output=True, timeout=timeout)


def run_cli_many(commands: dict[str, list[str]], timeout: float = 300.0) -> dict[str, dict]:
    """Several command lines at once (each pays seconds of start-up, mostly waiting):
    name -> {"rc", "stdout", "stderr"}."""
    import subprocess

    procs = {
        name: subprocess.Popen(**cli_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for name, args in commands.items()
    }
    done = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=timeout)
        done[name] = {"rc": proc.returncode, "stdout": stdout, "stderr": stderr}
    return done


def once_per_session(tmp_path_factory, key: str, compute):
    """``compute()`` (JSON-serialisable) run once per pytest session, even under xdist:
    the first worker to ask computes it under a file lock, the others read its result."""
    import fcntl
    import json

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # the workers' common parent; it may outlive the run (--basetemp): key by the run
        base = base.parent
        key = f"{key}-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'run')}"
    done = base / f"{key}.json"
    with open(base / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            tmp = done.with_suffix(".tmp")
            tmp.write_text(json.dumps(compute()))
            tmp.replace(done)
    return json.loads(done.read_text())


def revealing_python(command: list[str], skel: Path) -> list[str]:
    """``command`` in a private mount namespace where every user may pass through the
    directory that hides the Python installation (pyenv's /root, mode 0700) to the
    installation, as an image's /usr is readable; the rest of that directory stays hidden
    (``skel``, an empty directory made here, is mounted over it). Unchanged where nothing
    hides the installation."""
    import stat as _stat
    import sys as _sys

    base = Path(_sys.base_prefix).resolve()
    hidden = next((p for p in reversed(base.parents) if not os.stat(p).st_mode & _stat.S_IXOTH), None)
    if hidden is None:
        return command
    inner = base.relative_to(hidden).parts[0]
    (skel / inner).mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(skel, 0o755)
    script = 'mount --bind "$1/$2" "$3/$2" && mount --rbind "$3" "$1" && shift 3 && exec "$@"'
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        str(hidden),
        inner,
        str(skel),
        *command,
    ]

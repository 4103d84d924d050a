"""What a grader installs and imports (issue 19): the grading runtime, not the instructors'.

requirements.txt is the grading runtime (Gradescope's setup.sh and docker/ install it
alone); requirements-instructor.txt adds the instructors' notebook tools (nbgrader, the
Jupyter stack), pyproject.toml's ``instructor`` extra; requirements-dev.txt adds both and
the test tools (the Makefile's venv). A grade imports nothing from the instructors' set,
in the CLI's process, in the fork server or in the child that runs student code: a
grading-only install can grade, and no grade pays for importing what it does not use.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from autograder.grader.grade import Grader
from tests.support import ROOT, max_score, write_py

STAGE = "01_attention"
# The instructors' and developers' tools, by their top-level module names: none is
# installed where only grading is, so a grade must never import one.
NOT_FOR_GRADING = {
    "nbformat",
    "nbclient",
    "nbgrader",
    "ipykernel",
    "jupyter_client",
    "jupyter_server",
    "jupyter_events",
    "jsonschema",
    "rfc3987_syntax",
    "pytest",
    "hypothesis",
}
# Installed for grading (students' cells import it, now and then in a graded cell), but
# loaded only when a submission does: never by the grader itself.
ON_DEMAND = {"matplotlib"}


def _names(path) -> list[str]:
    """The requirement names of a requirements file (no ``-r`` includes, no options)."""
    names = []
    for line in (ROOT / path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("-"), f"{path}: {line!r} (pyproject.toml reads it: requirements only)"
        assert "#" not in line, f"{path}: {line!r} (a comment on its own line: pyproject.toml reads it)"
        names.append(re.split(r"[=<>!~\[; ]", line, maxsplit=1)[0].lower())
    return names


def test_the_grading_runtime_holds_no_instructor_tool():
    runtime, instructor = _names("requirements.txt"), _names("requirements-instructor.txt")
    assert {"torch", "numpy", "safetensors", "ipython", "typer", "rich"} <= set(runtime)
    assert {"nbformat", "nbclient", "nbgrader", "ipykernel"} <= set(instructor)
    assert not set(runtime) & set(instructor)
    assert not set(runtime) & {n.replace("_", "-") for n in NOT_FOR_GRADING}
    # one list of pins: pyproject.toml's dependencies and `instructor` extra are these files
    dynamic = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]
    assert dynamic["dependencies"] == {"file": ["requirements.txt"]}
    assert dynamic["optional-dependencies"]["instructor"] == {"file": ["requirements-instructor.txt"]}
    # and the Makefile's venv (requirements-dev.txt) gets both
    dev = (ROOT / "requirements-dev.txt").read_text().splitlines()
    assert "-r requirements.txt" in dev and "-r requirements-instructor.txt" in dev


# Run as ``python -m autograder`` runs it; at exit, the top-level modules it imported.
WATCH = """\
import atexit, runpy, sys
atexit.register(lambda: print("MODULES", *sorted({m.split(".")[0] for m in sys.modules}), file=sys.stderr))
sys.argv = ["autograder", *sys.argv[1:]]
runpy.run_module("autograder", run_name="__main__", alter_sys=True)
"""


def test_a_cli_grade_imports_no_instructor_tool(tmp_path):
    results = tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, "-c", WATCH, "grade", str(ROOT / "solutions" / STAGE), "--stage", STAGE]
        + ["--results", str(results)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert results.is_file()
    loaded = set(next(line for line in p.stderr.splitlines() if line.startswith("MODULES")).split()[1:])
    assert "torch" in loaded and "autograder" in loaded  # it did grade, in this process
    assert not loaded & (NOT_FOR_GRADING | ON_DEMAND), loaded & (NOT_FOR_GRADING | ON_DEMAND)


# A graded submission that says what its child process holds: the fork server's preload,
# inherited, and what the child imported to run it.
SAYS_WHAT_IT_HOLDS = """\
import sys as _sys
print("HOLDS", *sorted({_m.split(".")[0] for _m in _sys.modules}))
"""


def test_a_child_holds_no_instructor_tool_and_matplotlib_only_when_asked(tmp_path):
    code = (ROOT / "examples" / "class" / "ada_correct_matmul" / f"{STAGE}.py").read_text()
    plain = write_py(tmp_path / "plain", STAGE, code + SAYS_WHAT_IT_HOLDS)
    plots = write_py(tmp_path / "plots", STAGE, "import matplotlib\n" + code + SAYS_WHAT_IT_HOLDS)

    def holds(result) -> set[str]:
        stage = result.stages[0]
        line = next(x for x in stage.stdout.splitlines() if x.startswith("HOLDS"))
        return set(line.split()[1:])

    with Grader(expected_dir=None) as grader:
        a = grader.grade(plain, [STAGE])
        b = grader.grade(plots, [STAGE])
    assert a.score == b.score == max_score(STAGE)
    assert "torch" in holds(a)
    assert not holds(a) & (NOT_FOR_GRADING | ON_DEMAND), holds(a) & (NOT_FOR_GRADING | ON_DEMAND)
    # a graded cell that imports matplotlib gets it (the server loads it for such children)
    assert "matplotlib" in holds(b) and not holds(b) & NOT_FOR_GRADING

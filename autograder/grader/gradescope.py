"""Gradescope's autograder: the zip (``gradescope-zip``) and what runs inside it.

The zip holds what Gradescope's contract asks for at its root (``setup.sh``,
``run_autograder``) and what grading needs: the requirement files, ``scripts/install.sh``
(the one list of install commands, shared with the Makefile and docker/), the
``autograder`` and ``reference`` packages (stage specs and drivers live in autograder/),
the data stages read while grading (``solutions/*/*.txt``) and ``bertlab-gradescope.json``
(the stages graded and their points).

``run_autograder`` grades ``$ROOT/submission`` into ``$ROOT/results/results.json``, with
``ROOT`` = ``$BERTLAB_AUTOGRADER_ROOT`` (default ``/autograder``). Whatever happens, a
valid results file is left there: a fault of the grader gives score 0 and a visible
"Autograder failed" entry, with the traceback only in the (hidden) stdout.

Visibility. Every test is ``visible``, so a student sees each score before the deadline
(the point of an autograder); the top-level ``stdout_visibility`` is ``hidden``.
What a student sees is ``visibility.for_students`` (the rule all student-facing outputs
share): a public-case test shows its full output, as the notebook's self-check does; a
hidden-case test shows only its score, how many cases passed and the named mistake with
its hint (trusted text from the spec): no case labels, errors or values; and of what the
submission printed, only what it printed before it received any hidden input. A student
therefore cannot read the hidden cases back by submitting again and again.
(``after_published`` was the alternative: it would hide those scores, and the total,
until grades are released, leaving students nothing to act on.) The instructor sees
everything, per case, in the autograder's stdout.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import traceback
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from autograder.grader import instructor_tests
from autograder.grader.report import write_json

if TYPE_CHECKING:
    from autograder.runtime.results import SubmissionResult

ROOT_ENV = "BERTLAB_AUTOGRADER_ROOT"
CONFIG = "bertlab-gradescope.json"
PROJECT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = "build/gradescope/"  # a folder: one zip per stage, as Gradescope assignments are
# the project files the runtime install needs (scripts/install.sh and pyproject.toml read
# them; the instructors' requirements only name the project's `instructor` extra)
INSTALL_FILES = (
    "requirements.txt",
    "requirements-instructor.txt",
    "requirements-nodeps.txt",
    "pyproject.toml",
    "README.md",
)
PACKAGES = ("autograder", "reference")
FAILED = (
    "The autograder failed on this submission. This is a fault in the grader, not in your "
    "code: please tell your instructor. Your submission is kept and will be graded again."
)

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder's image: a venv beside the
# code, installed by scripts/install.sh (the same commands as `make` and docker/).
# Every step is checked where it happens, so a broken image fails here, naming the step,
# and not later in the first student's run.
set -euo pipefail
cd "$(dirname "$0")"

fail() {
    echo "setup.sh: $*" >&2
    exit 1
}

# A name on PATH proves nothing: a python3.13 may be a dangling link or a wrapper that
# cannot start. A candidate counts only if it runs and is new enough (pyproject.toml).
usable_python() {
    local v
    for v in python3.13 python3.12 python3.11 python3; do
        if command -v "$v" >/dev/null 2>&1 &&
            "$v" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
            echo "$v"
            return 0
        fi
    done
    return 1
}

if ! py=$(usable_python); then
    echo "setup.sh: no Python >= 3.11 runs here; installing python3.11 with apt-get" >&2
    apt-get update -qq || fail "apt-get update failed: cannot install python3.11"
    apt-get install -y -qq python3.11 python3.11-venv || fail "apt-get could not install python3.11"
    py=$(usable_python) || fail "python3.11 was installed, but no Python >= 3.11 runs"
fi
echo "setup.sh: using $(command -v "$py") ($("$py" --version 2>&1))"

# Debian's Python makes no venv without its pythonX.Y-venv package: install it once, then
# the venv must work, or nothing below can.
if ! "$py" -m venv .venv; then
    rm -rf .venv
    venv_pkg="python3.$("$py" -c 'import sys; print(sys.version_info[1])')-venv"
    echo "setup.sh: $py cannot create a venv; installing $venv_pkg with apt-get" >&2
    { apt-get update -qq && apt-get install -y -qq "$venv_pkg"; } ||
        fail "apt-get could not install $venv_pkg"
    "$py" -m venv .venv || fail "$py cannot create a venv, even with $venv_pkg"
fi
.venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    fail ".venv/bin/python does not run: the venv made by $py is broken"
bash scripts/install.sh .venv/bin/python requirements.txt
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this per submission: grade $ROOT/submission into
# $ROOT/results/results.json. Whatever happens, a valid results.json is left there.
root="${BERTLAB_AUTOGRADER_ROOT:-/autograder}"
source_dir="$root/source"
py="${BERTLAB_PYTHON:-$source_dir/.venv/bin/python}"
results="$root/results/results.json"
mkdir -p "$root/results"
cd "$source_dir" || exit 1
if ! "$py" -m autograder.grader.gradescope run --root "$root"; then
    # Python itself could not write one (it failed to start, or was killed)
    echo "bertlab: the grader exited abnormally; writing a failed results.json"
    rm -f "$results"
    cat > "$results" <<'JSON'
__FALLBACK__
JSON
fi
"""


# -- the zip --------------------------------------------------------------------------------


def _project_files() -> list[tuple[Path, str]]:
    """(path on disk, name in the zip) of the code and data grading needs."""
    files = [(PROJECT / name, name) for name in INSTALL_FILES]
    files.append((PROJECT / "scripts" / "install.sh", "scripts/install.sh"))
    for package in PACKAGES:
        for path in sorted((PROJECT / package).rglob("*")):
            rel = path.relative_to(PROJECT)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc":
                files.append((path, rel.as_posix()))
    # data a stage reads while grading (stage 07's corpus), never notebooks or self-check data
    for path in sorted((PROJECT / "solutions").glob("*/*.txt")):
        files.append((path, path.relative_to(PROJECT).as_posix()))
    return files


def _config(stages: list[str]) -> dict[str, Any]:
    from autograder.stages import load_spec

    return {
        "stages": stages,
        "max_score": sum(load_spec(s).max_score for s in stages),
        "device": "cpu",
    }


def _add(zf: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # reproducible bytes
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def build_zip(
    out: Path,
    stages: list[str] | None = None,
    allow_weak_sandbox: bool = False,
    tests: Path | None = None,
    tests_timeout_s: float = instructor_tests.TIMEOUT_S,
) -> Path:
    """Write Gradescope's autograder zip to ``out`` (an existing directory gets
    ``autograder.zip``; missing folders are made), grading ``stages`` (default: all).
    ``allow_weak_sandbox``: grade even where Gradescope's container lets the grader make no
    job box (README: Security model). ``tests``: a folder of the instructor's own
    gradescope-utils tests (``grader/instructor_tests.py``), run on the one stage's code
    within ``tests_timeout_s`` in all. Returns the zip's path."""
    from autograder.stages import stage_ids

    known = stage_ids()
    for s in stages or []:
        if s not in known:
            raise ValueError(f"unknown stage {s!r}; known stages: {', '.join(known)}")
    chosen = list(stages or known)
    config = _config(chosen)
    if allow_weak_sandbox:
        config["allow_weak_sandbox"] = True
    extra: list[tuple[str, bytes]] = []
    if tests is not None:
        if len(chosen) != 1:
            raise ValueError("--tests: a zip with instructor tests grades one stage (name it with --stage)")
        from autograder.grader.runner import Limits

        cell_s = Limits().cell_s  # the tests run as one cell; in their run every cell gets their limit
        if not tests_timeout_s >= cell_s:
            raise ValueError(
                f"--tests-timeout must be at least {cell_s:g} s (a notebook cell's limit), "
                f"not {tests_timeout_s:g}"
            )
        extra, declared = instructor_tests.collect(tests)
        config["instructor_tests"] = {"timeout_s": tests_timeout_s, "tests": declared}
        config["max_score"] += sum(d["weight"] or 0 for d in declared)
    fallback = failure_results(config["max_score"], 0.0, chosen)
    out = out / "autograder.zip" if out.is_dir() else out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        _add(zf, "setup.sh", SETUP_SH.encode(), executable=True)
        run = RUN_AUTOGRADER.replace("__FALLBACK__", json.dumps(fallback, indent=2))
        _add(zf, "run_autograder", run.encode(), executable=True)
        _add(zf, CONFIG, (json.dumps(config, indent=2) + "\n").encode())
        for path, name in _project_files():
            _add(zf, name, path.read_bytes(), executable=os.access(path, os.X_OK))
        for name, data in [*_expected_files(chosen), *extra]:
            _add(zf, name, data)
    tmp.replace(out)
    return out


def _expected_files(stages: list[str]) -> list[tuple[str, bytes]]:
    """The graded stages' expected values (and those of the stages they run), computed here
    once (``grader/expected.py``), instead of at every container start. The zip is the
    instructor's: nothing in it reaches a student, and a child cannot read ``expected/``.
    setup.sh's install (``build --verify``) runs the reference once on Gradescope's machine
    and keeps them only where they are its values bit for bit, and fresh."""
    import tempfile

    from autograder.grader import expected

    with tempfile.TemporaryDirectory(prefix="bertlab-expected-") as tmp:
        expected.build(Path(tmp), stages)
        return [
            (f"{expected.DEFAULT_DIR.name}/{p.name}", p.read_bytes())
            for p in sorted(Path(tmp).glob("*.safetensors"))
        ]


# -- inside Gradescope -----------------------------------------------------------------------


def failure_results(max_score: float, seconds: float, stages: list[str] | None = None) -> dict[str, Any]:
    """Score 0 and one visible entry saying the grader (not the student) failed."""
    return {
        "score": 0,
        "output": FAILED,
        "stdout_visibility": "hidden",
        "execution_time": round(seconds, 3),
        "tests": [
            {
                "name": "Autograder failed",
                "number": "0.1",
                "score": 0,
                "max_score": max_score or 1,
                "status": "failed",
                "output": FAILED,
                "tags": [f"stage:{s}" for s in stages or []],
                "visibility": "visible",
            }
        ],
    }


def student_view(result: SubmissionResult) -> dict[str, Any]:
    """``report.to_gradescope`` of what the student may see (``visibility.for_students``),
    every test visible and tagged hidden or public."""
    from autograder.grader.report import to_gradescope
    from autograder.grader.visibility import for_students

    data = to_gradescope(for_students(result), markdown=True)  # code in backticks shows as code
    flat = [t for s in result.stages for t in s.tests]
    for entry, t in zip(data["tests"], flat, strict=True):
        entry["visibility"] = "visible"
        entry["tags"].append("hidden" if t.hidden else "public")
    return data


def _student_name(root: Path) -> str:
    try:
        users = json.loads((root / "submission_metadata.json").read_text())["users"]
        return ", ".join(u["name"] for u in users) or "submission"
    except (OSError, ValueError, KeyError, TypeError):
        return "submission"


def instructor_log(
    result: SubmissionResult, submission: Path, recomputed: dict[str, str], extra: list[dict[str, Any]] = ()
) -> str:
    """What ``run_autograder`` prints: Gradescope hides stdout from students, so this is the
    instructors' full view (every case, hidden ones included), scores as the table shows them;
    ``extra``: the instructor's own tests' entries."""
    from rich.console import Console

    from autograder.grader.report import test_table, to_gradescope
    from autograder.runtime.results import points

    lines = [
        f"bertlab from {PROJECT}",
        f"graded {submission} on {', '.join(s.stage for s in result.stages)}: "
        f"{points(result.score)}/{points(result.max_score)}",
    ]
    for stage, why in sorted(recomputed.items()):  # slower, never wrong: setup.sh fixes it
        lines.append(f"{stage}: expected values computed here, not read from the zip's store ({why})")
    full = to_gradescope(result)
    lines.append(full["output"])
    for entry in full["tests"]:
        score = f"{points(entry['score'])}/{points(entry['max_score'])}"
        lines.append(f"\n== {entry['number']} {entry['name']}: {score}")
        lines.append(entry["output"])
    for entry in extra:
        score = (
            f"{points(entry['score'])}/{points(entry['max_score'])}" if "max_score" in entry else "no score"
        )
        lines.append(
            f"\n== instructor test {entry['name']}: {score}, {entry['status']}, {entry['visibility']}"
        )
        lines.append(entry["output"])
    table = io.StringIO()
    Console(width=160, file=table).print(test_table(result))
    lines.append(table.getvalue())
    return "\n".join(lines)


def _instructor_tests(
    config: dict[str, Any], grader: Any, submission: Path, stages: list[str]
) -> list[dict[str, Any]]:
    """The entries of the instructor's own tests, when the zip has them (none otherwise)."""
    own = config.get("instructor_tests")
    if not own:
        return []
    declared = [instructor_tests.Declared.from_json(d) for d in own["tests"]]
    folder = PROJECT / instructor_tests.FOLDER
    return instructor_tests.run(grader, submission, stages[0], folder, declared, float(own["timeout_s"]))


def run(root: Path) -> int:
    """Grade ``root/submission`` into ``root/results/results.json``. Returns 0 when a valid
    results file was written (a grader fault included), 1 when not even that worked."""
    t0 = time.monotonic()
    results = root / "results" / "results.json"
    config: dict[str, Any] = {}
    try:
        config = json.loads((PROJECT / CONFIG).read_text())
        from autograder.stages import stage_ids

        stages = list(config["stages"])
        unknown = sorted(set(stages) - set(stage_ids()))
        if unknown:  # checked before torch loads: a zip out of step with its code fails fast
            raise ValueError(f"{CONFIG} names stages this code does not have: {', '.join(unknown)}")
        from autograder.grader.batch import default_workers
        from autograder.grader.options import SUBMISSION_S, launch_for, open_grader
        from autograder.runtime.submission import Submission

        # Found before torch loads, so the fork server imports it while this process does
        # (no server at all for an upload without a stage file); expected values come from
        # the zip's store, checked (``grader/expected.py``).
        if config.get("allow_weak_sandbox"):  # the instructor said so when building the zip
            from autograder.sandbox.jail import WEAK_ENV

            os.environ[WEAK_ENV] = "1"
        submission = Submission.upload(root / "submission", stages).path
        server = launch_for([submission], stages)
        with open_grader(config.get("device", "cpu"), None, SUBMISSION_S, server=server) as grader:
            # the stages side by side, each in its own child, on the container's cores
            result = grader.grade(submission, stages, student=_student_name(root), workers=default_workers())
            data = student_view(result)
            extra = _instructor_tests(config, grader, submission, stages)
        data["tests"] += extra
        data["score"] = round(data["score"] + sum(e.get("score", 0) for e in extra), 4)
        data["execution_time"] = round(time.monotonic() - t0, 3)
        write_json(data, results)
        print(instructor_log(result, submission, grader.recomputed, extra), end="")
        return 0
    except BaseException:  # a grader fault (or a kill by Gradescope's timeout): say so, score 0
        print("bertlab: the autograder failed:", flush=True)
        traceback.print_exc(file=sys.stdout)
        try:
            write_json(
                failure_results(config.get("max_score", 0), time.monotonic() - t0, config.get("stages")),
                results,
            )
            return 0
        except BaseException:
            traceback.print_exc(file=sys.stdout)
            return 1


def main(argv: list[str]) -> int:
    """``python -m autograder.grader.gradescope run [--root ROOT]`` (what ``run_autograder`` calls)."""
    root = Path(os.environ.get(ROOT_ENV, "/autograder"))
    if argv[:1] != ["run"]:
        print("usage: python -m autograder.grader.gradescope run [--root ROOT]", file=sys.stderr)
        return 2
    if "--root" in argv:
        root = Path(argv[argv.index("--root") + 1])
    return run(root)


# -- the command -------------------------------------------------------------------------------


def zip_paths(out: str, groups: list[list[str]]) -> list[Path]:
    """Where each group of stages' zip goes: ``out`` itself for one zip, unless it names a
    folder (it ends with ``/`` or is one): then ``<stage>.zip`` in it, as for several zips
    (``01_attention+02_multihead.zip`` for a zip grading both)."""
    folder = out.endswith(("/", os.sep)) or Path(out).is_dir() or len(groups) > 1
    if not folder:
        if not out.endswith(".zip"):
            raise ValueError(f"--out {out!r}: name a .zip file, or a folder with a trailing /")
        return [Path(out)]
    return [Path(out) / ("+".join(g) + ".zip") for g in groups]


def command(
    out: Annotated[
        str,
        typer.Option(
            help="Where the zips go: a folder (a trailing / makes it) gets one zip per stage, "
            "<stage>.zip; with --stage, a .zip file name is the one zip's."
        ),
    ] = DEFAULT_OUT,
    stage: Annotated[
        list[str] | None,
        typer.Option(
            "--stage",
            "-s",
            help="Stage id(s) one zip grades, together (repeat for several); default: one zip per "
            "stage, each its own Gradescope assignment.",
        ),
    ] = None,
    allow_weak_sandbox: Annotated[
        bool,
        typer.Option(
            help="Grade even where the container allows no job box (no namespaces): student code "
            "then runs with the process-level sandbox alone. Without it such a run says why and "
            "grades nothing."
        ),
    ] = False,
    tests: Annotated[
        Path | None,
        typer.Option(
            help="A folder of your own unittest files with gradescope-utils' decorators (@weight, "
            "@visibility, @number, ...): they run on the student's code (imported as `submission`) "
            "and land in the same results.json. Needs one --stage."
        ),
    ] = None,
    tests_timeout: Annotated[
        float, typer.Option(help="Seconds all of a submission's --tests may take together.")
    ] = instructor_tests.TIMEOUT_S,
) -> None:
    """Build Gradescope's autograder zips (setup.sh, run_autograder, requirements, the
    reference and hidden cases): by default one per stage, to upload as the autograder of
    that stage's assignment. A zip grades only its stages: a student's upload without its
    stage's file scores 0 and is told which file was expected."""
    from autograder.stages import stage_ids

    groups = [list(stage)] if stage else [[s] for s in stage_ids()]
    try:
        if tests is not None and not stage:
            raise ValueError("--tests: name the stage they test with --stage (their zip grades that stage)")
        paths = zip_paths(out, groups)
        for path, group in zip(paths, groups, strict=True):
            build_zip(path, group, allow_weak_sandbox, tests, tests_timeout)
            with zipfile.ZipFile(path) as zf:
                config = json.loads(zf.read(CONFIG))
                n = len(zf.namelist())
            own = config.get("instructor_tests", {}).get("tests", [])
            also = f" and {len(own)} instructor tests" if own else ""
            typer.echo(
                f"{path}: {n} files, {path.stat().st_size / 1e6:.1f} MB; grades "
                f"{', '.join(config['stages'])}{also} for {config['max_score']:g} points "
                "(set the assignment's autograder points to match)"
            )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


if __name__ == "__main__":
    from autograder.grader.options import quick_exit

    quick_exit(main(sys.argv[1:]))  # results.json is written: no interpreter teardown to wait for

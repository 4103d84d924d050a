"""Gradescope's autograder zip, run as Gradescope runs it, and the TAs' Docker entry point.

The real ``run_autograder`` (bash) runs on a temporary directory standing in for
``/autograder`` (``BERTLAB_AUTOGRADER_ROOT``), with this venv's python instead of the
one setup.sh would build. All the grading runs start at once (each pays seconds of
start-up, mostly waiting); the tests then read what each left behind.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autograder.grader.gradescope import CONFIG, build_zip
from autograder.runtime.submission import Submission
from tests.support import ROOT, assert_gradescope_results, max_score

STAGE = "01_attention"
EXAMPLES = ROOT / "examples" / "class"
HOSTILE = """\
import json, os, sys
results = {results!r}
try:  # plant a perfect score where Gradescope reads the grade
    os.makedirs(os.path.dirname(results), exist_ok=True)
    with open(results, "w") as f:
        json.dump({{"score": 987654, "tests": []}}, f)
except OSError as exc:
    print("could not write", exc)
print('{{"score": 987654}}')
sys.exit(0)
"""


def _autograder(tmp: Path, zip_path: Path, name: str) -> Path:
    """``<tmp>/<name>``: an /autograder with the zip unpacked in source/, an empty submission/."""
    root = tmp / name
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "source")
    for script in ("run_autograder", "setup.sh"):
        (root / "source" / script).chmod(0o755)  # zipfile drops the mode; Gradescope keeps it
    (root / "submission").mkdir()
    return root


def _start(root: Path, python: str = sys.executable) -> subprocess.Popen:
    env = {**os.environ, "BERTLAB_AUTOGRADER_ROOT": str(root), "BERTLAB_PYTHON": python}
    return subprocess.Popen(
        ["bash", str(root / "source" / "run_autograder")],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradescope")
    zip_path = build_zip(tmp / "autograder.zip", [STAGE])
    roots = {name: _autograder(tmp, zip_path, name) for name in ("correct", "broken", "empty", "hostile")}
    roots.update({name: _autograder(tmp, zip_path, name) for name in ("crash", "no_python")})
    # a student who zipped a folder: the files one level down
    nested = roots["correct"] / "submission" / "ada_hw1"
    nested.mkdir()
    shutil.copy(EXAMPLES / "ada_correct_matmul" / f"{STAGE}.py", nested)
    shutil.copy(EXAMPLES / "carol_scale_by_d" / f"{STAGE}.py", roots["broken"] / "submission")
    results = roots["hostile"] / "results" / "results.json"
    (roots["hostile"] / "submission" / f"{STAGE}.py").write_text(HOSTILE.format(results=str(results)))
    (roots["crash"] / "source" / CONFIG).write_text('{"stages": ["99_no_such_stage"], "max_score": 17}')
    shutil.copy(EXAMPLES / "ada_correct_matmul" / f"{STAGE}.py", roots["crash"] / "submission")
    # the TAs' entry point, outside Docker: /submissions and /out relocated
    subs, out = tmp / "submissions", tmp / "out"
    for student, example in (("ada", "ada_correct_matmul"), ("carol", "carol_scale_by_d")):
        (subs / student).mkdir(parents=True)
        shutil.copy(EXAMPLES / example / f"{STAGE}.py", subs / student)
    docker = subprocess.Popen(
        [
            "bash",
            str(ROOT / "docker" / "entrypoint.sh"),
            "batch",
            str(subs),
            "--stage",
            STAGE,
            "--workers",
            "1",
        ],
        cwd=tmp,
        env={**os.environ, "BERTLAB_OUT": str(out), "BERTLAB_PYTHON": sys.executable, "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    procs = {name: _start(root) for name, root in roots.items() if name != "no_python"}
    procs["no_python"] = _start(roots["no_python"], python=str(tmp / "no-such-python"))
    done = {}
    for name, proc in procs.items():
        stdout, _ = proc.communicate(timeout=300)
        path = roots[name] / "results" / "results.json"
        done[name] = {
            "rc": proc.returncode,
            "stdout": stdout,
            "results": json.loads(path.read_text()) if path.exists() else None,
            "root": roots[name],
        }
    stdout, _ = docker.communicate(timeout=300)
    done["docker"] = {"rc": docker.returncode, "stdout": stdout, "out": out}
    done["zip"] = zip_path
    return done


def _plain(entry: dict) -> str:
    """A test's output as plain text: Markdown's escapes and hard line breaks undone."""
    if entry.get("output_format") != "md":
        return entry["output"]
    text = entry["output"].replace("  \n", "\n").replace("\u00a0", " ")
    return re.sub(r"\\(.)", r"\1", text)


def _tests(results: dict) -> dict[str, dict]:
    return {t["name"]: t for t in results["tests"]}


def test_correct_submission_in_a_folder_scores_full_marks(runs):
    r = runs["correct"]
    assert r["rc"] == 0, r["stdout"]
    data = r["results"]
    assert_gradescope_results(data)
    assert data["score"] == max_score(STAGE)
    assert data["stdout_visibility"] == "hidden"
    assert isinstance(data["execution_time"], float) and data["execution_time"] > 0
    assert all(t["visibility"] == "visible" and t["status"] == "passed" for t in data["tests"])
    assert [t["number"] for t in data["tests"]] == [f"1.{i}" for i in range(1, 16)]
    # the code that graded is the zip's, not this checkout's
    assert f"bertlab from {r['root'] / 'source'}" in r["stdout"]


def test_wrong_submission_names_the_mistake_without_showing_hidden_cases(runs):
    data = runs["broken"]["results"]
    assert_gradescope_results(data)
    assert 0 < data["score"] < max_score(STAGE)
    failed = [t for t in data["tests"] if t["status"] == "failed"]
    assert failed and all("misconception:scale-by-d" in t["tags"] for t in failed), failed
    hidden = [t for t in failed if "hidden" in t["tags"]]
    public = [t for t in failed if "public" in t["tags"]]
    assert hidden and public
    for t in hidden:  # score, counts and the named mistake; no case labels, errors or values
        assert t["output_format"] == "md"  # its note quotes `function`: shown as code
        assert "hidden cases passed" in _plain(t) and "likely mistake [scale-by-d]" in _plain(t)
        # (its counterexample, a public input's, may say what differs there)
        redacted = _plain(t).split("Smallest input found on which", 1)[0]
        assert "✗" not in redacted and "max abs error" not in redacted, t["output"]
    assert any("✗" in t["output"] for t in public)  # public cases: in full, as in the self-check
    # the instructor sees each hidden case's message in the (hidden) stdout
    for t in hidden:
        shown = runs["broken"]["stdout"].split(t["name"], 1)[1].split("\n== ", 1)[0]
        assert "✗" in shown, shown


def test_empty_submission_scores_zero_with_every_test(runs):
    data = runs["empty"]["results"]
    assert runs["empty"]["rc"] == 0
    assert_gradescope_results(data)
    assert data["score"] == 0
    assert data["output"].startswith(
        f"no stage file found in the submission (it is empty); expected {STAGE}.ipynb"
    )
    assert all(t["output"].endswith(f"not submitted: no {STAGE}.ipynb or {STAGE}.py in the submission; it scores 0")
               for t in data["tests"])  # fmt: skip


def test_hostile_submission_cannot_plant_its_grade(runs):
    r = runs["hostile"]
    assert r["rc"] == 0, r["stdout"]
    data = r["results"]
    assert_gradescope_results(data)
    assert data["score"] == 0
    # neither the planted file nor the printed JSON is the grade: what it printed (before
    # it received any hidden input) is shown as printed, in the top-level output only
    assert "987654" not in json.dumps(data["tests"])
    printed = data["output"].partition("your code printed:\n")[2]
    assert '    {"score": 987654}' in printed.splitlines()


def test_a_grader_crash_still_writes_a_valid_failed_results_file(runs):
    for name in ("crash", "no_python"):  # a fault in Python; Python that cannot even start
        r = runs[name]
        assert r["rc"] == 0, r["stdout"]
        data = r["results"]
        assert_gradescope_results(data, max_score(STAGE), 1)
        assert data["score"] == 0
        (entry,) = data["tests"]
        assert entry["name"] == "Autograder failed" and entry["visibility"] == "visible"
        assert "not in your code" in entry["output"]
        assert "Traceback" not in json.dumps(data)  # for the instructor's eyes: stdout only
    assert "Traceback" in runs["crash"]["stdout"] and "99_no_such_stage" in runs["crash"]["stdout"]


def test_zip_holds_what_gradescope_and_grading_need(runs):
    with zipfile.ZipFile(runs["zip"]) as zf:
        names = set(zf.namelist())
        assert {"setup.sh", "run_autograder", CONFIG, "scripts/install.sh", "pyproject.toml"} <= names
        for req in ("requirements.txt", "requirements-nodeps.txt"):  # the repo's, byte for byte
            assert zf.read(req) == (ROOT / req).read_bytes()
        assert f"autograder/stages/{STAGE}.py" in names and f"reference/{STAGE}.py" in names
        assert "solutions/07_bert_pretraining/corpus.txt" in names  # stage 07 reads it while grading
        assert not any(n.endswith((".ipynb", ".pyc")) or "__pycache__" in n for n in names)
        assert json.loads(zf.read(CONFIG)) == {
            "stages": [STAGE],
            "max_score": max_score(STAGE),
            "device": "cpu",
        }
        for script in ("setup.sh", "run_autograder"):
            assert zf.getinfo(script).external_attr >> 16 & 0o111, f"{script} is not executable"
        setup = zf.read("setup.sh").decode()
    # setup.sh installs with the Makefile's one script, on the runtime requirements
    assert _install_calls(setup) == [("scripts/install.sh", ".venv/bin/python", "requirements.txt")]
    assert "pip install" not in setup
    # reproducible: the same checkout gives the same bytes (one upload per change, not per build)
    one, two = (build_zip(runs["zip"].parent / f"again{i}.zip", [STAGE]) for i in (1, 2))
    assert one.read_bytes() == two.read_bytes()


def test_a_zip_built_to_grade_without_a_job_box_says_so_in_its_config(tmp_path):
    """Where Gradescope's container refuses namespaces, grading refuses to start (the
    instructor's log says why) unless the zip was built with --allow-weak-sandbox."""
    with zipfile.ZipFile(build_zip(tmp_path / "weak.zip", [STAGE], allow_weak_sandbox=True)) as zf:
        assert json.loads(zf.read(CONFIG))["allow_weak_sandbox"] is True
    with zipfile.ZipFile(build_zip(tmp_path / "strict.zip", [STAGE])) as zf:
        assert "allow_weak_sandbox" not in json.loads(zf.read(CONFIG))


def _install_calls(text: str) -> list[tuple[str, ...]]:
    """Every ``bash scripts/install.sh PYTHON REQUIREMENTS`` in a script, Makefile or Dockerfile."""
    return [tuple(m) for m in re.findall(r"bash (scripts/install\.sh) (\S+) (\S+)", text)]


def test_makefile_dockerfile_and_setup_install_with_one_script():
    makefile = (ROOT / "Makefile").read_text()
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert _install_calls(makefile) == [("scripts/install.sh", "$(BIN)/python", "requirements-dev.txt")]
    # the image's first layer is the pinned packages alone (kept while the code changes)
    image = ("scripts/install.sh", "/opt/venv/bin/python", "requirements.txt")
    assert _install_calls(dockerfile) == [image, image]
    assert "requirements.txt --packages-only" in dockerfile
    for text in (makefile, dockerfile):  # no second list of install commands to drift
        assert "pip install" not in text
    # the dev requirements are the runtime ones plus tools, so the images grade as make's venv does
    assert (ROOT / "requirements-dev.txt").read_text().splitlines()[1] == "-r requirements.txt"
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert '-r "$req"' in install and "--no-deps -r requirements-nodeps.txt" in install
    # the Dockerfile copies every file install.sh reads before running it
    copied = " ".join(line for line in dockerfile.splitlines() if line.startswith("COPY"))
    for needed in (
        "requirements.txt",
        "requirements-nodeps.txt",
        "pyproject.toml",
        "README.md",
        "scripts/install.sh",
    ):
        assert needed in copied.split(), needed
    assert dockerfile.index("scripts/install.sh scripts/install.sh") < dockerfile.index(
        "bash scripts/install.sh"
    )
    entry = [line for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT")]
    assert entry == ['ENTRYPOINT ["bash", "/usr/local/bin/bertlab-entrypoint"]']


def test_runtime_requirements_can_build_the_project_without_isolation():
    # install.sh builds the project with --no-build-isolation: its build backend must come
    # from the requirements the images install, or Docker and Gradescope cannot install it
    runtime = (ROOT / "requirements.txt").read_text()
    assert re.search(r"^setuptools==", runtime, re.M)


def test_docker_entrypoint_grades_a_class_into_out(runs):
    r = runs["docker"]
    assert r["rc"] == 0, r["stdout"]
    out = r["out"]
    with sqlite3.connect(out / "bertlab-gradebook.sqlite") as db:
        grades = dict(db.execute("SELECT student, score FROM grades WHERE stage = ?", (STAGE,)))
    assert grades == {"ada": max_score(STAGE), "carol": 8.25}  # examples/class/README.md
    with open(out / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {row["student"] for row in rows} == {"ada", "carol"}


def test_locate_submission_finds_the_zipped_folder(tmp_path):
    sub = tmp_path / "submission"
    (sub / "__MACOSX" / "hw").mkdir(parents=True)
    (sub / "__MACOSX" / "hw" / f"{STAGE}.py").write_text("")
    (sub / "hw" / "deeper").mkdir(parents=True)
    assert Submission.upload(sub, [STAGE]).path == sub  # nothing anywhere: the upload itself
    (sub / "hw" / STAGE).mkdir()
    (sub / "hw" / STAGE / f"{STAGE}.py").write_text("")  # nbgrader's stage folder, zipped
    assert Submission.upload(sub, [STAGE]).path == sub / "hw"
    (sub / f"{STAGE}.ipynb").write_text("{}")
    assert Submission.upload(sub, [STAGE]).path == sub


# -- setup.sh: which Python builds the image -------------------------------------------------


def _setup_dir(tmp: Path, pythons: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """A copy of setup.sh whose PATH holds only ``pythons`` (name -> shell script body), an
    apt-get that fails (no root, no network: as in a test) and the tools the script uses;
    scripts/install.sh records its arguments instead of installing."""
    from autograder.grader.gradescope import SETUP_SH

    here, bin_ = tmp / "source", tmp / "bin"
    (here / "scripts").mkdir(parents=True)
    bin_.mkdir()
    (here / "setup.sh").write_text(SETUP_SH)
    (here / "scripts" / "install.sh").write_text(f'echo "$@" > {tmp / "installed"}\n')
    for tool in ("bash", "dirname", "rm"):
        (bin_ / tool).symlink_to(shutil.which(tool))
    stubs = {"apt-get": 'echo "E: Could not open lock file /var/lib/dpkg/lock-frontend" >&2; exit 100'}
    for name, body in {**stubs, **pythons}.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    return here, {"PATH": str(bin_), "HOME": str(tmp)}


def _setup(here: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [shutil.which("bash"), "setup.sh"], cwd=here, env=env, capture_output=True, text=True, timeout=120
    )


# a python3.13 that is on PATH but cannot start (a dangling library, a broken wrapper)
BROKEN = 'echo "python3.13: error while loading shared libraries: libpython3.13.so.1.0" >&2; exit 127'
TOO_OLD = 'case "$*" in *version_info*) exit 1;; esac; echo "Python 3.8.10"'


def test_setup_fails_early_and_clearly_when_no_python_runs(tmp_path):
    here, env = _setup_dir(tmp_path, {"python3.13": BROKEN, "python3": TOO_OLD})
    proc = _setup(here, env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "setup.sh: no Python >= 3.11 runs here; installing python3.11 with apt-get" in proc.stderr
    assert "setup.sh: apt-get update failed: cannot install python3.11" in proc.stderr
    assert "No such file" not in proc.stderr  # it stopped there, not at .venv/bin/python
    assert not (here / ".venv").exists() and not (tmp_path / "installed").exists()


def test_setup_skips_a_python_that_does_not_run_and_uses_the_next(tmp_path):
    real = sys.executable  # a Python >= 3.11 that runs, under another name
    here, env = _setup_dir(tmp_path, {"python3.13": BROKEN, "python3.12": f'exec "{real}" "$@"'})
    proc = _setup(here, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"setup.sh: using {tmp_path / 'bin' / 'python3.12'} (Python 3." in proc.stdout
    assert (tmp_path / "installed").read_text() == ".venv/bin/python requirements.txt\n"
    assert subprocess.run([str(here / ".venv" / "bin" / "python"), "-c", "pass"]).returncode == 0


def test_setup_stops_when_no_venv_can_be_made(tmp_path):
    real = sys.executable  # runs, but its venv module fails (Debian without python3.X-venv)
    no_venv = (
        f'case "$*" in "-m venv"*) echo "ensurepip is not available" >&2; exit 1;; esac\nexec "{real}" "$@"'
    )
    here, env = _setup_dir(tmp_path, {"python3.12": no_venv})
    proc = _setup(here, env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    minor = f"python3.{sys.version_info[1]}-venv"
    assert f"setup.sh: python3.12 cannot create a venv; installing {minor} with apt-get" in proc.stderr
    assert f"setup.sh: apt-get could not install {minor}" in proc.stderr
    assert not (here / ".venv").exists() and not (tmp_path / "installed").exists()


def test_instructor_log_shows_scores_as_the_table_does():
    """run_autograder's stdout (hidden from students) gives every score with at most 2 decimals,
    as the CLI's table and the student's results do: a third of a point is 0.33, not 0.333333."""
    from autograder.grader.gradescope import instructor_log
    from autograder.runtime.results import CaseResult, StageResult, SubmissionResult, TestResult

    cases = [CaseResult(f"case {i}", i == 0, "passed" if i == 0 else "wrong values") for i in range(3)]
    tests = [
        TestResult(STAGE, name, "float64", f"1.{i + 1}", 1.0, score, hidden, cases, [])
        for i, (name, score, hidden) in enumerate([("softmax", 1 / 3, False), ("causal_mask", 2 / 3, True)])
    ]
    result = SubmissionResult("ada", [StageResult(STAGE, f"{STAGE}.py", tests, [])])
    log = instructor_log(result, Path("/autograder/submission"), {STAGE: "no store"})
    assert f"graded /autograder/submission on {STAGE}: 1/2\n" in log
    assert "\n== 1.1 01_attention · softmax · float64: 0.33/1\n" in log
    assert "\n== 1.2 01_attention · causal_mask · float64: 0.67/1\n" in log
    assert "0.333" not in log and "0.666" not in log and "0.667" not in log
    assert f"{STAGE}: expected values computed here, not read from the zip's store (no store)" in log
    assert "wrong values" in log  # the hidden case's message: instructors see it in full


def test_gradescope_zip_makes_one_zip_per_stage_in_a_folder_it_creates(tmp_path, monkeypatch):
    """Gradescope assignments are per stage: by default the command writes one zip per stage,
    each grading its stage alone (a stage-01 assignment once scored a student 8/204, ten
    stages "not submitted"); ``--out DIR/`` for a folder that does not exist yet makes it
    (it once wrote a file named DIR)."""
    from typer.testing import CliRunner

    from autograder.grader import gradescope
    from autograder.grader.cli import app
    from autograder.stages import stage_ids

    built: list[tuple[Path, list[str]]] = []

    def record(out: Path, stages: list[str], allow_weak_sandbox: bool = False, *instructor_tests) -> Path:
        built.append((out, stages))
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out, "w") as zf:
            zf.writestr(CONFIG, json.dumps({"stages": stages, "max_score": 1}))
        return out

    monkeypatch.setattr(gradescope, "build_zip", record)
    runner = CliRunner()
    folder = tmp_path / "zips" / "new"
    ran = runner.invoke(app, ["gradescope-zip", "--out", f"{folder}/"])
    assert ran.exit_code == 0, ran.output
    assert built == [(folder / f"{s}.zip", [s]) for s in stage_ids()]
    built.clear()
    ran = runner.invoke(app, ["gradescope-zip", "--out", str(tmp_path / "new2") + "/", "-s", STAGE])
    assert ran.exit_code == 0 and built == [(tmp_path / "new2" / f"{STAGE}.zip", [STAGE])]
    built.clear()
    ran = runner.invoke(
        app, ["gradescope-zip", "--out", str(tmp_path / "two.zip"), "-s", STAGE, "-s", "02_multihead"]
    )
    assert ran.exit_code == 0 and built == [(tmp_path / "two.zip", [STAGE, "02_multihead"])]
    built.clear()
    ran = runner.invoke(app, ["gradescope-zip", "--out", str(tmp_path / "nofolder"), "-s", STAGE])
    assert ran.exit_code == 2 and "trailing /" in ran.output and not built


def test_a_real_per_stage_zip_grades_its_stage_alone(tmp_path):
    """The zip the command writes for one stage, into a folder it makes, holds that stage's
    points only."""
    proc = subprocess.run(
        [sys.executable, "-m", "autograder", "gradescope-zip", "--out", f"{tmp_path}/made/", "-s", STAGE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(tmp_path / "made" / f"{STAGE}.zip") as zf:
        config = json.loads(zf.read(CONFIG))
    assert config["stages"] == [STAGE] and config["max_score"] == max_score(STAGE)

"""docker/entrypoint.sh without Docker: what it says when /out is unusable, the outputs it
wires for batch, grade and feedback, HOME under --user. The image itself, built and run,
is `make docker-check` (docker/check.py); tests/test_gradescope.py grades a class through
this entry point.

``BERTLAB_PYTHON`` is a fake interpreter that prints where it was started and with what,
so these tests read the command the entry point would run.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support import ROOT

ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
NOBODY = 65534
# where it runs, HOME, whether HOME is writable, then one argument a line (sh only: the
# test's own Python may sit where another user cannot read it)
FAKE_PYTHON = """#!/bin/sh
pwd; echo "$HOME"; if [ -w "$HOME" ]; then echo yes; else echo no; fi
printf '%s\\n' "$@"
"""


@pytest.fixture
def shared(tmp_path_factory):
    """A directory every user may enter (pytest's own are root's alone), holding the fake
    interpreter; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="bertlab-entry-"))
    path.chmod(0o755)
    fake = path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    yield path
    shutil.rmtree(path)


def entry(
    args: list[str], out: Path | str, shared: Path, as_other_user: bool = False, **env
) -> subprocess.CompletedProcess:
    """Run the entry point (as another user than /out's owner, if asked and if root)."""
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": env.pop("HOME", str(shared)),
        "BERTLAB_OUT": str(out),
        "BERTLAB_PYTHON": str(shared / "python"),
        **env,
    }
    argv = ["bash", "-s", "--", *args]  # the script on stdin: readable whoever runs it
    if as_other_user and os.geteuid() == 0:
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    with open(ENTRYPOINT) as script:
        return subprocess.run(
            argv, stdin=script, env=environ, cwd=shared, capture_output=True, text=True, timeout=60
        )


def ran(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    cwd, home, writable, *argv = proc.stdout.splitlines()
    return {"cwd": cwd, "home": home, "home_writable": writable == "yes", "argv": argv}


def unwritable(shared: Path) -> Path:
    """A directory the entry point's user may not write in: root's, run as nobody; or
    read-only to a non-root runner."""
    path = shared / "out"
    path.mkdir(mode=0o755)
    if os.geteuid() != 0:
        path.chmod(0o555)
    return path


def test_an_out_dir_it_cannot_write_in_stops_it_saying_what_to_do(shared):
    out = unwritable(shared)
    proc = entry(["batch", "/submissions"], out, shared, as_other_user=True)
    assert proc.returncode == 2 and proc.stdout == ""
    said = proc.stderr.strip()
    assert said.startswith(f"bertlab: {out} is not writable by uid ")
    assert f"it belongs to uid {os.stat(out).st_uid}" in said and "mkdir -p out" in said


def test_an_out_dir_it_cannot_make_stops_it(shared):
    out = unwritable(shared) / "deeper"
    proc = entry(["grade", "/submissions/ada"], out, shared, as_other_user=True)
    assert proc.returncode == 2
    assert f"bertlab: {out} does not exist and uid " in proc.stderr and "cannot make it" in proc.stderr


def test_in_the_image_an_out_that_is_not_mounted_stops_it(shared, tmp_path):
    proc = entry(["batch", "/submissions"], tmp_path, shared, BERTLAB_IN_IMAGE="1")
    assert proc.returncode == 2
    assert f"bertlab: nothing is mounted on {tmp_path}" in proc.stderr
    assert '-v "$PWD/out:' in proc.stderr  # the option to add


@pytest.mark.skipif(
    not os.path.ismount("/dev/shm") or not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm mount"
)
def test_in_the_image_a_mounted_out_is_used(shared):
    got = ran(entry(["batch", "/submissions"], "/dev/shm", shared, BERTLAB_IN_IMAGE="1"))
    assert got["cwd"] == "/dev/shm"
    assert got["argv"][-4:] == ["--db", "/dev/shm/bertlab-gradebook.sqlite", "--csv", "/dev/shm/grades.csv"]


def test_outputs_land_in_out_unless_given(shared, tmp_path):
    out = tmp_path / "out"
    assert ran(entry([], out, shared))["argv"] == [
        "-m", "autograder", "batch", "/submissions",
        "--db", f"{out}/bertlab-gradebook.sqlite", "--csv", f"{out}/grades.csv",
    ]  # fmt: skip
    sharded = ran(entry(["batch", "/s", "--shard", "2/8"], out, shared))["argv"]
    assert sharded[-4:] == [
        "--db",
        f"{out}/bertlab-gradebook.shard-2-of-8.sqlite",
        "--csv",
        f"{out}/grades.shard-2-of-8.csv",
    ]
    assert ran(entry(["grade", "/s/ada"], out, shared))["argv"][-2:] == ["--results-dir", f"{out}/results"]
    assert ran(entry(["feedback", "/s/ada"], out, shared))["argv"][-2:] == ["--out", f"{out}/feedback"]
    for given in (["--out", "pages"], ["-o", "pages"], ["--out=pages"]):
        assert ran(entry(["feedback", "/s/ada", *given], out, shared))["argv"] == [
            "-m",
            "autograder",
            "feedback",
            "/s/ada",
            *given,
        ]
    assert ran(entry(["batch", "/s", "--db", "b.sqlite"], out, shared))["argv"][-4:] == [
        "--db", "b.sqlite", "--csv", f"{out}/grades.csv"
    ]  # fmt: skip
    assert ran(entry(["grade", "/s/ada"], out, shared))["cwd"] == str(out)


def test_a_quoted_pattern_is_expanded_in_the_container(shared, tmp_path):
    for name in ("ada", "amir", "bob"):
        (tmp_path / "subs" / name).mkdir(parents=True)
    subs = tmp_path / "subs"
    argv = ran(entry(["feedback", f"{subs}/a*", f"{subs}/zz*", "--stage", "01_a*"], tmp_path / "o", shared))[
        "argv"
    ]
    # matches, in order; a pattern matching nothing stays for the CLI to refuse; options untouched
    assert argv[2:7] == ["feedback", f"{subs}/ada", f"{subs}/amir", f"{subs}/zz*", "--stage"]
    assert argv[7] == "01_a*"


def test_doctor_needs_no_out(shared):
    got = ran(entry(["doctor"], unwritable(shared), shared, as_other_user=True))
    assert got["argv"] == ["-m", "autograder", "doctor"]


def test_a_home_it_cannot_write_in_is_replaced(shared):
    # under docker run --user, a uid with no passwd entry has HOME=/
    out = shared / "out"
    out.mkdir()
    if os.geteuid() == 0:
        os.chown(out, NOBODY, NOBODY)
    got = ran(entry(["grade", "/s/ada"], out, shared, as_other_user=True, HOME="/"))
    assert got["home"] != "/" and got["home_writable"]
    assert ran(entry(["grade", "/s/ada"], out, shared, HOME=str(shared)))["home"] == str(shared)


def test_the_dockerfile_header_documents_one_command_as_docker_check_runs_it():
    spec = importlib.util.spec_from_file_location("docker_check", ROOT / "docker" / "check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    command = check.documented(DOCKERFILE.read_text())
    assert command.startswith("docker run --rm --network none ") and command.endswith(" bertlab")
    assert check.USER_OPTION in command and check.OUT_MOUNT in command
    assert '-v "$PWD/submissions:/submissions:ro" ' in command

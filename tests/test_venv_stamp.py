"""The Makefile's venv is installed again when what it was installed from changes, not when
file dates do, and a venv made for another checkout never runs that checkout's code (issue 28:
`make generate` rebuilt the venv after a clone; a copied `.venv`'s editable install silently
ran the other checkout's code).

The real Makefile and scripts/venv.sh run in a checkout made in a temporary folder, whose
scripts/install.sh stands in for pip: it makes the venv import the checkout's ``autograder``
(as ``pip install -e .`` does) and counts its runs. Venvs are made without pip, in seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import ROOT

INPUTS = (
    "requirements.txt",
    "requirements-instructor.txt",
    "requirements-dev.txt",
    "requirements-nodeps.txt",
    "pyproject.toml",
)
# what install.sh does, for this test: an editable install of the checkout it runs in
FAKE_INSTALL = """#!/usr/bin/env bash
set -euo pipefail
site=$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pwd -P > "$site/bertlab-editable.pth"
echo run >> installs.log
"""

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def _checkout(where: Path) -> Path:
    (where / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "Makefile", where)
    shutil.copy2(ROOT / "scripts" / "venv.sh", where / "scripts")
    (where / "scripts" / "install.sh").write_text(FAKE_INSTALL)
    for name in INPUTS:
        (where / name).write_text(f"{name}: pins\n")
    (where / "autograder").mkdir()
    (where / "autograder" / "__init__.py").write_text("")
    return where


def _python(tmp: Path) -> str:
    """$(PY) for the Makefile: the base interpreter, making venvs without pip (fast)."""
    wrapper = tmp / "python3"
    base = getattr(sys, "_base_executable", sys.executable)
    wrapper.write_text(f'#!/bin/sh\nexec "{base}" "$@" --without-pip\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def _make(checkout: Path, py: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "MAKEFLAGS")}
    return subprocess.run(
        ["make", "-s", ".venv/.installed", f"PY={py}"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _installs(checkout: Path) -> int:
    log = checkout / "installs.log"
    return len(log.read_text().splitlines()) if log.is_file() else 0


def _runs_code_of(checkout: Path) -> str:
    python = checkout / ".venv" / "bin" / "python"
    code = "import os, autograder; print(os.path.dirname(os.path.dirname(os.path.realpath(autograder.__file__))))"
    return subprocess.run(
        [python, "-I", "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def _later(paths: list[Path]) -> None:
    """Newer dates, the same content: what a clone or a copy does to the files."""
    later = time.time() + 5
    for p in paths:
        os.utime(p, (later, later))


def test_the_venv_is_installed_again_when_its_requirements_change_not_their_dates(tmp_path):
    py = _python(tmp_path)
    here = _checkout(tmp_path / "a")
    first = _make(here, py)
    assert first.returncode == 0, first.stdout + first.stderr
    assert _installs(here) == 1 and "no venv here yet" in first.stdout
    assert _make(here, py).stdout == "" and _installs(here) == 1  # up to date: silent
    _later([here / name for name in INPUTS] + [here / "scripts" / "install.sh"])
    again = _make(here, py)
    assert again.returncode == 0 and _installs(here) == 1, again.stdout  # dates alone: nothing
    (here / "requirements.txt").write_text("requirements.txt: other pins\n")
    changed = _make(here, py)
    assert changed.returncode == 0 and _installs(here) == 2
    assert "installed from other requirements" in changed.stdout


def test_a_venv_copied_from_another_checkout_is_made_again_for_this_one(tmp_path):
    py = _python(tmp_path)
    one = _checkout(tmp_path / "one")
    assert _make(one, py).returncode == 0 and _runs_code_of(one) == str(one.resolve())
    other = tmp_path / "other"
    shutil.copytree(one, other, symlinks=True)  # .venv and its stamp, dates kept
    made = _make(other, py)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "made again" in made.stdout.replace("making it again", "made again"), made.stdout
    assert str(one / ".venv") in made.stdout or str(one.resolve()) in made.stdout
    assert _runs_code_of(other) == str(other.resolve())  # its own code now, not one's
    assert _installs(other) == 2  # the copied log's run, and this checkout's own
    assert _make(other, py).stdout == "" and _runs_code_of(one) == str(one.resolve())


def test_a_stamp_from_before_digests_is_taken_when_newer_than_the_requirements(tmp_path):
    """The venvs made by the Makefile before this change have an empty stamp: one newer than
    every requirement is taken as it is, once (no reinstall on upgrade); an older one is not."""
    py = _python(tmp_path)
    here = _checkout(tmp_path / "a")
    assert _make(here, py).returncode == 0 and _installs(here) == 1
    stamp = here / ".venv" / ".installed"
    stamp.write_text("")
    assert _make(here, py).stdout == "" and _installs(here) == 1
    assert stamp.read_text().strip().endswith(str(here.resolve()))  # the digest is kept now
    stamp.write_text("")
    _later([here / "requirements-dev.txt"])
    old = _make(here, py)
    assert old.returncode == 0 and _installs(here) == 2, old.stdout


def test_a_venv_whose_editable_install_is_another_checkouts_is_made_again(tmp_path):
    py = _python(tmp_path)
    here, elsewhere = _checkout(tmp_path / "here"), _checkout(tmp_path / "elsewhere")
    assert _make(here, py).returncode == 0
    # `pip install -e ../elsewhere` run by hand in this checkout's venv
    pth = next((here / ".venv").rglob("bertlab-editable.pth"))
    pth.write_text(f"{elsewhere.resolve()}\n")
    assert _runs_code_of(here) == str(elsewhere.resolve())
    made = _make(here, py)
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"its editable install runs the code of {elsewhere.resolve()}, another checkout" in made.stdout
    assert _runs_code_of(here) == str(here.resolve())

"""Property tests do not make CI flaky: `make test` runs hypothesis derandomized, the same
examples on every run and in every process; `make explore` (HYPOTHESIS_PROFILE=explore)
draws new examples, several times as many, a test's own max_examples included."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import EXPLORE_FACTOR
from tests.support import ROOT

PROBE = """
import json, os
from hypothesis import given, settings, strategies as st

@settings(max_examples=7)
@given(st.binary(min_size=8, max_size=8))
def test_probe(b):
    with open(os.environ["PROBE_OUT"], "a") as f:
        f.write(json.dumps(b.hex()) + "\\n")
"""


def _examples(tmp_path, name: str, profile: str | None) -> list[str]:
    """The examples a property test with its own max_examples=7 draws in a fresh pytest
    process, under tests/conftest.py and ``profile`` (None: HYPOTHESIS_PROFILE unset)."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / f"{name}.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}
    env["PROBE_OUT"] = str(out)
    if profile is not None:
        env["HYPOTHESIS_PROFILE"] = profile
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
        ]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
        cwd=ROOT,  # `tests.conftest` is imported from the repository, as the suite does
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
def test_ci_is_the_default_and_draws_the_same_examples_in_every_process_explore_draws_more(tmp_path):
    unset = _examples(tmp_path, "unset", None)
    ci = _examples(tmp_path, "ci", "ci")
    assert len(unset) == 7 and len(set(unset)) == 7
    assert unset == ci
    explore = _examples(tmp_path, "explore", "explore")
    assert len(explore) == 7 * EXPLORE_FACTOR

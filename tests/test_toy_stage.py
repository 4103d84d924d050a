"""Adding a stage is one spec, one reference, one notebook: a stage that lives only in tests/
is graded by the unchanged pipeline, through the CLI, modules included."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import ROOT, write_py

TOY = ROOT / "tests" / "toy_stage"

CORRECT = """
import torch
from torch import nn

def scale_rows(x, alpha):
    return alpha * x / torch.sqrt((x * x).sum(-1, keepdim=True))

class Gate(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w_g = nn.Linear(d, d)
        self.w_v = nn.Linear(d, d)

    def forward(self, x):
        return torch.sigmoid(self.w_g(x)) * self.w_v(x)
"""

BUGGY = CORRECT.replace("alpha * x", "x").replace("torch.sigmoid(self.w_g(x))", "self.w_g(x)")
FORBIDDEN = CORRECT.replace("torch.sqrt((x * x).sum(-1, keepdim=True))", "x.norm(dim=-1, keepdim=True)")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    subs = [
        write_py(root / n, "99_toy", code)
        for n, code in (("correct", CORRECT), ("buggy", BUGGY), ("forbidden", FORBIDDEN))
    ]
    env = {**os.environ, "BERTLAB_STAGE_PATH": str(TOY)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            *map(str, subs),
            "--stage",
            "99_toy",
            "--results-dir",
            str(root / "out"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return {
        n: json.loads((root / "out" / n / "results.json").read_text())
        for n in ("correct", "buggy", "forbidden")
    }


def test_correct_toy_submission_scores_full_marks(graded):
    r = graded["correct"]
    assert r["score"] == 5
    assert [t["name"] for t in r["tests"]] == [
        "99_toy · scale_rows · float32",
        "99_toy · scale_rows · float64",
        "99_toy · Gate · float32",
        "99_toy · Gate · float64",
    ]


def test_toy_mistakes_are_named_for_functions_and_modules(graded):
    tags = {t["name"]: t["tags"] for t in graded["buggy"]["tests"]}
    assert graded["buggy"]["score"] == 0
    assert "misconception:forgot-alpha" in tags["99_toy · scale_rows · float32"]
    assert "misconception:no-sigmoid" in tags["99_toy · Gate · float64"]


def test_toy_forbidden_call_costs_only_that_name(graded):
    tests = {t["name"]: t for t in graded["forbidden"]["tests"]}
    assert tests["99_toy · scale_rows · float32"]["score"] == 0
    assert "torch.Tensor.norm" in tests["99_toy · scale_rows · float32"]["output"]
    assert graded["forbidden"]["score"] == 2

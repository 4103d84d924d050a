"""The synthetic class of benchmarks/bench_class.py is the class its figures claim to grade.

A named mistake is graded on what its student handed in: every earlier stage the stage
runs (``requires``: 11 runs 09 and, through it, 06, 02 and 01) must be that student's own
code, or the class grades a mix no student wrote (lena's 11 on another student's 02). A
later mistake's earlier stages replace an earlier one's: this holds while the example
students' earlier stages are the same code (all of them are ada's today), and fails here
when one that differs is drawn. No timing here: the figures are the bench's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from autograder.runtime.submission import Submission
from autograder.stages import requires, stage_ids

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_class  # noqa: E402


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_a_named_mistake_brings_every_earlier_stage_it_runs(tmp_path):
    kinds = bench_class.build_class(tmp_path, 12, seed=1)
    assert {stage for _, stage in kinds} == set(stage_ids())  # every stage, 10 to 13 included
    checked: set[str] = set()
    for (student, stage), kind in kinds.items():
        if not kind.startswith("mistake:"):
            continue
        origin = kind.split(":", 1)[1]
        for dep in requires(stage):
            own = Submission(bench_class.EXAMPLES / origin).file(dep)
            if own is None or kinds[(student, dep)] == "hanging":
                continue
            handed_in = nbformat.read(tmp_path / student / f"{dep}.ipynb", as_version=4)
            assert _code(handed_in) == _code(bench_class._notebook(own)), (student, stage, origin, dep)
            checked.add(f"{stage}<-{dep}")
    # the seed draws named mistakes at 10, 11 and 12 whose students hand in the stages beneath
    assert {
        "10_gpt<-02_multihead",
        "11_transfer<-09_mini_bert",
        "11_transfer<-01_attention",
        "12_seq2seq<-06_transformer_block",
    } <= checked, checked

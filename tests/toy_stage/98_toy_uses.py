"""A toy stage that runs the student's own 99_toy (``autograder.parts``), as 02 runs 01."""

import importlib.util
from pathlib import Path

import torch

from autograder.stages.spec import Case, CaseData, Graded, StageSpec, Test, randn

_spec = importlib.util.spec_from_file_location("toy_reference", Path(__file__).with_name("toy_reference.py"))
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


def _twice(x, alpha):
    return 2 * ref.scale_rows(x, alpha)


SPEC = StageSpec(
    id="98_toy_uses",
    title="Toy stage built on 99_toy",
    uses=("99_toy",),
    graded=(
        Graded(
            name="twice_scaled",
            task=1,
            signature="twice_scaled(x, alpha)",
            outputs=("y",),
            reference=_twice,
            tests=(
                Test(
                    "float32",
                    torch.float32,
                    points=1,
                    hidden=False,
                    cases=(
                        Case("(3, 4)", lambda g, dtype: CaseData(args=(randn(g, 3, 4, dtype=dtype), 2.0))),
                    ),
                ),
                Test(
                    "float64",
                    torch.float64,
                    points=1,
                    cases=(
                        Case("(2, 5)", lambda g, dtype: CaseData(args=(randn(g, 2, 5, dtype=dtype), 3.0))),
                    ),
                ),
            ),
        ),
    ),
    misconceptions={},
)

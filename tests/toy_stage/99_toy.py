"""A stage defined only here, in tests: the pipeline grades it with no change."""

import importlib.util
from pathlib import Path

import torch

from autograder.stages.spec import Case, CaseData, Graded, StageSpec, Test, Variant, randn

_spec = importlib.util.spec_from_file_location("toy_reference", Path(__file__).with_name("toy_reference.py"))
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


def _rows(shape, alpha):
    return lambda g, dtype: CaseData(args=(randn(g, *shape, dtype=dtype), alpha))


def _gate(b, d):
    def build(g, dtype):
        state = {
            f"{m}.{p}": randn(g, *((d, d) if p == "weight" else (d,)), dtype=dtype)
            for m in ("w_g", "w_v")
            for p in ("weight", "bias")
        }
        return CaseData(args=(randn(g, b, d, dtype=dtype),), init_args=(d,), state=state)

    return build


class _GateWithoutSigmoid(ref.Gate):
    def forward(self, x):
        return self.w_g(x) * self.w_v(x)


SPEC = StageSpec(
    id="99_toy",
    title="Toy stage",
    graded=(
        Graded(
            name="scale_rows",
            task=1,
            signature="scale_rows(x, alpha)",
            outputs=("y",),
            reference=ref.scale_rows,
            forbidden=("aten::linalg_vector_norm",),
            variants=(Variant("forgot-alpha", lambda x, alpha: ref.scale_rows(x, 1.0)),),
            tests=(
                Test(
                    "float32",
                    torch.float32,
                    points=2,
                    hidden=False,
                    cases=(Case("(3, 4)", _rows((3, 4), 2.0)), Case("(2, 2, 5)", _rows((2, 2, 5), 0.5))),
                ),
                Test("float64", torch.float64, points=1, cases=(Case("(4, 3)", _rows((4, 3), 3.0)),)),
            ),
        ),
        Graded(
            name="Gate",
            task=2,
            signature="Gate(d) with w_g, w_v; forward(x)",
            outputs=("y",),
            reference=ref.Gate,
            kind="module",
            variants=(Variant("no-sigmoid", _GateWithoutSigmoid),),
            tests=(
                Test(
                    "float32", torch.float32, points=1, hidden=False, cases=(Case("B=3, d=4", _gate(3, 4)),)
                ),
                Test("float64", torch.float64, points=1, cases=(Case("B=2, d=6", _gate(2, 6)),)),
            ),
        ),
    ),
    misconceptions={"forgot-alpha": "multiply by alpha", "no-sigmoid": "gate with sigmoid(w_g x)"},
)

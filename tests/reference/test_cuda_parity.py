"""The hidden reference gives on CUDA what it gives on the CPU, within the tolerance the
grader uses on CUDA, case by case, and the same misconception variants apply: a course
that grades with ``--device cuda`` grades the same. Run where torch sees a GPU (skipped
elsewhere); what it measured on an H100 is in the README's "Grading on a GPU"."""

from __future__ import annotations

import pytest
import torch

from autograder.grader.plan import StagePlan
from autograder.runtime.compare import compare
from autograder.stages import load_spec, stage_ids

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


def _share_of_tolerance(got: torch.Tensor, expected: torch.Tensor, tol, region) -> float:
    """max |got - expected| / (atol + rtol |expected|) over the graded region (1 = the limit)."""
    if not expected.is_floating_point() or expected.numel() == 0:
        return 0.0
    e, g = expected.double(), got.double()
    share = (g - e).abs() / (tol.atol + tol.rtol * e.abs()).clamp_min(1e-300)
    if region is not None:
        share = share[region.expand(e.shape)]
    share = share[torch.isfinite(share)]
    return float(share.max()) if share.numel() else 0.0


@pytest.mark.parametrize("stage", stage_ids())
def test_reference_on_cuda_equals_cpu(stage):
    cpu = StagePlan.build(load_spec(stage), "cpu")
    gpu = StagePlan.build(load_spec(stage), "cuda")
    assert [(c.graded.name, c.label) for c in gpu.cases] == [(c.graded.name, c.label) for c in cpu.cases]
    worst = 0.0
    for c, g in zip(cpu.cases, gpu.cases, strict=True):
        where = f"{stage} {c.graded.name} {c.label}"
        e = g.expectation
        assert len(e.values) == len(c.expectation.values), where
        for i, (on_gpu, on_cpu) in enumerate(zip(e.values, c.expectation.values, strict=True)):
            result = compare(on_gpu, on_cpu, e.tolerance, e.regions[i])
            assert result.ok, f"{where} output {i}: {result.message}"
            worst = max(worst, _share_of_tolerance(on_gpu, on_cpu, e.tolerance, e.regions[i]))
        # the same known mistakes are recognisable, with the same outputs
        assert [m for m, _ in e.variants] == [m for m, _ in c.expectation.variants], where
        for (m, on_gpu), (_, on_cpu) in zip(e.variants, c.expectation.variants, strict=True):
            for i, (a, b) in enumerate(zip(on_gpu, on_cpu, strict=True)):
                assert compare(a, b, e.tolerance, e.regions[i]).ok, f"{where} variant {m} output {i}"
    print(f"{stage}: {len(cpu.cases)} cases; worst error {worst:.3f} of the CUDA tolerance")

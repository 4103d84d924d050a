"""The public self-check data of a stage: public cases' inputs, expected outputs and the
known mistakes' outputs, as data (one safetensors file, JSON metadata). Never hidden
cases, never the reference code."""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch
import torch

from autograder.grade import StagePlan
from autograder.spec import StageSpec

FORMAT = 1


def selfcheck_file(stage: str) -> str:
    return f"{stage}.selfcheck.safetensors"


def build(spec: StageSpec) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of the stage's public self-check data, computed on the CPU."""
    plan = StagePlan.build(spec, "cpu", hidden=False)
    tensors = dict(plan.inputs)
    calls = {c.index: c for c in plan.calls}
    cases = []
    for pc in plan.cases:
        e = pc.expectation
        for k, v in enumerate(e.values):
            tensors[f"e{pc.index}.{k}"] = v.contiguous().clone()
        for k, r in enumerate(e.regions):
            if r is not None:
                tensors[f"r{pc.index}.{k}"] = r.contiguous().clone()
        variants = []
        for j, (mid, outs) in enumerate(e.variants):
            for k, v in enumerate(outs):
                tensors[f"v{pc.index}.{j}.{k}"] = v.contiguous().clone()
            variants.append(mid)
        cases.append(
            {
                "index": pc.index,
                "name": pc.graded.name,
                "group": pc.test.group,
                "label": pc.label,
                "data": calls[pc.index].data,
                "rtol": e.tolerance.rtol,
                "atol": e.tolerance.atol,
                "check_device": e.device is not None,
                "variants": variants,
                "regions": [r is not None for r in e.regions],
            }
        )
    graded = {
        g.name: {
            "task": g.task,
            "signature": g.signature,
            "outputs": list(g.outputs),
            "returns": list(g.returns_per_output()),
            "kind": g.kind,
            "driver": g.driver,
            "forbidden": list(g.forbidden),
            "hidden_groups": [t.group for t in g.tests if t.hidden],
        }
        for g in spec.graded
    }
    meta = {
        "format": FORMAT,
        "stage": spec.id,
        "title": spec.title,
        "graded": graded,
        "cases": cases,
        "misconceptions": dict(spec.misconceptions),
    }
    return tensors, {"bertlab": json.dumps(meta, sort_keys=True)}


def encode(spec: StageSpec) -> bytes:
    tensors, meta = build(spec)
    return safetensors.torch.save(tensors, metadata=meta)


def write(spec: StageSpec, directory: Path) -> Path:
    path = directory / selfcheck_file(spec.id)
    path.write_bytes(encode(spec))
    return path


def same(path: Path, spec: StageSpec) -> bool:
    """Does ``path`` hold exactly the bytes the spec gives now?"""
    return path.is_file() and path.read_bytes() == encode(spec)

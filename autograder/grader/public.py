"""The public self-check data of a stage: public cases' inputs, expected outputs and the
known mistakes' outputs, as data (one safetensors file, JSON metadata); and each graded
name's small inputs (``small``: the counterexample search's, ``grader/counterexample.py``),
the same way, with the code that makes each call. Never hidden cases, never the reference
code.

Expected and mistaken outputs are computed here, and their last bits depend on the CPU:
torch picks AVX-512, AVX2 or plain kernels (``ATEN_CPU_CAPABILITY``), oneDNN, MKL and
numpy's OpenBLAS each pick their own. So "the data is up to date" means: the inputs, every
integer and boolean, every key, dtype and shape and the metadata are the same bytes, and
the float outputs agree within the tolerance the grader applies to that very case
(:func:`differences`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import safetensors
import safetensors.torch
import torch

from autograder.grader.counterexample import call_code
from autograder.grader.plan import PlannedCase, StagePlan
from autograder.grader.runner import encode_inputs
from autograder.runtime import wire
from autograder.runtime.check import FLOAT32, at_least
from autograder.runtime.compare import Tolerance, matches
from autograder.runtime.harness import CallSpec
from autograder.runtime.selfcheck import FORMAT, one_thread
from autograder.stages.spec import StageSpec

Data = tuple[dict[str, torch.Tensor], dict[str, str]]
# e{case}.{output} expected values, v{case}.{variant}.{output} a known mistake's outputs
_OUTPUT_KEY = re.compile(r"^(?:e(\d+)|v(\d+)\.\d+)\.(\d+)$")


def selfcheck_file(stage: str) -> str:
    return f"{stage}.selfcheck.safetensors"


def _stored(t: torch.Tensor) -> torch.Tensor:
    """A copy in row-major strides: an output of one element may come with any stride (a
    slice), which ``contiguous()`` and ``clone()`` keep."""
    return t.clone(memory_format=torch.contiguous_format)


def _case(pc: PlannedCase, call: CallSpec, tensors: dict[str, torch.Tensor], index: int) -> dict:
    """One case's call and expectation as the self-check reads them; its tensors go into
    ``tensors`` under ``index`` (inputs ``c{index}.*``, expected ``e``, regions ``r``,
    variants ``v``: a variant's output that equals the expected one is not stored, and reads
    as ``e``)."""
    e = pc.expectation
    for k, v in enumerate(e.values):
        tensors[f"e{index}.{k}"] = _stored(v)
    for k, r in enumerate(e.regions):
        if r is not None:
            tensors[f"r{index}.{k}"] = _stored(r)
    variants = []
    for j, (mid, outs) in enumerate(e.variants):
        for k, v in enumerate(outs):
            # an output a mistake leaves right (the running mean of a BatchNorm whose variance
            # is wrong, a GPT's cached flag) is the expected one: not stored twice
            if not (
                v.dtype == e.values[k].dtype and v.shape == e.values[k].shape and torch.equal(v, e.values[k])
            ):
                tensors[f"v{index}.{j}.{k}"] = _stored(v)
        variants.append(mid)
    return {
        **CallSpec.to_json(call),  # the call, as the grading child's plan holds it
        "group": pc.test.group,
        "label": pc.label,
        "rtol": e.tolerance.rtol,
        "atol": e.tolerance.atol,
        "check_device": e.device is not None,
        "variants": variants,
        "regions": [r is not None for r in e.regions],
        "credit": list(e.credit) if e.credit else None,
    }


def _small(plan: StagePlan, first: int, tensors: dict[str, torch.Tensor]) -> list[dict]:
    """The small inputs of every graded name, numbered from ``first`` on (after the public
    cases), each with its place in its name's order, its size and the code of its call."""
    calls = {c.index: c for c in plan.rung_calls}
    out = []
    for n, pc in enumerate(plan.rungs):
        index, call, rung = first + n, calls[pc.index], pc.rung
        assert rung is not None
        data = {k: wire.decode(v, plan.rung_inputs) for k, v in call.data.items()}
        skeletons, inputs = encode_inputs([(index, data)])
        tensors |= inputs
        # the notebook watches its small inputs for forbidden calls too (the grader's run
        # leaves them unwatched: what a small input shows earns nothing)
        moved = dataclasses.replace(call, index=index, data=skeletons[index], forbidden=pc.graded.forbidden)
        code = call_code(pc.graded, rung.data)
        out.append({**_case(pc, moved, tensors, index), "rank": rung.rank, "size": rung.size, "code": code})
    return out


def build(spec: StageSpec) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of the stage's public self-check data, computed on the CPU, on
    one thread (beside two busy cores a thread pool made 10's and 12's take 2.4x as long)."""
    with one_thread():
        plan = StagePlan.build(spec, "cpu", hidden=False)
        tensors = dict(plan.inputs)
        calls = {c.index: c for c in plan.calls}
        cases = [_case(pc, calls[pc.index], tensors, pc.index) for pc in plan.cases]
        small = _small(plan, len(plan.cases), tensors)
    graded = {
        g.name: {
            "task": g.task,
            "signature": g.signature,
            "returns": list(g.returns_per_output()),
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
        "small": small,
    }
    return tensors, {"bertlab": json.dumps(meta, sort_keys=True)}


def encode(spec: StageSpec) -> bytes:
    tensors, meta = build(spec)
    return safetensors.torch.save(tensors, metadata=meta)


def read(path: Path) -> Data:
    """(tensors, metadata) of a self-check file, as :func:`build` returns them."""
    with safetensors.safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def _bits(t: torch.Tensor) -> torch.Tensor:
    return _stored(t).reshape(-1).view(torch.uint8)


def _resolved(tensors: dict[str, torch.Tensor], cases: dict[int, dict]) -> dict[str, torch.Tensor]:
    """``tensors`` with every variant output that is not stored read as the expected one."""
    out = dict(tensors)
    for i, case in cases.items():
        for j in range(len(case.get("variants", []))):
            for k in range(len(case.get("outputs", []))):
                if f"v{i}.{j}.{k}" not in out and f"e{i}.{k}" in out:
                    out[f"v{i}.{j}.{k}"] = out[f"e{i}.{k}"]
    return out


def _variant_id(case: dict, key: str) -> str | None:
    j = int(key.split(".")[1])
    variants = case.get("variants", [])
    return variants[j] if j < len(variants) else None


def differences(have: Data, want: Data) -> list[str]:
    """What a student could notice between two versions of a stage's self-check data, one
    line each; [] when they are the same data. Float expected and mistaken outputs may
    differ within their case's tolerance (rtol/atol as stored for that case, the grader's
    own), inside the graded region; everything else must be the same bits."""
    (tensors, meta), (want_tensors, want_meta) = have, want
    out = []
    if meta != want_meta:
        out += _meta_differences(meta, want_meta)
    try:
        wanted = json.loads(want_meta["bertlab"])
        cases = {c["index"]: c for c in [*wanted["cases"], *wanted.get("small", [])]}
    except (KeyError, TypeError, ValueError):
        cases = {}
    # a variant's output left unstored is its expected one (``_case``): compared as such, since
    # where it equals the expected bits on one CPU it may not on another
    tensors, want_tensors = _resolved(tensors, cases), _resolved(want_tensors, cases)
    for key in sorted(tensors.keys() - want_tensors.keys()):
        out.append(f"{key}: not expected")
    for key in sorted(want_tensors.keys() - tensors.keys()):
        out.append(f"{key}: missing")
    for key in sorted(tensors.keys() & want_tensors.keys()):
        got, expected = tensors[key], want_tensors[key]
        if got.dtype != expected.dtype or got.shape != expected.shape:
            want = f"{expected.dtype} {tuple(expected.shape)}"
            out.append(f"{key}: {got.dtype} {tuple(got.shape)} where {want} is expected")
            continue
        if torch.equal(_bits(got), _bits(expected)):
            continue
        m = _OUTPUT_KEY.match(key)
        case = cases.get(int(m[1] or m[2])) if m else None
        if case is None or not expected.is_floating_point():
            out.append(f"{key}: {expected.dtype} {tuple(expected.shape)} differs (must be the same bits)")
            continue
        tol = Tolerance(case["rtol"], case["atol"])
        if m[2] is not None and _variant_id(case, key) == FLOAT32:  # values computed in float32
            tol = at_least(tol, torch.float32, "cpu")
        region = want_tensors.get(f"r{case['index']}.{m[3]}")
        if not matches(got, expected, tol, region):
            worst = (got.double() - expected.double()).abs().nan_to_num(nan=float("inf")).max().item()
            out.append(
                f"{key}: differs beyond the case's tolerance (atol={tol.atol:g}, rtol={tol.rtol:g}): "
                f"max abs difference {worst:.3g}"
            )
    return out


def _meta_differences(meta: dict[str, str], want: dict[str, str]) -> list[str]:
    try:
        a, b = json.loads(meta["bertlab"]), json.loads(want["bertlab"])
    except (KeyError, TypeError, ValueError):
        return ["metadata differs"]
    keys = sorted(a.keys() | b.keys())
    listed = {"cases": "case", "small": "small input"}
    out = [f"metadata differs: {k}" for k in keys if k not in listed and a.get(k) != b.get(k)]
    for key in listed:
        if not isinstance(a.get(key), list) or not isinstance(b.get(key), list):
            out.append(f"metadata differs: {key}")
        elif len(a[key]) != len(b[key]):
            out.append(f"metadata differs: {len(a[key])} {key} where {len(b[key])} are expected")
        else:
            for n, (x, y) in enumerate(zip(a[key], b[key], strict=True)):
                if x != y:
                    what = f" ({y.get('name')}/{y.get('label')})" if isinstance(y, dict) else ""
                    out.append(f"metadata differs: {listed[key]} {n}{what}")
    return out or ["metadata differs"]


def write(spec: StageSpec, directory: Path) -> Path:
    """Write the stage's data into ``directory``; a file already there that holds the same
    data (:func:`differences`) is kept, so regenerating on a machine with other CPU
    kernels leaves the committed file alone instead of churning its last bits."""
    path = directory / selfcheck_file(spec.id)
    data = build(spec)
    if same_data(path, data):
        return path
    path.write_bytes(safetensors.torch.save(data[0], metadata=data[1]))
    return path


def same_data(path: Path, data: Data) -> bool:
    """Does ``path`` hold ``data`` (:func:`differences`: floats within tolerance)?"""
    if not path.is_file():
        return False
    try:
        have = read(path)
    except (safetensors.SafetensorError, OSError, ValueError):
        return False
    return not differences(have, data)


def same(path: Path, spec: StageSpec) -> bool:
    """Does ``path`` hold the data the spec gives now, on this machine's CPU kernels?"""
    return same_data(path, build(spec))

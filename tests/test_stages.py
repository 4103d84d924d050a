"""Properties every stage spec must have, parametrized over all stages (no per-stage copies)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from autograder.grader.notebooks import generate_stage
from autograder.grader.plan import StagePlan
from autograder.runtime.check import FLOAT32, check_case
from autograder.stages import all_specs, stage_ids
from autograder.stages.spec import LARGE, build_case, small_cases
from tests.support import ROOT

SPECS = {s.id: s for s in all_specs()}


@pytest.fixture(scope="module", params=stage_ids())
def plan(request):
    return StagePlan.build(SPECS[request.param], "cpu")


def _items(outputs, kinds):
    """The reference's outputs as the child would describe them, with the kinds the spec names."""
    kinds = [kinds] * len(outputs) if isinstance(kinds, str) else kinds
    return [
        (kind, t, {"device": "cpu", "dtype": str(t.dtype), "type": "torch.Tensor"})
        for t, kind in zip(outputs, kinds, strict=True)
    ]


def test_reference_passes_its_own_cases(plan):
    for pc in plan.cases:
        result = check_case(
            pc.label, "ok", {}, _items(pc.expectation.values, pc.expectation.returns), pc.expectation, {}
        )
        assert result.passed, (pc.graded.name, pc.label, result.message)


def test_every_misconception_has_a_variant_and_is_named(plan):
    spec = plan.spec
    named: set[str] = set()
    for pc in plan.cases:
        for mid, outs in pc.expectation.variants:
            if mid == FLOAT32:  # the generic float32-intermediates (tests/test_structural_mistakes.py)
                continue
            result = check_case(
                pc.label, "ok", {}, _items(outs, pc.expectation.returns), pc.expectation, spec.misconceptions
            )
            if not result.passed:
                named.update(result.misconceptions)
    declared = set(spec.misconceptions)
    with_variants = {v.misconception for g in spec.graded for v in g.variants}
    assert with_variants == declared
    assert named == declared, f"never diagnosed: {declared - named}"


def test_no_variant_passes_every_case(plan):
    """Each known mistake is distinguishable from the reference on some case of its name."""
    by_variant: dict[tuple[str, str], bool] = {}
    for pc in plan.cases:
        for mid, outs in pc.expectation.variants:
            if mid == FLOAT32:
                continue
            ok = check_case(
                pc.label, "ok", {}, _items(outs, pc.expectation.returns), pc.expectation, {}
            ).passed
            key = (pc.graded.name, mid)
            by_variant[key] = by_variant.get(key, True) and ok
    assert not any(by_variant.values()), [k for k, v in by_variant.items() if v]


@pytest.mark.parametrize("stage", stage_ids())
def test_cases_are_deterministic(stage):
    a, b = StagePlan.build(SPECS[stage], "cpu"), StagePlan.build(SPECS[stage], "cpu")
    assert a.inputs.keys() == b.inputs.keys()
    assert all(torch.equal(a.inputs[k], b.inputs[k]) for k in a.inputs)
    assert [c.data for c in a.calls] == [c.data for c in b.calls]


@pytest.mark.parametrize("stage", stage_ids())
def test_every_name_has_public_and_hidden_cases_in_both_float_dtypes(stage):
    for g in SPECS[stage].graded:
        assert any(not t.hidden for t in g.tests), g.name
        assert any(t.hidden for t in g.tests), g.name
        floats = {t.dtype for t in g.tests if t.dtype.is_floating_point}
        torch_outputs = "tensor" in g.returns_per_output()
        if floats and torch_outputs:
            assert floats == {torch.float32, torch.float64}, g.name
        elif floats:  # a numpy stage works in float64 (CURRICULUM.md, 04_word2vec)
            assert torch.float64 in floats, g.name


def _is_default(value, default) -> bool:
    if isinstance(value, torch.Tensor | np.ndarray):
        return False
    return value is default or (type(value) is type(default) and value == default)


@pytest.mark.parametrize("stage", stage_ids())
def test_every_optional_parameter_is_left_out_by_a_case_and_moved_by_another(stage):
    """A default is graded only by a call that omits it, and the parameter only by a call
    that moves it away from its default. A driver calls the student's code by its own
    protocol, which its stage's tests check."""
    spec = SPECS[stage]
    for g in spec.graded:
        if g.kind == "driver":
            continue
        cases = [build_case(spec, g, t, c) for t in g.tests for c in t.cases]
        if g.kind == "module":
            calls = [
                (g.reference.__init__, "init_args", "init_kwargs"),
                (g.reference.forward, "args", "kwargs"),
            ]
        else:
            calls = [(g.reference, "args", "kwargs")]
        for fn, args_field, kwargs_field in calls:
            params = list(inspect.signature(fn).parameters.values())[1 if g.kind == "module" else 0 :]
            for i, p in enumerate(params):
                if p.default is inspect.Parameter.empty:
                    continue
                left_out = moved = False
                for data in cases:
                    args, kwargs = getattr(data, args_field), getattr(data, kwargs_field)
                    if i < len(args) and p.kind is not inspect.Parameter.KEYWORD_ONLY:
                        moved |= not _is_default(args[i], p.default)
                    elif p.name in kwargs:
                        moved |= not _is_default(kwargs[p.name], p.default)
                    else:
                        left_out = True
                assert left_out, f"{g.name}: no case leaves {p.name} at its default ({p.default!r})"
                assert moved, f"{g.name}: no case passes {p.name} other than its default ({p.default!r})"


def _axes(value, path: str, out: dict[tuple[str, int], int]) -> None:
    """Each input axis's size, by (where it is, which axis): a tensor's or array's axes, and
    the length of a list of indices (negatives, a window)."""
    if isinstance(value, torch.Tensor | np.ndarray):
        for axis, size in enumerate(value.shape):
            out[(path, axis)] = int(size)
    elif isinstance(value, list | tuple) and value and all(type(v) is int for v in value):
        out[(f"{path} (length)", 0)] = len(value)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _axes(v, f"{path}[{i}]", out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _axes(v, f"{path}[{k!r}]", out)


@pytest.mark.parametrize("stage", stage_ids())
def test_every_size_dimension_is_one_in_some_graded_case(stage):
    """Code that squeezes, broadcasts or indexes a size-1 axis wrongly passes every larger
    case: each dimension the contract lets be 1 is 1 in a graded case (``Graded.dims``), and
    every axis of every input is a declared dimension, 1, or the same size in every case."""
    spec = SPECS[stage]
    for g in spec.graded:
        cases = [build_case(spec, g, t, c) for t in g.tests for c in t.cases]
        seen: dict[tuple[str, int], set[int]] = {}
        undeclared: dict[tuple[str, int], set[int]] = {}
        ones = {d.name: False for d in g.dims}
        for data in cases:
            sizes = {d.name: d.size(data) for d in g.dims}
            for name, size in sizes.items():
                ones[name] |= size == 1
            axes: dict[tuple[str, int], int] = {}
            for i, arg in enumerate(data.args):
                _axes(arg, f"args[{i}]", axes)
            for k, arg in data.kwargs.items():
                _axes(arg, f"kwargs[{k!r}]", axes)
            for key, size in axes.items():
                seen.setdefault(key, set()).add(size)
                if size != 1 and size not in sizes.values():
                    undeclared.setdefault(key, set()).add(size)
        loose = {k: sorted(v) for k, v in undeclared.items() if len(seen[k]) > 1}
        assert not loose, f"{g.name}: input axes that are no declared dimension (Graded.dims): {loose}"
        never = [d.name for d in g.dims if d.never_one is None and not ones[d.name]]
        assert not never, f"{g.name}: no graded case has {never} = 1"


def _largest(data) -> float:
    values: list[torch.Tensor] = []

    def walk(v) -> None:
        if isinstance(v, torch.Tensor | np.ndarray):
            t = torch.as_tensor(v)
            if t.is_floating_point() and t.numel():
                values.append(
                    t[torch.isfinite(t)].abs().max() if torch.isfinite(t).any() else t.new_zeros(())
                )
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk((data.args, dict(data.kwargs)))
    return max((float(v) for v in values), default=0.0)


@pytest.mark.parametrize("stage", stage_ids())
def test_small_inputs_climb_to_the_graded_magnitudes(stage):
    """A failure only large values show (an unstable softmax, 0 * log 0 = NaN) has a public
    counterexample: a name's small inputs reach half its graded cases' largest input value,
    or half of ``LARGE``, unless the spec says why not (``Graded.small_magnitude``)."""
    spec = SPECS[stage]
    for g in spec.graded:
        if g.small_magnitude or not g.small:
            continue
        graded = max(_largest(build_case(spec, g, t, c)) for t in g.tests for c in t.cases)
        small = max(_largest(sc.data) for sc in small_cases(spec, g))
        assert small >= min(graded, LARGE) / 2, (
            f"{g.name}: small inputs reach {small:g}, graded ones {graded:g}"
        )


@pytest.mark.parametrize("stage", stage_ids())
def test_student_material_is_in_sync(stage):
    assert generate_stage(stage, check=True) == [], "run `make generate`"


@pytest.mark.parametrize("stage", stage_ids())
def test_solution_scores_full_marks(stage, grader):
    result = grader.grade(ROOT / "solutions" / stage, [stage])
    failed = [t.output for s in result.stages for t in s.tests if not t.passed]
    assert result.score == result.max_score == SPECS[stage].max_score, failed
    assert not result.stages[0].notes


@pytest.mark.parametrize("stage", stage_ids())
def test_untouched_assignment_scores_zero_and_says_not_implemented(stage, grader):
    result = grader.grade(ROOT / "assignments" / stage, [stage])
    assert result.score == 0
    for t in result.stages[0].tests:
        assert all("not implemented yet" in c.message for c in t.cases), t.output


def _execute(path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    return nb


def _texts(nb) -> list[str]:
    out = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            if o.output_type == "error":
                out.append(f"ERROR {o.ename}: {o.evalue}")
            else:
                data = o.get("data", {})
                out.append(o.get("text", "") or data.get("text/plain", ""))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("stage", stage_ids())
def test_notebooks_run_in_a_kernel_and_self_checks_report(stage):
    """Run All works for a student before and after they solve it; the self-check agrees."""
    solved = _texts(_execute(ROOT / "solutions" / stage / f"{stage}.ipynb"))
    assert not [t for t in solved if t.startswith("ERROR")], solved
    reports = [t for t in solved if "public cases pass" in t]
    assert len(reports) == len(SPECS[stage].graded)
    assert all(
        t.split(":", 1)[1].split()[0].split("/")[0] == t.split(":", 1)[1].split()[0].split("/")[1]
        for t in reports
    ), reports
    fresh = _texts(_execute(ROOT / "assignments" / stage / f"{stage}.ipynb"))
    assert not [t for t in fresh if t.startswith("ERROR")], fresh
    assert any("not implemented yet" in t for t in fresh)

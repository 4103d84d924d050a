"""Expected values, planned once per (stage, device): the trusted side's half of a case.

A ``StagePlan`` holds a stage's seeded case inputs (encoded for the child: the public
calls' and, apart, the hidden ones'), the reference's expected outputs and, computed when
a failing submission first needs them, every misconception variant's outputs. One plan
serves every submission of a grading run; only this process ever sees expected values.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import safetensors.torch
import torch
from torch import Tensor

from autograder.grader.runner import (
    MIN_RETURN_BYTES,
    Planned,
    encode_inputs,
)
from autograder.runtime.check import FLOAT32, Expectation
from autograder.runtime.compare import tolerance_for
from autograder.runtime.harness import invoke, split_outputs
from autograder.stages import load_spec
from autograder.stages.spec import Case, CaseData, Graded, StageSpec, Test, build_case, small_cases


def _data_dict(data: CaseData) -> dict[str, Any]:
    return {
        "args": data.args,
        "kwargs": dict(data.kwargs),
        "init_args": data.init_args,
        "init_kwargs": dict(data.init_kwargs),
        "state": dict(data.state) if data.state else None,
    }


def _on(value: Any, device: str) -> Any:
    """A deep copy of a case value with tensors on ``device`` (the reference may not mutate cases)."""
    if isinstance(value, Tensor):
        return value.to(device, copy=True)
    if isinstance(value, tuple):
        return tuple(_on(v, device) for v in value)
    if isinstance(value, list):
        return [_on(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _on(v, device) for k, v in value.items()}
    return value


# The reference and its variants run one at a time in this process. torch's global random
# generator is one per process: a driver seeds it and draws from it (10's sample under global
# seeds 1 and 2, whose `sampling-ignores-generator` variant is exactly those draws), and any
# module built meanwhile (nn.Linear's init, in another batch worker's plan) would take draws
# from between the seed and the sample: the variant's tokens, and so the named mistake,
# changed with what else the process was doing.
_TRUSTED = threading.RLock()
_SMALL = threading.Lock()  # a plan's small inputs are made once, whichever thread asks first


def run_trusted(
    fn: Any,
    graded: Graded,
    data: CaseData,
    device: str,
    spec: StageSpec | None = None,
    replaces: str | None = None,
) -> list[Tensor]:
    """Outputs of the reference (or a variant) on one case, as CPU tensors. A driver runs
    on the stage's reference names, with ``fn`` in place of ``replaces`` (default: the
    graded name), and on those of the stages it uses (11's drivers build 09's BertModel,
    as the child finds the student's own in the notebook's namespace)."""
    namespace = None
    if graded.kind == "driver":
        if spec is None:
            raise ValueError(f"{graded.name}: a driver needs the stage's reference names")
        stages = (*(load_spec(s) for s in spec.uses), spec)
        namespace = {g.name: g.reference for s in stages for g in s.graded} | {replaces or graded.name: fn}
        fn = namespace[graded.name]
    with _TRUSTED:
        result = invoke(fn, graded.kind, _on(_data_dict(data), device), device, namespace, graded.driver)
    outs = []
    for item in split_outputs(result, graded.outputs):
        if isinstance(item, Tensor):
            outs.append(item.detach().cpu())
        else:
            outs.append(torch.as_tensor(item).cpu())
    return outs


def _in_float32(value: Any) -> Any:
    """A case value with its float64 tensors, arrays and dtypes in float32."""
    if isinstance(value, Tensor):
        return value.float() if value.dtype == torch.float64 else value
    if isinstance(value, np.ndarray):
        return value.astype(np.float32) if value.dtype == np.float64 else value
    if isinstance(value, torch.dtype):
        return torch.float32 if value == torch.float64 else value
    if isinstance(value, tuple | list):
        return type(value)(_in_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: _in_float32(v) for k, v in value.items()}
    return value


def in_float32(data: CaseData) -> CaseData:
    return CaseData(
        args=_in_float32(data.args),
        kwargs=_in_float32(dict(data.kwargs)),
        init_args=_in_float32(data.init_args),
        init_kwargs=_in_float32(dict(data.init_kwargs)),
        state=_in_float32(dict(data.state)) if data.state else data.state,
    )


class LazyVariants(Sequence[tuple[str, list[Tensor]]]):
    """The misconception variants' outputs on one case, as (misconception id, outputs),
    computed the first time a failing submission needs them: most submissions pass most
    cases, and a class's grading starts sooner without them (09's plan: 1.9 -> 0.6 s).
    Computed at most once; a variant that does not apply to the case (ValueError) is left out.

    A case graded in float64 also gets ``check.FLOAT32``: the reference's outputs on its inputs
    in float32, cast back to float64, for ``check_case`` to name float32 intermediates."""

    def __init__(
        self,
        graded: Graded,
        data: CaseData,
        device: str,
        spec: StageSpec,
        lower: bool = False,
        stored: Sequence[tuple[str, list[Tensor]]] | None = None,
    ) -> None:
        """``stored``: the outputs computed at install (``grader/expected.py``): none is run."""
        self._case: tuple[Graded, CaseData, str, StageSpec] | None = (graded, data, device, spec)
        self._lower = lower
        self._outputs: tuple[tuple[str, list[Tensor]], ...] = ()
        if stored is not None:
            self._outputs, self._case = tuple((m, list(o)) for m, o in stored), None
        self._lock = threading.Lock()  # batch workers are threads sharing one plan

    @property
    def computed(self) -> bool:
        """Whether the outputs are in hand (stored, or computed already)."""
        return self._case is None

    def _computed(self) -> tuple[tuple[str, list[Tensor]], ...]:
        if self._case is None:
            return self._outputs
        with self._lock:
            if self._case is None:
                return self._outputs
            graded, data, device, spec = self._case
            outputs = []
            for variant in graded.variants:
                try:
                    outputs.append(
                        (
                            variant.misconception,
                            run_trusted(variant.fn, graded, data, device, spec, variant.replaces),
                        )
                    )
                except ValueError:
                    continue
            if self._lower:
                outputs += self._float32(graded, data, device, spec)
            self._outputs, self._case = tuple(outputs), None
        return self._outputs

    @staticmethod
    def _float32(
        graded: Graded, data: CaseData, device: str, spec: StageSpec
    ) -> list[tuple[str, list[Tensor]]]:
        try:
            outs = run_trusted(graded.reference, graded, in_float32(data), device, spec)
        except (ValueError, TypeError, RuntimeError):  # a reference that takes float64 alone
            return []
        if not any(o.dtype == torch.float32 for o in outs):
            return []
        return [(FLOAT32, [o.double() if o.dtype == torch.float32 else o for o in outs])]

    def __len__(self) -> int:
        return len(self._computed())

    def __getitem__(self, i):  # type: ignore[override]
        return self._computed()[i]


@dataclass(frozen=True, eq=False)
class Rung:
    """A small input's place among its name's (``spec.small_cases``): 1-based rank, smallest
    first, its size, and its data (what ``counterexample.call_code`` writes as the call)."""

    rank: int
    size: int
    data: CaseData


@dataclass
class PlannedCase:
    index: int
    graded: Graded
    test: Test
    label: str
    expectation: Expectation | None  # None in an outline (``StagePlan.outline``)
    rung: Rung | None = None  # a small input (``StagePlan.rungs``), not a graded case


def _fixed(data: CaseData):
    def build(g: Any, dtype: Any) -> CaseData:
        return data

    return build


def small_tests(spec: StageSpec, graded: Graded) -> list[tuple[Test, Rung]]:
    """``graded``'s small inputs, smallest first, each as a public test of one case."""
    out = []
    for rank, sc in enumerate(small_cases(spec, graded) if graded.small else (), start=1):
        test = Test(sc.label, sc.dtype, (Case(sc.label, _fixed(sc.data)),), points=1.0, hidden=False)
        out.append((test, Rung(rank, sc.size, sc.data)))
    return out


# A small input runs in milliseconds (a 09 call still builds and loads MiniLM, about a
# second): a call gets a fifth of its stage's limit, at least RUNG_CALL_S but never more than
# the grading run's own (a small input is no slower than a graded one).
RUNG_CALL_S = 2.0


def rung_call_s(spec: StageSpec, call_s: float | None) -> float:
    """The time limit of one small input's call, given the grading run's (None: the spec's)."""
    stage_call_s = call_s or spec.call_timeout_s
    return min(stage_call_s, max(RUNG_CALL_S, stage_call_s / 5))


@dataclass
class StagePlan:
    spec: StageSpec
    device: str
    cases: list[PlannedCase]
    calls: list[Planned]  # public calls first, then hidden ones (each group in spec order)
    inputs: dict[str, Tensor]  # the public calls' inputs
    hidden_inputs: dict[str, Tensor] = field(default_factory=dict)
    # Makes every graded name's small inputs (``spec.small_cases``), numbered after the
    # graded cases: public, never scored, run only to find a failing name's counterexample
    # (``grader/counterexample.py``), unwatched (no forbidden calls: they earn nothing).
    # Made when first asked for (``rungs``): a cold grade of passing code never builds them.
    small: Any = field(default=None, repr=False)

    @property
    def _small(self) -> tuple[list[PlannedCase], list[Planned], dict[str, Tensor]]:
        made = self.__dict__.get("_small_made")
        if made is None:
            with _SMALL:
                made = self.__dict__.get("_small_made")
                if made is None:
                    made = self.small() if self.small is not None else ([], [], {})
                    self.__dict__["_small_made"] = made
        return made

    @property
    def rungs(self) -> list[PlannedCase]:
        return self._small[0]

    @property
    def rung_calls(self) -> list[Planned]:
        return self._small[1]

    @property
    def rung_inputs(self) -> dict[str, Tensor]:
        return self._small[2]

    @cached_property
    def inputs_file(self) -> bytes:
        """The public inputs as one safetensors file, serialised once for every submission."""
        return safetensors.torch.save(self.inputs)

    @cached_property
    def hidden_file(self) -> bytes:
        """The hidden inputs, likewise: a child receives them after its public calls."""
        return safetensors.torch.save(self.hidden_inputs)

    @cached_property
    def rung_file(self) -> bytes:
        """The small inputs' tensors, likewise (a failing submission's child reads them)."""
        return safetensors.torch.save(self.rung_inputs)

    @classmethod
    def outline(cls, spec: StageSpec, device: str) -> StagePlan:
        """The cases of ``spec``, no more: enough to score a stage that runs nothing (no
        file handed in, a file that cannot be read), without building an input or running
        the reference: an empty submission, or one stage of nine, costs no expected values."""
        cases = [
            PlannedCase(index, graded, test, case.label, None)
            for index, (graded, test, case) in enumerate(
                (g, t, c) for g in spec.graded for t in g.tests for c in t.cases
            )
        ]
        return cls(spec, device, cases, [], {})

    @classmethod
    def build(
        cls,
        spec: StageSpec,
        device: str,
        hidden: bool = True,
        stored: Mapping[int, Sequence[Tensor]] | None = None,
        stored_variants: Mapping[int, Sequence[tuple[str, list[Tensor]]]] | None = None,
        small: bool = True,
    ) -> StagePlan:
        """Cases of ``spec`` (public only unless ``hidden``) with their expected outputs:
        the reference's, run now, or ``stored[case index]`` (``grader/expected.py``, which
        checks that they were computed from these very inputs), and likewise the named
        mistakes' outputs (``stored_variants``; a case without any computes them when first
        needed). ``small``: the graded names' small inputs too (``rungs``)."""
        cases, items = [], []
        index = 0

        def planned(
            graded: Graded, test: Test, case: Case, data: CaseData, rung: Rung | None, use_stored: bool = True
        ) -> PlannedCase:
            expected = (
                list(stored[index])
                if stored is not None and use_stored
                else run_trusted(graded.reference, graded, data, device, spec)
            )
            # float32 intermediates show only in float outputs (tokens, masks: none)
            lower = test.dtype == torch.float64 and any(v.is_floating_point() for v in expected)
            kept = None if stored_variants is None or not use_stored else stored_variants.get(index)
            variants = LazyVariants(graded, data, device, spec, lower=lower, stored=kept)
            regions = graded.graded_region(data) if graded.graded_region else (None,) * len(graded.outputs)
            has_tensor = any(isinstance(a, Tensor) for a in (*data.args, *data.kwargs.values()))
            expectation = Expectation(
                name=graded.name,
                signature=graded.signature,
                outputs=graded.outputs,
                returns=graded.returns_per_output(),
                values=expected,
                regions=[None if r is None else r.cpu() for r in regions],
                tolerance=(
                    graded.tolerance(data, test.dtype, device)
                    if graded.tolerance
                    else tolerance_for(test.dtype, device)
                ),
                device=device if graded.check_device and has_tensor else None,
                variants=variants,
                credit=graded.credit,
            )
            return PlannedCase(index, graded, test, case.label, expectation, rung)

        for graded in spec.graded:
            for test in graded.tests:
                if test.hidden and not hidden:
                    continue
                for case in test.cases:
                    data = build_case(spec, graded, test, case)
                    cases.append(planned(graded, test, case, data, None))
                    items.append((index, _data_dict(data), test.hidden))
                    index += 1
        # the kinds of input travel apart: a child gets the hidden ones only after it has
        # answered every public case (runner.run_submission), the small ones only if asked
        skeletons, inputs = encode_inputs([(i, d) for i, d, h in items if not h])
        hidden_skeletons, hidden_inputs = encode_inputs([(i, d) for i, d, h in items if h])
        skeletons |= hidden_skeletons
        calls = [_call(pc, skeletons[pc.index], pc.graded.forbidden) for pc in cases]
        calls.sort(key=lambda c: c.hidden)  # stable: spec order within each kind
        first = index

        def make_small(use_stored: bool = True) -> tuple[list[PlannedCase], list[Planned], dict[str, Tensor]]:
            """``use_stored``: False runs the reference on each even where stored values were given."""
            nonlocal index
            index, rungs, data = first, [], []
            for graded in spec.graded:
                for test, rung in small_tests(spec, graded):
                    rungs.append(planned(graded, test, test.cases[0], rung.data, rung, use_stored))
                    data.append((index, _data_dict(rung.data)))
                    index += 1
            rung_skeletons, rung_inputs = encode_inputs(data)
            rung_calls = [_call(pc, rung_skeletons[pc.index], ()) for pc in rungs]
            return rungs, rung_calls, rung_inputs

        return cls(spec, device, cases, calls, inputs, hidden_inputs, make_small if small else None)


def _call(pc: PlannedCase, skeleton: dict, forbidden: tuple[str, ...]) -> Planned:
    assert pc.expectation is not None
    return Planned(
        pc.index,
        pc.graded.name,
        pc.graded.kind,
        pc.graded.outputs,
        forbidden,
        skeleton,
        pc.graded.driver,
        hidden=pc.test.hidden,
        max_return_bytes=max(MIN_RETURN_BYTES, 16 * sum(v.nbytes for v in pc.expectation.values)),
    )

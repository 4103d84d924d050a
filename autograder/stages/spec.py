"""The stage spec: the single source of truth for what a stage grades.

A stage module under ``autograder/stages/`` defines one ``SPEC = StageSpec(...)``. Public
self-check data, hidden cases, Gradescope entries, points and messages all derive from it.
Specs are data: builders and variants are small functions, nothing runs at import.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

# the spec's vocabulary for tolerances; they live with the comparison that applies them
from autograder.runtime.compare import CUDA_TOLERANCES, DEFAULT_TOLERANCES, Tolerance, tolerance_for  # noqa: F401


@dataclass(frozen=True)
class CaseData:
    """What one call of a graded name receives.

    For a function: ``fn(*args, **kwargs)``. For a module: ``cls(*init_args, **init_kwargs)``,
    then ``load_state_dict(state)``, then ``module(*args, **kwargs)`` in eval mode.
    Values may be tensors, numpy arrays, None/bool/int/float/str and lists, tuples and
    str-keyed dicts of those.
    """

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    init_args: tuple[Any, ...] = ()
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Tensor] | None = None


Builder = Callable[[torch.Generator, torch.dtype], CaseData]
ReturnKind = Literal["tensor", "ndarray", "scalar"]


@dataclass(frozen=True)
class Case:
    """One seeded input. The seed comes from (stage, name, group, label), so a case is the
    same on every machine and every run, and renaming a case changes its data."""

    label: str
    build: Builder


@dataclass(frozen=True)
class Test:
    """One Gradescope entry: a graded name on a group of cases of one dtype."""

    group: str
    dtype: torch.dtype
    cases: tuple[Case, ...]
    points: float
    hidden: bool = True
    partial_credit: bool = True


@dataclass(frozen=True)
class Variant:
    """A known mistake, written as a small function of the reference with the graded
    name's signature. Several variants may share one misconception id."""

    misconception: str
    fn: Callable[..., Any]
    # For a driver: the name of the stage the variant stands in for, when the mistake lives
    # in another name than the graded one (e.g. a BertModel that ignores its mask, seen
    # through load_pretrained's driver). Default: the graded name.
    replaces: str | None = None


@dataclass(frozen=True)
class Graded:
    """A name the student implements."""

    name: str
    task: int
    signature: str
    outputs: tuple[str, ...]
    reference: Callable[..., Any]
    tests: tuple[Test, ...]
    kind: Literal["function", "module", "driver"] = "function"
    # One kind for every output, or one per output: ("scalar", "ndarray", "ndarray").
    returns: ReturnKind | tuple[ReturnKind, ...] = "tensor"
    forbidden: tuple[str, ...] = ()  # fnmatch patterns of aten op names, e.g. "aten::_softmax"
    variants: tuple[Variant, ...] = ()
    # Which elements of each output are graded (None = all); e.g. rows of attention in
    # which every key is masked are not graded.
    graded_region: Callable[[CaseData], tuple[Tensor | None, ...]] | None = None
    # Outputs must be on the inputs' device; off for names that take no tensor.
    check_device: bool = True
    # kind="driver": "module:function" in autograder/runtime/drivers/, a small program that
    # exercises the graded name (and others of the student's namespace) when one call
    # cannot: a backward pass on the student's own forward cache, state updated in place,
    # build-load-run. See autograder/runtime/drivers/__init__.py.
    driver: str | None = None
    # A tolerance that depends on the case (e.g. on the size of an angle) instead of the
    # dtype's default: (case data, dtype, device) -> Tolerance.
    tolerance: Callable[[CaseData, torch.dtype, str], Tolerance] | None = None
    # The CURRICULUM.md clause every test of this name checks ("01.softmax"): the results
    # tag their tests with it, and tests/test_curriculum.py holds the two files together.
    # None only for a stage defined outside bertlab's own (a toy under tests/).
    clause: str | None = None

    def returns_per_output(self) -> tuple[str, ...]:
        if isinstance(self.returns, str):
            return (self.returns,) * len(self.outputs)
        return tuple(self.returns)

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tests)


@dataclass(frozen=True)
class StageSpec:
    id: str  # "01_attention"
    title: str
    graded: tuple[Graded, ...]
    misconceptions: Mapping[str, str]  # id -> hint shown to the student
    call_timeout_s: float = 5.0  # per call of a graded name; cases take milliseconds
    # Earlier stages whose student code this one runs (``autograder.runtime.parts.load_stage``):
    # the grader hands the same submission's files to the child and, when this stage
    # fails, says which of them fail too.
    uses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [g.name for g in self.graded]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.id}: graded names repeat: {names}")
        for g in self.graded:
            for v in g.variants:
                if v.misconception not in self.misconceptions:
                    raise ValueError(f"{self.id}.{g.name}: unknown misconception {v.misconception}")
                if v.replaces is not None and (g.kind != "driver" or v.replaces not in names):
                    raise ValueError(f"{self.id}.{g.name}: a variant replaces a graded name, in a driver")
            if (g.kind == "driver") != (g.driver is not None):
                raise ValueError(f"{self.id}.{g.name}: kind='driver' and driver= go together")
            if not isinstance(g.returns, str) and len(g.returns) != len(g.outputs):
                raise ValueError(f"{self.id}.{g.name}: one `returns` kind per output")
            groups = [t.group for t in g.tests]
            if len(set(groups)) != len(groups):
                raise ValueError(f"{self.id}.{g.name}: test groups repeat: {groups}")
            if g.clause is not None and not g.clause.startswith(f"{self.id[:2]}."):
                raise ValueError(f"{self.id}.{g.name}: clause {g.clause!r} is not one of this stage's")

    @property
    def number(self) -> int:
        return int(self.id.split("_", 1)[0])

    @property
    def max_score(self) -> float:
        return sum(g.max_score for g in self.graded)

    def graded_name(self, name: str) -> Graded:
        for g in self.graded:
            if g.name == name:
                return g
        raise KeyError(f"{self.id} has no graded name {name!r}")


def case_seed(stage: str, name: str, group: str, label: str) -> int:
    """A 63-bit seed from the case's identity: stable across Python versions and machines."""
    digest = hashlib.sha256(f"{stage}/{name}/{group}/{label}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def build_case(spec: StageSpec, graded: Graded, test: Test, case: Case) -> CaseData:
    """Materialise a case's inputs on the CPU, deterministically."""
    g = torch.Generator().manual_seed(case_seed(spec.id, graded.name, test.group, case.label))
    return case.build(g, test.dtype)


# -- helpers for builders ---------------------------------------------------------------


def randn(g: torch.Generator, *shape: int, dtype: torch.dtype, scale: float = 1.0) -> Tensor:
    """Standard normal samples drawn in float64 then cast, so float32 and float64 cases of
    one seed hold the same numbers up to rounding."""
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def randint(g: torch.Generator, low: int, high: int, *shape: int) -> Tensor:
    return torch.randint(low, high, shape, generator=g, dtype=torch.int64)

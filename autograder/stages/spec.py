"""The stage spec: the single source of truth for what a stage grades.

A stage module under ``autograder/stages/`` defines one ``SPEC = StageSpec(...)``. Public
self-check data, hidden cases, Gradescope entries, points and messages all derive from it.
Specs are data: builders and variants are small functions, nothing runs at import.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
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
class Dim:
    """A size dimension of a graded name's inputs, as the contract names it ("B", "L_k",
    "d_model", "V", "K"): its size in a case, read from the case's data.

    Every dimension the contract lets be 1 is 1 in some graded case: code that squeezes,
    broadcasts or indexes a size-1 axis wrongly (``.squeeze()``, ``x[0]`` for a batch) passes
    every larger case. tests/test_stages.py holds each spec to it, and checks that every axis
    of every input is one of the declared dimensions (or the same size in every case)."""

    name: str
    size: Callable[[CaseData], int | None]  # None: this case has no such dimension
    never_one: str | None = None  # why the contract does not allow 1, when it does not


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
    # Counterexamples: builders of this name's smallest inputs, public by construction. When
    # a student's name fails (on a public or a hidden test), the grader and the self-check try
    # ``small_cases(spec, graded)`` (every builder here, at every value level of
    # ``SMALL_VALUES``, in each dtype of the name's tests) smallest first, and show the first
    # one on which the student's code disagrees with the reference. See ``small_cases``.
    small: tuple[Builder, ...] = ()
    # Why ``small`` is empty, when it is (every graded name of a bertlab stage has one or
    # the other: tests/test_counterexamples.py).
    no_small: str | None = None
    # Outputs that are right or wrong apart (a BatchNorm's train outputs, its running
    # statistics, its eval output): the share of a case each earns when right, one weight
    # per output. None: a case is right or wrong as a whole. Only with partial credit.
    credit: tuple[float, ...] | None = None
    # The size dimensions of its inputs (``Dim``): each is 1 in some graded case unless the
    # contract forbids it (tests/test_stages.py).
    dims: tuple[Dim, ...] = ()
    # The small inputs climb in magnitude too: their largest float reaches at least half the
    # graded cases' (capped at ``LARGE``), so that a failure only large values show
    # (an overflowing exp, 0 * log 0) has a public counterexample. Why not, when it does not.
    small_magnitude: str | None = None

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
            if g.credit is not None and (
                len(g.credit) != len(g.outputs) or min(g.credit) < 0 or not sum(g.credit)
            ):
                raise ValueError(f"{self.id}.{g.name}: one non-negative `credit` weight per output")
            if g.small and g.no_small:
                raise ValueError(f"{self.id}.{g.name}: small inputs, or a reason why there are none")

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


# -- small inputs: counterexamples ------------------------------------------------------------
#
# A counterexample is the smallest public input on which a student's graded name disagrees
# with the reference (grader/counterexample.py; the self-check ships the same inputs). Its
# candidates are ``small_cases(spec, graded)``: the name's ``small`` builders (the stage's own
# case builders at their smallest sizes), each built at every value level below and in each
# dtype the name is graded in, ordered smallest first (fewest numbers in the input, then the
# simplest values), without repeats, at most MAX_SMALL_CASES of them. That order is the
# shrinking: shapes first, then values toward small integers, so the first input that fails
# is the smallest the search knows, and a student can read it. When a name has more than
# the budget, each builder keeps its first input in each dtype and the smallest others fill
# the rest: every builder is there to show a mistake the others cannot, and a cut by size
# alone dropped a name's largest builder whole.
#
# For a new stage: give every graded name ``small=(builder, ...)`` (the builders its cases
# use, at the smallest sizes that can show each of its mistakes: 1-3 positions, a feature
# or two, two keys where a softmax must have a choice), or ``no_small="why"``. Builders draw
# their floats through ``randn`` below, so the value levels reach them for free; any other
# value (an index, a length, a mask) is the builder's own and stays valid at every level.
# Small builders must not use a hidden case's data (strings, sentences, constants): their
# inputs are shown to students.

# The value levels ``randn`` draws at while ``small_cases`` builds (the last is the builder's
# own normal samples): simple numbers first, so a counterexample is readable when it can be.
SMALL_VALUES = ("integers in [-1, 1]", "integers in [-3, 3]", "halves in [-2, 2]", "normal samples")
# Per graded name: a search is a few dozen calls of tiny inputs (it stops at the first that
# fails, so one past the first 40 costs only the names that fail on none of those); the
# largest ladder today, 01's scaled_dot_product_attention, has 56.
MAX_SMALL_CASES = 64
# ``Graded.small_magnitude``: a name's small inputs reach half its graded cases' largest float,
# or half of LARGE when those go further (past exp's overflow in float64, 709.8).
LARGE = 2000.0
_VALUE_LEVEL: ContextVar[int | None] = ContextVar("bertlab_small_values", default=None)


@contextlib.contextmanager
def small_values(level: int) -> Iterator[None]:
    """``randn`` draws at ``SMALL_VALUES[level]`` inside this block."""
    token = _VALUE_LEVEL.set(level)
    try:
        yield
    finally:
        _VALUE_LEVEL.reset(token)


@dataclass(frozen=True)
class SmallCase:
    """One candidate input of a counterexample search, in the order ``small_cases`` gives."""

    label: str  # "small input 3 of 40: builder 2, integers in [-1, 1], float64"
    dtype: torch.dtype
    data: CaseData
    size: int  # how many numbers (and words) the input holds


def _count(value: Any) -> int:
    if isinstance(value, Tensor):
        return value.numel()
    if isinstance(value, np.ndarray):
        return int(value.size)
    if isinstance(value, str):
        return max(1, len(value.split()))
    if isinstance(value, list | tuple):
        return sum(_count(v) for v in value)
    if isinstance(value, Mapping):
        return sum(_count(v) for v in value.values())
    return 0 if value is None else 1


def _fingerprint(data: CaseData) -> bytes:
    """The same bytes for the same input: repeats (a builder whose values no level changes,
    the same ints in two dtypes) are tried once."""
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, Tensor | np.ndarray):
            t = torch.as_tensor(value).detach().cpu().contiguous()
            digest.update(f"{type(value).__name__}{t.dtype}{tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, list | tuple):
            digest.update(f"{type(value).__name__}{len(value)}(".encode())
            for v in value:
                feed(v)
            digest.update(b")")
        elif isinstance(value, Mapping):
            digest.update(f"dict{len(value)}(".encode())
            for k, v in value.items():
                digest.update(repr(k).encode())
                feed(v)
            digest.update(b")")
        else:
            digest.update(f"{type(value).__name__}:{value!r};".encode())

    feed((data.args, dict(data.kwargs), data.init_args, dict(data.init_kwargs), dict(data.state or {})))
    return digest.digest()


def small_dtypes(graded: Graded) -> tuple[torch.dtype, ...]:
    """The dtypes a name's small inputs are built in: those of its tests, float64 first (its
    values print exactly and its tolerance is the tightest), then in the tests' order."""
    seen = list(dict.fromkeys(t.dtype for t in graded.tests))
    return tuple(sorted(seen, key=lambda d: d != torch.float64))


def small_cases(spec: StageSpec, graded: Graded, limit: int = MAX_SMALL_CASES) -> tuple[SmallCase, ...]:
    """The candidates of ``graded``'s counterexample search, smallest first (see above).

    A builder that raises ValueError at a value level (its inputs must meet a condition
    that simple values cannot: distinct logits among three integers) is skipped there.

    Deterministic: each candidate's seed comes from (stage, name, builder, level), never from
    a test's group or a case's label, so no candidate is a hidden case's input. The same on
    every call, so the grader and the self-check data try the same inputs in the same order."""
    found: list[tuple[tuple[int, int, int, int], str, torch.dtype, CaseData, int]] = []
    seen: set[bytes] = set()
    dtypes = small_dtypes(graded)
    for b, build in enumerate(graded.small):
        own = getattr(build, "own_values", False)
        for level, values in enumerate(SMALL_VALUES):
            if own and level < len(SMALL_VALUES) - 1:
                continue
            for d, dtype in enumerate(dtypes):
                g = torch.Generator().manual_seed(case_seed(spec.id, graded.name, "small", f"{b}/{level}"))
                with small_values(level):
                    try:
                        data = build(g, dtype)
                    except ValueError:  # what it must draw cannot be drawn in these values
                        continue
                key = _fingerprint(data)
                if key in seen:
                    continue
                seen.add(key)
                size = _count((data.args, data.kwargs, data.init_args, data.init_kwargs, data.state))
                what = f"builder {b + 1}, {values}, {str(dtype).removeprefix('torch.')}"
                found.append(((size, level, d, b), what, dtype, data, size))
    found.sort(key=lambda f: f[0])
    found = _within_budget(found, limit)
    return tuple(
        SmallCase(f"small input {i} of {len(found)}: {what}", dtype, data, size)
        for i, (_, what, dtype, data, size) in enumerate(found, start=1)
    )


def _within_budget(found: list[Any], limit: int) -> list[Any]:
    """``limit`` of ``found`` (sorted smallest first, each keyed (size, level, dtype, builder)),
    in that order: each (builder, dtype)'s first, then the smallest of the others."""
    if len(found) <= limit:
        return found
    first: dict[tuple[int, int], int] = {}
    for i, ((_, _, d, b), *_) in enumerate(found):
        first.setdefault((b, d), i)
    keep = set(list(first.values())[:limit])  # first seen = smallest: already in order
    for i in range(len(found)):
        if len(keep) >= limit:
            break
        keep.add(i)
    return [f for i, f in enumerate(found) if i in keep]


def own_values(build: Builder) -> Builder:
    """A small builder tried at its own values only (the last level of ``SMALL_VALUES``), in
    each dtype: for an input whose every call is costly (a real checkpoint loaded) and whose
    numbers simpler values would not make shorter to read."""

    def at_own_values(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        return build(g, dtype)

    at_own_values.own_values = True  # type: ignore[attr-defined]
    return at_own_values


# -- helpers for builders ---------------------------------------------------------------


def randn(g: torch.Generator, *shape: int, dtype: torch.dtype, scale: float = 1.0) -> Tensor:
    """Standard normal samples drawn in float64 then cast, so float32 and float64 cases of
    one seed hold the same numbers up to rounding.

    Inside ``small_values(level)`` (counterexample candidates), simpler numbers instead:
    integers or halves (``SMALL_VALUES``), times ``scale`` when it is 1 or more (large
    magnitudes stay large), else as they are (a weight's 1/sqrt(d) would only make them
    harder to read)."""
    level = _VALUE_LEVEL.get()
    if level is None or level >= len(SMALL_VALUES) - 1:
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    high, step = ((1, 1.0), (3, 1.0), (4, 0.5))[level]
    values = torch.randint(-high, high + 1, shape, generator=g, dtype=torch.int64).to(torch.float64) * step
    return (values * (scale if scale >= 1 else 1.0)).to(dtype)


def rand(g: torch.Generator, *shape: int) -> Tensor:
    """Uniform samples in [0, 1), float64 (``torch.rand``'s); inside ``small_values``, 0 or 1
    at the integer levels and 0 or 0.5 at the halves (see ``randn``)."""
    level = _VALUE_LEVEL.get()
    if level is None or level >= len(SMALL_VALUES) - 1:
        return torch.rand(*shape, generator=g, dtype=torch.float64)
    step = 0.5 if level == 2 else 1.0
    return torch.randint(0, 2, shape, generator=g, dtype=torch.int64).to(torch.float64) * step


def randint(g: torch.Generator, low: int, high: int, *shape: int) -> Tensor:
    return torch.randint(low, high, shape, generator=g, dtype=torch.int64)

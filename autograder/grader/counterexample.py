"""A minimal counterexample for every failing graded name: the smallest public input on which
the student's code disagrees with the reference, shown with every failing test of the name.

The search never starts from a hidden case and never runs where one has been:

- Its inputs are the name's small inputs (``stages/spec.small_cases``): the stage's own case
  builders at their smallest sizes, at simple values first, seeded from the name alone and
  ordered smallest first. They are public by construction; the self-check data ships them
  with their expected outputs (``grader/public.py``), so a notebook finds the same one.
- The student's code runs on them in a fresh child that never receives a hidden input
  (``runner.run_public``: no hidden phase, a new job), so what it returns cannot carry one,
  whatever the grading run's child saw. That is why a hidden test may show it too
  (``visibility.for_students``).
- The reference runs on them here, in the trusted process (``plan.StagePlan`` of a stage
  whose only cases are the small inputs); the verdict is ``check_case``'s, as for any case.

The first input in the ladder's order that fails (other values, another shape or dtype, an
exception) is the counterexample: since the order is by size, then simplicity, that is the
shrinking. A name that is missing, forbidden, unfinished or hangs has none
(``runtime.counterexample.NOT_A_COUNTEREXAMPLE``): no input could make it pass.

Budget: at most ``MAX_SMALL_CASES`` calls per failing name, in at most two children per
stage (each name's first ``FIRST_RUNGS`` inputs, then the others of the names still
without a counterexample), each stopped once its names have their counterexamples; held to
a fifth of the stage's call limit per call (at least ``CALL_S``, at most the stage's) and
``RUN_S`` for the whole search (cells included), on top of the grading run's own limits: a
hanging name costs one call's limit, then its other inputs are skipped.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
import traceback
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from autograder.grader.plan import StagePlan
from autograder.grader.runner import ForkServer, Limits, run_public
from autograder.runtime.check import check_case
from autograder.runtime.counterexample import Pick, counterexample, literal
from autograder.runtime.load import LoadError, load_source
from autograder.runtime.results import Counterexample, StageResult
from autograder.runtime.submission import Submission
from autograder.stages.spec import Case, CaseData, Graded, StageSpec, Test, small_cases


class Grader(Protocol):
    """What the search uses of ``grade.Grader`` (which holds a ``Counterexamples``; named
    here by what it does, not imported, so that neither module imports the other)."""

    device: str
    limits: Limits

    @property
    def server(self) -> ForkServer: ...

    def plan(self, stage: str) -> StagePlan: ...

    def _parts(self, submission: Submission, path: Path, spec: StageSpec) -> tuple[dict, list[str]]: ...


# A small input runs in milliseconds (a 09 call still builds and loads MiniLM, about a
# second): a call gets a fifth of its stage's limit, at least CALL_S but never more than the
# grading run's own (a small input is no slower than a graded one), and the whole search of a
# stage (its cells, then every failing name's small inputs) RUN_S. A name that hangs costs
# one call's limit.
CALL_S = 2.0
RUN_S = 20.0
WHOLE_AFTER = 3  # sets of failing names of a stage planned on their own (``Counterexamples.ladder``)


@dataclass(frozen=True)
class Rung:
    """One small input of a name: where it is in the order, its size and its code."""

    name: str
    rank: int  # 1-based, smallest first
    size: int
    code: str  # Python that makes the call (``Counterexample.code``)


def _fixed(data: CaseData):
    def build(g: Any, dtype: Any) -> CaseData:
        return data

    return build


def ladder_spec(
    spec: StageSpec, names: Collection[str] | None = None
) -> tuple[StageSpec, dict[tuple[str, str], Rung]]:
    """``spec`` with each graded name's tests replaced by its small inputs, one public test
    each, in the order the search tries them (only ``names``', if given: the others get no
    test); and each one's ``Rung``, by (name, group)."""
    rungs: dict[tuple[str, str], Rung] = {}
    graded = []
    for g in spec.graded:
        tests = []
        chosen = names is None or g.name in names
        for rank, sc in enumerate(small_cases(spec, g) if chosen else (), start=1):
            tests.append(
                Test(sc.label, sc.dtype, (Case(sc.label, _fixed(sc.data)),), points=1.0, hidden=False)
            )
            rungs[(g.name, sc.label)] = Rung(g.name, rank, sc.size, call_code(g, sc.data))
        graded.append(dataclasses.replace(g, tests=tuple(tests)))
    return dataclasses.replace(spec, graded=tuple(graded)), rungs


@dataclass
class Ladder:
    """A stage's small inputs planned: inputs encoded for the child, expected values, variants."""

    plan: StagePlan
    rungs: dict[int, Rung]  # by the plan's case index

    @classmethod
    def build(cls, spec: StageSpec, device: str, names: Collection[str] | None = None) -> Ladder:
        """``names``: only these names' small inputs (the reference runs on each input here)."""
        derived, rungs = ladder_spec(spec, names)
        plan = StagePlan.build(derived, device, hidden=False)
        return cls(plan, {pc.index: rungs[(pc.graded.name, pc.test.group)] for pc in plan.cases})


def search(
    grader: Grader, ladder: Ladder, source: Any, parts: dict | None, names: set[str], limits: Limits
) -> dict[str, Counterexample]:
    """Run ``names``' small inputs on the student's code in a clean child; each name's
    first failing input, as a ``Counterexample``.

    Every name's first ``FIRST_RUNGS`` inputs run first, every name's first before any
    name's second: most mistakes fail the smallest ones, and a name whose every input runs
    (up to ``MAX_SMALL_CASES``, a model built for each of 10's) costs ten times as much. The
    names left without a counterexample then run their other inputs, name by name, in a
    second clean child, with what remains of ``limits``' budget; a name that hung or crashed
    is not run again (its other inputs would be skipped in one child too). Each child is
    stopped as soon as each of its names has its counterexample. Each name's inputs run
    smallest first, so the input picked is the one a single child's run of every input
    would pick. No forbidden-call watch: a name whose graded run called a forbidden function
    has its headline and no search, and what a small input shows earns nothing."""
    hints = ladder.plan.spec.misconceptions
    picks = {name: Pick(hints) for name in names}
    calls = [dataclasses.replace(c, forbidden=()) for c in ladder.plan.calls if c.name in names]
    if not calls:
        return {}
    rank = {index: rung.rank for index, rung in ladder.rungs.items()}
    first = sorted((c for c in calls if rank[c.index] <= FIRST_RUNGS), key=lambda c: (rank[c.index], c.index))
    report = _run_rungs(grader, ladder, source, parts, first, picks, limits)
    stopped = {c.name for c in first if report.calls[c.index].status in _STOPPED}
    rest = [
        c
        for c in calls
        if rank[c.index] > FIRST_RUNGS and c.name not in stopped and picks[c.name].chosen is None
    ]
    left_s = limits.submission_s - report.wall_s
    if rest and left_s > 0:
        budget = dataclasses.replace(limits, cell_s=min(limits.cell_s, left_s), submission_s=left_s)
        _run_rungs(grader, ladder, source, parts, rest, picks, budget)
    return {name: pick.result for name, pick in picks.items() if pick.result is not None}


# A name's inputs run in a first child (``search``); a limit hit or a crash stops the name.
FIRST_RUNGS = 4
_STOPPED = frozenset({"timeout", "crashed", "skipped"})


def _run_rungs(
    grader: Grader,
    ladder: Ladder,
    source: Any,
    parts: dict | None,
    calls: list,
    picks: dict[str, Pick],
    limits: Limits,
) -> Any:
    """Run ``calls`` in one public-only child, stopped once each of their names is settled,
    and offer each name's outcomes, smallest first, to its ``Pick``. Returns the run's report."""
    offers = _Offers(ladder, calls, picks)
    report = run_public(
        grader.server,
        source.cells,
        source.module_name,
        calls,
        ladder.plan.inputs_file,
        grader.device,
        limits,
        parts,
        enough=offers.settled,
    )
    offers.settled(report.calls)  # what ended after the last look: the last call, a hang, a crash
    return report


class _Offers:
    """Offers each name's outcomes to its ``Pick``, smallest input first, as they come in."""

    def __init__(self, ladder: Ladder, calls: list, picks: dict[str, Pick]) -> None:
        self.ladder = ladder
        self.picks = picks
        ran = {c.index for c in calls}
        # each name's cases in this run, smallest first (a name with none here is settled)
        self.cases: dict[str, list] = {name: [] for name in picks}
        for pc in ladder.plan.cases:
            if pc.index in ran and pc.graded.name in self.cases:
                self.cases[pc.graded.name].append(pc)
        self.next = dict.fromkeys(picks, 0)  # each name's first case not offered yet

    def settled(self, outcomes: dict[int, Any]) -> bool:
        """Offer what has come in; True once every name is settled or has no input left."""
        hints = self.ladder.plan.spec.misconceptions
        done = True
        for name, cases in self.cases.items():
            pick = self.picks[name]
            while pick.chosen is None and self.next[name] < len(cases):
                pc = cases[self.next[name]]
                o = outcomes.get(pc.index)
                if o is None:
                    break
                self.next[name] += 1
                result = check_case(pc.label, o.status, o.info, o.outputs, pc.expectation, hints)
                rung = self.ladder.rungs[pc.index]
                pick.offer(
                    counterexample(
                        name, rung.code, o.status, o.outputs, pc.expectation, result, rung.rank, rung.size
                    )
                )
            done = done and (pick.chosen is not None or self.next[name] == len(cases))
        return done


class Counterexamples:
    """The counterexample search of one ``Grader``: each stage's ladder is planned once, the
    first time a submission fails it, and shared by every thread of the grader."""

    def __init__(self, grader: Grader) -> None:
        self.grader = grader
        # by (stage, the names it holds: None for all)
        self._ladders: dict[tuple[str, frozenset[str] | None], Ladder] = {}
        self._lock = threading.Lock()

    def ladder(self, spec: StageSpec, names: Collection[str] | None = None) -> Ladder:
        """A ladder holding ``names``' small inputs (every name's if None). The reference runs
        on each of them here, once per grader: a set of names is planned on its own (one
        student fails a few names, and a name on a real checkpoint costs seconds), until a
        stage has been asked for ``WHOLE_AFTER`` sets; then all its names at once (a batch's
        students fail in many ways)."""
        with self._lock:
            whole = self._ladders.get((spec.id, None))
            if whole is not None:
                return whole
            key = None if names is None else frozenset(names)
            if (spec.id, key) not in self._ladders:
                if sum(stage == spec.id for stage, _ in self._ladders) >= WHOLE_AFTER:
                    key = None
                self._ladders[(spec.id, key)] = Ladder.build(spec, self.grader.device, key)
            return self._ladders[(spec.id, key)]

    def limits(self, spec: StageSpec) -> Limits:
        own = self.grader.limits
        stage_call_s = own.call_s or spec.call_timeout_s
        return Limits(
            call_s=min(stage_call_s, max(CALL_S, stage_call_s / 5)),
            cell_s=min(own.cell_s, RUN_S),
            submission_s=min(own.submission_s, RUN_S),
        )

    def attach(self, submission: Path, results: list[StageResult]) -> None:
        """Give every failing test of ``results`` its name's counterexample, where one is found."""
        for result in results:
            failing = {
                t.function
                for t in result.tests
                if not t.passed and t.headline is None and t.counterexample is None
            }
            if result.file is None or result.grader_fault or not failing:
                continue
            try:
                found = self.for_stage(submission, result.stage, failing)
            except Exception:  # the grade stands without its counterexamples; this is our bug
                traceback.print_exc(file=sys.stderr)
                continue
            for t in result.tests:
                if not t.passed and t.function in found:
                    t.counterexample = found[t.function]

    def for_stage(self, submission: Path, stage: str, names: set[str]) -> dict[str, Counterexample]:
        spec = self.grader.plan(stage).spec
        names = {g.name for g in spec.graded if g.name in names and g.small}
        if not names:
            return {}
        ladder = self.ladder(spec, names)
        handed_in = Submission(submission)
        try:
            path = handed_in.file(stage)
            if path is None:
                return {}
            source = load_source(path, stage)
        except LoadError:
            return {}
        parts, _ = self.grader._parts(handed_in, path, spec)
        return search(self.grader, ladder, source, parts, names, self.limits(spec))


# -- the code of a call --------------------------------------------------------------------------


def _parameters(fn: Any) -> list[str]:
    """The names of ``fn``'s parameters that can be passed by position (no ``self``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds and p.name != "self"]


def _has_array(value: Any) -> bool:
    import numpy as np

    if isinstance(value, np.ndarray):
        return True
    if isinstance(value, list | tuple):
        return any(_has_array(v) for v in value)
    if isinstance(value, dict):
        return any(_has_array(v) for v in value.values())
    return False


def _arguments(args: tuple, kwargs: dict, names: list[str], lines: list[str], taken: set[str]) -> list[str]:
    """The call's argument texts; a tensor, an array or a long value first gets a line of its
    own, ``name = value``, under its parameter's name."""
    import numpy as np
    import torch

    def text(name: str, value: Any) -> str:
        written = literal(value)
        if not isinstance(value, torch.Tensor | np.ndarray) and "\n" not in written and len(written) <= 60:
            return written
        var = name if name.isidentifier() and name not in taken else f"arg{len(taken)}"
        taken.add(var)
        lines.append(f"{var} = {literal(value)}")
        return var

    out = [text(names[i] if i < len(names) else f"arg{i}", v) for i, v in enumerate(args)]
    out += [f"{k}={text(k, v)}" for k, v in kwargs.items()]
    return out


def call_code(graded: Graded, data: CaseData) -> str:
    """Python that makes ``graded``'s call on ``data`` as the grader makes it (see
    ``runtime.harness.invoke``), in the student's notebook: imports, inputs, the call; the
    last line is an expression whose value is the output."""
    everything = (
        data.args,
        dict(data.kwargs),
        data.init_args,
        dict(data.init_kwargs),
        dict(data.state or {}),
    )
    lines = ["import torch"] + (["import numpy as np"] if _has_array(everything) else [])
    taken = {"torch", "np", "model", "state", "case", "out", graded.name}
    if graded.kind == "function":
        arguments = _arguments(data.args, dict(data.kwargs), _parameters(graded.reference), lines, taken)
        lines.append(f"{graded.name}({', '.join(arguments)})")
    elif graded.kind == "module":
        init = _arguments(data.init_args, dict(data.init_kwargs), _parameters(graded.reference), lines, taken)
        state = dict(data.state or {})
        floats = [t.dtype for t in state.values() if t.is_floating_point()]
        lines.append(f"model = {graded.name}({', '.join(init)})")
        if floats:
            lines.append(f"model.to(dtype={floats[0]})")
        lines.append(f"state = {literal(state)}")
        lines += ["model.load_state_dict(state)", "model.eval()"]
        forward = _parameters(getattr(graded.reference, "forward", None))
        arguments = _arguments(data.args, dict(data.kwargs), forward, lines, taken)
        lines += ["with torch.no_grad():", f"    out = model({', '.join(arguments)})", "out"]
    else:
        from autograder.runtime.drivers import resolve

        case = {"args": data.args, "kwargs": dict(data.kwargs)}
        case |= {
            k: v for k, v in (("init_args", data.init_args), ("init_kwargs", dict(data.init_kwargs))) if v
        }
        if data.state:
            case["state"] = dict(data.state)
        doc = " ".join((inspect.getdoc(resolve(graded.driver or "")) or "").split("\n\n")[0].split())
        lines.append("from autograder.runtime.drivers import resolve")
        lines.append(f"case = {literal(case)}")
        lines.append(f"# how the grader calls your code here (autograder/runtime/drivers): {doc}")
        lines.append(f"resolve({graded.driver!r})(globals(), case, 'cpu')")
    return "\n".join(lines)

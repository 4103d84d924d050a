"""A minimal counterexample for every failing graded name: the smallest public input on which
the student's code disagrees with the reference, shown with every failing test of the name.

The search never starts from a hidden case and never runs where one has been:

- Its inputs are the name's small inputs (``stages/spec.small_cases``; ``StagePlan.rungs``):
  the stage's own case builders at their smallest sizes, at simple values first, seeded from
  the name alone and ordered smallest first. They are public by construction; the self-check
  data ships them with their expected outputs (``grader/public.py``), so a notebook finds the
  same one. Their expected values and named mistakes' outputs come with the stage's plan
  (computed at install, ``grader/expected.py``).
- They run in the grading child itself, after its public calls and before it is given any
  hidden input (``runner.run_submission``'s ``ladder``): the parent checks the public cases as
  they come, and a name that fails one (on values, not by being missing, unfinished,
  forbidden or hanging: ``NO_INPUT_CHANGES``) has its small inputs run, one at a time, as
  ``Search.next`` says, until its counterexample is settled (``runtime.counterexample.Pick``).
  What such a child returns then cannot carry a hidden input: it has not received one. That
  is why a hidden test may show it too (``visibility.for_students``). No second child, no
  second run of the cells.
- A name that fails hidden cases only is known to fail once the child holds hidden inputs:
  its small inputs then run in a fresh child of their own (``Counterexamples.attach``,
  ``runner.run_public``), one that never receives a hidden input, started once the grading
  job has ended (its processes gone with its PID namespace). In the example class, 5 of 114
  failing names (issue 27).

The first input in the ladder's order that fails (other values, another shape or dtype, an
exception) is the counterexample: since the order is by size, then simplicity, that is the
shrinking. Every failing name's first input runs before any name's second, so that a budget
spent on one slow name still leaves the others theirs.

Budget: at most ``MAX_SMALL_CASES`` inputs per failing name, each held to a fifth of the
stage's call limit (``plan.rung_call_s``), ``RUN_S`` for the whole search; a name whose small
input hangs or crashes is stopped there (its graded calls are still made: the time the
search takes is added to the submission's budget, not taken from it).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import time
import traceback
from collections.abc import Collection
from functools import cached_property
from typing import Any, Protocol

import safetensors.torch

from autograder.grader.job import Jobs, StageJob
from autograder.grader.plan import PlannedCase, StagePlan, rung_call_s
from autograder.grader.runner import CallOutcome, ForkServer, Limits, Planned, finish_outcome, run_public
from autograder.runtime.check import check_case
from autograder.runtime.counterexample import NOT_A_COUNTEREXAMPLE, Pick, counterexample, literal
from autograder.runtime.results import CaseResult, Counterexample, StageResult, TestResult
from autograder.stages.spec import CaseData, Graded


class Grader(Protocol):
    """What the search uses of ``grade.Grader`` (which holds a ``Counterexamples``; named
    here by what it does, not imported, so that neither module imports the other)."""

    device: str
    limits: Limits

    @property
    def server(self) -> ForkServer: ...

    def plan(self, stage: str) -> StagePlan: ...


RUN_S = 20.0  # the whole search of one submission's stage
# a small input that ended so stops its name: a hang or a crash would come again
_STOPPED = frozenset({"timeout", "crashed", "skipped", "untrusted"})


class Search:
    """One run's search: the ``runner.Ladder`` that a grading child's parent asks, each time
    the child is ready for more, which small input it runs next.

    Its first ``next`` checks the public cases (their results are kept: ``checked``, which
    scoring reuses) and picks the names to search: those given, else those failing a public
    case on its values. Each answer after that first offers the outcome that came in to its
    name's ``Pick``; the next input is the next one, in the order every name's first input,
    then every name's second..., of a name not settled yet."""

    def __init__(
        self,
        plan: StagePlan,
        call_s: float | None,
        names: Collection[str] | None = None,
        budget_s: float = RUN_S,
    ) -> None:
        self.plan = plan
        self.names = None if names is None else set(names)
        self.budget_s = budget_s
        self._call_s = rung_call_s(plan.spec, call_s)
        self.checked: dict[int, CaseResult] = {}
        self.picks: dict[str, Pick] = {}
        self._rungs: dict[str, list[PlannedCase]] = {}  # each searched name's, smallest first
        self._offered: dict[str, int] = {}  # how many of them were offered to its Pick
        self._order: list[Planned] | None = None
        self._at = 0
        self._since: float | None = None
        self.spent_s = 0.0

    @cached_property
    def calls(self) -> list[Planned]:
        """The small inputs' calls, each held to its own limit (the plan makes them when first
        asked for: a submission that fails no public case never needs them)."""
        return [dataclasses.replace(c, call_s=self._call_s) for c in self.plan.rung_calls]

    @cached_property
    def _calls(self) -> dict[int, Planned]:
        return {c.index: c for c in self.calls}

    @property
    def inputs(self) -> bytes:
        return self.plan.rung_file

    def next(self, outcomes: dict[int, CallOutcome]) -> Planned | None:
        if self._since is not None:
            self.spent_s += time.monotonic() - self._since
            self._since = None
        if self._order is None:
            self._start(outcomes)
        self._offer(outcomes)
        assert self._order is not None
        while self._at < len(self._order) and self.spent_s < self.budget_s:
            call = self._order[self._at]
            self._at += 1
            name = call.name
            if call.index in outcomes or self.picks[name].chosen is not None or self._offered[name] < 0:
                continue
            self._since = time.monotonic()
            return call
        return None

    def _start(self, outcomes: dict[int, CallOutcome]) -> None:
        hints = self.plan.spec.misconceptions
        names = self.names
        if names is None:
            names = set()
            public = {c.index: c for c in self.plan.calls if not c.hidden}
            for pc in self.plan.cases:
                if pc.index not in public or pc.index not in outcomes:
                    continue
                finish_outcome(public[pc.index], outcomes)
                o = outcomes[pc.index]
                assert pc.expectation is not None
                result = check_case(pc.label, o.status, o.info, o.outputs, pc.expectation, hints)
                self.checked[pc.index] = result
                if not result.passed and o.status not in NOT_A_COUNTEREXAMPLE:
                    names.add(pc.graded.name)
        for pc in self.plan.rungs if names else ():
            if pc.graded.name in names:
                self._rungs.setdefault(pc.graded.name, []).append(pc)
        self.picks = {name: Pick(hints) for name in self._rungs}
        self._offered = dict.fromkeys(self._rungs, 0)
        rank = {pc.index: pc.rung.rank for rungs in self._rungs.values() for pc in rungs if pc.rung}
        self._order = sorted((self._calls[i] for i in rank), key=lambda c: (rank[c.index], c.index))

    def _offer(self, outcomes: dict[int, CallOutcome]) -> None:
        """Offer each name's outcomes that came in, smallest input first; a name whose input
        hung or crashed is stopped (``_offered`` -1)."""
        hints = self.plan.spec.misconceptions
        for name, rungs in self._rungs.items():
            pick = self.picks[name]
            while pick.chosen is None and 0 <= self._offered[name] < len(rungs):
                pc = rungs[self._offered[name]]
                if pc.index not in outcomes:
                    break
                self._offered[name] += 1
                finish_outcome(self._calls[pc.index], outcomes)
                o = outcomes[pc.index]
                if o.status in _STOPPED:
                    self._offered[name] = -1
                    break
                pick.offer(_counterexample(pc, o, hints))

    def found(self) -> dict[str, Counterexample]:
        return {name: pick.result for name, pick in self.picks.items() if pick.result is not None}

    def attach(self, result: StageResult) -> None:
        """Give every failing test of ``result`` its name's counterexample, where one was found."""
        found = self.found()
        for t in result.tests:
            if not t.passed and t.headline is None and t.counterexample is None and t.function in found:
                t.counterexample = found[t.function]


def _counterexample(pc: PlannedCase, o: CallOutcome, hints: Any) -> Counterexample | None:
    assert pc.expectation is not None and pc.rung is not None
    result = check_case(pc.label, o.status, o.info, o.outputs, pc.expectation, hints)
    if result.passed or o.status in NOT_A_COUNTEREXAMPLE:
        return None
    code = call_code(pc.graded, pc.rung.data)
    return counterexample(
        pc.graded.name, code, o.status, o.outputs, pc.expectation, result, pc.rung.rank, pc.rung.size
    )


def _searchable(t: TestResult) -> bool:
    """A failing test some input could show: it failed on values (or an exception), not only
    by a name missing, unfinished, forbidden or hanging, and no headline says why."""
    failing = [c for c in t.cases if not c.passed]
    return (
        not t.passed
        and t.headline is None
        and t.counterexample is None
        and any(c.status not in NOT_A_COUNTEREXAMPLE for c in failing)
    )


class Counterexamples:
    """The counterexample search of one ``Grader``: ``search`` makes the one a grading child
    runs; ``attach`` searches, in a child of its own, for the names that failed hidden
    cases only (the grading child could not know before it held hidden inputs)."""

    def __init__(self, grader: Grader) -> None:
        self.grader = grader

    def search(self, plan: StagePlan, names: Collection[str] | None = None) -> Search:
        return Search(plan, self.grader.limits.call_s, names)

    def limits(self, plan: StagePlan) -> Limits:
        own = self.grader.limits
        return Limits(
            call_s=rung_call_s(plan.spec, own.call_s),
            cell_s=min(own.cell_s, RUN_S),
            submission_s=min(own.submission_s, RUN_S),
        )

    def attach(self, jobs: Jobs, results: list[StageResult]) -> None:
        """Give each failing test of ``results`` that has no counterexample yet, of a name
        that failed no public case (those were searched in the grading child), its name's."""
        for result in results:
            if result.file is None or result.grader_fault:
                continue
            failing_public = {t.function for t in result.tests if not t.hidden and _searchable(t)}
            names = {t.function for t in result.tests if _searchable(t)} - failing_public
            if not names:
                continue
            try:
                found = self.for_stage(jobs.job(result.stage), names)
            except Exception:  # the grade stands without its counterexamples; this is our bug
                traceback.print_exc(file=sys.stderr)
                continue
            for t in result.tests:
                if _searchable(t) and t.function in found:
                    t.counterexample = found[t.function]

    def for_stage(self, job: StageJob, names: set[str]) -> dict[str, Counterexample]:
        """``names``' counterexamples, searched in a fresh child that is never given a hidden
        input (its only calls are small inputs)."""
        plan = self.grader.plan(job.stage)
        names = {pc.graded.name for pc in plan.rungs if pc.graded.name in names}
        if not names or job.source is None:
            return {}
        search = self.search(plan, names)
        run_public(
            self.grader.server,
            job.source.cells,
            job.source.module_name,
            [],
            safetensors.torch.save({}),
            self.grader.device,
            self.limits(plan),
            job.parts,
            ladder=search,
        )
        return search.found()


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

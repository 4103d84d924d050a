"""A whole class: N students × every stage (``stage_ids()``: 01-13) graded by ``batch``,
against nbgrader, the floor, and the students' self-check latency (issue 9; stages 10 and 11,
issue 21); a class where every notebook fails beside one where every notebook passes (issue 27).

Method
------
0. *The classes* (``--classes``, default ``failing,correct``), each of ``--students``
   students, graded one after another, each by a fresh ``batch`` run: ``mix`` (item 1),
   ``correct`` (every notebook the solution notebook or a correct example student's file)
   and ``failing`` (every notebook fails something or leaves something unwritten:
   ``FAIL_MIX`` of named mistakes, other example students who lose points in that stage,
   the solution with one task as the template has it, ``raise NotImplementedError``, and
   broken ones; no hanging student; a stage that runs earlier ones runs the student's own,
   failing too). The first class listed is the one of the whole-class figures below
   (items 2-4, 6); nbgrader grades a sample of each class but the correct one. With both
   ``correct`` and ``failing``, a table sets side by side per stage what a notebook costs
   in each (its ``grade_stage`` and the counterexample search after it, mean and median;
   the correct class's notebooks at full marks, the failing class's that lose points:
   the grades are checked, not assumed; warm: the first students to start, and each
   worker's first notebook of each stage, left out), with the target of issue 27: failing
   ≤ 1.3× correct, per notebook, in every stage (mean).
1. *The class* (``mix``): a synthetic class of ``--students`` students, each holding every stage as a
   notebook in the flat layout ``<student>/<NN_stage>.ipynb``, built deterministically
   (``--seed``). Each (student, stage) is drawn from: a correct notebook (the solution
   notebook, or an example student's correct file), a named mistake (an example student
   whose expected misconceptions are not empty; a ``.py`` becomes a one-cell notebook; that
   student's own earlier stages come along, every one the stage runs (``requires``: 10
   brings 01 and 02, 11 brings 09 and through it 06, 02 and 01), or a broken notebook (the
   solution with a syntax error in one graded cell). Exactly one student hangs: stage 01
   from ``leo_infinite_loop`` (``causal_mask`` never returns); that student's later stages
   that run their 01 (02, 06, 09, 10, 11) hit their limits too.
2. *Ours*: ``autograder.grader.batch.run`` with ``--workers`` (default: the cores) into a fresh
   gradebook, timed end to end (worker start-up, fork servers, expected values included).
   A thread samples ``/proc`` every 0.2 s and sums the RSS of this process and all of its
   descendants, and every second their PSS; both peaks are reported. A sum of RSS counts
   pages shared between the fork server and its jobs' processes once per process (an upper
   bound, some 180 MB per process); the sum of PSS splits them: the memory the class run
   holds, the measure of the memory target. Each ``Grader.grade_stage``
   call is timed too (wall, in its worker, the other workers running beside it): the
   grading time per submission of each stage.
3. *nbgrader*: a sample of ``--sample`` notebooks of the same class, round robin over the
   stages, graded by the real ``nbgrader autograde`` (a fresh kernel per notebook, every
   cell run, the skip-grading demos included: that is what autograde costs) in a temporary
   course whose source is the solution notebooks. The stages a notebook loads are put
   beside it as ``.py`` files (graded cells only), as ``load_stage`` finds them. The demos
   are the solution notebooks' (10 trains and samples a character GPT; 11 fine-tunes
   MiniLM three ways, minutes on a CPU): each stage's time in them is reported (nbclient's
   per-cell timestamps), and the ratio with and without them.
4. *The floor*: per stage, the reference on every hidden case in-process (one thread, as a
   child; building the cases excluded), plus one warm child per submission (grading an
   empty stage-01 submission through a warm fork server), plus every time limit the class
   hit (no grader can stop a hang sooner). Compared per core: ours' wall × workers; and
   per stage, against each stage's grading time per submission.
5. *Self-check*: each solution notebook in one warm kernel (nbclient); every ``check(x)``
   call of the notebook is timed in its own cell, after the cells before it ran (the demos
   after the last check are not run).
6. ``--memory-scaling``: the batch's peak RSS at 50 and at 200 students.

Run: ``make bench-class`` or ``.venv/bin/python benchmarks/bench_class.py [options]``; the
figures of before issue 27 (200 students of the mix): ``--classes mix --students 200
--sample 22``. Figures also go to ``build/bench/bench_class.json`` (per class under
``per_class``; the side-by-side table under ``failing_vs_correct``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EXAMPLES = ROOT / "examples" / "class"
EXPECTED = ROOT / "examples" / "expected"
SOLUTIONS = ROOT / "solutions"
HANGING = ("leo_infinite_loop", "01_attention")
CORRECT_EXAMPLES = ("ada_correct_matmul", "grace_correct_einsum")
MIX = {"correct": 0.80, "mistake": 0.16, "broken": 0.04}  # the hanging one comes on top
# the failing class (issue 27): every notebook fails something or leaves something unwritten;
# "losing" is an example student who loses points without a named mistake (a forbidden call,
# a function left unwritten, a syntax error: examples/expected's score below the stage's)
FAIL_MIX = {"mistake": 0.45, "losing": 0.15, "unfinished": 0.30, "broken": 0.10}
# --classes: mix (MIX, one hanging student), correct (every notebook passes), failing
CLASSES = ("mix", "correct", "failing")
TARGETS = {
    "nbgrader": 50.0,  # the mix, 200 students x 11 stages (issue 27: kept from issue 21)
    "nbgrader_failing": 25.0,  # every notebook failing or unfinished (issue 27)
    "floor": 1.5,
    "rss_gib": 2.0,
    "selfcheck_s": 1.0,
    "selfcheck_median_s": 0.2,
    "failing_over_correct": 1.3,
}
# nbgrader's cell time limit in the bench's course: long enough that every demo runs to its
# end (11's fine-tuning takes minutes on a CPU), as a course that keeps its demos must set it
CELL_TIMEOUT_S = 900


# -- the class ------------------------------------------------------------------------------


def _notebook(path: Path) -> Any:
    import nbformat

    if path.suffix == ".ipynb":
        return nbformat.read(path, as_version=4)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(path.read_text(encoding="utf-8"))]
    return nb


def _compiles(source: str) -> bool:
    try:
        compile(source, "<cell>", "exec")
    except SyntaxError:
        return False
    return True


def _broken(nb: Any, rng: random.Random) -> Any:
    """The notebook with a syntax error in one of its graded (solution) cells: the first
    ``):`` whose colon removed breaks the cell (a ``def`` line's; one in a comment would
    not), else ``return )`` appended."""
    import copy

    nb = copy.deepcopy(nb)
    graded = [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")]
    cell = rng.choice(graded)
    source = cell.source
    at = source.find("):")
    while at >= 0:
        candidate = source[: at + 1] + source[at + 2 :]
        if not _compiles(candidate):
            cell.source = candidate
            return nb
        at = source.find("):", at + 1)
    cell.source = source + "\nreturn )"
    return nb


def _unfinished(solution: Any, template: Any, rng: random.Random) -> tuple[Any, str]:
    """The solution notebook with one task left unwritten: one of its graded (solution)
    cells replaced by the released template's cell of the same ``grade_id`` (its bodies
    ``# YOUR CODE HERE`` / ``raise NotImplementedError``). Returns it and the grade_id."""
    import copy

    stubs = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in template.cells
        if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")
    }
    nb = copy.deepcopy(solution)
    graded = [
        c
        for c in nb.cells
        if c.cell_type == "code"
        and c.metadata.get("nbgrader", {}).get("solution")
        and stubs.get(c.metadata["nbgrader"].get("grade_id"), c.source) != c.source
    ]
    cell = rng.choice(graded)
    task = cell.metadata["nbgrader"]["grade_id"]
    cell.source = stubs[task]
    return nb, task


@dataclass
class Pools:
    correct: dict[str, list[tuple[str, Path]]]  # stage -> (origin, file)
    mistakes: dict[str, list[tuple[str, Path]]]  # named misconceptions
    # example students who lose points in that stage without a named mistake (the hanging
    # one left out): forbidden calls, functions left unwritten, syntax errors
    losing: dict[str, list[tuple[str, Path]]]

    @classmethod
    def load(cls) -> Pools:
        from autograder.runtime.submission import Submission
        from autograder.stages import load_spec, stage_ids

        correct: dict[str, list[tuple[str, Path]]] = {}
        mistakes: dict[str, list[tuple[str, Path]]] = {}
        losing: dict[str, list[tuple[str, Path]]] = {}
        for stage in stage_ids():
            correct[stage] = [("solution", SOLUTIONS / stage / f"{stage}.ipynb")]
            for s in CORRECT_EXAMPLES:
                f = Submission(EXAMPLES / s).file(stage)
                if f is not None:
                    correct[stage].append((s, f))
            expected = json.loads((EXPECTED / f"{stage}.json").read_text())["students"]
            top = load_spec(stage).max_score
            mistakes[stage], losing[stage] = [], []
            for s, e in sorted(expected.items()):
                if (f := Submission(EXAMPLES / s).file(stage)) is None or s == HANGING[0]:
                    continue
                if e["misconceptions"]:
                    mistakes[stage].append((s, f))
                elif e["score"] < top:
                    losing[stage].append((s, f))
        return cls(correct, mistakes, losing)


def build_class(root: Path, n: int, seed: int) -> dict[tuple[str, str], str]:
    """Write the class under ``root``; return (student, stage) -> kind (correct, mistake:WHO,
    broken, hanging)."""
    import nbformat

    from autograder.runtime.submission import Submission
    from autograder.stages import requires, stage_ids

    rng = random.Random(seed)
    pools = Pools.load()
    stages = stage_ids()
    solution_nbs = {s: _notebook(SOLUTIONS / s / f"{s}.ipynb") for s in stages}
    hanging_student = rng.randrange(n)
    kinds: dict[tuple[str, str], str] = {}
    width = len(str(n))
    for i in range(n):
        student = f"s{i:0{width}d}"
        folder = root / student
        folder.mkdir(parents=True)
        nbs: dict[str, Any] = {}
        for stage in stages:
            kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
            if i == hanging_student and stage == HANGING[1]:
                kind = "hanging"
            if kind == "correct":
                origin, f = rng.choice(pools.correct[stage])
                nbs[stage] = _notebook(f)
            elif kind == "mistake":
                origin, f = rng.choice(pools.mistakes[stage])
                nbs[stage] = _notebook(f)
                kind = f"mistake:{origin}"
                for dep in requires(stage):  # that student's own earlier stages it runs, if any
                    if (d := Submission(EXAMPLES / origin).file(dep)) is not None and kinds.get(
                        (student, dep)
                    ) != "hanging":
                        nbs[dep] = _notebook(d)
                        kinds[(student, dep)] = f"mistake-dep:{origin}"
            elif kind == "broken":
                nbs[stage] = _broken(solution_nbs[stage], rng)
            else:
                nbs[stage] = _notebook(Submission(EXAMPLES / HANGING[0]).file(HANGING[1]))
            kinds[(student, stage)] = kind
        for stage, nb in nbs.items():
            nbformat.write(nb, folder / f"{stage}.ipynb")
    return kinds


def build_correct_class(root: Path, n: int, seed: int) -> dict[tuple[str, str], str]:
    """Every (student, stage) correct: the solution notebook or a correct example
    student's file (``Pools.correct``); kinds ``correct:WHO``."""
    import nbformat

    from autograder.stages import stage_ids

    rng = random.Random(seed)
    pools = Pools.load()
    kinds: dict[tuple[str, str], str] = {}
    width = len(str(n))
    for i in range(n):
        student = f"s{i:0{width}d}"
        folder = root / student
        folder.mkdir(parents=True)
        for stage in stage_ids():
            origin, f = rng.choice(pools.correct[stage])
            nbformat.write(_notebook(f), folder / f"{stage}.ipynb")
            kinds[(student, stage)] = f"correct:{origin}"
    return kinds


def build_failing_class(root: Path, n: int, seed: int) -> dict[tuple[str, str], str]:
    """Every (student, stage) fails something or leaves something unwritten (``FAIL_MIX``):
    a named mistake (``Pools.mistakes``), another example student's losing file
    (``Pools.losing``), the solution with one task left as the template has it
    (``_unfinished``), or the solution with a syntax error (``_broken``). No hanging student.
    A stage that runs earlier ones runs the student's own, failing too (a mistake's author's
    own earlier stages do not come along, as they do in the mix: most are correct). Kinds:
    ``mistake:WHO``, ``losing:WHO``, ``unfinished:GRADE_ID``, ``broken``."""
    import nbformat

    from autograder.stages import stage_ids

    rng = random.Random(seed)
    pools = Pools.load()
    stages = stage_ids()
    solution_nbs = {s: _notebook(SOLUTIONS / s / f"{s}.ipynb") for s in stages}
    templates = {s: _notebook(ROOT / "assignments" / s / f"{s}.ipynb") for s in stages}
    kinds: dict[tuple[str, str], str] = {}
    width = len(str(n))
    for i in range(n):
        student = f"s{i:0{width}d}"
        folder = root / student
        folder.mkdir(parents=True)
        for stage in stages:
            kind = rng.choices(list(FAIL_MIX), weights=list(FAIL_MIX.values()))[0]
            if kind == "losing" and not pools.losing[stage]:
                kind = "mistake"  # a stage whose losing students all name a mistake
            if kind in ("mistake", "losing"):
                origin, f = rng.choice(getattr(pools, "mistakes" if kind == "mistake" else kind)[stage])
                nb, kind = _notebook(f), f"{kind}:{origin}"
            elif kind == "unfinished":
                nb, task = _unfinished(solution_nbs[stage], templates[stage], rng)
                kind = f"unfinished:{task}"
            else:
                nb = _broken(solution_nbs[stage], rng)
            nbformat.write(nb, folder / f"{stage}.ipynb")
            kinds[(student, stage)] = kind
    return kinds


BUILDERS = {"mix": build_class, "correct": build_correct_class, "failing": build_failing_class}


# -- memory ---------------------------------------------------------------------------------


class TreeRSS:
    """Samples the summed RSS of this process and its descendants every ``period`` s, and
    their summed PSS every ``pss_every`` samples.

    The RSS sum counts a page once per process that maps it: the fork server's torch (some
    180 MB) once more for every job's init and child, all of it shared, copy-on-write. The
    PSS sum splits each shared page among the processes that map it: what the tree holds
    in memory. It is sampled less often (smaps_rollup walks page tables under the mm lock:
    every 0.2 s it slowed the batch twofold), so its peak may miss a short one."""

    def __init__(self, period: float = 0.2, pss_every: int = 5) -> None:
        self.period = period
        self.pss_every = pss_every
        self.peak_rss = 0
        self.peak_pss = 0
        self._samples = 0
        self.peak_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._page = os.sysconf("SC_PAGE_SIZE")

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
        out, todo = [], [os.getpid()]
        while todo:
            p = todo.pop()
            out.append(p)
            todo += children.get(p, [])
        return out

    def sample(self) -> None:
        rss = 0
        procs = self._tree()
        for p in procs:
            try:
                r = int(Path(f"/proc/{p}/statm").read_text().split()[1]) * self._page
            except (OSError, IndexError, ValueError):
                continue
            rss += r
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_procs = max(self.peak_procs, len(procs))
        if self._samples % self.pss_every == 0:
            self.peak_pss = max(self.peak_pss, sum(_pss(p) for p in procs))
        self._samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def __enter__(self) -> TreeRSS:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _pss(pid: int) -> int:
    """``pid``'s proportional set size in bytes (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


# -- ours -----------------------------------------------------------------------------------


@dataclass
class BatchFigures:
    students: int
    notebooks: int
    workers: int
    wall_s: float
    first_done_s: float  # until the first grade came back: worker start-up, plans
    peak_rss: int
    peak_pss: int  # what the tree holds (``TreeRSS``): the memory target's measure
    peak_procs: int
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # kind -> mean fraction
    # every time limit the class hit (a call or a cell that never returned): seconds each;
    # no grader stops a hang sooner than its limit, so the floor pays them too
    hangs_s: list[float] = field(default_factory=list)
    # stage -> kind (correct, mistake, mistake-dep, broken; the correct and failing classes'
    # kinds: ``build_correct_class``, ``build_failing_class``; a notebook of the correct class
    # that lost points is "lost", one of the failing class at full marks "passed") -> seconds
    # of each grade_stage call (wall, in its worker); the hanging student's stages left out
    # (they time their limits)
    stage_s: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    # the same notebooks, in the same order: seconds of the counterexample search after the
    # grade (``Counterexamples.for_stage``, a child of its own), 0 where none ran
    search_s: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    # the notebooks at full marks, of those graded (the hanging student's left out)
    full_marks: int = 0
    # the same notebooks again: whether each is warm, i.e. not of the first ``workers``
    # students to start (``cold_students``: each worker's first pays the first use of every
    # stage, its plans, ladders and imports), nor a worker's first notebook of its stage
    warm: dict[str, dict[str, list[bool]]] = field(default_factory=dict)
    cold_students: list[str] = field(default_factory=list)


class StageClock:
    """Times every ``Grader.grade_stage`` call made while it is entered: one stage of one
    submission, as ``batch`` grades it (the fork, the cells, the calls, the checks, the
    score), keyed by (student folder, stage); and, apart, the counterexample search a
    failing stage gets after its grade (``Counterexamples.for_stage``, where the grader
    has it). Each key's calls are summed; ``started``: when each key's first call began."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = {}
        self.search: dict[tuple[str, str], float] = {}
        self.started: dict[tuple[str, str], float] = {}
        self.worker: dict[tuple[str, str], int] = {}  # the thread (batch worker) that graded it
        self._lock = threading.Lock()
        self._restore: list[tuple[Any, str, Any]] = []

    def _wrap(
        self,
        owner: Any,
        name: str,
        into: dict[tuple[str, str], float],
        key_of: Callable[..., tuple[str, str]],
    ) -> None:
        """Time ``owner.name``'s calls into ``into``, keyed by ``key_of(*args)``."""
        original = getattr(owner, name)
        lock, started, worker = self._lock, self.started, self.worker

        def timed(this: Any, *args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            key = key_of(*args)
            with lock:
                started.setdefault(key, t)
                worker.setdefault(key, threading.get_ident())
            try:
                return original(this, *args, **kwargs)
            finally:
                with lock:
                    into[key] = into.get(key, 0.0) + time.perf_counter() - t

        setattr(owner, name, timed)
        self._restore.append((owner, name, original))

    def __enter__(self) -> StageClock:
        from autograder.grader import counterexample
        from autograder.grader.grade import Grader

        self._wrap(
            Grader, "grade_stage", self.seconds, lambda submission, stage, *_: (Path(submission).name, stage)
        )
        searcher = getattr(counterexample, "Counterexamples", None)
        if searcher is not None and hasattr(searcher, "for_stage"):  # for_stage(job, names)
            self._wrap(
                searcher, "for_stage", self.search, lambda job, *_: (Path(job.submission).name, job.stage)
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()


_LIMIT_HIT = re.compile(r"did not finish within (\d+(?:\.\d+)?) s")


def hangs(rows: list[dict[str, Any]]) -> list[float]:
    """The time limits the graded class hit, from its gradebook: each hanging cell (a note)
    and each hanging call (a case; the name's later calls are skipped, not run) once."""
    out = []
    for r in rows:
        result = json.loads(r["result"])
        for note in result["notes"]:  # "code cell 5 (...) raised Timeout: did not finish within 20 s"
            out += [float(m) for m in _LIMIT_HIT.findall(note)]
        for case in (c["message"] for t in result["tests"] for c in t["cases"]):
            # a call that hung; not the cases that repeat a cell's timeout, nor the later
            # calls of a name that hung (skipped, never waited for)
            if "raised Timeout" not in case and "not run:" not in case:
                out += [float(m) for m in _LIMIT_HIT.findall(case)]
    return out


def grade_class(
    class_dir: Path, workers: int, db: Path, kinds: dict[tuple[str, str], str], which: str = "mix"
) -> BatchFigures:
    """``which``: the class's name (``CLASSES``): in the correct class, a notebook that
    lost points is timed as "lost"; in the failing class, one at full marks as "passed"."""
    from autograder.grader.batch import Gradebook, discover, run

    units = discover(class_dir, None)
    stamps: list[float] = []
    t0 = time.perf_counter()
    with TreeRSS() as mem, StageClock() as clock, Gradebook(db) as book:
        report = run(units, book, workers, progress=lambda n, total: stamps.append(time.perf_counter()))
        rows = book.rows()
    wall = time.perf_counter() - t0
    assert report.graded == len(units), report
    by_kind: dict[str, list[float]] = {}
    for r in rows:
        kind = kinds.get((r["student"], r["stage"]), "?").split(":")[0]
        by_kind.setdefault(kind, []).append(r["score"] / r["max_score"])
    hanging = {student for (student, _), kind in kinds.items() if kind == "hanging"}
    full = {(r["student"], r["stage"]): r["score"] >= r["max_score"] > 0 for r in rows}
    first: dict[str, float] = {}
    for (student, _), t in clock.started.items():
        first[student] = min(t, first.get(student, t))
    cold = sorted(first, key=first.__getitem__)[:workers]
    # each worker's first notebook of each stage pays that stage's once-per-grader costs (its
    # plan read from the store, its drivers' warm-up; in the failing class, the small inputs
    # built from the store on the first failing notebook): not the steady state either
    opened: dict[tuple[int, str], tuple[float, tuple[str, str]]] = {}
    for key, t in clock.started.items():
        at = (clock.worker.get(key, 0), key[1])
        if at not in opened or t < opened[at][0]:
            opened[at] = (t, key)
    stage_first = {key for _, key in opened.values()}
    stage_s: dict[str, dict[str, list[float]]] = {}
    search_s: dict[str, dict[str, list[float]]] = {}
    warm: dict[str, dict[str, list[bool]]] = {}
    for (student, stage), seconds in sorted(clock.seconds.items()):
        if student not in hanging:
            kind = kinds.get((student, stage), "?").split(":")[0]
            if which == "correct" and not full.get((student, stage), True):
                kind = "lost"
            elif which == "failing" and full.get((student, stage), False):
                kind = "passed"
            stage_s.setdefault(stage, {}).setdefault(kind, []).append(seconds)
            searched = clock.search.get((student, stage), 0.0)
            search_s.setdefault(stage, {}).setdefault(kind, []).append(searched)
            warm.setdefault(stage, {}).setdefault(kind, []).append(
                student not in cold and (student, stage) not in stage_first
            )
    students = len({u.student for u in units})
    return BatchFigures(
        students,
        len(units),
        workers,
        wall,
        (stamps[1] - t0) if len(stamps) > 1 else wall,
        mem.peak_rss,
        mem.peak_pss,
        mem.peak_procs,
        {k: {"n": len(v), "mean_fraction": statistics.fmean(v)} for k, v in sorted(by_kind.items())},
        hangs(rows),
        stage_s,
        search_s,
        sum(ok for (student, _), ok in full.items() if student not in hanging),
        warm,
        cold,
    )


def grade_sharded(class_dir: Path, workers: int, shards: int, base: Path, whole: Path) -> dict[str, Any]:
    """The class as ``shards`` shards (``--shard K/N``) graded one after another, each by a
    fresh ``batch`` run into its own gradebook (what one task of a job array does), then
    ``merge``d: the wall times, and whether the merged book equals the unsharded one."""
    from autograder.grader.batch import Gradebook, discover, run

    per_shard, t0 = [], time.perf_counter()
    books = []
    for k in range(1, shards + 1):
        db = base / f"shard{k}of{shards}.db"
        db.unlink(missing_ok=True)
        t = time.perf_counter()
        units = discover(class_dir, None, (k, shards))
        with Gradebook(db) as book:
            run(units, book, workers)
        per_shard.append(
            {
                "students": len({u.student for u in units}),
                "units": len(units),
                "wall_s": time.perf_counter() - t,
            }
        )
        books.append(db)
    t = time.perf_counter()
    merged = base / f"merged{shards}.db"
    merged.unlink(missing_ok=True)
    with Gradebook(merged) as book:
        for db in books:
            book.merge(db)
        rows = book.rows()
    merge_s = time.perf_counter() - t
    with Gradebook(whole) as book:
        reference = book.rows()

    def scores(rs: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
        return {(r["student"], r["stage"]): r["score"] for r in rs}

    return {
        "shards": shards,
        "per_shard": per_shard,
        "merge_s": merge_s,
        "wall_s": time.perf_counter() - t0,
        "same_grades": scores(rows) == scores(reference),
    }


# -- nbgrader -------------------------------------------------------------------------------


def _graded_py(nb_path: Path) -> str:
    """A stage notebook's graded code cells as one .py file (what load_stage runs)."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    return "\n\n".join(
        c.source
        for c in nb.cells
        if c.cell_type == "code" and "skip-grading" not in c.metadata.get("tags", [])
    )


def pick_sample(
    class_dir: Path, kinds: dict[tuple[str, str], str], size: int, seed: int
) -> list[tuple[str, str]]:
    """``size`` (student, stage) pairs, round robin over the stages, in proportion to the mix;
    the hanging notebook and notebooks with shell escapes (a kernel would run them) left out."""
    from autograder.stages import stage_ids

    rng = random.Random(seed + 1)
    stages = stage_ids()
    students = sorted(p.name for p in class_dir.iterdir() if p.is_dir())
    rng.shuffle(students)
    sample: list[tuple[str, str]] = []
    used: set[tuple[str, str]] = set()
    j = 0
    while len(sample) < size and j < len(students) * len(stages):
        stage = stages[len(sample) % len(stages)]
        student = students[j % len(students)]
        j += 1
        key = (student, stage)
        if key in used or kinds[key] == "hanging":
            continue
        text = (class_dir / student / f"{stage}.ipynb").read_text()
        if re.search(r'"\s*!', text):
            continue
        used.add(key)
        sample.append(key)
    return sample


def _nbgrader(course: Path, *args: str) -> float:
    # this checkout's venv, else the one running the bench (a checkout measured from another's venv)
    bin_dir = ROOT / ".venv" / "bin"
    if not (bin_dir / "nbgrader").is_file():
        bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    t = time.perf_counter()
    p = subprocess.run(
        [str(bin_dir / "nbgrader"), *args],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return elapsed


def nbgrader_sample(class_dir: Path, sample: list[tuple[str, str]], course: Path) -> dict[str, Any]:
    """Grade ``sample`` with the real nbgrader autograde; seconds and where they went."""
    import nbformat

    from autograder.stages import load_spec

    (course / "source").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"c.CourseDirectory.root = {str(course)!r}\n"
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(course / 'gradebook.db')!r}\n"
        "c.ClearSolutions.code_stub = {'python': '# YOUR CODE HERE\\nraise NotImplementedError()'}\n"
        f"c.ExecutePreprocessor.timeout = {CELL_TIMEOUT_S}\n"
    )
    stages = sorted({st for _, st in sample})
    for stage in stages:
        shutil.copytree(SOLUTIONS / stage, course / "source" / stage)
        _nbgrader(course, "generate_assignment", stage, "--force")
    for student, stage in sample:
        d = course / "submitted" / student / stage
        d.mkdir(parents=True)
        shutil.copy(class_dir / student / f"{stage}.ipynb", d / f"{stage}.ipynb")
        for extra in (SOLUTIONS / stage).iterdir():  # the released data files
            if extra.suffix != ".ipynb":
                shutil.copy(extra, d / extra.name)
        todo = list(load_spec(stage).uses)
        while todo:  # the stages it loads, beside it (load_stage finds them there)
            dep = todo.pop(0)
            (d / f"{dep}.py").write_text(_graded_py(class_dir / student / f"{dep}.ipynb"))
            todo += load_spec(dep).uses
    per_stage: dict[str, float] = {}
    t0 = time.perf_counter()
    for stage in stages:
        per_stage[stage] = _nbgrader(course, "autograde", stage, "--force")
    total = time.perf_counter() - t0
    # where the kernel's time went: nbclient records each cell's execution timestamps
    from datetime import datetime

    cells = {"graded": 0.0, "skip-grading": 0.0}
    # per stage: notebooks, seconds in graded and in skip-grading cells, cells stopped by the
    # cell time limit (autograde interrupts them and goes on: their cost is that limit)
    stage_cells = {st: {"notebooks": 0, "graded": 0.0, "skip-grading": 0.0, "timed_out": 0} for st in stages}
    graded_nbs = 0
    for student, stage in sample:
        stage_cells[stage]["notebooks"] += 1
        f = course / "autograded" / student / stage / f"{stage}.ipynb"
        if not f.is_file():
            continue
        graded_nbs += 1
        for c in nbformat.read(f, as_version=4).cells:
            ex = c.get("metadata", {}).get("execution", {})
            if "iopub.execute_input" in ex and "shell.execute_reply" in ex:
                dt = (
                    datetime.fromisoformat(ex["shell.execute_reply"].replace("Z", "+00:00"))
                    - datetime.fromisoformat(ex["iopub.execute_input"].replace("Z", "+00:00"))
                ).total_seconds()
                where = "skip-grading" if "skip-grading" in c.metadata.get("tags", []) else "graded"
                cells[where] += dt
                stage_cells[stage][where] += dt
            if any(o.get("ename") == "CellTimeoutError" for o in c.get("outputs", [])):
                stage_cells[stage]["timed_out"] += 1
    return {
        "notebooks": len(sample),
        "autograded": graded_nbs,
        "seconds": total,
        "per_stage_s": per_stage,
        "cells_s": cells,
        "per_stage_cells_s": stage_cells,
        "cell_timeout_s": CELL_TIMEOUT_S,
        "sample": [f"{a}/{b}" for a, b in sample],
    }


# -- the floor ------------------------------------------------------------------------------


def floor_figures(repeat: int = 3, child_repeat: int = 15) -> dict[str, Any]:
    """Per stage, the reference on every case in-process; one warm child per submission."""
    import torch

    from autograder.grader.grade import Grader
    from autograder.grader.plan import run_trusted
    from autograder.grader.runner import Limits
    from autograder.stages import load_spec, stage_ids
    from autograder.stages.spec import build_case

    torch.set_num_threads(1)  # as a child: one thread
    ref: dict[str, float] = {}
    for stage in stage_ids():
        spec = load_spec(stage)
        cases = [
            (graded, build_case(spec, graded, test, case))
            for graded in spec.graded
            for test in graded.tests
            for case in test.cases
        ]
        run_trusted  # noqa: B018
        for g, data in cases:  # warm: first-call costs are not the floor
            run_trusted(g.reference, g, data, "cpu", spec)
        runs = []
        for _ in range(repeat):
            t = time.perf_counter()
            for g, data in cases:
                run_trusted(g.reference, g, data, "cpu", spec)
            runs.append(time.perf_counter() - t)
        ref[stage] = statistics.median(runs)
    with tempfile.TemporaryDirectory(prefix="bertlab-bench-") as tmp:
        empty = Path(tmp) / "01_attention.py"
        empty.write_text("")
        with Grader(limits=Limits()) as g:
            g.grade(empty, ["01_attention"])  # warm
            child = []
            for _ in range(child_repeat):
                t = time.perf_counter()
                g.grade(empty, ["01_attention"])
                child.append(time.perf_counter() - t)
    return {"reference_s": ref, "child_s": statistics.median(child), "child_samples_s": child}


# -- self-check -----------------------------------------------------------------------------


def selfcheck_latency(repeat: int = 3) -> dict[str, dict[str, Any]]:
    """Every ``check(x)`` of each solution notebook, timed in a warm kernel."""
    import nbformat
    from nbclient import NotebookClient

    from autograder.stages import stage_ids

    logging.getLogger("traitlets").setLevel(logging.ERROR)
    out: dict[str, dict[str, Any]] = {}
    for stage in stage_ids():
        path = SOLUTIONS / stage / f"{stage}.ipynb"
        nb = nbformat.read(path, as_version=4)
        last = max(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "check(" in c.source)
        client = NotebookClient(
            nb,
            kernel_name="python3",
            timeout=300,
            allow_errors=True,
            resources={"metadata": {"path": str(path.parent)}},
        )
        times: dict[str, list[float]] = {}
        t_kernel = time.perf_counter()
        with client.setup_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
            kernel_s = time.perf_counter() - t_kernel
            setup_s = 0.0
            for i, cell in enumerate(nb.cells[: last + 1]):
                if cell.cell_type != "code":
                    continue
                for name in re.findall(r"\bcheck\((\w+)\)", cell.source):
                    probe = nbformat.v4.new_code_cell(f"_bench_r = check({name})")
                    nb.cells.append(probe)  # nbclient writes outputs by index into nb.cells
                    for _ in range(repeat):
                        t = time.perf_counter()
                        client.execute_cell(probe, len(nb.cells) - 1)
                        times.setdefault(name, []).append(time.perf_counter() - t)
                    nb.cells.pop()
                    errs = [o for o in probe.outputs if o.get("output_type") == "error"]
                    if errs:
                        times[name] = [float("nan")]
                        print(
                            f"  self-check {stage} check({name}) raised {errs[0].get('ename')}",
                            file=sys.stderr,
                        )
                t = time.perf_counter()
                client.execute_cell(cell, i)
                setup_s += time.perf_counter() - t
        flat = [x for v in times.values() for x in v]
        first = [v[0] for v in times.values()]
        out[stage] = {
            "kernel_start_s": kernel_s,
            "cells_s": setup_s,
            "median_s": statistics.median(flat) if flat else None,
            "max_s": max(flat) if flat else None,
            "first_call_median_s": statistics.median(first) if first else None,
            "per_check_s": times,
        }
    return out


# -- report ---------------------------------------------------------------------------------


def stage_table(
    ours: BatchFigures, floor: dict[str, Any] | None, nbg: dict[str, Any] | None, sc: dict[str, Any] | None
) -> dict[str, dict[str, Any]]:
    """Per stage (seconds): ours' grading time per submission (median, mean; correct and
    named-mistake notebooks apart), its floor (the reference on every case + a warm child)
    and the ratio of the two means; nbgrader's time per notebook, its share in the demos;
    the self-check's median."""
    out: dict[str, dict[str, Any]] = {}
    for stage, by_kind in sorted(ours.stage_s.items()):
        every = [x for xs in by_kind.values() for x in xs]
        row: dict[str, Any] = {
            "n": len(every),
            "median_s": statistics.median(every),
            "mean_s": statistics.fmean(every),
            "correct_mean_s": statistics.fmean(by_kind["correct"]) if by_kind.get("correct") else None,
            "mistake_mean_s": statistics.fmean(by_kind["mistake"]) if by_kind.get("mistake") else None,
        }
        if floor:
            row["floor_s"] = floor["reference_s"][stage] + floor["child_s"]
            row["over_floor"] = row["mean_s"] / row["floor_s"]
        if nbg and (c := nbg["per_stage_cells_s"].get(stage)) and c["notebooks"]:
            row["nbgrader_s"] = nbg["per_stage_s"][stage] / c["notebooks"]
            row["nbgrader_demo_s"] = c["skip-grading"] / c["notebooks"]
            row["nbgrader_timed_out"] = c["timed_out"]
            # one nbgrader kernel against one of ours, each on one core, demos not run: the
            # ratio a stage can reach is at most (nbgrader's time) / (its floor)
            row["nbgrader_graded_over_ours"] = (row["nbgrader_s"] - row["nbgrader_demo_s"]) / row["mean_s"]
        if sc and stage in sc:
            row["selfcheck_median_s"] = sc[stage]["median_s"]
            row["selfcheck_max_s"] = sc[stage]["max_s"]
        out[stage] = row
    return out


FAILING_KINDS = ("mistake", "losing", "unfinished", "broken")


def failing_vs_correct(correct: BatchFigures, failing: BatchFigures) -> dict[str, dict[str, Any]]:
    """Per stage (seconds): what a notebook costs, its grade (``grade_stage``) and the
    counterexample search after it summed, in the correct class (its notebooks at full
    marks) and in the failing class (its notebooks that lose points: ``FAILING_KINDS``),
    warm (``BatchFigures.warm``; all of them in a class of no more students than workers):
    mean and median, their ratios failing / correct (the target: ``TARGETS``, on the means),
    the search's share, the failing class's mean per kind; and the ratio of the means of
    every notebook, the first students' included (``ratio_mean_all``)."""

    def totals(
        f: BatchFigures, stage: str, kinds: tuple[str, ...], warm_only: bool
    ) -> tuple[list[float], list[float]]:
        out_t, out_s = [], []
        for k in kinds:
            grade = f.stage_s.get(stage, {}).get(k, [])
            search = f.search_s.get(stage, {}).get(k, [])
            warm = f.warm.get(stage, {}).get(k, [True] * len(grade))
            for g, x, w in zip(grade, search, warm, strict=True):
                if w or not warm_only:
                    out_t.append(g + x)
                    out_s.append(x)
        return out_t, out_s

    out: dict[str, dict[str, Any]] = {}
    for stage in sorted(set(correct.stage_s) | set(failing.stage_s)):
        row: dict[str, Any] = {}
        every_ok, _ = totals(correct, stage, ("correct",), False)
        every_bad, _ = totals(failing, stage, FAILING_KINDS, False)
        if every_ok and every_bad:
            row["ratio_mean_all"] = statistics.fmean(every_bad) / statistics.fmean(every_ok)
        ok, _ = totals(correct, stage, ("correct",), True)
        bad, bad_search = totals(failing, stage, FAILING_KINDS, True)
        row["warm"] = warm_only = bool(ok and bad)
        if not warm_only:
            ok, _ = totals(correct, stage, ("correct",), False)
            bad, bad_search = totals(failing, stage, FAILING_KINDS, False)
        row |= {"correct_n": len(ok), "failing_n": len(bad)}
        if ok:
            row |= {"correct_mean_s": statistics.fmean(ok), "correct_median_s": statistics.median(ok)}
        if bad:
            by_kind = {k: totals(failing, stage, (k,), warm_only)[0] for k in FAILING_KINDS}
            row |= {
                "failing_mean_s": statistics.fmean(bad),
                "failing_median_s": statistics.median(bad),
                "failing_search_mean_s": statistics.fmean(bad_search),
                "failing_by_kind_mean_s": {k: statistics.fmean(v) for k, v in by_kind.items() if v},
            }
        if ok and bad:
            row["ratio_mean"] = row["failing_mean_s"] / row["correct_mean_s"]
            row["ratio_median"] = row["failing_median_s"] / row["correct_median_s"]
        out[stage] = row
    return out


def print_failing_table(table: dict[str, dict[str, Any]], cold: int) -> None:
    def ms(x: float | None) -> str:
        return "—" if x is None else f"{1000 * x:,.0f}"

    head = (
        "stage",
        "n",
        "correct",
        "failing",
        "of it search",
        "fail/corr",
        "all",
        "by kind (failing, mean)",
    )
    lines = [head]
    for stage, r in table.items():
        ratio = f"{r['ratio_mean']:.2f}x / {r['ratio_median']:.2f}x" if "ratio_mean" in r else "—"
        lines.append(
            (
                stage + ("" if r["warm"] else " *"),
                f"{r['correct_n']} / {r['failing_n']}",
                f"{ms(r.get('correct_mean_s'))} / {ms(r.get('correct_median_s'))}",
                f"{ms(r.get('failing_mean_s'))} / {ms(r.get('failing_median_s'))}",
                ms(r.get("failing_search_mean_s")),
                ratio,
                f"{r['ratio_mean_all']:.2f}x" if "ratio_mean_all" in r else "—",
                ", ".join(f"{k} {ms(v)}" for k, v in r.get("failing_by_kind_mean_s", {}).items()),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    print(
        "\nfailing class against correct class, per notebook, warm (ms; mean / median): grade_stage plus "
        "the\ncounterexample search after it (its mean apart), in the correct class (notebooks at full "
        f"marks) and in\nthe failing class (notebooks that lose points), the first {cold} students to "
        "start in each class and\neach worker's first notebook of each stage left out (* where that "
        "leaves none: all); n = correct / failing notebooks; "
        "fail/corr = mean / median ratio;\nall = ratio of the means of every notebook, the first "
        "students' included"
    )
    for line in lines:
        print(
            "  ".join(
                x.ljust(w) if i in (0, len(head) - 1) else x.rjust(w)
                for i, (x, w) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
        )


def print_stage_table(per_stage: dict[str, dict[str, Any]]) -> None:
    def ms(x: float | None) -> str:
        return "—" if x is None else f"{1000 * x:,.0f}"

    head = (
        "stage",
        "n",
        "median",
        "mean",
        "correct",
        "mistake",
        "floor",
        "/floor",
        "nbgrader",
        "in demos",
        "nbg/ours",
        "self-check",
    )
    lines = [head]
    for stage, r in per_stage.items():
        lines.append(
            (
                stage,
                str(r["n"]),
                ms(r["median_s"]),
                ms(r["mean_s"]),
                ms(r["correct_mean_s"]),
                ms(r["mistake_mean_s"]),
                ms(r.get("floor_s")),
                f"{r['over_floor']:.2f}x" if "over_floor" in r else "—",
                ms(r.get("nbgrader_s")),
                ms(r.get("nbgrader_demo_s")),
                f"{r['nbgrader_graded_over_ours']:.1f}x" if "nbgrader_graded_over_ours" in r else "—",
                f"{ms(r.get('selfcheck_median_s'))} / {ms(r.get('selfcheck_max_s'))}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    print(
        "\nper stage (ms): ours' grading time per submission (wall in its worker; median, mean, and "
        "the means of\ncorrect and named-mistake notebooks), its floor (reference + warm child) and "
        "mean / floor; nbgrader per\nnotebook, its time in the skip-grading demos, and the rest over "
        "ours' mean (both one core's);\nself-check median / max per check() call"
    )
    for line in lines:
        print(
            "  ".join(
                x.ljust(w) if i == 0 else x.rjust(w)
                for i, (x, w) in enumerate(zip(line, widths, strict=True))
            )
        )


def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def _classes(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CLASSES]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a comma-separated list of {', '.join(CLASSES)}, each once")
    return names


def main(argv: list[str] | None = None) -> int:
    from autograder.grader.batch import default_workers

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--students", type=int, default=40, help="students per class (default 40)")
    ap.add_argument(
        "--classes",
        type=_classes,
        default=["failing", "correct"],
        help="the classes graded, one after another: mix (80%% correct, 16%% named mistakes, 4%% broken, "
        "one hanging student), correct (every notebook passes), failing (every notebook fails something "
        "or leaves something unwritten); the first is the one of the whole-class figures and targets "
        "(default: failing,correct)",
    )
    ap.add_argument("--workers", type=int, default=default_workers(), help="batch workers (default: cores)")
    ap.add_argument(
        "--sample",
        type=int,
        default=11,
        help="notebooks of the mix and of the failing class graded by nbgrader (default 11: one per stage)",
    )
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument(
        "--memory-scaling", action="store_true", help="also grade 50 and 200 students (first class): peak RSS"
    )
    ap.add_argument(
        "--shards",
        type=int,
        default=0,
        help="also grade the first class as N shards one after another, then merge",
    )
    ap.add_argument("--skip-nbgrader", action="store_true")
    ap.add_argument("--skip-selfcheck", action="store_true")
    ap.add_argument("--skip-floor", action="store_true")
    ap.add_argument("--keep", type=Path, help="build the classes here and keep them (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=ROOT / "build" / "bench" / "bench_class.json")
    args = ap.parse_args(argv)
    from autograder.stages import stage_ids

    stages = stage_ids()
    primary = args.classes[0]
    figures: dict[str, Any] = {
        "students": args.students,
        "classes": args.classes,
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "load_average_start": list(os.getloadavg()),
    }
    tmp_ctx = tempfile.TemporaryDirectory(prefix="bertlab-bench-class-")
    tmp = Path(tmp_ctx.name)
    base = args.keep or tmp
    print(
        f"bench_class: classes {', '.join(args.classes)} of {args.students} students × {len(stages)} stages, "
        f"{args.workers} workers, {os.cpu_count()} CPUs, seed {args.seed}; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    graded: dict[str, BatchFigures] = {}
    nbgs: dict[str, dict[str, Any] | None] = {}
    per_class: dict[str, dict[str, Any]] = {}
    try:
        for which in args.classes:
            class_dir = base / f"{which}{args.students}"
            t = time.perf_counter()
            kinds = BUILDERS[which](class_dir, args.students, args.seed)
            counts: dict[str, int] = {}
            for k in kinds.values():
                counts[k.split(":")[0]] = counts.get(k.split(":")[0], 0) + 1
            print(f"  {which} class built in {time.perf_counter() - t:.1f} s: {counts}", flush=True)
            db = base / f"gradebook-{which}{args.students}.db"
            f = grade_class(class_dir, args.workers, db, kinds, which)
            graded[which] = f
            per_class[which] = {"mix": counts, "batch": f.__dict__}
            print(
                f"  batch, {which} class: {f.notebooks} notebooks in {f.wall_s:.1f} s "
                f"({1000 * f.wall_s / f.notebooks:,.0f} ms/notebook; first grade back after "
                f"{f.first_done_s:.1f} s); peak RSS {_mib(f.peak_rss)}, PSS {_mib(f.peak_pss)}; "
                f"{f.full_marks} at full marks; "
                f"limits hit: {len(f.hangs_s)}",
                flush=True,
            )
            print(
                f"    mean score fraction by kind: "
                f"{ {k: round(v['mean_fraction'], 3) for k, v in f.scores.items()} }",
                flush=True,
            )
            if which == "mix":
                figures["mix"] = counts  # the figures of before --classes, kept
            if which == primary:
                figures["batch"] = f.__dict__
                primary_dir = class_dir

            if which != "correct" and not args.skip_nbgrader and args.sample > 0:
                sample = pick_sample(class_dir, kinds, args.sample, args.seed)
                try:
                    nbg = nbgrader_sample(class_dir, sample, base / f"nbgrader-course-{which}")
                except Exception as exc:  # the batch figures survive a failing part
                    print(f"  nbgrader failed: {type(exc).__name__}: {exc}", flush=True)
                    nbg = None
                nbgs[which] = per_class[which]["nbgrader"] = nbg
                if which == primary:
                    figures["nbgrader"] = nbg
                if nbg:
                    demos = {
                        st: f"{c['skip-grading']:.1f} of {nbg['per_stage_s'][st]:.1f} s"
                        for st, c in nbg["per_stage_cells_s"].items()
                    }
                    print(
                        f"  nbgrader autograde, {which} class: {nbg['notebooks']} notebooks in "
                        f"{nbg['seconds']:.1f} s ({nbg['autograded']} autograded); cells: graded "
                        f"{nbg['cells_s']['graded']:.1f} s, skip-grading "
                        f"{nbg['cells_s']['skip-grading']:.1f} s; "
                        f"in demos per stage: {demos}",
                        flush=True,
                    )
        figures["per_class"] = per_class
        ours = graded[primary]
        per_nb = ours.wall_s / ours.notebooks
        nbg = nbgs.get(primary)

        sharded = None
        if args.shards > 1:
            sharded = grade_sharded(
                primary_dir,
                args.workers,
                args.shards,
                base,
                base / f"gradebook-{primary}{args.students}.db",
            )
            figures["sharded"] = sharded
            walls = ", ".join(f"{x['wall_s']:.1f}" for x in sharded["per_shard"])
            print(
                f"  {args.shards} shards one after another: {sharded['wall_s']:.1f} s "
                f"(shards {walls} s, "
                f"merge {sharded['merge_s']:.2f} s); same grades as unsharded: {sharded['same_grades']}",
                flush=True,
            )

        floor = None
        if not args.skip_floor:
            try:
                floor = floor_figures()
            except Exception as exc:  # the batch figures survive a failing part
                print(f"  floor failed: {type(exc).__name__}: {exc}", flush=True)
                floor = None
            figures["floor"] = floor
            if floor:
                print(
                    f"  floor: reference per stage (ms) "
                    f"{ {s: round(1000 * v, 1) for s, v in floor['reference_s'].items()} }; "
                    f"warm child {1000 * floor['child_s']:.0f} ms",
                    flush=True,
                )

        sc = None
        if not args.skip_selfcheck:
            try:
                sc = selfcheck_latency()
            except Exception as exc:  # the batch figures survive a failing part
                print(f"  selfcheck failed: {type(exc).__name__}: {exc}", flush=True)
                sc = None
            figures["selfcheck"] = sc

        scaling: dict[int, int] = {}
        if args.memory_scaling:
            scaling[args.students] = ours.peak_rss
            for n in (50, 200):
                if n in scaling:
                    continue
                d = base / f"{primary}-scaling{n}"
                k = BUILDERS[primary](d, n, args.seed)
                f = grade_class(d, args.workers, base / f"gradebook-scaling{n}.db", k, primary)
                scaling[n] = f.peak_rss
                figures[f"batch_{n}"] = f.__dict__
                print(
                    f"  memory scaling: {n} students, peak RSS {_mib(f.peak_rss)} ({f.wall_s:.1f} s)",
                    flush=True,
                )
            figures["memory_scaling"] = scaling
    finally:
        tmp_ctx.cleanup()

    # ---- the table ----
    rows: list[tuple[str, str, str]] = []
    verdicts: list[tuple[str, str, str]] = []
    rows.append(
        (
            "students / s",
            f"{ours.students / ours.wall_s:.2f}",
            f"{ours.students} students, wall {ours.wall_s:.1f} s",
        )
    )
    rows.append(
        (
            "ms / notebook (wall)",
            f"{1000 * per_nb:,.0f}",
            f"wall / {ours.notebooks} notebooks, {ours.workers} workers",
        )
    )
    rows.append(("core-ms / notebook", f"{1000 * per_nb * ours.workers:,.0f}", "wall × workers / notebooks"))
    rows.append(
        (
            "start-up (first grade back)",
            f"{ours.first_done_s:.1f} s",
            "spawn workers, torch, fork servers, plans",
        )
    )
    rows.append(
        (
            "peak RSS, process tree",
            _mib(ours.peak_rss),
            f"sum over up to {ours.peak_procs} processes (shared pages counted per process)",
        )
    )
    rows.append(
        (
            "peak PSS, process tree",
            _mib(ours.peak_pss),
            "sum of proportional set sizes (each shared page split among its processes), each 1 s",
        )
    )
    if sharded:
        overhead = sharded["wall_s"] / ours.wall_s
        rows.append(
            (
                f"{sharded['shards']} shards, one after another",
                f"{sharded['wall_s']:.1f} s",
                f"{overhead:.2f}x the unsharded run; merge {sharded['merge_s']:.2f} s; "
                f"grades {'identical' if sharded['same_grades'] else 'DIFFER'}",
            )
        )
        start = sum(x["wall_s"] for x in sharded["per_shard"]) - ours.wall_s
        rows.append(
            (
                "  overhead per shard",
                f"{start / sharded['shards']:.1f} s",
                "(sum of shard walls - unsharded wall) / shards: each task's start-up",
            )
        )
    if nbg:
        nb_per = nbg["seconds"] / nbg["notebooks"]
        ratio = nb_per / per_nb
        share = nbg["cells_s"]["skip-grading"] / nbg["seconds"]
        rows.append(
            ("nbgrader ms / notebook", f"{1000 * nb_per:,.0f}", f"{nbg['notebooks']} notebooks, one process")
        )
        rows.append(
            (
                "  of it in skip-grading cells",
                f"{100 * share:.0f} %",
                "nbgrader runs every cell: its honest cost",
            )
        )
        rows.append(
            ("nbgrader / ours (per notebook)", f"{ratio:.1f}x", "ours at its workers, nbgrader serial")
        )
        graded_only = (nbg["seconds"] - nbg["cells_s"]["skip-grading"]) / nbg["notebooks"]
        rows.append(
            (
                "  without the skip-grading cells",
                f"{graded_only / per_nb:.1f}x",
                "if nbgrader skipped the demos",
            )
        )
        rows.append(
            ("  per core", f"{nb_per / (per_nb * ours.workers):.1f}x", "ours' core time vs nbgrader's wall")
        )
        timed_out = sum(c["timed_out"] for c in nbg["per_stage_cells_s"].values())
        if timed_out:
            rows.append(
                (
                    "  cells stopped by its limit",
                    str(timed_out),
                    f"each counted at nbgrader's {nbg['cell_timeout_s']} s cell limit",
                )
            )
        target = TARGETS["nbgrader" if primary == "mix" else "nbgrader_failing"]
        verdicts.append((f"≥ {target:g}× nbgrader", f"{ratio:.1f}x", "PASS" if ratio >= target else "MISS"))
        verdicts.append(
            (
                "  the same, demos not run",
                f"{graded_only / per_nb:.1f}x",
                "PASS" if graded_only / per_nb >= target else "MISS",
            )
        )
    if floor:
        ref_per_student = sum(floor["reference_s"].values())
        hang_s = sum(ours.hangs_s)
        floor_core = ours.students * ref_per_student + ours.notebooks * floor["child_s"] + hang_s
        floor_wall = floor_core / ours.workers
        ratio_f = ours.wall_s / floor_wall
        rows.append(
            ("floor: reference, all stages", f"{1000 * ref_per_student:,.0f} ms", "per student, in-process")
        )
        rows.append(
            ("floor: warm child", f"{1000 * floor['child_s']:,.0f} ms", "per notebook (empty submission)")
        )
        rows.append(
            (
                "floor, whole class",
                f"{floor_wall:.1f} s",
                f"/ {ours.workers} workers; with {len(ours.hangs_s)} limits hit, {hang_s:g} s",
            )
        )
        rows.append(("ours / floor", f"{ratio_f:.2f}x", "wall, start-up included"))
        steady = (ours.wall_s - ours.first_done_s) / (floor_wall * (ours.notebooks - 1) / ours.notebooks)
        rows.append(("  after start-up", f"{steady:.2f}x", "wall from the first grade back"))
        verdicts.append(
            ("≤ 1.5× floor", f"{ratio_f:.2f}x", "PASS" if ratio_f <= TARGETS["floor"] else "MISS")
        )
    rss_note = f"{_mib(ours.peak_pss)} at {ours.workers} workers (RSS sum {_mib(ours.peak_rss)})"
    verdicts.append(
        (
            f"memory (PSS) ≤ {TARGETS['rss_gib']:g} GiB, {ours.workers} workers",
            rss_note,
            ("PASS" if ours.peak_pss < TARGETS["rss_gib"] * 2**30 else "MISS")
            if ours.workers == 2
            else "n/a (not 2 workers)",
        )
    )
    if scaling:
        lo, hi = scaling.get(50), scaling.get(200)
        for n, b in sorted(scaling.items()):
            rows.append((f"peak RSS, {n} students", _mib(b), ""))
        if lo and hi:
            verdicts.append(
                ("memory flat 50 → 200", f"{hi / lo:.2f}x", "PASS" if hi <= 1.15 * lo else "MISS")
            )
    if sc:
        for stage, s in sc.items():
            rows.append(
                (
                    f"self-check {stage}",
                    f"{1000 * s['median_s']:,.0f} / {1000 * s['max_s']:,.0f} ms",
                    f"median / max; first calls' median {1000 * s['first_call_median_s']:,.0f} ms",
                )
            )
        worst_stage = max(sc, key=lambda st: sc[st]["median_s"])
        worst = sc[worst_stage]["median_s"]
        verdicts.append(
            (
                "self-check < 1 s median",
                f"worst stage {1000 * worst:,.0f} ms",
                "PASS" if worst < TARGETS["selfcheck_s"] else "MISS",
            )
        )
        verdicts.append(
            (
                "self-check < 200 ms median",
                f"{worst_stage[:2]}: {1000 * worst:,.0f} ms",
                "PASS" if worst < TARGETS["selfcheck_median_s"] else "MISS",
            )
        )

    # ---- the classes side by side ----
    for which, f in graded.items():
        f_per_nb = f.wall_s / f.notebooks
        rows.append(
            (
                f"{which} class: ms / notebook",
                f"{1000 * f_per_nb:,.0f}",
                f"{f.notebooks} notebooks in {f.wall_s:.1f} s (start-up {f.first_done_s:.1f} s), "
                f"{f.full_marks} at full marks, peak RSS {_mib(f.peak_rss)}, PSS {_mib(f.peak_pss)}",
            )
        )
        if which != primary and (n := nbgs.get(which)):
            n_per = n["seconds"] / n["notebooks"]
            n_graded = (n["seconds"] - n["cells_s"]["skip-grading"]) / n["notebooks"]
            rows.append(
                (
                    f"  nbgrader / ours ({which})",
                    f"{n_per / f_per_nb:.1f}x",
                    f"nbgrader {1000 * n_per:,.0f} ms / notebook ({n['notebooks']} notebooks); "
                    f"demos not run: {n_graded / f_per_nb:.1f}x",
                )
            )
            target = TARGETS["nbgrader" if which == "mix" else "nbgrader_failing"]
            for label, value in (
                (f"≥ {target:g}× nbgrader ({which} class)", n_per / f_per_nb),
                ("  the same, demos not run", n_graded / f_per_nb),
            ):
                verdicts.append((label, f"{value:.1f}x", "PASS" if value >= target else "MISS"))
    versus = None
    if "correct" in graded and "failing" in graded:
        versus = failing_vs_correct(graded["correct"], graded["failing"])
        figures["failing_vs_correct"] = versus
        c, f = graded["correct"], graded["failing"]
        rows.append(
            (
                "failing / correct, whole class",
                f"{(f.wall_s / f.notebooks) / (c.wall_s / c.notebooks):.2f}x",
                "wall per notebook, start-up included",
            )
        )
        for stage, r in versus.items():
            if "ratio_mean" in r:
                verdicts.append(
                    (
                        f"failing ≤ 1.3× correct, {stage}{'' if r['warm'] else ' (not warm)'}",
                        f"{r['ratio_mean']:.2f}x",
                        "PASS" if r["ratio_mean"] <= TARGETS["failing_over_correct"] else "MISS",
                    )
                )
            else:
                verdicts.append((f"failing ≤ 1.3× correct, {stage}", "—", "n/a (no notebook timed)"))

    per_stage = stage_table(ours, floor, nbg, sc)
    figures["per_stage"] = per_stage
    w1 = max(len(r[0]) for r in rows + verdicts)
    w2 = max(len(r[1]) for r in rows + verdicts)
    print(f"\nfigure ({primary} class unless said)".ljust(w1 + 1), "value".rjust(w2), " note")
    for a, b, c in rows:
        print(a.ljust(w1), b.rjust(w2), "", c)
    print_stage_table(per_stage)
    if versus:
        print_failing_table(versus, len(graded["failing"].cold_students))
    print(f"\ntarget ({primary} class unless said)".ljust(w1 + 1), "measured".rjust(w2), " verdict")
    for a, b, c in verdicts:
        print(a.ljust(w1), b.rjust(w2), "", c)
    figures["verdicts"] = verdicts
    figures["load_average_end"] = list(os.getloadavg())
    print(
        f"\nload average (1, 5, 15 min): {figures['load_average_start']} at the start, "
        f"{[round(x, 2) for x in figures['load_average_end']]} at the end"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cold start (issue 19): one submission graded in about the time it takes to import torch.

Not a test: it prints figures and one PASS/FAIL line per target, each a ratio of two
figures measured in the same run, on the same machine.

Method
------
Every figure is the wall time of a fresh process (or a fresh Gradescope root), as a user
waits for it; ``--repeat`` rounds, each round running every measurement once in the same
order (so a slow minute of a shared machine slows a round, not one figure), then medians.

- *import torch*: ``python -c "import torch"``, the issue's yardstick.
- *CLI*: ``python -m autograder grade solutions/01_attention --stage 01_attention --results
  R.json`` in this checkout, whose ``expected/`` store ``make`` (scripts/install.sh) built;
  the bench refreshes it first, as an install would. Also shown without the store
  (``BERTLAB_EXPECTED_DIR=``): every expected value computed at start-up.
- *run_autograder*: Gradescope's zip (``gradescope-zip``) unpacked into a temporary
  ``/autograder`` root, then what setup.sh does to it besides making the venv (the project
  steps of the zip's own ``scripts/install.sh``: compiling the code, checking the zip's
  expected values), then the real ``run_autograder`` with this venv's python. The root is
  unpacked anew before every run: each run is a fresh container. Three submissions: one
  stage-01 file (``examples/class/ada_correct_matmul``, zip of stage 01), the nine solution
  notebooks (zip of the nine stages that have one), and an empty upload (same zip).
- *batch per student*: ``python -m autograder batch CLASS --workers 1`` on classes of 1 and
  of ``--batch-students`` students who each hand in the nine solution notebooks: the
  difference per added student, i.e. what a class pays per student once started.
- *40 notebooks*: ``--class-size`` stage-01 notebooks drawn as bench_class.py draws a class
  (80 % correct, 16 % named mistakes, 4 % broken; no hang and no ``!`` shell line, which
  the real kernel would run): ``python -m autograder batch`` (its default workers, start-up
  included) against the real ``nbgrader autograde`` of the same files (bench_class.py's
  course, once: it takes minutes).
- *40 failing notebooks* (issue 27): ``--class-size`` stage-01 notebooks that all lose
  points, as a class near a deadline does: each is an example student's whose
  ``softmax``, ``scaled_dot_product_attention`` or ``causal_mask`` has a real mistake
  (``examples/expected/01_attention.json``: a student losing points on one of those three;
  the hanging one and those that leave one of them unwritten left out), drawn in turn, with
  ``padding_mask`` left unwritten as the template has it (``raise NotImplementedError``)
  and any ``!`` shell line commented out; ``batch`` (as above, in every round) against
  ``nbgrader autograde`` of the same files. Target: ≥ 25× nbgrader, as the class above.

``--baseline DIR`` measures another checkout the same way, in the same rounds (the
"before" of a change): ``git archive COMMIT | tar -x -C DIR`` (its store of expected
values is built as this checkout's, where it has one). Where a target is missed (or with
``--profile``) the bench shows where the time goes: a cold grade cut into its phases, with
the CPU time of the grader and of the fork server and its children (one stage-01
submission, and the nine stages); the class of stage-01 notebooks graded by ``batch``, cut
likewise (start-up until the fork server is ready, until the first student's child, the
students, the rest); the fork server's start alone (launch to ready), the parent's
imports, and a cProfile of the CLI. Beside each, the floors no schedule can beat: the CPU
floor (the CPU seconds of every process, over the cores) and, for the nine stages, the path
floor (a fresh ``import torch``, before which no child starts, plus what ``batch`` spends
per student spread over the cores). The load average at the start and the end is printed
with the figures: other processes on the machine slow the two processes of a cold grade
more than one ``import torch``.

Run: ``make bench-cold`` or ``.venv/bin/python benchmarks/bench_cold.py [options]``.
Figures also go to ``build/bench/bench_cold.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PYTHON = sys.executable
STAGE = "01_attention"
SOLUTIONS = ROOT / "solutions"
EXAMPLES = ROOT / "examples" / "class"
TARGETS = {"cli": 1.5, "gradescope_01": 2.0, "gradescope_all": 2.0, "nbgrader": 25.0}
# the failing class: the names one of which each notebook gets wrong, and the one left unwritten
MISTAKEN = ("softmax", "scaled_dot_product_attention", "causal_mask")
UNWRITTEN = "padding_mask"


def _wall(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, check: bool = True) -> float:
    t = time.perf_counter()
    p = subprocess.run(
        cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    elapsed = time.perf_counter() - t
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout.decode()[-3000:]}")
    return elapsed


def _tree_env(tree: Path) -> dict[str, str]:
    """Run ``python -m autograder`` from ``tree`` (this venv holds an editable install of
    this checkout; PYTHONPATH puts the other tree first)."""
    return {"PYTHONPATH": str(tree)}


# -- what is graded ------------------------------------------------------------------------


def nine_stages() -> list[str]:
    """The nine stages of issue 19 (01-09): those of a course's whole submission then."""
    from autograder.stages import stage_ids

    return [s for s in stage_ids() if int(s[:2]) <= 9 and (SOLUTIONS / s / f"{s}.ipynb").is_file()]


def all_stage_submission(folder: Path, stages: list[str]) -> Path:
    folder.mkdir(parents=True)
    for s in stages:
        shutil.copy(SOLUTIONS / s / f"{s}.ipynb", folder)
    return folder


def stage01_class(root: Path, n: int, seed: int) -> list[str]:
    """``n`` students, each a stage-01 notebook, drawn as bench_class draws a class, without
    its hanging student and without a notebook that has a shell line (nbgrader's kernel
    would run it). Returns their kinds."""
    import nbformat

    from autograder.runtime.submission import Submission
    from benchmarks.bench_class import CORRECT_EXAMPLES, EXPECTED, MIX, _broken, _notebook

    rng = random.Random(seed)
    # bench_class's pools (Pools.load), of stage 01 only
    correct = [SOLUTIONS / STAGE / f"{STAGE}.ipynb"]
    correct += [f for s in CORRECT_EXAMPLES if (f := Submission(EXAMPLES / s).file(STAGE)) is not None]
    promised = json.loads((EXPECTED / f"{STAGE}.json").read_text())["students"]
    mistakes = [
        (who, f)
        for who, e in sorted(promised.items())
        if e["misconceptions"] and (f := Submission(EXAMPLES / who).file(STAGE)) is not None
    ]
    solution = _notebook(SOLUTIONS / STAGE / f"{STAGE}.ipynb")
    kinds = []
    width = len(str(n))
    for i in range(n):
        while True:
            kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
            if kind == "correct":
                nb = _notebook(rng.choice(correct))
            elif kind == "mistake":
                who, f = rng.choice(mistakes)
                nb, kind = _notebook(f), f"mistake:{who}"
            else:
                nb = _broken(solution, rng)
            text = nbformat.writes(nb)
            if not re.search(r'"\s*!', text):
                break
        folder = root / f"s{i:0{width}d}"
        folder.mkdir(parents=True)
        (folder / f"{STAGE}.ipynb").write_text(text)
        kinds.append(kind)
    return kinds


def _parsable(source: str) -> str:
    """``source`` with its IPython lines (``%magic``, ``!shell``) commented out: the line
    numbers of what Python parses are the cell's."""
    return "\n".join("#" + line if line.lstrip()[:1] in ("%", "!") else line for line in source.split("\n"))


def _unwrite(nb: Any, name: str) -> bool:
    """Leave the top-level function ``name`` of ``nb`` unwritten, as the template has it:
    its definition (the student's own parameters) with the body ``# YOUR CODE HERE`` /
    ``raise NotImplementedError("not implemented yet")``. False if no cell defines it."""
    import ast

    for cell in nb.cells:
        if cell.cell_type != "code" or f"def {name}" not in cell.source:
            continue
        try:
            tree = ast.parse(_parsable(cell.source))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                lines = cell.source.split("\n")
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
                params = ", ".join(a.arg for a in node.args.args)
                stub = [
                    f"def {name}({params}):",
                    "    # YOUR CODE HERE",
                    '    raise NotImplementedError("not implemented yet")',
                ]
                cell.source = "\n".join(lines[:first] + stub + lines[node.end_lineno :])
                return True
    return False


def _writes(nb: Any, names: tuple[str, ...]) -> bool:
    """Whether each of ``names`` is defined in ``nb``, none of them raising NotImplementedError."""
    import ast

    bodies: dict[str, str] = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or "skip-grading" in cell.metadata.get("tags", []):
            continue
        try:
            tree = ast.parse(_parsable(cell.source))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                bodies[node.name] = ast.unparse(node)
    return all(n in bodies and "NotImplementedError" not in bodies[n] for n in names)


def failing01_class(root: Path, n: int, seed: int) -> list[str]:
    """``n`` students, each a stage-01 notebook that loses points: an example student's
    real mistake in ``MISTAKEN`` (the pool: those losing points on one of them, who write
    all three; the origins drawn in turn, shuffled by ``seed``), with ``UNWRITTEN`` left
    unwritten and ``!`` lines commented out (nbgrader's kernel would run them). Returns
    their kinds, ``failing:WHO``."""
    import nbformat

    from autograder.runtime.submission import Submission
    from benchmarks.bench_class import EXPECTED, HANGING, _notebook

    promised = json.loads((EXPECTED / f"{STAGE}.json").read_text())["students"]
    pool = []
    for who, e in sorted(promised.items()):
        if who == HANGING[0] or not set(e["losing"]) & set(MISTAKEN):
            continue
        f = Submission(EXAMPLES / who).file(STAGE)
        if f is not None and _writes(_notebook(f), MISTAKEN):
            pool.append((who, f))
    rng = random.Random(seed)
    order: list[tuple[str, Path]] = []
    kinds = []
    width = len(str(n))
    for i in range(n):
        if not order:
            order = pool[:]
            rng.shuffle(order)
        who, f = order.pop()
        nb = _notebook(f)
        if not _unwrite(nb, UNWRITTEN):
            raise RuntimeError(f"{who}'s {STAGE} defines no {UNWRITTEN}")
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.source = "\n".join(
                    "# " + line if line.lstrip().startswith("!") else line for line in cell.source.split("\n")
                )
        folder = root / f"s{i:0{width}d}"
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{STAGE}.ipynb")
        kinds.append(f"failing:{who}")
    return kinds


def class_scores(db: Path) -> dict[str, Any]:
    """A graded class's scores, from its gradebook: how many at full marks, the mean."""
    from autograder.grader.batch import Gradebook

    with Gradebook(db) as book:
        rows = book.rows()
    return {
        "notebooks": len(rows),
        "full_marks": sum(r["score"] >= r["max_score"] > 0 for r in rows),
        "mean_score": statistics.fmean(r["score"] for r in rows) if rows else 0.0,
        "max_score": max((r["max_score"] for r in rows), default=0.0),
    }


# -- Gradescope ----------------------------------------------------------------------------


@dataclass
class Zip:
    tree: Path
    path: Path
    stages: list[str]


def build_zip(tree: Path, out: Path, stages: list[str]) -> Zip:
    cmd = [PYTHON, "-m", "autograder", "gradescope-zip", "--out", str(out)]
    for s in stages:
        cmd += ["--stage", s]
    _wall(cmd, tree, _tree_env(tree))
    return Zip(tree, out, stages)


def fresh_root(z: Zip, base: Path, submission: Path | None) -> Path:
    """An /autograder root as a new container holds it: the zip in source/ (with what
    setup.sh's install does to the project), the upload in submission/."""
    root = base / "root"
    if root.exists():
        shutil.rmtree(root)
    with zipfile.ZipFile(z.path) as zf:
        zf.extractall(root / "source")
    for script in ("run_autograder", "setup.sh"):
        (root / "source" / script).chmod(0o755)
    (root / "submission").mkdir()
    if submission is not None:
        for f in submission.iterdir():
            shutil.copy(f, root / "submission")
    source = root / "source"
    install = (source / "scripts" / "install.sh").read_text()
    # the project steps of the zip's own install.sh (its pip steps are the venv's: done)
    if "compileall" in install:
        _wall([PYTHON, "-m", "compileall", "-q", "autograder", "reference"], source)
    if "autograder.grader.expected build" in install:
        # as setup.sh would, less its --verify (the reference run once at image build: the
        # same machine and libraries as the zip's, so the values are kept either way)
        _wall([PYTHON, "-m", "autograder.grader.expected", "build"], source, {"PYTHONPATH": str(source)})
    return root


def run_autograder(root: Path) -> float:
    env = {"BERTLAB_AUTOGRADER_ROOT": str(root), "BERTLAB_PYTHON": PYTHON, "PYTHONPATH": ""}
    elapsed = _wall(["bash", str(root / "source" / "run_autograder")], root, env)
    results = json.loads((root / "results" / "results.json").read_text())
    if any(t["name"] == "Autograder failed" for t in results["tests"]):
        raise RuntimeError(f"run_autograder failed: {results['output'][:500]}")
    return elapsed


# -- one round -----------------------------------------------------------------------------


@dataclass
class Tree:
    """A checkout measured: this one, or a baseline."""

    name: str
    path: Path
    zip01: Zip | None = None
    zip_all: Zip | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, what: str, seconds: float) -> None:
        self.samples.setdefault(what, []).append(seconds)

    def median(self, what: str) -> float:
        return statistics.median(self.samples[what])


def one_round(trees: list[Tree], work: Path, subs: dict[str, Path], args: argparse.Namespace) -> None:
    for tree in trees:
        env = _tree_env(tree.path)
        results = work / "r.json"
        cli = [
            PYTHON,
            "-m",
            "autograder",
            "grade",
            str(subs["cli"]),
            "--stage",
            STAGE,
            "--results",
            str(results),
        ]
        tree.add("import torch", _wall([PYTHON, "-c", "import torch"], work))
        tree.add("CLI", _wall(cli, tree.path, env))
        if tree.name == "this":
            tree.add("CLI, no store", _wall(cli, tree.path, {**env, "BERTLAB_EXPECTED_DIR": ""}))
        for label, z, sub in (
            ("run_autograder, stage 01", tree.zip01, subs["one"]),
            ("run_autograder, nine stages", tree.zip_all, subs["nine"]),
            ("run_autograder, empty upload", tree.zip_all, None),
        ):
            root = fresh_root(z, work / tree.name, sub)
            tree.add(label, run_autograder(root))
        for n in (1, args.batch_students):
            db = work / f"{tree.name}-batch{n}.sqlite"
            db.unlink(missing_ok=True)
            cmd = [
                PYTHON,
                "-m",
                "autograder",
                "batch",
                str(subs[f"class{n}"]),
                "--workers",
                "1",
                "--db",
                str(db),
            ]
            tree.add(f"batch --workers 1, {n} students", _wall(cmd, work, env, check=tree.name == "this"))
        db = work / f"{tree.name}-class.sqlite"
        db.unlink(missing_ok=True)
        cmd = [PYTHON, "-m", "autograder", "batch", str(subs["class40"]), "--db", str(db)]
        # a baseline's batch may exit 1 for a grader fault of its own (before issue 19, two
        # threads importing IPython at once could fail a notebook): timed all the same
        seconds = _wall(cmd, work, env, check=tree.name == "this")
        tree.add(f"batch, {args.class_size} stage-01 notebooks", seconds)
        db = work / f"{tree.name}-failing.sqlite"
        db.unlink(missing_ok=True)
        cmd = [PYTHON, "-m", "autograder", "batch", str(subs["failing40"]), "--db", str(db)]
        seconds = _wall(cmd, work, env, check=tree.name == "this")
        tree.add(f"batch, {args.class_size} failing stage-01 notebooks", seconds)


# -- where the time goes ---------------------------------------------------------------------


# One cold grade cut into its phases, as run_autograder runs it (the server launched before
# torch loads, asked then for what the submission uses where the tree does so; the stages
# side by side, each planned where the tree plans it): wall time of each, and the CPU time of
# this process and of its children (the fork server and the children it forked, reaped at
# close). "first child" is when the first stage's child is asked for.
PHASES = """\
import io, json, resource, sys, time
t0 = time.perf_counter()
from pathlib import Path
from autograder.grader.options import SUBMISSION_S, launch_for, open_grader
from autograder.runtime.submission import Submission
from autograder.stages import stage_ids
sub = Path(sys.argv[1]); stages = Submission(sub).stages(stage_ids())
launched = launch_for([sub], stages)
t1 = time.perf_counter()
grader = open_grader("cpu", None, SUBMISSION_S, server=launched)
t2 = time.perf_counter()
if stages and hasattr(grader, "warm_for"):  # as grade() asks, before it plans (a baseline may not)
    grader.warm_for([(sub, s) for s in stages])
grader.server.wait_ready()
t3 = time.perf_counter()
planning, forks = [0.0], []
plan, fork = grader.plan, grader.server.fork
def timed_plan(stage):
    t = time.perf_counter()
    try:
        return plan(stage)
    finally:
        planning[0] += time.perf_counter() - t
def timed_fork(*a, **k):
    forks.append(time.perf_counter())
    return fork(*a, **k)
grader.plan, grader.server.fork = timed_plan, timed_fork
from autograder.grader.batch import default_workers
result = grader.grade(sub, stages, workers=default_workers())
t4 = time.perf_counter()
from autograder.grader.gradescope import student_view
from autograder.grader.report import test_table, to_gradescope
from rich.console import Console
json.dumps(student_view(result)); to_gradescope(result)
Console(file=io.StringIO(), width=160).print(test_table(result))
t5 = time.perf_counter()
grader.close()
t6 = time.perf_counter()
me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
first = forks[0] if forks else t4
print(json.dumps({
    "CLI modules and server launch": t1 - t0, "torch and the grader imported": t2 - t1,
    "fork server still starting": t3 - t2, "until the first child (planning)": first - t3,
    "children, and the other stages' planning": t4 - first,
    "  expected values (store), all threads": planning[0],
    "results rendered (JSON, table)": t5 - t4, "server closed": t6 - t5, "total": t6 - t0,
    "cpu: this process": me.ru_utime + me.ru_stime, "cpu: server and children": kids.ru_utime + kids.ru_stime,
    "score": result.score, "max_score": result.max_score,
}))
"""

# A class graded by `python -m autograder batch` (its CLI, its early server), cut into its
# phases: start-up until the fork server is ready (its start-up check done), until the
# first student's child is asked for, the students, and the rest (gradebook, exit); with the
# CPU time of this process and of the fork server and its children.
BATCH_PHASES = """\
import contextlib, io, json, resource, sys, time
t0 = time.perf_counter()
from autograder.grader.launch import early
early(["batch"])
import importlib.abc, importlib.util
from autograder.grader import batch
marks, forks = {}, []
def timed(runner):  # once the grader imports it (and torch), where the command does
    fork, ready = runner.ForkServer.fork, runner.ForkServer.wait_ready
    def timed_fork(self, *a, **k):
        forks.append(time.perf_counter())
        return fork(self, *a, **k)
    def timed_ready(self, *a, **k):
        ready(self, *a, **k)
        marks.setdefault("ready", time.perf_counter())
    runner.ForkServer.fork, runner.ForkServer.wait_ready = timed_fork, timed_ready
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "autograder.grader.runner":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module
        def exec_module(module):
            run_module(module)
            timed(module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
run = batch.run
def timed_run(*a, **k):
    try:
        return run(*a, **k)
    finally:
        marks["graded"] = time.perf_counter()
batch.run = timed_run
from autograder.grader import cli
cli.quick_exit = sys.exit  # the command's own exit would skip the lines below
main = cli.main
sys.argv = ["autograder", "batch", *sys.argv[1:]]
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
t9 = time.perf_counter()
me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
graded = [t for t in forks if t >= marks["ready"]]  # the start-up check's child is before
print(json.dumps({
    "start-up: the fork server ready": marks["ready"] - t0,
    "until the first student's child": graded[0] - marks["ready"],
    "students (children, comparisons)": marks["graded"] - graded[0],
    "gradebook and exit": t9 - marks["graded"], "total": t9 - t0, "children": len(graded),
    "cpu: this process": me.ru_utime + me.ru_stime, "cpu: server and children": kids.ru_utime + kids.ru_stime,
}))
"""


def phases(tree: Path, sub: Path) -> dict[str, float]:
    env = {**os.environ, **_tree_env(tree)}
    out = subprocess.run(
        [PYTHON, "-c", PHASES, str(sub)], cwd=tree, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def batch_phases(tree: Path, class_dir: Path, db: Path) -> dict[str, float]:
    db.unlink(missing_ok=True)
    env = {**os.environ, **_tree_env(tree)}
    cmd = [PYTHON, "-c", BATCH_PHASES, str(class_dir), "--db", str(db)]
    out = subprocess.run(cmd, cwd=db.parent, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def profile(
    tree: Path, sub: Path, work: Path, nine: Path, class_dir: Path, failing_dir: Path | None = None
) -> dict[str, Any]:
    """The fork server's start alone; the parent's imports; a cProfile of the CLI; a cold
    grade's phases, of one stage-01 submission and of the nine stages; the class of
    stage-01 notebooks graded by batch, in its phases, and the failing class likewise."""
    env = {**os.environ, **_tree_env(tree)}
    code = (
        "import time; t = time.perf_counter()\n"
        "from autograder.grader.launch import launch\n"
        "from autograder.grader.runner import ForkServer\n"
        "launched = launch(); t1 = time.perf_counter()\n"
        "server = ForkServer(launched); server._ready.wait(300); t2 = time.perf_counter()\n"
        "server.wait_ready(); t3 = time.perf_counter(); server.close()\n"
        "print(t1 - t, t2 - t1, t3 - t2)\n"
    )
    out = subprocess.run([PYTHON, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=True)
    importing, warm, self_test = (float(x) for x in out.stdout.split()[-3:])
    imports = subprocess.run(
        [PYTHON, "-X", "importtime", "-c", "import autograder.grader.grade"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    top = []
    for line in imports.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if m and len(m.group(2)) <= 2 and int(m.group(1)) > 20_000:
            top.append((m.group(3), int(m.group(1)) / 1e6))
    stats = work / "cli.prof"
    cmd = [
        PYTHON,
        "-m",
        "cProfile",
        "-o",
        str(stats),
        "-m",
        "autograder",
        "grade",
        str(sub),
        "--stage",
        STAGE,
    ]
    subprocess.run(cmd, cwd=tree, env=env, capture_output=True, check=True)
    import pstats

    p = pstats.Stats(str(stats))
    rows = []
    for (file, line, fn), (_cc, _nc, _tt, ct, _callers) in p.stats.items():  # type: ignore[attr-defined]
        rows.append((ct, f"{Path(file).name}:{line}({fn})"))
    rows.sort(reverse=True)
    return {
        "phases, one stage-01 submission": phases(tree, sub),
        "phases, nine stages": phases(tree, nine),
        "phases, batch of the class": batch_phases(tree, class_dir, work / f"phases-{tree.name}.sqlite"),
        **(
            {
                "phases, batch of the failing class": batch_phases(
                    tree, failing_dir, work / f"phases-failing-{tree.name}.sqlite"
                )
            }
            if failing_dir is not None
            else {}
        ),
        "server_launch_s": importing,
        "server_warm_up_s": warm,
        "server_self_test_s": self_test,
        "parent_imports_s": top,
        "cli_cumulative_s": [(name, round(ct, 3)) for ct, name in rows[:25]],
    }


# -- report ---------------------------------------------------------------------------------


def verdicts(
    tree: Tree, args: argparse.Namespace, nbgrader_s: float | None, nbgrader_failing_s: float | None = None
) -> list[tuple[str, str, str]]:
    out = []
    torch_s = tree.median("import torch")

    def verdict(name: str, ratio: float, limit: float, at_most: bool = True) -> tuple[str, str, str]:
        ok = ratio <= limit if at_most else ratio >= limit
        return name, f"{ratio:.2f}x", "PASS" if ok else "FAIL"

    out.append(verdict("CLI, one stage-01 submission ≤ 1.5× import torch", tree.median("CLI") / torch_s, 1.5))
    gs01 = tree.median("run_autograder, stage 01")
    out.append(verdict("run_autograder, stage 01 ≤ 2× import torch", gs01 / torch_s, 2.0))
    n = args.batch_students
    # the two classes of a round ran back to back, under the same load: their difference per
    # round, then the median (a difference of two medians mixes rounds of unlike load)
    big, one = (tree.samples[f"batch --workers 1, {k} students"] for k in (n, 1))
    rounds = zip(big, one, strict=True)
    tree.samples["batch --workers 1, per student"] = [(b - a) / (n - 1) for b, a in rounds]
    per_student = tree.median("batch --workers 1, per student")
    nine = tree.median("run_autograder, nine stages")
    out.append(verdict("run_autograder, nine stages ≤ 2× batch per student", nine / per_student, 2.0))
    if nbgrader_s is not None:
        ratio = nbgrader_s / tree.median(f"batch, {args.class_size} stage-01 notebooks")
        out.append(
            verdict(f"batch ≥ 25× nbgrader ({args.class_size} stage-01 notebooks)", ratio, 25.0, False)
        )
    if nbgrader_failing_s is not None:
        ratio = nbgrader_failing_s / tree.median(f"batch, {args.class_size} failing stage-01 notebooks")
        out.append(
            verdict(
                f"batch ≥ 25× nbgrader ({args.class_size} failing stage-01 notebooks)",
                ratio,
                TARGETS["nbgrader"],
                False,
            )
        )
    return out


def _slack(target: float, floor: float, total: float) -> None:
    """What a schedule may lose over the floor and still meet ``target``, against what this
    run lost (waits, and work on one core while the other idled: the phases above)."""
    print(
        f"  {'may lose over the floor, to meet it':40} {target - floor:7.2f}"
        f"   (this run lost {total - floor:.2f} s: {'met' if total <= target else 'missed'})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--repeat", type=int, default=5, help="rounds (default 5); medians are reported")
    ap.add_argument("--class-size", type=int, default=40, help="stage-01 notebooks for batch vs nbgrader")
    ap.add_argument(
        "--batch-students", type=int, default=5, help="the larger class of the per-student figure"
    )
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument(
        "--baseline", type=Path, help="another checkout, measured the same way in the same rounds"
    )
    ap.add_argument("--skip-nbgrader", action="store_true")
    ap.add_argument("--profile", action="store_true", help="where a cold CLI grade spends its time")
    ap.add_argument("--json", type=Path, default=ROOT / "build" / "bench" / "bench_cold.json")
    args = ap.parse_args(argv)

    load_at_start = list(os.getloadavg())
    print(
        f"bench_cold: {os.cpu_count()} CPUs, {args.repeat} rounds, python {PYTHON}; "
        f"load average {' '.join(f'{x:.2f}' for x in load_at_start)}",
        flush=True,
    )
    # this checkout's store, as an install leaves it (kept when fresh)
    _wall([PYTHON, "-m", "autograder.grader.expected", "build"], ROOT)
    trees = [Tree("this", ROOT)]
    if args.baseline is not None:
        trees.append(Tree("baseline", args.baseline.resolve()))
        base = trees[-1].path
        if (base / "autograder" / "grader" / "expected.py").is_file():
            _wall([PYTHON, "-m", "autograder.grader.expected", "build"], base, _tree_env(base))
    figures: dict[str, Any] = {"cpus": os.cpu_count(), "repeat": args.repeat}
    with tempfile.TemporaryDirectory(prefix="bertlab-bench-cold-") as tmp:
        work = Path(tmp)
        stages = nine_stages()
        subs = {
            "cli": SOLUTIONS / STAGE,
            "one": work / "one",
            "nine": all_stage_submission(work / "nine", stages),
        }
        (work / "one").mkdir()
        shutil.copy(EXAMPLES / "ada_correct_matmul" / f"{STAGE}.py", work / "one")
        for n in (1, args.batch_students):
            for i in range(n):
                shutil.copytree(subs["nine"], work / f"class{n}" / f"student{i}")
            subs[f"class{n}"] = work / f"class{n}"
        kinds = stage01_class(work / "class40", args.class_size, args.seed)
        subs["class40"] = work / "class40"
        counts: dict[str, int] = {}
        for k in kinds:
            counts[k.split(":")[0]] = counts.get(k.split(":")[0], 0) + 1
        figures["class"] = counts
        print(
            f"  {args.class_size} stage-01 notebooks: {counts}; nine stages: {', '.join(stages)}", flush=True
        )
        failing_kinds = failing01_class(work / "failing40", args.class_size, args.seed)
        subs["failing40"] = work / "failing40"
        origins: dict[str, int] = {}
        for k in failing_kinds:
            origins[k.split(":")[1]] = origins.get(k.split(":")[1], 0) + 1
        figures["failing_class"] = origins
        print(
            f"  {args.class_size} failing stage-01 notebooks ({UNWRITTEN} unwritten in each), mistakes of: "
            f"{origins}",
            flush=True,
        )
        for tree in trees:
            tree.zip01 = build_zip(tree.path, work / f"{tree.name}-01.zip", [STAGE])
            tree.zip_all = build_zip(tree.path, work / f"{tree.name}-nine.zip", stages)

        for r in range(args.repeat):
            t = time.perf_counter()
            one_round(trees, work, subs, args)
            print(f"  round {r + 1}/{args.repeat}: {time.perf_counter() - t:.0f} s", flush=True)

        graded = class_scores(work / "this-failing.sqlite")
        figures["failing_class_scores"] = graded
        print(
            f"  the failing class, as batch graded it: {graded['full_marks']} of {graded['notebooks']} "
            f"at full marks, mean {graded['mean_score']:.2f} / {graded['max_score']:g}",
            flush=True,
        )

        nbgrader_s = nbgrader_failing_s = None
        if not args.skip_nbgrader:
            from benchmarks.bench_class import nbgrader_sample

            for which in ("class40", "failing40"):
                sample = [(p.name, STAGE) for p in sorted((work / which).iterdir())]
                t = time.perf_counter()
                nbg = nbgrader_sample(work / which, sample, work / f"nbgrader-course-{which}")
                if which == "class40":
                    nbgrader_s = nbg["seconds"]
                    figures["nbgrader"] = nbg
                else:
                    nbgrader_failing_s = nbg["seconds"]
                    figures["nbgrader_failing"] = nbg
                print(
                    f"  nbgrader autograde{', failing class' if which == 'failing40' else ''}: "
                    f"{nbg['notebooks']} notebooks in {nbg['seconds']:.1f} s "
                    f"({nbg['autograded']} autograded; {time.perf_counter() - t:.0f} s with its course)",
                    flush=True,
                )
        nbformat_s = statistics.median(_wall([PYTHON, "-c", "import nbformat"], work) for _ in range(3))
        figures["import nbformat (this venv)"] = nbformat_s
        for tree in trees:
            figures[tree.name] = {
                "verdicts": verdicts(tree, args, nbgrader_s, nbgrader_failing_s),
                "samples": tree.samples,
            }
        args.json.parent.mkdir(parents=True, exist_ok=True)  # the rounds kept, should a profile fail
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
        # a target not met: where the time goes (this tree's; every tree's with --profile)
        missed = any(v == "FAIL" for _, _, v in figures[trees[0].name]["verdicts"])
        profiled = [
            t
            for t in (trees if args.profile else trees[:1] if missed else [])
            if (t.path / "autograder" / "grader" / "launch.py").is_file()  # what PHASES uses
        ]
        if profiled:
            figures["profile"] = {
                t.name: profile(t.path, subs["cli"], work, subs["nine"], subs["class40"], subs["failing40"])
                for t in profiled
            }
        figures["load average (1, 5, 15 min), start and end"] = [load_at_start, list(os.getloadavg())]

    rows = []
    names = list(trees[0].samples)
    extra = [
        "nbgrader autograde, the same failing notebooks",
        "import nbformat (this venv; no grader imports it)",
    ]
    w = max(len(n) for n in names + extra) + 2
    head = "".join(f"{t.name:>12}" for t in trees)
    print(f"\n{'figure (median, s)':{w}}{head}   runs ({trees[0].name})")
    for name in names:
        vals = "".join(
            f"{statistics.median(t.samples[name]):>12.2f}" if name in t.samples else f"{'—':>12}"
            for t in trees
        )
        runs = ", ".join(f"{x:.2f}" for x in trees[0].samples[name])
        print(f"{name:{w}}{vals}   {runs}")
        rows.append(name)
    if nbgrader_s is not None:
        print(f"{'nbgrader autograde, the same notebooks':{w}}{nbgrader_s:>12.2f}")
    if nbgrader_failing_s is not None:
        print(f"{'nbgrader autograde, the same failing notebooks':{w}}{nbgrader_failing_s:>12.2f}")
    print(f"{'import nbformat (this venv; no grader imports it)':{w}}{nbformat_s:>12.2f}")
    for tree in trees:
        print(f"\ntarget ({tree.name})")
        for name, ratio, verdict in figures[tree.name]["verdicts"]:
            print(f"  {name:62} {ratio:>8} {verdict}")
    start, end = figures["load average (1, 5, 15 min), start and end"]
    print(f"\nload average (1, 5, 15 min): {start} at the start, {[round(x, 2) for x in end]} at the end")
    for name, prof in figures.get("profile", {}).items():
        for which in ("phases, one stage-01 submission", "phases, nine stages"):
            ph = prof[which]
            print(f"\nwhere a cold grade goes ({name}, {which}; {ph['score']:g}/{ph['max_score']:g}), s:")
            for key, value in ph.items():
                if key not in ("score", "max_score"):
                    print(f"  {key:40} {value:7.2f}")
            # no schedule on these cores finishes before its CPU seconds spread over all of them
            cpu = ph["cpu: this process"] + ph["cpu: server and children"]
            floor = cpu / (os.cpu_count() or 1)
            print(f"  {'CPU floor: cpu seconds / ' + str(os.cpu_count()) + ' cores':40} {floor:7.2f}")
            per_student = (
                figures[name]["samples"].get("batch --workers 1, per student") if name in figures else None
            )
            if which == "phases, nine stages" and per_student:
                per_student = [statistics.median(per_student)]
                # no child starts before the server has imported torch, and the students'
                # work (children and comparisons) spreads over the cores at best
                torch_s = figures[name]["samples"]["import torch"]
                path = statistics.median(torch_s) + per_student[0] / (os.cpu_count() or 1)
                print(
                    f"  {'path floor: import torch + batch/student / cores':40} {path:7.2f}\n"
                    f"  {'2x batch per student (the target)':40} {2 * per_student[0]:7.2f}"
                    f"   (the floors are {floor / per_student[0]:.2f}x and {path / per_student[0]:.2f}x"
                    " batch per student)"
                )
                _slack(2 * per_student[0], max(floor, path), ph["total"])
        for which, label, nbg_s in (
            ("phases, batch of the class", "stage-01 notebooks", nbgrader_s),
            ("phases, batch of the failing class", "failing stage-01 notebooks", nbgrader_failing_s),
        ):
            if which not in prof:
                continue
            ph = prof[which]
            print(f"\nwhere batch of the {args.class_size} {label} goes ({name}), s:")
            for key, value in ph.items():
                print(f"  {key:40} {value:7.2f}" if key != "children" else f"  {key:40} {value:7d}")
            cpu = ph["cpu: this process"] + ph["cpu: server and children"]
            floor = cpu / (os.cpu_count() or 1)
            print(f"  {'CPU floor: cpu seconds / ' + str(os.cpu_count()) + ' cores':40} {floor:7.2f}")
            if nbg_s is not None:
                print(
                    f"  {'nbgrader / 25 (the target)':40} {nbg_s / 25:7.2f}"
                    f"   (the floor is {nbg_s / floor:.1f}x nbgrader)"
                )
                _slack(nbg_s / 25, floor, ph["total"])
        print(f"\nwhere a cold CLI grade goes ({name}):")
        print(
            f"  fork server alone: launch {prof['server_launch_s']:.2f} s, imports and warm-up "
            f"{prof['server_warm_up_s']:.2f} s, start-up check {prof['server_self_test_s']:.2f} s"
        )
        print("  parent imports: " + ", ".join(f"{n} {s:.2f} s" for n, s in prof["parent_imports_s"]))
        for fn, ct in prof["cli_cumulative_s"]:
            print(f"    {ct:7.3f} s  {fn}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(f"\nfigures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How fast bertlab grades a class, against a fresh Jupyter kernel per notebook.

Method
------
Every submission of a class directory (default ``examples/class``: one folder, or one
``NN_stage.py``/``.ipynb`` file, per student) is graded for one stage, in one process:

*ours*
    One ``Grader`` (so one fork server) for the whole run, used exactly as ``bertlab
    grade`` uses it. Its one-off costs are timed on their own, in this order:

    1. fork-server start-up: from ``Grader.server`` (which only launches the server) until
       the server has imported torch, warmed up and forked a first (empty) child;
    2. expected values: ``Grader.plan(stage)``, the reference and every misconception
       variant run on every case, once per grading run;
    3. a first pass that grades every submission once (the first child, the first
       notebook parse...). This pass also finds the submissions that hit a time limit.

    Then the steady state: ``--repeat`` passes over the class (round robin, so noise is
    spread over all students); a submission's figure is the median of its passes, the
    wall time of ``Grader.grade(submission, [stage])``: load, fork a child, run cells
    and calls, read outputs, check, score.

*baseline*
    What nbgrader's autograde does per notebook: a fresh kernel executes the notebook,
    ``NotebookClient(nb, kernel_name="python3", timeout=..., allow_errors=True).execute()``,
    timed from kernel start to kernel shutdown, in the submission's folder. A ``.py``
    submission becomes a notebook with one code cell. No checks run in the kernel: this
    is the floor of what a kernel-per-notebook grader pays, mostly the kernel start and
    ``import torch``. Two reference notebooks (empty; ``import torch`` only) show where
    that time goes.

A submission that hits a time limit (the grader's call or cell limit, or the baseline's
per-cell ``--hang-timeout``) would measure the limit, not the grader: it is graded once,
shown, and left out of both sides of the ratio (and its baseline run is skipped when the
grader already found it hanging). A submission without the stage's file is left out too.

The headline ``ratio: baseline/ours per notebook`` is mean baseline seconds per notebook
over mean steady-state grading seconds per submission, on the same submissions. The
amortised figure adds ours' one-off costs spread over the class.

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_grade.py [CLASS_DIR] [options]``.
Figures also go to ``build/bench/bench_grade.json`` unless ``--no-json``.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import logging
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Student-facing text of a result that ran into a limit (runner.py / grade.py wording).
TIME_LIMIT_MARKERS = ("did not finish within", "raised Timeout", "ran out of time", "used up its")


@dataclass
class Row:
    """One submission's figures (seconds)."""

    student: str
    file: str | None
    score: str = ""
    first_s: float | None = None
    ours_s: list[float] = field(default_factory=list)
    baseline_s: list[float] = field(default_factory=list)
    excluded: str | None = None  # why it is left out of the ratio

    @property
    def ours(self) -> float | None:
        return statistics.median(self.ours_s) if self.ours_s else None

    @property
    def baseline(self) -> float | None:
        return statistics.median(self.baseline_s) if self.baseline_s else None


def _submissions(class_dir: Path) -> list[Path]:
    """Each student folder, or each stage file, directly inside the class directory."""
    subs = []
    for p in sorted(class_dir.iterdir()):
        if p.name.startswith((".", "_")):
            continue
        if p.is_dir() or p.suffix in (".py", ".ipynb"):
            subs.append(p)
    return subs


def _hit_time_limit(result: Any) -> bool:
    """Whether grading ran into a call, cell or submission time limit, by the student-facing
    text (runner.py's wording). Not by the time it took: a first grade of a failing stage 10
    or 11 submission takes longer than a call's limit (its misconception variants, its
    counterexample search) without any call or cell reaching one."""
    texts: list[str] = []
    for stage in result.stages:
        texts += stage.notes
        for t in stage.tests:
            texts += [c.message for c in t.cases]
    return any(m in text for text in texts for m in TIME_LIMIT_MARKERS)


def _wait_until_ready(server: Any) -> None:
    """Fork one child on an empty job directory and wait for it to end.

    The fork server answers only once it has imported torch and warmed up, so this
    returns when a real submission would be forked at once. The child finds no plan and
    exits straight away.
    """
    with tempfile.TemporaryDirectory(prefix="bertlab-bench-") as tmp:
        r, w = os.pipe()
        try:
            _pid, exits, _cgroup = server.fork(Path(tmp), w)
        finally:
            os.close(w)
        try:
            exits.get(timeout=60)
        finally:
            os.close(r)


def _as_notebook(path: Path) -> Any:
    import nbformat

    if path.suffix == ".ipynb":
        return nbformat.read(path, as_version=4)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(path.read_text(encoding="utf-8"))]
    return nb


def _run_kernel(nb: Any, cwd: Path, timeout: float) -> float:
    """Seconds for a fresh kernel to start, execute ``nb`` and shut down.

    Raises nbclient's CellTimeoutError when a cell runs longer than ``timeout``.
    """
    from nbclient import NotebookClient

    client = NotebookClient(
        copy.deepcopy(nb),
        kernel_name="python3",
        timeout=timeout,
        allow_errors=True,  # as nbgrader's autograde: a failing cell does not stop the run
        resources={"metadata": {"path": str(cwd)}},
    )
    t0 = time.perf_counter()
    # The kernel's own stdout/stderr (its start-up warnings) go nowhere.
    client.execute(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{1000 * s:,.0f}"


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "class_dir",
        nargs="?",
        type=Path,
        default=ROOT / "examples" / "class",
        help="class directory: one folder (or stage file) per student; default examples/class",
    )
    ap.add_argument("--stage", default="01_attention", help="stage to grade (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="steady-state passes (default 3)")
    ap.add_argument(
        "--baseline-repeat", type=int, default=1, help="fresh-kernel runs per notebook (default 1)"
    )
    ap.add_argument(
        "--hang-timeout",
        type=float,
        default=10.0,
        help="seconds per cell before a submission counts as never terminating (default 10); "
        "also the grader's cell limit in this run. A notebook's demo runs in the fresh kernel: "
        "for 10 and 11, whose demos train for a minute or more, give it 120 or more",
    )
    ap.add_argument("--skip-baseline", action="store_true", help="time ours only")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="cProfile one extra steady pass and print its top N functions (parent side)",
    )
    ap.add_argument(
        "--json",
        type=Path,
        default=ROOT / "build" / "bench" / "bench_grade.json",
        help="where to write the figures (default build/bench/bench_grade.json)",
    )
    ap.add_argument("--no-json", action="store_true", help="write no JSON file")
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.baseline_repeat < 1:
        ap.error("--repeat and --baseline-repeat must be at least 1")

    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # piped or logged: wide enough that the tables do not wrap
        console = Console(width=150)
    class_dir: Path = args.class_dir
    if not class_dir.is_dir():
        console.print(f"error: {class_dir} is not a directory")
        return 2
    subs = _submissions(class_dir)
    if not subs:
        console.print(f"error: no submissions in {class_dir}")
        return 2

    t0 = time.perf_counter()
    from autograder.grader.grade import Grader
    from autograder.grader.runner import Limits
    from autograder.runtime.submission import Submission

    import_s = time.perf_counter() - t0  # torch + the grader, in this process
    stage = args.stage
    console.print(
        f"[bold]bench_grade[/bold]: {len(subs)} submissions in {class_dir}, stage {stage}, "
        f"{args.repeat} steady passes, {args.baseline_repeat} fresh kernel(s) per notebook, "
        f"{os.cpu_count()} CPUs"
    )
    rows = {s.name: Row(s.name if s.is_dir() else s.stem, None) for s in subs}
    files: dict[str, Path | None] = {}
    for s in subs:
        f = Submission(s).file(stage)
        files[s.name] = f
        rows[s.name].file = None if f is None else f.suffix.lstrip(".")
        if f is None:
            rows[s.name].excluded = f"no {stage} file"

    # ---- ours -------------------------------------------------------------------------
    limits = Limits(cell_s=args.hang_timeout)
    wall0 = time.perf_counter()
    with Grader(limits=limits) as g:
        t = time.perf_counter()
        _wait_until_ready(g.server)
        server_s = time.perf_counter() - t
        console.print(f"  fork server ready in {_ms(server_s)} ms")

        t = time.perf_counter()
        g.plan(stage)
        plan_s = time.perf_counter() - t
        console.print(f"  expected values (reference + variants) in {_ms(plan_s)} ms")

        spec = g.plan(stage).spec
        shortest = min(limits.cell_s, limits.call_s or spec.call_timeout_s)
        first_pass_s = 0.0
        for s in subs:
            row = rows[s.name]
            t = time.perf_counter()
            result = g.grade(s, [stage])
            row.first_s = time.perf_counter() - t
            first_pass_s += row.first_s
            row.score = f"{result.score:g}/{result.max_score:g}"
            if row.excluded is None and _hit_time_limit(result):
                row.excluded = "hit the grader's time limit"
                console.print(
                    f"  {row.student}: hit a time limit when graded "
                    f"({_ms(row.first_s)} ms): left out of repeats, baseline and ratio"
                )
            elif row.excluded is None and row.first_s >= 0.9 * shortest:
                # a hang whose wording the markers miss would show here: said, not hidden
                console.print(
                    f"  {row.student}: graded in {_ms(row.first_s)} ms, near or over the shortest "
                    f"limit ({shortest:g} s), and no limit reported: kept"
                )
        console.print(f"  first pass over the class in {_ms(first_pass_s)} ms")

        steady = [s for s in subs if rows[s.name].excluded is None]
        for _ in range(args.repeat):
            for s in steady:
                t = time.perf_counter()
                g.grade(s, [stage])
                rows[s.name].ours_s.append(time.perf_counter() - t)
        console.print(f"  {args.repeat} steady passes over {len(steady)} submissions done")

        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for s in steady:
                g.grade(s, [stage])
            prof.disable()
            console.print(f"[bold]cProfile[/bold], one steady pass ({len(steady)} submissions):")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(args.profile)
    ours_wall_s = time.perf_counter() - wall0

    # ---- baseline ---------------------------------------------------------------------
    floors: dict[str, float] = {}
    base_wall_s = 0.0
    if not args.skip_baseline:
        import nbformat
        from nbclient.exceptions import CellTimeoutError

        logging.getLogger("traitlets").setLevel(logging.ERROR)
        wall0 = time.perf_counter()
        for label, code in (("empty notebook", None), ("`import torch` only", "import torch")):
            nb = nbformat.v4.new_notebook()
            if code:
                nb.cells = [nbformat.v4.new_code_cell(code)]
            floors[label] = _run_kernel(nb, ROOT, args.hang_timeout)
            console.print(f"  fresh kernel, {label}: {_ms(floors[label])} ms")
        for s in subs:
            row, f = rows[s.name], files[s.name]
            if row.excluded is not None or f is None:
                continue
            nb = _as_notebook(f)
            try:
                for _ in range(args.baseline_repeat):
                    row.baseline_s.append(_run_kernel(nb, f.parent, args.hang_timeout))
            except CellTimeoutError:
                row.excluded = f"a cell ran over {args.hang_timeout:g} s in a fresh kernel"
                row.baseline_s.clear()
                console.print(
                    f"  {row.student}: a cell did not finish within {args.hang_timeout:g} s "
                    "in a fresh kernel (counted as never terminating): left out of the ratio"
                )
        base_wall_s = time.perf_counter() - wall0
        console.print(f"  baseline done in {base_wall_s:.1f} s")

    # ---- report -----------------------------------------------------------------------
    table = Table(title=f"per submission, stage {stage} (ms)", title_justify="left")
    for col, just in (
        ("student", "left"),
        ("file", "left"),
        ("score", "right"),
        ("ours, 1st pass", "right"),
        (f"ours, median of {args.repeat}", "right"),
        (f"fresh kernel, median of {args.baseline_repeat}", "right"),
        ("ratio", "right"),
        ("left out because", "left"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for s in subs:
        r = rows[s.name]
        ratio = f"{r.baseline / r.ours:.1f}x" if r.ours and r.baseline else "—"
        table.add_row(
            r.student,
            r.file or "—",
            r.score,
            _ms(r.first_s),
            _ms(r.ours),
            _ms(r.baseline),
            ratio,
            r.excluded or "",
        )
    console.print(table)

    compared = [r for r in rows.values() if r.excluded is None and r.ours is not None and r.baseline]
    ours_all = [r.ours for r in rows.values() if r.ours is not None]
    ours_cmp = [r.ours for r in compared if r.ours is not None]
    base_cmp = [r.baseline for r in compared if r.baseline is not None]
    ours_mean, base_mean = _mean(ours_cmp), _mean(base_cmp)
    n_class = len(subs)
    one_off_s = server_s + plan_s
    # ours' one-off costs spread over the submissions timed on both sides (or all timed
    # ones, without a baseline), each graded once in the steady state
    spread = ours_cmp or ours_all
    amortised_s = (one_off_s + sum(spread)) / len(spread) if spread else None

    summary = Table(title="summary", title_justify="left")
    summary.add_column("what")
    summary.add_column("ms", justify="right")
    summary.add_column("note")
    summary.add_row("import torch + grader (this process)", _ms(import_s), "once per run")
    summary.add_row("fork server start-up", _ms(server_s), "once per run: torch import + warm-up, first fork")
    summary.add_row("expected values (first run of stage)", _ms(plan_s), "once per run and stage")
    summary.add_row("first pass, whole class", _ms(first_pass_s), f"{n_class} submissions, time limits incl.")
    summary.add_row(
        "ours, steady, median / submission",
        _ms(_median(ours_all)),
        f"{len(ours_all)} submissions",
    )
    summary.add_row("ours, steady, mean / submission", _ms(_mean(ours_all)), f"{len(ours_all)} submissions")
    summary.add_row(
        "ours, amortised / submission",
        _ms(amortised_s),
        f"steady + server start-up + expected values, over {len(spread)}",
    )
    if not args.skip_baseline:
        for label, s in floors.items():
            summary.add_row(f"fresh kernel, {label}", _ms(s), "baseline floor")
        summary.add_row(
            "fresh kernel, median / notebook", _ms(_median(base_cmp)), f"{len(base_cmp)} notebooks"
        )
        summary.add_row("fresh kernel, mean / notebook", _ms(base_mean), f"{len(base_cmp)} notebooks")
    console.print(summary)

    left_out = [f"{r.student} ({r.excluded})" for r in rows.values() if r.excluded]
    if left_out:
        console.print("left out of the ratio: " + "; ".join(left_out))
    ratio = base_mean / ours_mean if ours_mean and base_mean else None
    ratio_amortised = base_mean / amortised_s if amortised_s and base_mean else None
    if ratio is None:
        console.print("ratio: not measured (no submission timed on both sides)")
    else:
        console.print(
            f"ratio (amortised, start-up included, {len(compared)} submissions): {ratio_amortised:.1f}x",
            highlight=False,
        )
        print(
            f"ratio: baseline/ours per notebook = {ratio:.1f}x "
            f"(mean over the same {len(compared)} submissions)"
        )

    if not args.no_json:
        out = {
            "class_dir": str(class_dir),
            "stage": stage,
            "repeat": args.repeat,
            "baseline_repeat": args.baseline_repeat,
            "hang_timeout_s": args.hang_timeout,
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "startup_s": {
                "import_torch_and_grader": import_s,
                "fork_server": server_s,
                "expected_values": plan_s,
                "first_pass_class": first_pass_s,
            },
            "ours_s": {
                "median": _median(ours_all),
                "mean": _mean(ours_all),
                "mean_compared": ours_mean,
                "amortised_compared": amortised_s,
                "wall": ours_wall_s,
            },
            "baseline_s": {
                "floors": floors,
                "median": _median(base_cmp),
                "mean": base_mean,
                "wall": base_wall_s,
            },
            "ratio_baseline_over_ours": ratio,
            "ratio_amortised": ratio_amortised,
            "compared": [r.student for r in compared],
            "submissions": [
                {**asdict(r), "ours_median_s": r.ours, "baseline_median_s": r.baseline} for r in rows.values()
            ],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        console.print(f"figures: {args.json}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

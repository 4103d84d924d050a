"""``python -m autograder`` / ``bertlab``: grade submissions, regenerate student material."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from autograder.grader import feedback, gradescope, release
from autograder.grader.launch import discard, early
from autograder.grader.options import (
    SUBMISSION_S,
    CallTimeout,
    Device,
    Stages,
    Submissions,
    SubmissionTimeout,
    check_stages,
    check_submissions,
    console,
    err,
    launch_for,
    open_grader,
    quick_exit,
    safe_name,
    usage_error,
)
from autograder.sandbox.confine import SandboxUnusable
from autograder.stages.unfilled import UnfilledStage

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="bertlab: grade Transformer/BERT exercises."
)


@app.command()
def grade(
    submissions: Submissions,
    stage: Stages = None,
    results: Annotated[Path | None, typer.Option(help="results.json to write (one submission).")] = None,
    results_dir: Annotated[
        Path | None, typer.Option(help="Write DIR/<student>/results.json per submission.")
    ] = None,
    device: Device = "cpu",
    call_timeout: CallTimeout = None,
    submission_timeout: SubmissionTimeout = SUBMISSION_S,
    show_hidden: Annotated[
        bool,
        typer.Option(
            "--show-hidden",
            help="Results files for instructors: hidden cases in full, and all the code printed "
            "(by default they hold what a student may see).",
        ),
    ] = False,
) -> None:
    """Grade SUBMISSIONS against the hidden reference. Exit 0 whenever grading completed.
    Results files hold what the student may see; the table printed here shows everything."""
    check_submissions(submissions, "results" if results_dir is not None else None)
    if results is not None and len(submissions) != 1:
        raise usage_error("--results takes one submission; use --results-dir for several")
    check_stages(stage)
    from autograder.grader.batch import default_workers
    from autograder.grader.report import class_table, print_notes, test_table, write_results
    from autograder.runtime.submission import Submission
    from autograder.stages import stage_ids

    grader = open_grader(device, call_timeout, submission_timeout, server=launch_for(submissions, stage))
    graded = []
    with grader:
        for sub in submissions:
            r = grader.grade(sub, Submission(sub).stages(stage_ids(), stage), workers=default_workers())
            graded.append(r)
            if results is not None:
                write_results(r, results, show_hidden)
            if results_dir is not None:
                write_results(r, results_dir / safe_name(r.student) / "results.json", show_hidden)
    if len(graded) == 1:
        console.print(test_table(graded[0]))
        print_notes(console, graded[0])
    else:
        console.print(class_table(graded))
    if results_dir is not None:
        console.print(f"results: {results_dir}/<student>/results.json")


def _shard(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        k, n = (int(x) for x in value.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise usage_error(f"--shard takes K/N with 1 <= K <= N, e.g. 2/8; got {value!r}")
    return k, n


@app.command()
def batch(
    class_dir: Annotated[
        Path, typer.Argument(help="nbgrader's CLASS/submitted/<student>/<stage>/ or CLASS/<student>/.")
    ],
    stage: Stages = None,
    layout: Annotated[
        str,
        typer.Option(
            help="flat (CLASS/<student>/), nbgrader (CLASS/submitted/<student>/) or auto, which "
            "refuses a class that could be either (a student may name a folder 'submitted')."
        ),
    ] = "auto",
    db: Annotated[
        Path | None,
        typer.Option(help="The SQLite gradebook (default: ./bertlab-gradebook[.shard-K-of-N].sqlite)."),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help="Parallel graders; default: this machine's cores.")
    ] = None,
    regrade: Annotated[
        bool,
        typer.Option(
            help="Grade again what the gradebook already holds, and show what changed since "
            "(per student and test: old and new score, and why)."
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Grade and show what would change since the gradebook's grades, writing nothing "
            "to it: with --regrade, what new hidden cases or points would change, to announce first.",
        ),
    ] = False,
    diff_csv: Annotated[
        Path | None,
        typer.Option(
            "--diff-csv",
            help="Write what changed since the gradebook's previous grades as CSV, one row per "
            "student x test. For instructors only: it names hidden cases.",
        ),
    ] = None,
    shard: Annotated[
        str | None, typer.Option(help="K/N: grade only the K-th of N slices of the students (job arrays).")
    ] = None,
    csv: Annotated[Path | None, typer.Option(help="Also export the gradebook as CSV.")] = None,
    device: Device = "cpu",
    call_timeout: CallTimeout = None,
    submission_timeout: SubmissionTimeout = SUBMISSION_S,
) -> None:
    """Grade every student x stage of CLASS_DIR into a resumable gradebook: a killed batch,
    run again, grades only what is missing (or whose code changed). With --regrade or
    --dry-run, show per student and test what changed since the gradebook's previous grade
    (for instructors: it names hidden cases).
    Exit 1 when a student folder was left out or a grade could not be computed or stored
    (said at the end)."""
    from autograder.grader import batch as b

    if not class_dir.is_dir():
        raise usage_error(f"{class_dir} is not a directory")
    check_stages(stage)
    if dry_run and csv is not None:
        raise usage_error("--csv exports the gradebook, which --dry-run leaves as it is; use --diff-csv")
    sliced = _shard(shard)
    if db is None:
        db = Path("bertlab-gradebook" + (f".shard-{sliced[0]}-of-{sliced[1]}" if sliced else "") + ".sqlite")
    asked = b.ClassRun(
        class_dir, stage, layout, db, workers, regrade, dry_run, diff_csv, sliced, csv, device, call_timeout,
        submission_timeout,
    )  # fmt: skip
    status = b.grade_class(asked, console, err)
    if status:
        raise typer.Exit(status)


@app.command()
def merge(
    into: Annotated[Path, typer.Argument(help="The gradebook to merge into (created if missing).")],
    shards: Annotated[list[Path], typer.Argument(help="Shard gradebooks to merge in.")],
    csv: Annotated[Path | None, typer.Option(help="Also export the merged gradebook as CSV.")] = None,
) -> None:
    """Combine shard gradebooks (idempotent: merging one twice changes nothing)."""
    from autograder.grader.batch import Gradebook

    for s in shards:
        if not s.is_file():
            raise usage_error(f"{s} does not exist")
    with Gradebook(into) as book:
        changed = sum(book.merge(s) for s in shards)
        total = len(book.rows())
        if csv is not None:
            book.export_csv(csv)
    console.print(
        f"merged {len(shards)} gradebooks into {into}: {changed} grades added or updated, {total} in all"
    )


@app.command("nbgrader-export")
def nbgrader_export(
    gradebook: Annotated[Path, typer.Argument(help="A bertlab gradebook written by `batch` (or `merge`).")],
    to: Annotated[
        str, typer.Option(help="nbgrader's database URL (its course's gradebook.db).")
    ] = "sqlite:///gradebook.db",
) -> None:
    """Write the grades into nbgrader's gradebook (auto scores per grade cell; manual
    grades are kept), for formgrader and `nbgrader export`."""
    from autograder.grader.batch import Gradebook
    from autograder.grader.nbgrader_export import export

    if not gradebook.is_file():
        raise usage_error(f"{gradebook} does not exist")
    with Gradebook(gradebook) as book:
        written = export(book.rows(), to)
    console.print(f"wrote {written} grades into {to}")


@app.command()
def generate(
    stage: Annotated[list[str] | None, typer.Argument(help="Stage ids; default: all.")] = None,
    check: Annotated[bool, typer.Option(help="Only check that generated files are up to date.")] = False,
    cpu: Annotated[
        str | None,
        typer.Option(
            help="With --check: check under another CPU's kernels, default (no vector units) or avx2: "
            "a child process whose torch, oneDNN, MKL, OpenBLAS and numpy are held to that level "
            "computes the self-check data, which must match within each case's tolerance.",
        ),
    ] = None,
) -> None:
    """Regenerate assignments/ (student notebooks) and public self-check data from solutions/ and
    specs; with --check, compare instead (one stage: `generate --check 12_rope`)."""
    from autograder.grader import cpus
    from autograder.stages import stage_ids

    stages = stage or stage_ids()
    unknown = [s for s in stages if s not in stage_ids()]
    if unknown:
        raise usage_error(f"unknown stage {', '.join(unknown)} (known: {', '.join(stage_ids())})")
    if cpu is not None:
        if not check:
            raise usage_error("--cpu compares with the committed data under other kernels: add --check")
        if cpu not in cpus.LEVELS:
            raise usage_error(f"--cpu takes {' or '.join(cpus.LEVELS)}, not {cpu!r}")
        if os.environ.get(cpus.CHILD_ENV) != cpu:  # torch reads its level once, as it loads
            raise typer.Exit(cpus.rerun(cpu, ["generate", "--check", "--cpu", cpu, *stages]))
        if why := cpus.running(cpu):
            err.print(f"error: {why}", markup=False, highlight=False)
            raise typer.Exit(2)
    from autograder.grader.notebooks import generate_stage, why_stale

    stale = []
    for s in stages:
        stale += generate_stage(s, check=check)
    kernels = f" under the {cpu} kernels" if cpu else ""
    if check and stale:
        lines = [f"{p}" + "".join(f"\n      {d}" for d in why_stale(p)) for p in stale]
        again = " ".join(["python -m autograder generate", *(stage or [])])
        advice = f"run `{again}`" + (
            " on this machine first; if that changes nothing, a case's values depend on the CPU "
            "more than its tolerance allows"
            if cpu
            else ""
        )
        message = f"out of date{kernels} ({advice}):\n  " + "\n  ".join(lines)
        err.print(message, markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    console.print(f"up to date{kernels}: {', '.join(stages)}" if check else f"generated: {', '.join(stages)}")


@app.command("new-stage")
def new_stage(
    stage: Annotated[str, typer.Argument(help="The new stage's id, NN_name: 12_rope.")],
    names: Annotated[
        str, typer.Option(help="Its graded names, comma-separated, in task order: rms_norm,rotate_half.")
    ],
    title: Annotated[str | None, typer.Option(help="Its title (default: from its id).")] = None,
) -> None:
    """Write a new stage to fill in: its spec, reference, solution notebook, reference test and
    CURRICULUM.md section, each part only you can write marked FILL IN:. Nothing grades or
    generates the stage until every such line is written (README.md, "Adding a stage")."""
    from autograder.grader import scaffold

    try:
        made = scaffold.new_stage(stage, names.split(","), title)
    except scaffold.ScaffoldError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    root = scaffold.ROOT
    where = f"before {made.before!r}" if made.before else "at the end"
    lines = [f"wrote stage {made.stage} ({made.title!r}):"]
    lines += [f"  {path.relative_to(root)}" for path in made.written]
    lines += [f"  {made.curriculum.relative_to(root)}: its section, {where}", ""]
    lines += [f"{len(made.todo())} lines to write, each marked FILL IN: (grep -rn 'FILL IN:' these files);"]
    lines += ['then, in order (README.md, "Adding a stage"):']
    lines += [f"  {command}" for command in scaffold.checklist(made.stage)]
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


@app.command()
def doctor() -> None:
    """Which sandbox layers this machine offers to the child that runs student code, and
    whether a confined child can run a submission at all (exit 3 if not)."""
    from rich.table import Table

    from autograder.grader.runner import ForkServer
    from autograder.sandbox.confine import detect

    report = detect()
    table = Table(title="bertlab sandbox layers on this machine", title_justify="left")
    table.add_column("layer")
    table.add_column("active")
    table.add_column("detail")
    for layer in report.layers:
        active = (
            "[yellow]degraded[/yellow]"
            if layer.degraded
            else "[green]yes[/green]"
            if layer.active
            else "[red]no[/red]"
        )
        table.add_row(layer.name, active, layer.detail)
    console.print(table)
    degraded = [layer.name for layer in report.layers if layer.degraded]
    if report.missing or degraded:
        console.print(
            f"missing: {', '.join(report.missing) or 'none'}; degraded: {', '.join(degraded) or 'none'}"
        )
    else:
        console.print("all layers active")
    # the grader's own start-up check: a confined child imports and answers a call
    try:
        with ForkServer() as server:
            server.wait_ready()
    except RuntimeError as exc:  # SandboxUnusable, or a server that did not start
        err.print(f"student code cannot run here: {exc}", markup=False, highlight=False)
        raise typer.Exit(3) from None
    console.print("a confined child runs a submission: yes")


@app.command()
def stages() -> None:
    """List the stages, their graded names and points."""
    from autograder.stages import all_specs

    for spec in all_specs():
        console.print(f"[bold]{spec.id}[/bold] {spec.title}: {spec.max_score:g} points")
        for g in spec.graded:
            console.print(f"  task {g.task}: {g.signature}  ({g.max_score:g} points)")


# commands whose code lives in their own module
app.command("feedback")(feedback.command)
app.command("release")(release.command)
app.command("gradescope-zip")(gradescope.command)


def main() -> None:
    early(sys.argv[1:])  # `bertlab grade ...` (python -m autograder launched it already)
    try:
        app()
    except SystemExit as exc:
        # graded and written, the server closed (batch's 1: a student left out, said above)
        done = {"grade": (0, None), "batch": (0, None, 1)}.get(sys.argv[1] if sys.argv[1:] else "", ())
        if exc.code in done:
            discard()  # an early server nothing adopted (``--help``), as at a normal exit
            quick_exit(exc.code or 0)
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except UnfilledStage as exc:  # a stage new-stage scaffolded, not written yet: what to write
        err.print(f"bertlab: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
    except SandboxUnusable as exc:  # this machine, not a student: no grade is written
        err.print(f"bertlab: cannot grade here: {exc}", markup=False, highlight=False)
        err.print("`python -m autograder doctor` shows each sandbox layer.", markup=False, highlight=False)
        sys.exit(3)
    except Exception as exc:  # a grader fault: say so clearly and fail
        err.print(f"bertlab: internal error: {type(exc).__name__}: {exc}", markup=False, highlight=False)
        sys.exit(1)
    finally:
        # the interpreter's exit would walk every object torch made in a last collection
        # (a few tenths of a second, after grading is done): none of them holds anything
        gc.freeze()

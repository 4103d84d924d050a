"""Results out: Gradescope's results.json and the terminal tables.

The JSON uses gradescope-utils' keys (name, number, score, max_score, status, output,
tags, visibility) plus Gradescope's top-level score, output, stdout_visibility and
execution_time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autograder.runtime.results import StageResult, SubmissionResult, TestResult, counterexample_text

# C0 and C1 controls (terminal escapes among them) and lone surrogates, which cannot be
# written as UTF-8; newline and tab stay.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def escape(text: str, limit: int = 4000) -> str:
    """Student-produced text made safe to show: no control characters, bounded length."""
    text = _CONTROL.sub("�", text)
    return text if len(text) <= limit else text[:limit] + "\n… (truncated)"


def _output(t: TestResult) -> tuple[str, str]:
    """A test's text, bounded, and its counterexample's, which ends it: kept whole up to a
    bound of its own, since code cut short does not run."""
    if t.counterexample is None:
        return escape(t.output), ""
    found = escape(counterexample_text(t.counterexample), 16000)
    body = t.output[: -len(counterexample_text(t.counterexample))].rstrip("\n")
    return escape(body) + "\n" + found, found


def clause_of(stage: str, function: str) -> str | None:
    """The CURRICULUM.md clause a test of ``stage``'s ``function`` checks; None for a name
    this grader's specs do not know (a stage from elsewhere, or one renamed since)."""
    from autograder.stages import load_spec

    try:
        return load_spec(stage).graded_name(function).clause
    except (ImportError, KeyError, ValueError, FileNotFoundError):
        return None


def stage_record(stage: StageResult) -> dict[str, Any]:
    """A ``StageResult`` as JSON data, for instructors: its fields, its scores and each
    test's text as results.json shows it (``TestResult.output``). The gradebook stores it."""
    record = {**dataclasses.asdict(stage), "score": stage.score, "max_score": stage.max_score}
    for stored, t in zip(record["tests"], stage.tests, strict=True):
        stored["output"] = t.output
    return record


def to_gradescope(result: SubmissionResult) -> dict[str, Any]:
    tests = []
    for stage in result.stages:
        for t in stage.tests:
            tags = [f"stage:{t.stage}", f"function:{t.function}"]
            clause = clause_of(t.stage, t.function)
            tags += [f"clause:{clause}"] if clause else []
            tags += [f"misconception:{m}" for m in t.misconceptions]
            output, _ = _output(t)
            tests.append(
                {
                    "name": t.name,
                    "number": t.number,
                    "score": t.score,
                    "max_score": t.max_score,
                    "status": "passed" if t.passed else "failed",
                    "output": output,
                    "tags": tags,
                    "visibility": "visible",
                }
            )
    lines = []
    for stage in result.stages:
        head = f"{stage.stage}: {stage.score:g}/{stage.max_score:g}"
        lines.append(head + (f" ({stage.file})" if stage.file else " (no file)"))
        lines += [f"  note: {n}" for n in stage.notes]
        if stage.stdout.strip():
            lines.append(
                "  your code printed:\n"
                + "\n".join("    " + x for x in escape(stage.stdout, 2000).splitlines())
            )
        # present only in an instructor's view (visibility.for_students removes them)
        lines += [f"  after hidden inputs, note: {n}" for n in stage.private_notes]
        if stage.private_stdout.strip():
            lines.append(
                "  all it printed, hidden cases included:\n"
                + "\n".join("    " + x for x in escape(stage.private_stdout, 4000).splitlines())
            )
    return {
        "score": round(result.score, 4),
        "output": escape("\n".join(lines), 20000),
        "stdout_visibility": "hidden",
        "execution_time": round(result.execution_time, 3),
        "tests": tests,
    }


def write_results(result: SubmissionResult, path: Path, show_hidden: bool = False) -> None:
    """The results file of one submission: what its student may see
    (``visibility.for_students``), or everything with ``show_hidden`` (instructors)."""
    from autograder.grader.visibility import for_students

    write_json(to_gradescope(result if show_hidden else for_students(result)), path)


def write_json(data: dict[str, Any], path: Path) -> None:
    """Write atomically, so a reader never sees half a file (and a file planted at ``path``
    is replaced, not written through)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def class_table(results: list[SubmissionResult]) -> Table:
    table = Table(title="bertlab grades", title_justify="left")
    table.add_column("student", no_wrap=True)
    table.add_column("score", justify="right", no_wrap=True)
    table.add_column("%", justify="right", min_width=3)
    table.add_column("named mistakes", min_width=18)
    table.add_column("first problem", max_width=64, no_wrap=True, overflow="ellipsis")
    for r in results:
        problems = []
        for s in r.stages:
            problems += [n for n in s.notes if not n.startswith("neutralised")][:2]
            for t in s.tests:
                if not t.passed and not t.misconceptions:
                    first = next((c.message for c in t.cases if not c.passed), "")
                    if first and first not in problems:
                        problems.append(first.split("\n")[0])
        pct = 100 * r.score / r.max_score if r.max_score else 0.0
        table.add_row(  # Text, not markup: a student's "[/]" is shown, not parsed
            Text(escape(r.student, 80)),
            f"{r.score:g} / {r.max_score:g}",
            f"{pct:.0f}",
            ", ".join(r.misconceptions) or "—",
            Text(escape(problems[0].split("; ")[0], 400) if problems else "—"),  # one line; the file has all
        )
    return table


def test_table(result: SubmissionResult) -> Table:
    title = Text(f"{escape(result.student, 80)}: {result.score:g} / {result.max_score:g}")
    table = Table(title=title, title_justify="left")
    table.add_column("test")
    table.add_column("score", justify="right")
    table.add_column("message")
    for stage in result.stages:
        for t in stage.tests:
            first = next((c for c in t.cases if not c.passed), None)
            msg = "passed" if first is None else f"{first.label}: {first.text}"
            style = "green" if t.passed else ("yellow" if t.score > 0 else "red")
            table.add_row(t.name, Text(f"{t.score:g}/{t.max_score:g}", style=style), Text(escape(msg, 300)))
    return table


def print_notes(console: Console, result: SubmissionResult) -> None:
    for stage in result.stages:
        for n in stage.notes:
            console.print(Text(f"{stage.stage}: {escape(n, 300)}", style="dim"), highlight=False)

"""Results out: Gradescope's results.json and the terminal tables.

The JSON uses gradescope-utils' keys (name, number, score, max_score, status, output,
tags, visibility) plus Gradescope's top-level score, output, stdout_visibility and
execution_time. Its numbers keep every digit (Gradescope adds them up); its texts show
scores with at most 2 decimals (``results.points``). A text that quotes code in backticks
is sent as Markdown (``output_format: "md"``), every other character escaped (``markdown``).
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

from autograder.runtime.results import StageResult, SubmissionResult, TestResult, counterexample_text, points

# C0 and C1 controls (terminal escapes among them) and lone surrogates, which cannot be
# written as UTF-8; newline and tab stay.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def escape(text: str, limit: int = 4000) -> str:
    """Student-produced text made safe to show: no control characters, bounded length."""
    text = _CONTROL.sub("�", text)
    return text if len(text) <= limit else text[:limit] + "\n… (truncated)"


# Markdown: what would start markup anywhere in a line (an intraword _ cannot, in CommonMark,
# and stays readable: scaled_dot_product_attention) ...
_MD_INLINE = re.compile(r"[\\`*\[\]<>&|~$]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# ... and what would at its start: a heading, a list item, a setext underline
_MD_LINE_START = re.compile(r"^(?:[#+=-]|(\d+)[.)])")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def markdown(text: str) -> str:
    """Plain text as Markdown showing the same characters, line for line: what it quotes in
    backticks becomes a code span (literal in Markdown, whatever it holds), every other
    character that Markdown or HTML would read as markup is backslash-escaped, and leading
    spaces are kept as no-break spaces (four spaces would start a code block). A student's
    text can therefore never become a link, an image, HTML, a list or a heading; at most a
    part of it shows in code font."""

    def plain(part: str) -> str:
        return _MD_INLINE.sub(lambda m: "\\" + m.group(0), part)

    lines = []
    for line in text.expandtabs(4).split("\n"):
        body = line.lstrip(" ")
        out, pos = [], 0
        for m in _CODE_SPAN.finditer(body):
            out += [plain(body[pos : m.start()]), f"`{m.group(1)}`"]
            pos = m.end()
        md = "".join([*out, plain(body[pos:])])
        if body == line:  # unindented: its first characters could start a block
            md = _MD_LINE_START.sub(lambda m: (m.group(1) or "") + "\\" + m.group(0)[-1], md)
        lines.append("\u00a0" * (len(line) - len(body)) + md)
    return "  \n".join(lines)  # two spaces: a hard line break, as in the plain text


def _fenced(text: str) -> str:
    """Printed output as a Markdown code block: a fence longer than any run of backticks in
    it, so nothing inside can close it."""
    runs = [len(r) for r in re.findall(r"`+", text)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return f"{fence}\n{text}\n{fence}"


def _as_markdown(entry: dict[str, Any], counterexample: str = "") -> None:
    """Send a test's output as Markdown when it quotes code in backticks (else as it is); its
    counterexample (the output's end) as a code block, so that it pastes as Python."""
    if counterexample and entry["output"].endswith(counterexample):
        body = entry["output"][: -len(counterexample)].rstrip("\n")
        entry["output"] = markdown(body) + "\n\n" + _fenced(counterexample)
        entry["output_format"] = "md"
    elif "`" in entry["output"]:
        entry["output"] = markdown(entry["output"])
        entry["output_format"] = "md"


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


def to_gradescope(result: SubmissionResult, markdown: bool = False) -> dict[str, Any]:
    """Gradescope's results of ``result``; ``markdown``: a text that quotes code in backticks
    is Markdown, as Gradescope then shows it (else every text is plain, as for a terminal)."""
    tests = []
    for stage in result.stages:
        for t in stage.tests:
            tags = [f"stage:{t.stage}", f"function:{t.function}"]
            clause = clause_of(t.stage, t.function)
            tags += [f"clause:{clause}"] if clause else []
            tags += [f"misconception:{m}" for m in t.misconceptions]
            output, counterexample = _output(t)
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
            if markdown:
                _as_markdown(tests[-1], counterexample)
    # (text, printed): our lines, and what the code printed, which Markdown shows as a block
    parts: list[tuple[str, bool]] = [(n, False) for n in result.notes]
    for stage in result.stages:
        head = f"{stage.stage}: {points(stage.score)}/{points(stage.max_score)}"
        parts.append((head + (f" ({stage.file})" if stage.file else " (no file)"), False))
        parts += [(f"  note: {n}", False) for n in stage.notes]
        if stage.stdout.strip():
            parts += [("  your code printed:", False), (escape(stage.stdout, 2000), True)]
        # present only in an instructor's view (visibility.for_students removes them)
        parts += [(f"  after hidden inputs, note: {n}", False) for n in stage.private_notes]
        if stage.private_stdout.strip():
            parts += [
                ("  all it printed, hidden cases included:", False),
                (escape(stage.private_stdout, 4000), True),
            ]
    data = {
        "score": round(result.score, 4),
        "output": escape(_top_output(parts, md=False), 20000),
        "stdout_visibility": "hidden",
        "execution_time": round(result.execution_time, 3),
        "tests": tests,
    }
    if markdown and "`" in data["output"]:
        data["output"] = escape(_top_output(parts, md=True), 20000)
        data["output_format"] = "md"
    return data


def _top_output(parts: list[tuple[str, bool]], md: bool) -> str:
    if not md:
        return "\n".join(
            "\n".join("    " + x for x in text.splitlines()) if printed else text for text, printed in parts
        )
    blocks: list[str] = []
    lines: list[str] = []
    for text, printed in [*parts, ("", True)]:
        if not printed:
            lines.append(text)
            continue
        if lines:  # our consecutive lines: one paragraph, line for line
            blocks.append(markdown("\n".join(lines)))
            lines = []
        if text:
            blocks.append(_fenced(text))
    return "\n\n".join(blocks)


def write_results(result: SubmissionResult, path: Path, show_hidden: bool = False) -> None:
    """The results file of one submission: what its student may see
    (``visibility.for_students``), or everything with ``show_hidden`` (instructors)."""
    from autograder.grader.visibility import for_students

    write_json(to_gradescope(result if show_hidden else for_students(result), markdown=True), path)


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` sets it for every thread
    while it reads it): from /proc on Linux, else by setting it back at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json(data: dict[str, Any], path: Path) -> None:
    """Write atomically, so a reader never sees half a file (and a file planted at ``path``
    is replaced, not written through)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(text)
        # as open() would make it (0644 under the usual umask 022: Gradescope's and the TAs'
        # tools read it as other users), not mkstemp's 0600; a umask of 077 keeps it private
        os.chmod(tmp, 0o666 & ~_umask())
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
        problems = list(r.notes)
        for s in r.stages:
            problems += [n for n in s.notes if not n.startswith("neutralised")][:2]
            for t in s.tests:
                if not t.passed and not t.misconceptions:
                    first = (
                        next((c.message for c in t.cases if not c.passed), "") if t.ran else t.headline or ""
                    )
                    if first and first not in problems:
                        problems.append(first.split("\n")[0])
        pct = 100 * r.score / r.max_score if r.max_score else 0.0
        table.add_row(  # Text, not markup: a student's "[/]" is shown, not parsed
            Text(escape(r.student, 80)),
            f"{points(r.score)} / {points(r.max_score)}",
            f"{pct:.0f}",
            ", ".join(r.misconceptions) or "—",
            Text(escape(problems[0].split("; ")[0], 400) if problems else "—"),  # one line; the file has all
        )
    return table


def test_table(result: SubmissionResult) -> Table:
    """A row per test; a stage none of whose cases ran (no file) is one row. What is said of
    the whole submission (no stage file at all) heads it, once."""
    head = f"{escape(result.student, 80)}: {points(result.score)} / {points(result.max_score)}"
    title = Text("\n".join([head, *(escape(n, 1000) for n in result.notes)]))
    table = Table(title=title, title_justify="left")
    table.add_column("test")
    table.add_column("score", justify="right")
    table.add_column("message")

    def row(name: str, score: float, max_score: float, msg: str) -> None:
        style = "green" if score >= max_score else ("yellow" if score > 0 else "red")
        table.add_row(name, Text(f"{points(score)}/{points(max_score)}", style=style), Text(escape(msg, 300)))

    for stage in result.stages:
        if (
            stage.tests
            and not any(t.ran for t in stage.tests)
            and len({t.headline for t in stage.tests}) == 1
        ):
            row(
                f"{stage.stage} ({len(stage.tests)} tests)",
                stage.score,
                stage.max_score,
                stage.tests[0].headline or "",
            )
            continue
        for t in stage.tests:
            row(t.name, t.score, t.max_score, _first_problem(t))
    return table


def _first_problem(t: TestResult) -> str:
    if not t.ran:
        return t.headline or "not run"
    first = next((c for c in t.cases if not c.passed), None)
    return "passed" if first is None else f"{first.label}: {first.text}"


def print_notes(console: Console, result: SubmissionResult) -> None:
    for stage in result.stages:
        for n in stage.notes:
            console.print(Text(f"{stage.stage}: {escape(n, 300)}", style="dim"), highlight=False)

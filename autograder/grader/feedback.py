"""Feedback a student can act on: one self-contained HTML page per student.

Per stage and test: the score, each case's message, the named mistake with its hint in a
callout, and for a wrong tensor a picture (the student's values, the expected ones and
the error, as heatmaps drawn from ``CaseResult.arrays``, which ``Grader(keep_arrays=True)``
keeps). Every text that may come from the student is escaped; the page runs no script.

    python -m autograder feedback SUBMISSION... --out DIR   # DIR/<student>/feedback.html
"""

from __future__ import annotations

import base64
import html
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

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
    launch_for,
    open_grader,
    safe_name,
)
from autograder.grader.report import escape
from autograder.runtime.results import (
    CaseResult,
    KeptArrays,
    StageResult,
    SubmissionResult,
    TestResult,
    counterexample_text,
    points,
)

if TYPE_CHECKING:  # numpy loads when a picture is drawn, not with the CLI
    import numpy as np

# (stage id, test number, case label): the key of one case's picture
CaseKey = tuple[str, str, str]


def _t(text: str, limit: int = 4000) -> str:
    """Student-produced text made safe for HTML: no control characters, bounded, escaped."""
    return html.escape(escape(str(text), limit), quote=True)


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _md(text: str, limit: int = 4000) -> str:
    """A message, note or hint (which quote code in backticks, and may quote the student's
    text) as HTML: ``_t`` first, so everything is escaped, then each `span` becomes a
    <code> element around that escaped text. A student's backticks make code spans too,
    but nothing they hold can become markup."""
    return _CODE_SPAN.sub(r"<code>\1</code>", _t(text, limit))


# -- pictures -------------------------------------------------------------------------------
#
# Drawn as HTML and small PNGs built here (numpy and zlib), not with matplotlib: a figure of
# three heatmaps took 0.4 s, and a student with 19 wrong tensors waited longer for the
# pictures than for the grading (benchmarks/bench_feedback.py). Small matrices are tables
# whose cells show the numbers; larger ones are images, one pixel block per value.

# 9 samples of matplotlib's viridis (values) and reversed magma (errors), interpolated
_VIRIDIS = (
    (68, 1, 84), (71, 45, 123), (59, 82, 139), (44, 114, 142), (33, 145, 140),
    (40, 174, 128), (94, 201, 98), (173, 220, 48), (253, 231, 37),
)  # fmt: skip
_MAGMA_R = (
    (252, 253, 191), (254, 194, 135), (251, 135, 97), (229, 80, 100), (181, 54, 122),
    (129, 37, 129), (79, 18, 123), (28, 16, 68), (0, 0, 4),
)  # fmt: skip
GREY = (208, 208, 208)  # not graded, NaN or inf
NUMBERS_UP_TO = 64  # a matrix of at most this many values shows them, as a table
IMAGE_PX = 384  # the longer side of a larger matrix's image, at most


def _colours(values: np.ndarray, lo: float, hi: float, stops: tuple) -> np.ndarray:
    """(rows, cols, 3) uint8: ``values`` on the colour map ``stops`` from ``lo`` to ``hi``."""
    import numpy as np

    table = np.asarray(stops, dtype=np.float64)
    finite = np.isfinite(values)
    x = np.clip((np.where(finite, values, lo) - lo) / ((hi - lo) or 1.0), 0.0, 1.0) * (len(table) - 1)
    i = np.minimum(x.astype(int), len(table) - 2)
    f = (x - i)[..., None]
    rgb = table[i] * (1 - f) + table[i + 1] * f
    rgb[~finite] = GREY
    return np.rint(rgb).astype(np.uint8)


def _png(rgb: np.ndarray) -> str:
    """A data URI of the PNG of ``rgb`` ((h, w, 3) uint8)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    h, w, _ = rgb.shape
    raw = b"".join(b"\0" + rgb[y].tobytes() for y in range(h))  # filter 0 per row
    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _hex(rgb) -> str:
    return "#" + "".join(f"{int(c):02x}" for c in rgb)


def _grid(values: np.ndarray, lo: float, hi: float, stops: tuple, r0: int, c0: int, what: str) -> str:
    """One heatmap: a table of numbers when small, else an image (its rows and columns are
    in the caption)."""
    import numpy as np

    rows, cols = values.shape
    rgb = _colours(values, lo, hi, stops)
    if rows * cols <= NUMBERS_UP_TO:
        head = "".join(f"<th>{c0 + j}</th>" for j in range(cols))
        body = []
        for i in range(rows):
            cells = []
            for j in range(cols):
                v, colour = values[i, j], rgb[i, j]
                ink = "#000" if 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2] > 127 else "#fff"
                text = f"{v:.2g}" if np.isfinite(v) else "—"
                cells.append(f'<td style="background:{_hex(colour)};color:{ink}">{html.escape(text)}</td>')
            body.append(f"<tr><th>{r0 + i}</th>{''.join(cells)}</tr>")
        return f'<table class="heat"><tr><th></th>{head}</tr>{"".join(body)}</table>'
    block = max(1, IMAGE_PX // max(rows, cols))
    image = np.repeat(np.repeat(rgb, block, axis=0), block, axis=1)
    return (
        f'<img class="heat" src="{_png(image)}" width="{cols * block}" height="{rows * block}" '
        f'alt="{_t(what, 300)}">'
    )


def _scale(lo: float, hi: float, stops: tuple, label: str) -> str:
    gradient = ", ".join(_hex(c) for c in stops)
    return (
        f'<span class="scale">{_t(label)}: {lo:.3g} <span class="bar" '
        f'style="background:linear-gradient(to right, {gradient})"></span> {hi:.3g}</span>'
    )


def _limits(*arrays: np.ndarray) -> tuple[float, float]:
    import numpy as np

    finite = np.concatenate([a[np.isfinite(a)].ravel() for a in arrays])
    if finite.size == 0:
        return 0.0, 1.0
    lo, hi = float(finite.min()), float(finite.max())
    return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)


def draw(arrays: tuple[KeptArrays, ...] | list[KeptArrays]) -> str:
    """The picture of one case, as HTML: per wrong output a row of three heatmaps (yours,
    expected, the error) and their colour scales. Every text in it is escaped."""
    import numpy as np

    rows = []
    for a in arrays:
        got, expected = a.got.astype(np.float64), a.expected.astype(np.float64)
        lo, hi = _limits(got, expected)
        bad = int((~np.isfinite(got)).sum())
        yours = f"yours: {a.output}" + (f" ({bad} NaN/inf, grey)" if bad else "")
        panels = [
            (yours, _grid(got, lo, hi, _VIRIDIS, a.row0, a.col0, yours)),
            (
                f"expected: {a.output}",
                _grid(expected, lo, hi, _VIRIDIS, a.row0, a.col0, f"expected {a.output}"),
            ),
        ]
        scales = [_scale(lo, hi, _VIRIDIS, "values")]
        if got.shape == expected.shape:
            error = np.abs(got - expected)
            error[~np.isfinite(got) & a.graded] = np.inf  # NaN/inf where a number belongs
            finite = error[np.isfinite(error) & a.graded]
            top = float(finite.max()) if finite.size else 1.0
            error = np.where(np.isinf(error), top, error)
            error[~a.graded] = np.nan  # not graded: grey
            title = "|yours − expected|" + ("" if a.graded.all() else " (grey: not graded)")
            panels.append((title, _grid(error, 0.0, top or 1.0, _MAGMA_R, a.row0, a.col0, "the error")))
            scales.append(_scale(0.0, top or 1.0, _MAGMA_R, "error"))
        else:
            differ = (
                f"shapes differ: yours {got.shape[0]}×{got.shape[1]}, "
                f"expected {expected.shape[0]}×{expected.shape[1]}"
            )
            panels.append(("", f'<p class="differ">{_t(differ)}</p>'))
        cells = "".join(f'<div class="panel"><div class="ttl">{_t(t)}</div>{g}</div>' for t, g in panels)
        where = f'<div class="scales">{_t(a.where, 600)}: {" ".join(scales)}</div>'
        rows.append(f'<div class="heatrow">{cells}</div>{where}')
    return "".join(rows)


def draw_pictures(result: SubmissionResult, hidden: bool = False) -> dict[CaseKey, str]:
    """A picture (``draw``) for every failing case that kept arrays
    (``Grader(keep_arrays=True)``). Cases of hidden tests get none unless ``hidden``: a
    picture shows expected values, and hidden cases stay hidden (as in the Gradescope results)."""
    pictures = {}
    for stage in result.stages:
        for t in stage.tests:
            if t.hidden and not hidden:
                continue
            for c in t.cases:
                if not c.passed and c.arrays:
                    pictures[(stage.stage, t.number, c.label)] = draw(c.arrays)
    return pictures


# -- the page -------------------------------------------------------------------------------

STYLE = """
:root { --ok: #1a7f37; --part: #9a6700; --bad: #cf222e; --line: #d0d7de; --muted: #57606a; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       margin: 0; background: #f6f8fa; }
main { max-width: 1100px; margin: 0 auto; padding: 24px; }
h1 { margin: 0 0 4px; font-size: 26px; } h2 { margin: 0; font-size: 20px; }
h3 { margin: 0; font-size: 16px; font-weight: 600; }
header, section.stage { background: #fff; border: 1px solid var(--line); border-radius: 8px;
       padding: 16px 20px; margin-bottom: 20px; }
.badge { display: inline-block; min-width: 64px; text-align: center; padding: 1px 10px;
         border-radius: 999px; font-weight: 600; font-size: 13px; color: #fff; white-space: nowrap; }
.badge.pass { background: var(--ok); } .badge.partial { background: var(--part); }
.badge.fail { background: var(--bad); }
.tag { font-size: 12px; color: var(--muted); border: 1px solid var(--line); border-radius: 4px;
       padding: 0 6px; margin-left: 6px; font-weight: normal; }
table.summary { border-collapse: collapse; margin-top: 12px; }
table.summary td, table.summary th { padding: 4px 14px 4px 0; text-align: left; }
.stage-head { display: flex; align-items: center; gap: 12px; flex-wrap: wrap; }
.muted { color: var(--muted); }
article.test { border-top: 1px solid var(--line); padding: 12px 0 4px; }
article.test > .head { display: flex; align-items: center; gap: 10px; flex-wrap: wrap; }
.callout { border-left: 4px solid; border-radius: 4px; padding: 8px 12px; margin: 10px 0; }
.callout.hint { border-color: #0969da; background: #ddf4ff; }
.callout.note { border-color: var(--part); background: #fff8c5; }
.callout.problem { border-color: var(--bad); background: #ffebe9; }
.callout p { margin: 4px 0 0; } .callout ul { margin: 4px 0 0; padding-left: 20px; }
ol.cases { list-style: none; padding: 0; margin: 8px 0; }
ol.cases li { margin: 6px 0; }
.mark { display: inline-block; width: 1.4em; font-weight: 700; }
li.pass .mark { color: var(--ok); } li.fail .mark { color: var(--bad); }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 4px 0 4px 1.4em;
      font: 13px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
      background: #f6f8fa; border: 1px solid var(--line); border-radius: 6px; padding: 6px 10px; }
code { font: 13px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
figure { margin: 6px 0 10px 1.4em; }
figcaption { font-size: 13px; color: var(--muted); }
.heatrow { display: flex; flex-wrap: wrap; gap: 14px; align-items: flex-start; }
.panel .ttl { font-size: 13px; margin-bottom: 2px; }
img.heat { image-rendering: pixelated; max-width: 100%; height: auto; border: 1px solid var(--line); }
table.heat { border-collapse: collapse; font: 11px ui-monospace, Menlo, Consolas, monospace; }
table.heat td { min-width: 3.2em; padding: 2px 4px; text-align: center; }
table.heat th { color: var(--muted); font-weight: normal; padding: 0 4px; }
.scales { font-size: 12px; color: var(--muted); margin: 4px 0; }
.scale { margin-right: 16px; white-space: nowrap; }
.scale .bar { display: inline-block; width: 90px; height: 9px; vertical-align: middle; border-radius: 2px; }
.differ { width: 14em; font-size: 13px; }
pre code, p code, li code, .callout code { background: #eaeef2; border-radius: 4px; padding: 0 3px; }
details > summary { cursor: pointer; color: var(--muted); }
a { color: #0969da; }
"""


# No script, no fetch: the page shows only itself, even if something slipped through.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _badge(score: float, max_score: float) -> str:
    kind = "pass" if score >= max_score else ("partial" if score > 0 else "fail")
    return f'<span class="badge {kind}">{points(score)} / {points(max_score)}</span>'


def _anchor(stage: str) -> str:
    return "stage-" + "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in stage)


def _case(
    stage: str, t: TestResult, c: CaseResult, pictures: Mapping[CaseKey, str], folded: bool = False
) -> str:
    state = "pass" if c.passed else "fail"
    out = [
        f'<li class="{state}"><span class="mark">{"✓" if c.passed else "✗"}</span>'
        f"<code>{_t(c.label, 300)}</code>",
        f'<pre class="msg">{_md(c.message)}</pre>',
    ]
    picture = pictures.get((stage, t.number, c.label))
    if picture is not None:  # HTML from ``draw``, its texts escaped there
        figure = (
            f'<figure class="picture">{picture}'
            "<figcaption>Shown: the matrix with the largest error. Yours and expected share one "
            "colour scale; grey: not graded, or NaN/inf.</figcaption></figure>"
        )
        out.append(f"<details><summary>picture</summary>{figure}</details>" if folded else figure)
    out.append("</li>")
    return "\n".join(out)


def _test(stage: str, t: TestResult, pictures: Mapping[CaseKey, str]) -> str:
    state = "pass" if t.passed else "fail"
    parts = [
        f'<article class="test {state}" id="test-{_t(t.number)}">',
        f'<div class="head">{_badge(t.score, t.max_score)}<h3>{_t(t.function)} '
        f'<span class="muted">· {_t(t.group)}</span></h3>'
        + ('<span class="tag">hidden test</span>' if t.hidden else "")
        + "</div>",
        f'<div class="muted">{_t(t.summary, 300)}</div>',
    ]
    # a load failure, a forbidden call, an earlier stage to fix first (and of a hidden
    # test, its named mistakes and where to see its cases' messages)
    extra = "\n".join([*t.remarks, *t.summary_notes])
    if extra:
        parts.append(f'<div class="callout problem"><pre>{_md(extra)}</pre></div>')
    hints = t.hints
    for mid in t.misconceptions:
        hint = hints.get(mid, "")
        parts.append(
            f'<div class="callout hint"><strong>Likely mistake: {_t(mid, 200)}</strong>'
            f"<p>{_md(hint, 2000)}</p></div>"
        )
    # Open: the first failing case's picture and any of another shape (a transposed matrix
    # shows itself); the rest fold, so the page stays readable.
    first = next((c.label for c in t.cases if not c.passed), None)
    cases = "\n".join(
        _case(
            stage,
            t,
            c,
            pictures,
            folded=c.label != first and all(a.got.shape == a.expected.shape for a in c.arrays),
        )
        for c in t.cases
    )
    # no case ran: the remark above says why, and a list of them would only repeat it
    if t.ran and t.passed:
        parts.append(
            f'<details><summary>{len(t.cases)} case(s)</summary><ol class="cases">{cases}</ol></details>'
        )
    elif t.ran:
        parts.append(f'<ol class="cases">{cases}</ol>')
    if t.counterexample is not None:  # public data only, so a hidden test shows it too
        # our lines quote names in backticks (code, as elsewhere); its indented lines are
        # Python to paste, shown exactly as they are
        text = escape(counterexample_text(t.counterexample), 16000)
        found = "\n".join(_t(x) if x.startswith("    ") else _md(x) for x in text.split("\n"))
        parts.append(f'<div class="callout hint counterexample"><pre>{found}</pre></div>')
    parts.append("</article>")
    return "\n".join(parts)


def _stage(s: StageResult, pictures: Mapping[CaseKey, str]) -> str:
    file = f"graded file: <code>{_t(s.file, 300)}</code>" if s.file else "no file graded"
    parts = [
        f'<section class="stage" id="{_anchor(s.stage)}">',
        f'<div class="stage-head"><h2>{_t(s.stage)}</h2>{_badge(s.score, s.max_score)}'
        f'<span class="muted">{file}</span></div>',
    ]
    if s.notes:
        items = "".join(f"<li>{_md(n, 1000)}</li>" for n in s.notes)
        parts.append(f'<div class="callout note"><strong>Notes</strong><ul>{items}</ul></div>')
    if s.stdout.strip():
        lines = s.stdout.count("\n") + 1
        parts.append(
            f"<details><summary>your code printed ({lines} line{'s' if lines != 1 else ''})</summary>"
            f"<pre>{_t(s.stdout, 4000)}</pre></details>"
        )
    if s.private_notes or s.private_stdout.strip():  # an instructor's page only
        items = "".join(f"<li>{_t(n, 1000)}</li>" for n in s.private_notes)
        printed = f"<pre>{_t(s.private_stdout, 4000)}</pre>" if s.private_stdout.strip() else ""
        parts.append(
            '<div class="callout problem"><strong>After it received hidden inputs '
            f"(instructors only)</strong><ul>{items}</ul>{printed}</div>"
        )
    parts += [_test(s.stage, t, pictures) for t in s.tests]
    parts.append("</section>")
    return "\n".join(parts)


def render_html(
    result: SubmissionResult, pictures: Mapping[CaseKey, str] | None = None, show_hidden: bool = False
) -> str:
    """The whole page: what the student may see (``visibility.for_students``), or with
    ``show_hidden`` everything (an instructor's page). ``pictures`` maps (stage, test
    number, case label) to an image URI; default: drawn from the result's kept arrays."""
    from autograder.grader.visibility import for_students

    if not show_hidden:
        result = for_students(result)
    if pictures is None:
        pictures = draw_pictures(result, hidden=show_hidden)
    student = _t(result.student, 200)
    rows = "".join(
        f'<tr><td><a href="#{_anchor(s.stage)}">{_t(s.stage)}</a></td><td>{_badge(s.score, s.max_score)}</td>'
        f"<td>{sum(t.passed for t in s.tests)} of {len(s.tests)} tests passed</td></tr>"
        for s in result.stages
    )
    mistakes = ", ".join(f"<code>{_t(m, 200)}</code>" for m in result.misconceptions)
    pct = 100 * result.score / result.max_score if result.max_score else 0.0
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<title>bertlab feedback · {student}</title>
<style>{STYLE}</style>
</head>
<body>
<main>
<header>
<h1>Feedback for {student}</h1>
<div class="stage-head">{_badge(result.score, result.max_score)}
<span class="muted">{pct:.0f}% of the points</span></div>
{"".join(f'<div class="callout problem">{_md(n, 2000)}</div>' for n in result.notes)}
{f"<p>Named mistakes: {mistakes}. Each failing test below says what to try.</p>" if mistakes else ""}
<table class="summary"><tr><th>stage</th><th>score</th><th>tests</th></tr>{rows}</table>
</header>
{"".join(_stage(s, pictures) for s in result.stages)}
</main>
</body>
</html>
"""


def write_html(
    result: SubmissionResult,
    path: Path,
    pictures: Mapping[CaseKey, str] | None = None,
    show_hidden: bool = False,
) -> Path:
    """Write the page atomically, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_html(result, pictures, show_hidden)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".feedback-", suffix=".html")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # a page to be read by others (mkstemp makes it 0600)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


# -- the command ----------------------------------------------------------------------------


def command(
    submissions: Submissions,
    out: Annotated[Path, typer.Option("--out", "-o", help="Write OUT/<student>/feedback.html.")],
    stage: Stages = None,
    device: Device = "cpu",
    call_timeout: CallTimeout = None,
    submission_timeout: SubmissionTimeout = SUBMISSION_S,
    show_hidden: Annotated[
        bool,
        typer.Option("--show-hidden", help="Instructors' pages: hidden cases in full (never for students)."),
    ] = False,
) -> None:
    """Grade SUBMISSIONS and write each student an HTML page: per test the message, the
    named mistake with its hint, and heatmaps of wrong tensors against the expected ones."""
    check_submissions(submissions)
    check_stages(stage)
    check_submissions(submissions, "pages")
    from autograder.grader.batch import default_workers
    from autograder.runtime.submission import Submission
    from autograder.stages import stage_ids

    server = launch_for(submissions, stage)
    with open_grader(device, call_timeout, submission_timeout, keep_arrays=True, server=server) as grader:
        for sub in submissions:
            r = grader.grade(sub, Submission(sub).stages(stage_ids(), stage), workers=default_workers())
            page = write_html(r, out / safe_name(r.student) / "feedback.html", show_hidden=show_hidden)
            console.print(
                f"{escape(r.student, 80)}: {points(r.score)} / {points(r.max_score)} → {page}", markup=False
            )

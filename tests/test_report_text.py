"""The texts every output shows: scores with at most 2 decimals (the JSON keeps every
digit), code quoted in backticks sent to Gradescope as Markdown that no student text can
turn into markup, a named mistake's hint once per test, and results files others can read."""

from __future__ import annotations

import html
import json
import os
import re
import stat

import pytest
from markdown_it import MarkdownIt
from rich.console import Console

from autograder.grader import feedback, report
from autograder.runtime import results
from autograder.runtime.results import CaseResult, StageResult, SubmissionResult

STAGE = "01_attention"
HINT = "Divide q·kᵀ by sqrt(d_k), with `d_k = q.size(-1)`, before the softmax."
# a student's text that tries every way out of plain text
HOSTILE = (
    "`x` ![p](http://evil/p.png) [link](http://evil) <img src=x onerror=alert(1)> <b>b</b> &amp; "
    "*em* _em_ ~~s~~ | a | b | $x$ \\` ``` `</code><script>alert(2)</script>`"
)


def _case(label: str, passed: bool, message: str, mistakes: tuple[str, ...] = ()) -> CaseResult:
    return CaseResult(label, passed, message, list(mistakes), dict.fromkeys(mistakes, HINT))


def _result() -> SubmissionResult:
    cases = [
        _case("x(7,)", True, "passed (max abs error 0)"),
        _case("x(3,5)", False, "`out`: 15 of 15 values differ", ("scale-by-d",)),
        _case("x(2,3,4)", False, "`out`: 24 of 24 values differ", ("scale-by-d",)),
    ]
    t = results.TestResult(STAGE, "softmax", "float32", "1.1", 2.0, 0.6667, False, cases, ["scale-by-d"])
    other = results.TestResult(
        STAGE, "padding_mask", "bool", "1.2", 59.0, 28.66666, False, [_case("L=3", True, "ok")], []
    )
    lines = "\n".join(["# not a heading", "- not a list", "1. not a list", "===", "    not code", HOSTILE])
    stage = StageResult(
        STAGE, "01_attention.py", [t, other], [f"code cell 2 (`{HOSTILE}`) raised"], stdout=lines
    )
    return SubmissionResult("ada", [stage])


def test_scores_show_at_most_two_decimals_and_the_json_keeps_every_digit():
    r = _result()
    data = report.to_gradescope(r)
    assert [t["score"] for t in data["tests"]] == [0.6667, 28.66666] and data["score"] == round(r.score, 4)
    assert data["tests"][0]["output"].startswith("1/3 cases passed; 0.67/2 points.")
    assert data["output"].startswith("01_attention: 29.33/61 (01_attention.py)")
    console = Console(record=True, width=300)
    console.print(report.test_table(r))
    console.print(report.class_table([r]))
    printed = console.export_text()
    assert "ada: 29.33 / 61" in printed and "0.67/2" in printed and "28.67/59" in printed
    page = feedback.render_html(r, {})
    assert "29.33 / 61" in page and "0.67 / 2" in page
    for text in (printed, data["output"], *(t["output"] for t in data["tests"]), page):
        assert not re.search(r"\d\.\d{3}", text.replace("0.6667", "")), text  # no score with 3+ decimals


def test_a_named_mistake_s_hint_is_given_once_per_test_and_each_case_names_it():
    text = report.to_gradescope(_result())["tests"][0]["output"]
    assert text.count(HINT) == 1
    assert text.count("likely mistake [scale-by-d]") == 3  # each failing case names it, the hint follows once
    assert text.endswith(f"likely mistake [scale-by-d]: {HINT}")


def _rendered(md: str) -> str:
    """What a CommonMark renderer makes of ``md``, raw HTML allowed (the worst case)."""
    return MarkdownIt("commonmark", {"html": True}).render(md)


def _shown(rendered: str) -> str:
    """The characters a reader sees, spaces and backticks aside (backticks that pair up are
    code spans: that much a student's text may do)."""
    text = html.unescape(re.sub(r"<[^>]+>", "", rendered)).replace("`", "")
    return "".join(text.split())


def test_texts_that_quote_code_are_markdown_and_show_what_the_text_says():
    plain, data = report.to_gradescope(_result()), report.to_gradescope(_result(), markdown=True)
    test = data["tests"][0]
    assert test["output_format"] == "md" and data["output_format"] == "md"
    assert "output_format" not in data["tests"][1]  # no backtick: plain text, as it was
    out = _rendered(test["output"])
    assert "<code>out</code>: 15 of 15 values differ" in out and "<code>d_k = q.size(-1)</code>" in out
    assert out.count("<br />") == plain["tests"][0]["output"].count("\n")  # line for line
    assert set(re.findall(r"</?([a-zA-Z][\w-]*)", out)) <= {"p", "br", "code"}
    assert _shown(out) == "".join(plain["tests"][0]["output"].replace("`", "").split())
    top = _rendered(data["output"])  # the note quotes the student's cell; stdout is a block
    assert set(re.findall(r"</?([a-zA-Z][\w-]*)", top)) <= {"p", "br", "code", "pre"}, top
    assert "<pre><code># not a heading\n- not a list\n1. not a list\n===\n    not code\n" in top
    assert _shown(top) == "".join(plain["output"].replace("`", "").split())


@pytest.mark.parametrize(
    "text",
    [
        HOSTILE,
        "# heading\n- item\n+ item\n2) item\n10. item\n===\n---\n> quote\n    code\n\tcode",
        "<http://evil> https://evil/a_b_c <!-- c --> <?php ?> &#60;script&#62; &lt;",
        "``a` `b`` ```` ` `",
    ],
)
def test_no_student_text_becomes_markup_and_every_character_shows(text):
    out = _rendered(report.markdown(text))
    assert set(re.findall(r"</?([a-zA-Z!?][\w-]*)", out)) <= {"p", "br", "code"}, out
    assert _shown(out) == "".join(text.replace("`", "").split()), out


@pytest.mark.parametrize(
    ("show_hidden", "umask", "mode"), [(False, 0o022, 0o644), (True, 0o022, 0o644), (False, 0o077, 0o600)]
)
def test_results_files_are_readable_by_others_as_the_umask_allows(tmp_path, show_hidden, umask, mode):
    path = tmp_path / "out" / "results.json"
    old = os.umask(umask)
    try:
        report.write_results(_result(), path, show_hidden)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode  # as open() makes a file, not mkstemp's 0600
    assert json.loads(path.read_text())["tests"][0]["output_format"] == "md"

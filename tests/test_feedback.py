"""The per-student HTML feedback: messages, hints, pictures of wrong tensors, escaping,
and a look at the page in headless Chromium."""

from __future__ import annotations

import base64
import dataclasses
import html
import importlib.util
import re
import struct

import numpy as np
import pytest
import torch
import typer
from typer.testing import CliRunner

from autograder.grader import feedback
from autograder.grader.grade import Grader
from autograder.grader.report import to_gradescope
from autograder.grader.runner import Limits
from autograder.runtime.check import window
from autograder.runtime.results import CaseResult
from autograder.stages import load_spec
from tests.support import ROOT, max_score, write_py

pytestmark = pytest.mark.stage01

CLASS = ROOT / "examples" / "class"
STAGE = "01_attention"
EVIL = "<script>alert(1)</script>"

# A submission whose every text is hostile: it prints markup, raises with markup in the
# message, and sits in a folder named with markup.
HOSTILE = f"""
import torch

print({EVIL!r})
print("<img src=x onerror=alert(2)>")


def softmax(x, dim=-1):
    raise ValueError({EVIL!r})


def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1)  # no scale: a wrong tensor, a picture
    w = torch.exp(s - s.amax(-1, keepdim=True))
    w = w / w.sum(-1, keepdim=True)
    return w @ v, w
"""


@pytest.fixture(scope="module")
def keeper():
    """One grader that keeps arrays, for the module."""
    with Grader(limits=Limits(call_s=5.0), keep_arrays=True) as g:
        yield g


@pytest.fixture(scope="module")
def graded(keeper, tmp_path_factory) -> dict[str, tuple]:
    """student -> (SubmissionResult, the page's HTML), graded once for the module."""
    hostile = write_py(tmp_path_factory.mktemp("class") / "<b>eve", STAGE, HOSTILE)
    out = {}
    for sub in (CLASS / "bob_missing_scale", CLASS / "hana_weights_transposed", hostile):
        r = keeper.grade(sub, [STAGE])
        out[sub.name] = (r, feedback.render_html(r))
    return out


def _unquoted(text: str) -> str:
    """Our text as the page shows it: what it quotes in backticks is code, not backticks."""
    return re.sub(r"`([^`\n]+)`", r"\1", text)


def _visible(page: str) -> str:
    """The page's text as a reader sees it: tags and data URIs dropped, entities decoded."""
    page = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    return html.unescape(re.sub(r"<[^>]+>", "", page))


@pytest.mark.parametrize("student", ["bob_missing_scale", "hana_weights_transposed"])
def test_page_holds_every_message_and_the_named_mistakes_hint(graded, student):
    result, page = graded[student]
    text = _visible(page)
    hints = load_spec(STAGE).misconceptions
    assert f"Feedback for {student}" in text
    for t in result.stages[0].tests:
        assert f"{t.score:g} / {t.max_score:g}" in text
        if t.hidden:  # its score, how many cases passed, its hint: never a case (visibility)
            assert f"{sum(c.passed for c in t.cases)}/{len(t.cases)} hidden cases passed" in text
            assert not any(c.label in text for c in t.cases)
            continue
        assert t.output.partition("\n")[0] in text  # "0/3 cases passed; 0/2 points."
        for c in t.cases:
            assert c.label in text
            assert _unquoted(c.message) in text, (t.name, c.label)  # the message; its hint sits in a callout
    assert "`" not in text  # `out` is code on the page, not a word in backticks
    assert "<code>out</code>" in page or "<code>weights</code>" in page
    (mistake,) = result.misconceptions
    assert mistake in text and _unquoted(hints[mistake]) in text
    # the hint sits in a callout on each test it explains
    callouts = re.findall(r'<div class="callout hint">(.*?)</div>', page, re.S)
    losing = [t for t in result.stages[0].tests if mistake in t.misconceptions]
    assert len(callouts) == len(losing) > 0
    assert all(_unquoted(hints[mistake]) in _visible(c) for c in callouts)


@pytest.mark.parametrize("student", ["bob_missing_scale", "hana_weights_transposed"])
def test_one_picture_per_failing_tensor_case_of_a_public_test(graded, student):
    result, page = graded[student]
    failing = [c for t in result.stages[0].tests for c in t.cases if not c.passed]
    assert failing and all(c.arrays for c in failing)  # attention: every wrong output is a matrix
    public = [c for t in result.stages[0].tests if not t.hidden for c in t.cases if not c.passed]
    assert 0 < len(public) < len(failing)  # hidden cases' expected values are never pictured
    figures = re.findall(r'<figure class="picture">(.*?)</figure>', page, re.S)
    assert len(figures) == len(public)
    for c, figure in zip(public, figures, strict=True):
        rows = figure.split('<div class="heatrow">')[1:]  # one per wrong output
        assert len(rows) == len(c.arrays)
        for a, row in zip(c.arrays, rows, strict=True):
            assert "yours: " + a.output in row and "expected: " + a.output in row
            if a.got.size <= feedback.NUMBERS_UP_TO:  # the values themselves, in coloured cells
                cells = re.findall(
                    r'<td style="background:#[0-9a-f]{6};color:#(?:000|fff)">([^<]*)</td>', row
                )
                values = [*a.got.ravel(), *a.expected.ravel()]
                shown = [f"{v:.2g}" if np.isfinite(v) else "—" for v in values]  # NaN: a dash, grey
                assert cells[: len(shown)] == shown, c.label
            else:  # an image of the values: a real PNG, one block of pixels per value
                src, w, h = re.findall(r'<img class="heat" src="([^"]+)" width="(\d+)" height="(\d+)"', row)[
                    0
                ]
                png = base64.b64decode(src.removeprefix("data:image/png;base64,"))
                assert png[:8] == b"\x89PNG\r\n\x1a\n"
                assert struct.unpack(">II", png[16:24]) == (int(w), int(h))
                block = int(w) // a.got.shape[1]
                assert block >= 1 and (int(w), int(h)) == (a.got.shape[1] * block, a.got.shape[0] * block)
    assert '<div class="callout hint">' in page and "<script" not in page.lower()


def test_a_transposed_matrix_is_pictured_in_its_own_shape(graded):
    result, _ = graded["hana_weights_transposed"]
    kept = [a for t in result.stages[0].tests for c in t.cases for a in c.arrays]
    assert {a.output for a in kept} == {"weights"}
    shapes = {(a.got.shape, a.expected.shape) for a in kept if a.got.shape != a.expected.shape}
    assert ((7, 4), (4, 7)) in shapes  # Lq=4, Lk=7: yours (Lk, Lq), expected (Lq, Lk)


def test_student_text_is_escaped(graded):
    result, page = graded["<b>eve"]
    stage = result.stages[0]
    assert EVIL in stage.stdout  # the attack reached the result ...
    assert any(EVIL in c.message for t in stage.tests for c in t.cases)
    lowered = page.lower()
    assert "<script" not in lowered and "<b>eve" not in lowered  # ... but not the markup
    assert "<img src=x" not in lowered and "onerror" not in re.sub(r"&lt;.*?&gt;", "", lowered)
    escaped = html.escape(EVIL)
    assert page.count(escaped) >= 2  # printed and raised: shown as text
    assert "&lt;b&gt;eve" in page
    assert "Content-Security-Policy" in page  # and no script could run even if one slipped


def test_control_characters_are_replaced():
    from autograder.runtime.results import StageResult, SubmissionResult

    r = SubmissionResult(
        "x\x1b[31mred", [StageResult(STAGE, "f.py", [], ["bell\x07"], stdout="\x1b]0;t\x07")]
    )
    page = feedback.render_html(r, {})
    assert "\x1b" not in page and "\x07" not in page and "�" in page


def test_window_keeps_the_matrix_with_the_largest_error_cropped():
    expected = torch.zeros(3, 2, 100, 90, dtype=torch.float64)
    got = expected.clone()
    got[2, 1, 80, 5] = 7.0
    got[0, 0, 0, 0] = 1.0
    a = window("h", got, expected)
    assert a is not None and a.got.shape == (64, 64) and a.got.dtype == np.float32
    assert a.where == "h[2, 1, :, :], rows 36-99, columns 0-63"
    assert a.got[80 - a.row0, 5 - a.col0] == 7.0 and a.expected.max() == 0.0
    vector = window("y", torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([1.0, 2.0, 3.0]))
    assert vector is not None and vector.got.shape == (1, 3) and vector.where == "y[:]"
    assert window("loss", torch.tensor(1.0), torch.tensor(2.0)) is None  # one number: no picture
    region = torch.tensor([[True, False]])
    masked = window("w", torch.tensor([[1.0, 9.0]]), torch.tensor([[2.0, 0.0]]), region)
    assert masked is not None and masked.graded.tolist() == [[True, False]]


def test_arrays_stay_out_of_the_reports(graded):
    result, _ = graded["bob_missing_scale"]
    assert "arrays" not in {f.name for f in dataclasses.fields(CaseResult)}
    case = next(c for t in result.stages[0].tests for c in t.cases if c.arrays)
    assert "arrays" not in dataclasses.asdict(case)
    assert "arrays" not in str(to_gradescope(result))


def test_grader_keeps_no_arrays_unless_asked(keeper):
    keeper.keep_arrays = False  # as Grader() has it: the same plans, warm
    try:
        r = keeper.grade(CLASS / "hana_weights_transposed", [STAGE])
    finally:
        keeper.keep_arrays = True
    assert r.score < r.max_score
    assert all(c.arrays == () for t in r.stages[0].tests for c in t.cases)
    assert Grader().keep_arrays is False


def test_feedback_command_writes_one_page_per_student(tmp_path):
    app = typer.Typer()
    app.command("feedback")(feedback.command)
    app.command("unused")(lambda: None)  # two commands: typer keeps the subcommand name
    res = CliRunner().invoke(
        app,
        ["feedback", str(CLASS / "hana_weights_transposed"), "--out", str(tmp_path), "--stage", STAGE],
    )
    assert res.exit_code == 0, res.output
    page = tmp_path / "hana_weights_transposed" / "feedback.html"
    text = page.read_text(encoding="utf-8")
    assert "weights-transposed" in text and text.count('<figure class="picture">') >= 1
    assert f"8 / {max_score():g}" in text  # the example class's promised score for hana
    bad = CliRunner().invoke(app, ["feedback", str(tmp_path / "nobody"), "--out", str(tmp_path)])
    assert bad.exit_code == 2


def _screenshot_module():
    spec = importlib.util.spec_from_file_location(
        "screenshot_feedback", ROOT / "scripts" / "screenshot_feedback.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_page_in_headless_chromium_is_not_blank(graded, tmp_path):
    shot = _screenshot_module()
    if shot.chromium() is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    result, _ = graded["bob_missing_scale"]
    page = feedback.write_html(result, tmp_path / "bob" / "feedback.html")
    png = shot.screenshot(page, tmp_path / "bob.png", size=(1200, 2400))
    import matplotlib.image

    pixels = matplotlib.image.imread(png)[..., :3]
    assert pixels.shape == (2400, 1200, 3)
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200  # text, badges and heatmaps, not one flat colour
    assert pixels.std() > 0.05
    # the header's red/amber/green badges and a heatmap's viridis colours are on screen
    assert (np.abs(pixels - np.array([0x9A, 0x67, 0x00]) / 255).sum(-1) < 0.05).any()  # "8 / 17"


def test_code_spans_in_hostile_student_text_never_become_markup():
    """Our texts quote code in backticks, shown as <code>; a student's text may hold
    backticks too, around markup meant to escape the span: it stays text."""
    from autograder.runtime.results import StageResult, SubmissionResult, TestResult

    hostile = "`</code><script>alert(1)</script>` and `<img src=x onerror=alert(2)>` ``&lt;b&gt;`` <b>`"
    case = CaseResult("`<i>label`", False, f"`softmax` raised ValueError: {hostile}", ["m"], {"m": hostile})
    test = TestResult(STAGE, "softmax", "g", "1.1", 1.0, 0.0, False, [case], ["m"], headline=hostile)
    stage = StageResult(STAGE, "f.py", [test], [f"code cell 2 (`{hostile}`) raised"], stdout=hostile)
    page = feedback.render_html(SubmissionResult("`<b>eve`", [stage], notes=[hostile]))
    ours = {"html", "head", "meta", "title", "style", "body", "main", "header", "h1", "h2", "h3", "div"}
    ours |= {"span", "table", "tr", "th", "td", "p", "a", "section", "article", "pre", "code", "ol", "li"}
    ours |= {"ul", "strong", "details", "summary"}
    assert set(re.findall(r"<([a-zA-Z][\w-]*)", page)) <= ours  # no <script>, <img>, <b> or <i>
    assert "&lt;/code&gt;&lt;script&gt;" in page and "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "<code>softmax</code> raised ValueError" in page  # our own `softmax` is code
    assert all("<" not in inner for inner in re.findall(r"<code>(.*?)</code>", page, re.S))
    assert "&amp;lt;b&amp;gt;" in page  # an entity the student typed is shown as typed

"""Whatever a student hands in, the real command line writes a complete Gradescope results
file with a message the student can act on, and exits 0; only usage errors exit 2.

All the bad submissions are graded by one CLI run (``--results-dir``), once per session."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.support import (
    assert_gradescope_results,
    full_marks,
    max_score,
    once_per_session,
    run_cli_many,
    write_notebook,
    write_py,
)

pytestmark = pytest.mark.stage01
STAGE = "01_attention"

IMPORTS = "import math\nimport torch\n"
# Each function stands alone (attention has its own softmax), so breaking one breaks only it.
FUNCS = {
    "softmax": """
def softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)
""",
    "attention": """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    w = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    w = w / w.sum(dim=-1, keepdim=True)
    return w @ v, w
""",
    "padding_mask": """
def padding_mask(lengths, max_len):
    return (torch.arange(max_len, device=lengths.device) < lengths[:, None])[:, None, None, :]
""",
    "causal_mask": """
def causal_mask(L):
    return torch.ones(L, L, dtype=torch.bool).tril()
""",
}
FULL = full_marks("01_attention")  # every graded name with all of its points


def cells(**replace: str) -> list[str]:
    """The correct submission as notebook cells, some functions replaced."""
    return [IMPORTS] + [replace.get(name, src).strip() + "\n" for name, src in FUNCS.items()]


def py(**replace: str) -> str:
    return "\n\n".join(cells(**replace))


def _png() -> bytes:
    raw = b"\x00\xff\x00\x00"  # one red pixel
    chunk = lambda kind, data: (  # noqa: E731
        len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    )
    ihdr = (1).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


def build(root: Path) -> list[Path]:
    """The bad submissions, one directory (or file) each; returns what the CLI is given."""
    subs: list[Path] = []

    def d(name: str) -> Path:
        subs.append(root / name)
        return root / name

    d("empty_dir").mkdir(parents=True)
    txt = root / "txt" / f"{STAGE}.txt"  # given as a file: the student is "01_attention"
    txt.parent.mkdir()
    txt.write_text(py())
    subs.append(txt)
    d("png_as_notebook").mkdir()
    (root / "png_as_notebook" / f"{STAGE}.ipynb").write_bytes(_png())
    good = write_notebook(root / "scratch", cells()).read_text()
    d("corrupt_json").mkdir()
    (root / "corrupt_json" / f"{STAGE}.ipynb").write_text(good[: len(good) // 2])
    write_notebook(d("no_code_cells"), [("markdown", "# My attention\nI did it on paper.")])
    write_py(
        d("wrong_signature"),
        STAGE,
        py(
            attention=FUNCS["attention"]
            .replace("(q, k, v, mask=None)", "(q, k, v)")
            .replace("    if mask is not None:\n        scores = scores.masked_fill(~mask, -1e9)\n", "")
        ),
    )
    write_py(
        d("numpy_softmax"),
        STAGE,
        "import numpy as np\n"
        + py(
            softmax="def softmax(x, dim=-1):\n    x = x.numpy()\n"
            "    e = np.exp(x - x.max(axis=dim, keepdims=True))\n"
            "    return e / e.sum(axis=dim, keepdims=True)\n"
        ),
    )
    write_py(
        d("attention_returns_three"),
        STAGE,
        py(attention=FUNCS["attention"].replace("return w @ v, w", "return w @ v, w, scores")),
    )
    write_py(d("softmax_is_a_number"), STAGE, py(softmax="softmax = 3"))
    write_py(d("causal_mask_missing"), STAGE, py(causal_mask=""))
    write_notebook(d("nbformat_v3"), [("markdown", "# v3 notebook")] + cells(), version=3)
    marker = root / "bash_ran"
    write_notebook(
        d("magics_and_shell"),
        [
            "!pip install x\n%load_ext autoreload\n" + IMPORTS,
            f"%%bash\ntouch {marker}\npip install x\n",
            f"%%writefile {root / 'writefile_ran'}\nprint('hi')\n",
            *cells()[1:],
            "%time y = softmax(torch.randn(3))",
            "assert y.shape == (3,)  # %time ran its statement",
        ],
    )
    write_py(
        d("sys_exit_in_causal_mask"),
        STAGE,
        "import sys\n" + py(causal_mask="def causal_mask(L):\n    sys.exit('bye')\n"),
    )
    write_py(
        d("os_exit_in_padding_mask"),
        STAGE,
        "import os\n" + py(padding_mask="def padding_mask(lengths, max_len):\n    os._exit(1)\n"),
    )
    return subs


def _run_all(root: Path) -> dict:
    """The batch of bad submissions and the usage errors, as concurrent CLI runs."""
    subs = build(root)
    out = root / "results"
    (root / "alone").mkdir()
    runs = run_cli_many(
        {
            "batch": [
                "grade", *map(str, subs), "--stage", STAGE,
                "--results-dir", str(out), "--call-timeout", "2",
            ],
            "missing_path": ["grade", str(root / "no_such_student"), "--stage", STAGE],
            "unknown_stage": ["grade", str(root / "alone"), "--stage", "01_attenshun"],
            "results_file": [
                "grade", str(root / "alone"), "--stage", STAGE,
                "--results", str(root / "alone.json"),
            ],
            "results_file_twice": [
                "grade", str(root / "alone"), str(root / "empty_dir"),
                "--results", str(root / "twice.json"),
            ],
        }
    )  # fmt: skip
    read = lambda p: json.loads(p.read_text()) if p.exists() else None  # noqa: E731
    return {
        **runs,
        "root": str(root),
        "results": {p.parent.name: read(p) for p in out.glob("*/results.json")},
        "alone": read(root / "alone.json"),
        "twice": read(root / "twice.json"),
        "side_effects": [p.name for p in (root / "bash_ran", root / "writefile_ran") if p.exists()],
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return once_per_session(tmp_path_factory, "bad_input", lambda: _run_all(tmp_path_factory.mktemp("bad")))


def by_function(result: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in result["tests"]:
        fn = next(x.split(":", 1)[1] for x in t["tags"] if x.startswith("function:"))
        out[fn] = out.get(fn, 0) + t["score"]
    return out


def outputs(result: dict, function: str | None = None) -> str:
    return "\n".join(
        t["output"] for t in result["tests"] if function is None or f"function:{function}" in t["tags"]
    )


ZERO = dict.fromkeys(FULL, 0)
CASES = {
    # student: (points per graded name, text in the tests' or the file's output)
    "empty_dir": (ZERO, "no 01_attention.ipynb or 01_attention.py in the submission"),
    "01_attention": (ZERO, "01_attention.txt is neither a notebook (.ipynb) nor a Python file (.py)"),
    "png_as_notebook": (ZERO, "01_attention.ipynb is not a Jupyter notebook"),
    "corrupt_json": (ZERO, "01_attention.ipynb is not a valid notebook: invalid JSON at line"),
    "no_code_cells": (ZERO, "01_attention.ipynb has no code cells to run"),
    "wrong_signature": (
        {**FULL, "scaled_dot_product_attention": 4},
        "calling scaled_dot_product_attention(q, k, v, mask=None) -> (out, weights) raised TypeError",
    ),
    "numpy_softmax": ({**FULL, "softmax": 0}, "returned a numpy.ndarray; expected a torch.Tensor"),
    "attention_returns_three": (
        {**FULL, "scaled_dot_product_attention": 0},
        "returned a tuple of 3 values; expected 2 values (out, weights)",
    ),
    "softmax_is_a_number": ({**FULL, "softmax": 0}, "`softmax` is an int, not a function or class"),
    "causal_mask_missing": ({**FULL, "causal_mask": 0}, "`causal_mask` is not defined"),
    "nbformat_v3": (FULL, None),
    "magics_and_shell": (FULL, "code cell 2 starts with %%bash: not Python, skipped when grading"),
    "sys_exit_in_causal_mask": (
        {**FULL, "causal_mask": 0},
        "called sys.exit() at 01_attention.py, line 25: sys.exit('bye'): a graded function must return its result",
    ),
    "os_exit_in_padding_mask": (
        {**FULL, "padding_mask": 0},
        "stopped: the process exited with status 1",
    ),
}


def test_the_cli_completes_and_writes_every_results_file(run):
    batch = run["batch"]
    assert batch["rc"] == 0, batch["stderr"]
    assert set(run["results"]) == set(CASES)
    assert "internal error" not in batch["stdout"] + batch["stderr"]
    assert all(student in batch["stdout"] for student in CASES)  # the class table


@pytest.mark.parametrize("student", sorted(CASES))
def test_results_file_is_valid_with_a_clear_message(run, student):
    points, message = CASES[student]
    result = run["results"][student]
    assert_gradescope_results(result)
    assert by_function(result) == points
    assert result["score"] == sum(points.values())
    if message is not None:
        assert message in outputs(result) + "\n" + result["output"]


def test_load_failures_say_why_in_every_test(run):
    for student in ("empty_dir", "png_as_notebook", "corrupt_json"):
        message = CASES[student][1]
        result = run["results"][student]
        assert all(message in t["output"] for t in result["tests"]), student
        assert not any("not run" in t["output"] for t in result["tests"]), student  # no case ran: no list
    # a text file is no stage's file: said once, at the top; each test is "not submitted"
    result = run["results"]["01_attention"]
    assert result["output"].startswith(f"no stage file was handed in: {CASES['01_attention'][1]}")
    assert all("not submitted: no 01_attention.ipynb" in t["output"] for t in result["tests"])


def test_missing_stage_file_is_reported_at_the_top(run):
    assert f"01_attention: 0/{max_score():g} (no file)" in run["results"]["empty_dir"]["output"]


def test_wrong_signature_shows_the_expected_parameters(run):
    text = outputs(run["results"]["wrong_signature"], "scaled_dot_product_attention")
    assert "unexpected keyword argument 'mask'" in text
    assert "Check that your definition takes exactly these parameters" in text


def test_shell_lines_and_cell_magics_never_run(run):
    assert run["side_effects"] == []
    text = run["results"]["magics_and_shell"]["output"]
    assert "neutralised '!pip install x'" in text
    assert "%%writefile: not Python, skipped" in text
    assert "%time" not in text  # Python with a stopwatch: the statement ran, y exists
    assert "raised" not in text  # no cell failed


def test_nonexistent_path_is_a_usage_error(run):
    proc = run["missing_path"]
    assert proc["rc"] == 2
    missing = str(Path(run["root"]) / "no_such_student")
    assert f"{missing} does not exist" in "".join(proc["stderr"].split("\n"))


def test_unknown_stage_is_a_usage_error_listing_the_known_ones(run):
    proc = run["unknown_stage"]
    assert proc["rc"] == 2
    err = " ".join(proc["stderr"].split())
    assert "unknown stage '01_attenshun'" in err and "known stages:" in err and STAGE in err


def test_results_option_writes_one_file_for_one_submission(run):
    assert run["results_file"]["rc"] == 0, run["results_file"]["stderr"]
    assert_gradescope_results(run["alone"])
    assert run["alone"]["score"] == 0
    assert run["results_file_twice"]["rc"] == 2
    assert "--results takes one submission" in run["results_file_twice"]["stderr"]
    assert run["twice"] is None


def test_the_v3_notebook_really_is_nbformat_3(run):
    raw = json.loads((Path(run["root"]) / "nbformat_v3" / f"{STAGE}.ipynb").read_text())
    assert raw["nbformat"] == 3 and "worksheets" in raw


def test_console_script_is_the_same_cli():
    script = Path(sys.executable).parent / "bertlab"
    proc = subprocess.run([str(script), "stages"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "01_attention" in proc.stdout and "scaled_dot_product_attention(q, k, v, mask=None)" in proc.stdout

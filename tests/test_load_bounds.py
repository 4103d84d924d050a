"""Reading a submission in the grader itself: bounded, and faithful to what the student wrote.

A notebook is read and parsed in the trusted process, before any time limit applies. Each
hostile input below (quadratic cases of regular expressions, of IPython's input
transformation, of JSON structure; files far too large) must load, or be refused with a
message naming the limit, in a child process watched by a generous hang guard: the guard
catches a quadratic regression instead of hanging the run, and sets no speed target
(measured figures belong in benchmarks/). The reader's result is compared with
``json.loads`` on the fuzz corpus, and the conversion of magics with IPython's own
``transform_cell``; a Jupyter-saved nbformat 3 notebook and a 60 MB notebook of outputs,
both with correct code, are graded end to end to the full score.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import random
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.runtime import load
from autograder.runtime.load import LoadError, defines, load_source
from autograder.stages import load_spec
from tests.support import ROOT

pytestmark = pytest.mark.stage01
STAGE = "01_attention"
SOLUTION = ROOT / "solutions" / STAGE / f"{STAGE}.ipynb"
CODE = load.MAX_CODE_CHARS
HANG_S = 120.0  # per input; every one measured well under 2 s on a loaded 2-core machine


def _graded_code() -> list[str]:
    """The solution's code cells that the grader runs."""
    nb = json.loads(SOLUTION.read_text())
    return [
        "".join(c["source"])
        for c in nb["cells"]
        if c["cell_type"] == "code" and "skip-grading" not in c["metadata"].get("tags", [])
    ]


def _nb(cells: list) -> dict:
    """A v4 notebook; a ``str`` is a code cell's source, a dict a cell as it is."""
    made = [
        c
        if isinstance(c, dict)
        else {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": c}
        for c in cells
    ]
    return {"cells": made, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _v3_heading_bomb() -> dict:
    """The 438-byte notebook of issue 16: the upgrade to nbformat 4 wrote "#" * level."""
    heading = {"cell_type": "heading", "level": 1_500_000_000, "source": "T", "metadata": {}}
    code = {"cell_type": "code", "input": ["x = 1"], "language": "python", "outputs": [], "metadata": {}}
    return {
        "nbformat": 3,
        "nbformat_minor": 0,
        "metadata": {"name": ""},
        "worksheets": [{"cells": [heading] * 4 + [code]}],
    }


# name -> (file contents, what loading it must give: ("cells", n), ("refused", text) or ("defines", bool))
HOSTILE: dict[str, tuple] = {
    # issue 16: `^\s*[%!]` and `^\s*(def|class)` with MULTILINE scan every blank line from every line start
    "blank_lines": (lambda: _nb(["\n" * 800_000 + "def softmax(x):\n    return x\n"]), ("cells", 1)),
    "blank_lines_of_spaces": (lambda: _nb([" \n" * (CODE // 2 - 100)]), ("cells", 1)),
    "defines_after_blank_lines": (lambda: "\n" * 800_000 + "def softmax(x):\n", ("defines", True)),
    "defines_in_blank_lines": (lambda: "\n" * 800_000 + "x = 1\n", ("defines", False)),
    # IPython tokenizes the whole cell once per magic it converts (84 s for 5,000 `x = %who`)
    "magic_lines": (lambda: _nb(["%time x = 1\n" * (load.MAX_IPYTHON_LINES - 1)]), ("cells", 1)),
    "magic_assignments": (lambda: _nb(["x = %who\n" * (load.MAX_IPYTHON_LINES - 1)]), ("cells", 1)),
    "too_many_magic_lines": (
        lambda: _nb(["%time x = 1\n" * (load.MAX_IPYTHON_LINES + 1)]),
        ("refused", "lines of IPython syntax"),
    ),
    # Python's tokenizer rescans a line from each unclosed quote (5 s for 16 KB)
    "unclosed_quotes": (lambda: _nb(["'" + "\\'" * (CODE // 2 - 10)]), ("cells", 1)),
    "magic_then_unclosed_quotes": (lambda: _nb(["%'" + "\\'" * (CODE // 2 - 10)]), ("cells", 1)),
    # IPython's `name?` pattern backtracks over the whole line from each position
    "help_after_a_long_line": (lambda: _nb(["a." * (CODE // 2 - 10) + "a x?"]), ("cells", 1)),
    "many_help_lines": (lambda: _nb([("a." * 30 + "a x?\n") * 9_000]), ("cells", 1)),
    "deep_brackets": (lambda: _nb(["x = " + "(" * (CODE // 2 - 10) + ")" * (CODE // 2 - 10)]), ("cells", 1)),
    # IPython's doctest-prompt stripper slices the line before each triple quote
    "prompt_and_triple_quotes": (lambda: _nb([">>> x = 1\n" + '"""' * (CODE // 3 - 10)]), ("cells", 1)),
    "prompt_lines_of_triple_quotes": (
        lambda: _nb([(">>> " + '"""x' * 400 + "\n") * (CODE // 1700)]),
        ("cells", 1),
    ),
    "many_cells": (lambda: _nb([f"x_{i} = {i}" for i in range(load.MAX_CELLS)]), ("cells", load.MAX_CELLS)),
    "too_many_cells": (
        lambda: _nb(["x = 1"] * (load.MAX_CELLS + 1)),
        ("refused", "cells (the grader's limit)"),
    ),
    "too_much_code": (lambda: _nb(["x = 1\n" * (CODE // 6 + 1)]), ("refused", "1 MB of code to run")),
    # JSON structure the reader must look at value by value
    "fields_of_a_cell": (
        lambda: '{"cells": [{"cell_type": "code", ' + '"k": 1, ' * load.MAX_JSON_STEPS + '"source": "x"}]}',
        ("refused", "more JSON structure than a notebook Jupyter saves"),
    ),
    "tags": (
        lambda: _nb(
            [{"cell_type": "code", "metadata": {"tags": ["t"] * load.MAX_JSON_STEPS}, "source": "x"}]
        ),
        ("refused", "more JSON structure than a notebook Jupyter saves"),
    ),
    "deep_json": (
        lambda: '{"cells": [], "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}",
        ("refused", "nested too deeply"),
    ),
    "tiny_values_in_outputs": (
        lambda: (
            '{"cells": [{"cell_type": "code", "source": "x = 1", "outputs": ['
            + ",".join(['[],{},"",1,[[[["x"]]]]'] * 400_000)
            + "]}]}"
        ),
        ("cells", 1),
    ),
    "markdown_image": (
        lambda: _nb(
            [
                {
                    "cell_type": "markdown",
                    "metadata": {},
                    "source": "![](data:image/png;base64," + "A" * (40 << 20) + ")",
                }
            ]
            + _graded_code()
        ),
        ("cells", len(_graded_code())),
    ),
    "v3_heading_level": (_v3_heading_bomb, ("cells", 1)),
}

_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from autograder.runtime.load import LoadError, defines, load_source
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a regression fails, not the machine
for name, path in json.loads(sys.argv[1]).items():
    print(json.dumps({"start": name}), flush=True)
    t = time.monotonic()
    try:
        if path.endswith(".txt"):
            got = {"defines": defines(Path(path).read_text(), "softmax")}
        else:
            got = {"cells": len(load_source(Path(path), "01_attention").cells)}
    except LoadError as exc:
        got = {"refused": str(exc)}
    except MemoryError:
        got = {"memory_error": True}
    print(json.dumps({"done": name, "seconds": round(time.monotonic() - t, 2), **got}), flush=True)
"""


def _load_in_a_child(files: dict[str, Path], hang_s: float) -> dict[str, dict]:
    """Load each file in one fresh interpreter; stop it when one input runs past ``hang_s``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps({k: str(v) for k, v in files.items()})],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    results: dict[str, dict] = {}
    running, since = None, time.monotonic()
    try:
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, since + hang_s - time.monotonic()))
            if not ready:
                pytest.fail(f"loading {running!r} ran past {hang_s:g} s: not linear any more")
            line = proc.stdout.readline()
            if not line:
                break
            event = json.loads(line)
            if "start" in event:
                running, since = event["start"], time.monotonic()
            else:
                results[event.pop("done")] = event
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert set(results) == set(files), err[-3000:]
    return results


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("hostile")
    files = {}
    for name, (make, _) in HOSTILE.items():
        data = make()
        text = data if isinstance(data, str) else json.dumps(data)
        path = root / name / (f"{STAGE}.txt" if name.startswith("defines") else f"{STAGE}.ipynb")
        path.parent.mkdir()
        path.write_text(text)
        files[name] = path
    return _load_in_a_child(files, HANG_S)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_input_loads_or_is_refused_within_the_guard(hostile, name):
    kind, want = HOSTILE[name][1]
    got = hostile[name]
    if kind == "refused":
        assert want in got.get("refused", ""), got
    else:
        assert got.get(kind) == want, got


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / f"{STAGE}.ipynb"
    with path.open("wb") as f:  # sparse: no disk, and nothing to read if it were read
        f.truncate(load.MAX_FILE_BYTES + 1)
    with pytest.raises(LoadError, match=f"{STAGE}.ipynb is larger than 128 MB: clear its outputs"):
        load_source(path, STAGE)
    py = tmp_path / f"{STAGE}.py"
    py.write_text("x = 1\n" * (CODE // 6 + 1))
    with pytest.raises(LoadError, match="has more than 1 MB of code to run"):
        load_source(py, STAGE)


def test_defines_finds_definitions_on_their_own_line():
    src = "import torch\n\n  def softmax(x):\n    pass\nclass causal_mask:\n    pass\n"
    assert defines(src, "softmax") and defines(src, "causal_mask")
    assert not defines("def softmax2(x): pass\n", "softmax")
    assert not defines("x = 'def softmax'\n", "softmax")
    assert not defines("def\nsoftmax(x): pass\n", "softmax")  # a statement does not start on the next line


# -- faithful: the same code as json.loads and IPython would give --------------------------------


def _json_oracle(data: bytes) -> list[tuple[str, bool]] | str:
    """(source, skip) of each code cell as read with json.loads; why not, if it cannot be."""
    try:
        raw = json.loads(data.decode("utf-8").removeprefix("\ufeff"))
    except (ValueError, RecursionError) as exc:
        return str(exc)

    def text(s: object) -> str:
        return (
            s
            if isinstance(s, str)
            else "".join(x for x in s if isinstance(x, str))
            if isinstance(s, list)
            else ""
        )

    def skip(c: dict) -> bool:
        m = c.get("metadata")
        tags = m.get("tags", []) if isinstance(m, dict) else []
        return isinstance(tags, list) and "skip-grading" in tags

    if not isinstance(raw, dict):
        return "no cells"
    if raw.get("nbformat") == 3:
        sheets = raw.get("worksheets")
        if not isinstance(sheets, list):
            return "no worksheets"
        cells = [
            c for w in sheets if isinstance(w, dict) and isinstance(w.get("cells"), list) for c in w["cells"]
        ]
        key = "input"
    else:
        cells = raw.get("cells")
        if not isinstance(cells, list):
            return "no cells"
        key = "source"
    return [
        (text(c.get(key, "")), skip(c)) for c in cells if isinstance(c, dict) and c.get("cell_type") == "code"
    ]


def test_the_reader_gives_what_json_loads_gives_whatever_the_chunks():
    """Every fuzz notebook that json.loads reads, read a chunk at a time (chunks of 1 and 7
    bytes cut every token somewhere), gives the same code cells; what json.loads refuses is
    refused too, unless the damage is one that only a value the grader reads past holds (a
    number of more digits than Python converts, a raw control character in a string, nesting
    deeper than json's stack allows)."""
    from tests.test_fuzz import generate

    # json's depth limit is what is left of the interpreter's stack; the reader's is MAX_JSON_DEPTH
    read_past = ("Exceeds the limit", "Invalid control character", "maximum recursion depth")
    for name, category, data, _ in generate():
        if category == "odd_file":
            continue
        want = _json_oracle(data)
        for chunk in [1, 7, 4093, 1 << 20] if len(data) < 20_000 else [4093, 1 << 20]:
            try:
                got = load._notebook(io.BytesIO(data), "n.ipynb", chunk)
            except LoadError:
                assert isinstance(want, str), (name, chunk)
                continue
            if isinstance(want, str):
                assert want.startswith(read_past), (name, chunk, want)
            else:
                assert got == want, (name, chunk)


def test_damaged_json_is_reported_where_it_is():
    good = json.dumps(_nb(_graded_code()), indent=1)
    cut = good[: len(good) // 2]
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(cut)
    with pytest.raises(LoadError, match=r"invalid JSON at line \d+ column \d+ .*Was it saved completely\?"):
        load._notebook(io.BytesIO(cut.encode()), "n.ipynb", 64)
    bad = good.replace('"metadata": {}', '"metadata": {,}', 1)
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(bad)
    with pytest.raises(LoadError) as got:
        load._notebook(io.BytesIO(bad.encode()), "n.ipynb", 64)
    assert f"at line {want.value.lineno} column {want.value.colno} " in str(got.value)


def _cells_with_ipython_syntax() -> list[str]:
    from tests import test_fuzz

    rng = random.Random(5)
    cells = [*test_fuzz._MAGIC_CELLS, *_graded_code(), *test_fuzz._RAISING]
    cells += [test_fuzz._magic_cell(rng) for _ in range(400)]
    cells += ["\n".join(test_fuzz._garbage_line(rng) for _ in range(rng.randint(1, 6))) for _ in range(400)]
    return cells + [
        "if x:\n    %time f(x)\n    y = 1", "def f():\n    !ls\n    return 1", "x = (1,\n%time 2)\n%time 3",
        's = """\n%d items\n!not a shell\n"""\n%time x', "s = '%d' % 3\n%who", "a = b = %who",
        "x = %who_ls\ny = !ls -la", ">>> x = 1\n>>> %time y = 2\n... z", "In [1]: x = 1\n   ...: y = 2",
        "x = 1 \\\n + 2\n%time x", "%time x = \\\n  1", "torch.nn.functional.softmax?", "obj.attr??",
        "x? # comment", "f(x)?", "%time?", "%%bash?\n%time z", "!echo # what?", "!echo what?",
        "!echo 'it''s (", "%time f(\nx)", "  %time x\n  y = 1", "\n\n   x = 1\n   %time y", "x == %who",
        "x += %who", "x = %5", "x = % who", "x=!ls", "x = !=3", "!= 3\n%time x", "%= 3", "/f a b", ",f a b",
        ";f a b", "x = 1;%time y", "print('?')\n%time x", "'''unterminated\n%time x", "'unterminated\n%time x",
        "x = (\n%time x", "x = )\n%time y", "x = 1\r\n%time y\r\n", "%time x\x0cy = 1", "ｘ = 1\n%time ｘ",
        "#!shebang\n%time x", "x = {'a': 1,\n 'b': %time}\n", "    if True:\n        %time x",
        "x = f'{1}'\n%time y", "x = b'\\''\n%time y", "x = r'\\'\n%time y", "[nav] In [3]: x = 1",
        "x = 1\n\n%time y", "import math\n\nx = !ls", "x = 1\n\n>>> y = 2", "x = 1\n\n...: %time y",
        "x = 1\n\nIn [2]: %time y", "x = 1\n\n    %time y\n",
    ]  # fmt: skip


def test_magics_are_converted_exactly_as_ipython_converts_them():
    """Where IPython's own transform_cell gives Python, the linear conversion gives the
    same text (on cells small enough for IPython's quadratic passes)."""
    from IPython.core.inputtransformer2 import TransformerManager

    manager = TransformerManager()
    compared = 0
    for cell in _cells_with_ipython_syntax():
        try:
            want = manager.transform_cell(cell)
            ast.parse(want)
        except Exception:  # IPython gave up, or gave code that is no Python: nothing to match
            continue
        assert load._to_python(cell, load._Budget("n.ipynb")) == want, cell
        compared += 1
    assert compared > 500


# -- end to end: correct code scores in full, whatever else the file holds --------------------------


def _v3_notebook() -> dict:
    """A notebook as IPython 2 saved it: nbformat 3, headings, code as ``input`` lines, outputs."""
    cells: list[dict] = [
        {"cell_type": "heading", "level": 1, "metadata": {}, "source": ["Stage 01: attention"]},
        {"cell_type": "markdown", "metadata": {}, "source": ["Saved by IPython 2.\n", "Every task below."]},
    ]
    for n, src in enumerate(_graded_code(), start=1):
        cells.append({"cell_type": "heading", "level": 2, "metadata": {}, "source": [f"Task {n}"]})
        cells.append(
            {
                "cell_type": "code",
                "collapsed": False,
                "input": src.splitlines(keepends=True),
                "language": "python",
                "metadata": {},
                "outputs": [
                    {
                        "output_type": "pyout",
                        "prompt_number": n,
                        "metadata": {},
                        "text": ["tensor([0.0900, 0.6652])"],
                    },
                    {"output_type": "stream", "stream": "stdout", "text": ["checked\n"]},
                    {"output_type": "display_data", "metadata": {}, "png": "iVBORw0KGgo=\n"},
                ],
                "prompt_number": n,
            }
        )
    cells.append(
        {
            "cell_type": "code",
            "collapsed": False,
            "input": ["softmax(torch.tensor([1.0, 2.0]))"],
            "language": "python",
            "metadata": {},
            "outputs": [{"output_type": "pyerr", "ename": "NameError", "evalue": "x", "traceback": ["..."]}],
            "prompt_number": 99,
        }
    )
    return {
        "metadata": {"name": STAGE},
        "nbformat": 3,
        "nbformat_minor": 0,
        "worksheets": [{"cells": cells, "metadata": {}}],
    }


def test_a_jupyter_saved_nbformat3_notebook_grades_in_full(grader, tmp_path):
    import nbformat

    nb = _v3_notebook()
    nbformat.validate(nb, version=3)  # a valid nbformat 3 notebook, as the contract means it
    (tmp_path / f"{STAGE}.ipynb").write_text(json.dumps(nb, indent=1))
    source = load_source(tmp_path / f"{STAGE}.ipynb", STAGE)
    assert [src for _, src in source.cells[:-1]] == [
        s if s.endswith("\n") else s + "\n" for s in _graded_code()
    ]
    result = grader.grade(tmp_path, [STAGE])
    assert result.score == load_spec(STAGE).max_score, result.stages[0]


def _with_outputs(total: int) -> dict:
    """The solution notebook, executed as it might be: an embedded image, a long printed
    tensor and an HTML table among its outputs, about ``total`` bytes in all."""
    nb = json.loads(SOLUTION.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    rng = random.Random(0)
    png = base64.b64encode(rng.randbytes(total // 2 * 3 // 4)).decode() + "\n"
    row = "tensor([[ 0.1234, -0.5678,  0.9012, -0.3456,  0.7890, -0.1234,  0.5678, -0.9012],\n"
    html = [f'<tr><td class="n">{i}</td><td>"a" &amp; b</td></tr>\n' for i in range(total // 5 // 48)]
    for n, cell in enumerate(code):
        cell["execution_count"] = n + 1
        cell["outputs"] = []
    code[1]["outputs"] = [{"output_type": "display_data", "metadata": {}, "data": {"image/png": png}}]
    code[2]["outputs"] = [
        {"output_type": "stream", "name": "stdout", "text": [row] * (total * 3 // 10 // len(row))}
    ]
    code[3]["outputs"] = [
        {"output_type": "execute_result", "execution_count": 4, "metadata": {}, "data": {"text/html": html}}
    ]
    return nb


def test_a_60_mb_notebook_of_outputs_grades_in_full_and_is_never_held(grader, tmp_path):
    path = tmp_path / f"{STAGE}.ipynb"
    path.write_text(json.dumps(_with_outputs(60 << 20), indent=1))
    assert path.stat().st_size > 55 << 20
    result = grader.grade(tmp_path, [STAGE])
    assert result.score == load_spec(STAGE).max_score, result.stages[0]
    # what reading it costs: the bytes of a chunk, not of the outputs
    probe = (
        "import sys; from pathlib import Path; from autograder.runtime.load import load_source\n"
        "hwm = lambda: int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])\n"
        "import IPython.core.inputtransformer2; before = hwm()\n"
        f"load_source(Path({str(path)!r}), {STAGE!r}); print(hwm() - before)"
    )
    grown_kb = int(subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                                  timeout=HANG_S, check=True).stdout)  # fmt: skip
    assert grown_kb < 16 << 10, f"reading a 60 MB notebook held {grown_kb >> 10} MB"


@pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="POSIX")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / f"{STAGE}.ipynb"
    os.mkfifo(path)
    with pytest.raises(LoadError, match="is not a regular file"):
        load_source(path, STAGE)

"""Fuzz: a few hundred malformed or odd ``01_attention.ipynb`` files never crash the grader,
and every one of them gets a complete, valid Gradescope results file.

A seeded generator (``random.Random(SEED)``, so every run grades the same files) mixes:
truncated and mutated copies of the real notebooks, random bytes, JSON of the wrong
shape, odd nbformat versions, huge metadata, deep nesting, unicode edge cases, BOM and
CRLF, random Python-ish garbage, random magics, cells that raise or kill their process,
empty notebooks and notebooks of 2000 cells. All of them are graded in-process by one
Grader (each submission in its own directory, each results file written by the real
``write_results``); a sample goes through the real command line as well, concurrently.
The grader must stay usable afterwards: the solution notebook, graded last, scores 17.

Select with ``pytest -m fuzz``. ``FUZZ_SEED=N`` grades another set of files.
"""

from __future__ import annotations

import json
import logging
import os
import random
import string
import subprocess
import time
import traceback
import unicodedata
from pathlib import Path

import pytest

from tests.support import (
    ROOT,
    assert_gradescope_results,
    cli_command,
    max_score,
    n_tests,
    once_per_session,
)

pytestmark = [pytest.mark.fuzz, pytest.mark.stage01]

STAGE = "01_attention"
SEED = int(os.environ.get("FUZZ_SEED", "20250101"))
N_TESTS, MAX_SCORE = n_tests(STAGE), max_score(STAGE)
TEMPLATE = ROOT / "assignments" / STAGE / f"{STAGE}.ipynb"
SOLUTION = ROOT / "solutions" / STAGE / f"{STAGE}.ipynb"
GRADED = ("softmax", "scaled_dot_product_attention", "padding_mask", "causal_mask")
N_CLI = 20


# -- building blocks -------------------------------------------------------------------------


def _nb(cells: list, nbformat=4, minor=5, metadata=None) -> dict:
    """A v4-shaped notebook dict; a ``str`` cell is a code cell, a dict is used as is."""
    made = []
    for i, c in enumerate(cells):
        if isinstance(c, str):
            c = {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
                 "outputs": [], "source": c}  # fmt: skip
        made.append(c)
    return {"cells": made, "metadata": {} if metadata is None else metadata,
            "nbformat": nbformat, "nbformat_minor": minor}  # fmt: skip


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _dump(obj, rng: random.Random | None = None) -> bytes:
    """JSON as Jupyter writes it (or compact, or ASCII-escaped); lone surrogates pass as is."""
    indent = 1 if rng is None else rng.choice([1, None, 2])
    if rng is not None and rng.random() < 0.5:
        try:
            return json.dumps(obj, indent=indent, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: only escaped is it valid UTF-8
            pass
    return json.dumps(obj, indent=indent).encode()


def _solution_cells() -> list[str]:
    """The solution's graded code cells (skip-grading ones left out), as plain sources."""
    nb = json.loads(SOLUTION.read_text())
    out = []
    for c in nb["cells"]:
        if c["cell_type"] == "code" and "skip-grading" not in c["metadata"].get("tags", []):
            out.append("".join(c["source"]))
    return out


def _rand_text(rng: random.Random, n: int) -> str:
    """Unicode soup: ASCII, controls, C1, bidi, surrogates, astral, non-characters."""
    pools = [
        string.printable,
        "".join(map(chr, range(0, 32))) + "\x7f",
        "".join(map(chr, range(0x80, 0xA0))),
        "\u202e\u202d\u2066\u2067\u2069\u200b\u200d\ufeff\u2028\u2029",
        "\ud800\udbff\udc00\udfff",
        "éß漢字😀𝔘\U0010ffff\uffff\ue000ﬁ",
    ]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def _rand_json(rng: random.Random, depth: int = 0):
    kinds = ["null", "bool", "int", "bigint", "float", "str", "list", "dict"]
    if depth > 2:
        kinds = kinds[:6]
    k = rng.choice(kinds)
    if k == "null":
        return None
    if k == "bool":
        return rng.random() < 0.5
    if k == "int":
        return rng.randint(-(10**6), 10**6)
    if k == "bigint":
        return 10 ** rng.randint(19, 300) * rng.choice([1, -1])
    if k == "float":
        return rng.choice([0.5, -0.0, 1e308, 5e-324, float("nan"), float("inf")])
    if k == "str":
        return _rand_text(rng, rng.randint(0, 40))
    if k == "list":
        return [_rand_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {_rand_text(rng, rng.randint(0, 8)): _rand_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _mutate(rng: random.Random, obj):
    """One random edit somewhere in a parsed notebook: replace, delete, insert or duplicate."""
    path, node = [], obj
    while isinstance(node, (dict, list)) and node and rng.random() < 0.75:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append((node, key))
        node = node[key]
    if not path:
        return _rand_json(rng)
    parent, key = path[-1]
    op = rng.choice(["replace", "replace", "delete", "insert", "duplicate"])
    if op == "replace":
        parent[key] = _rand_json(rng)
    elif op == "delete":
        del parent[key]
    elif op == "insert":
        if isinstance(parent, list):
            parent.insert(key, _rand_json(rng))
        else:
            parent[_rand_text(rng, 5)] = _rand_json(rng)
    elif isinstance(parent, list):
        parent[key:key] = [json.loads(json.dumps(parent[key]))] * rng.randint(1, 5)
    return obj


# Python-ish garbage: no loops, no powers, shifts or products, so nothing can hang or
# allocate much; the cells only ever fail or do little.
_TOKENS = (
    "x y z softmax causal_mask torch math np None True False lambda def class return if else "
    "elif try except finally with as pass raise yield import from del global nonlocal assert "
    "and or not in is ( ) [ ] { } : , . ; = == != < > + - / % @ ~ -> ... 0 1 2 3.5 1e3 0x1f "
    "'a' \"b\" '''c f'{x}' b'\\x00' \\ # \t"
).split(" ")
_LINES = [
    "x = {a}",
    "y = [x, {a}, 'z']",
    "def {f}({p}):\n    return {a}",
    "def {f}({p}):\n    raise {e}('{t}')",
    "class {F}:\n    pass",
    "import {m}",
    "from {m} import {a}",
    "print({a})",
    "raise {e}",
    "raise {e}('{t}')",
    "assert {a}, '{t}'",
    "del {a}",
    "{a}.{a}",
    "if {a}:\n  pass\n    else",
    "'''unterminated",
    "    indented = 1",
    "x = ({a}",
    "@{a}\ndef g(): pass",
    "lambda: {a}",
    "{a} = {a} + 1",
    "async def h():\n    await {a}",
]
_NAMES = ["x", "y", "torch", "math", "None", "softmax", "causal_mask", "padding_mask", "len", "str", "Tensor"]


def _garbage_line(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return " ".join(rng.choice(_TOKENS) for _ in range(rng.randint(1, 12)))
    return rng.choice(_LINES).format(
        a=rng.choice(_NAMES),
        f=rng.choice([*GRADED, "helper"]),
        p=rng.choice(["", "x", "x, dim=-1", "*a, **k", "q, k, v, mask=None", "lengths, max_len", "L"]),
        F=rng.choice(["A", "Softmax"]),
        e=rng.choice(["ValueError", "TypeError", "NotImplementedError", "SystemExit", "KeyboardInterrupt"]),
        m=rng.choice(["math", "torch", "numpy", "json", "no_such_module_xyz", "torch.nn.functional"]),
        t=rng.choice(["oops", "é", "\\x1b[31mred", "\\x85", "\\u202e"]),
    )


_WORDS = ["matplotlib", "inline", "load_ext", "autoreload", "2", "pip", "install", "torch", "ls", "-la",
          "cd", "/tmp", "env", "X=1", "who", "reset", "-f", "run", "other.ipynb", "pinfo", "time",
          "timeit", "capture", "bash", "writefile", "out.py", "python", "html", "javascript", "\\", "$x",
          "{x}", "é", "\ud800", "\u202e"]  # fmt: skip
_MAGIC_CELLS = [
    "%matplotlib inline", "%load_ext autoreload\n%autoreload 2", "!pip install torch", "files = !ls",
    "%%bash\necho hi > hi.txt", "%%writefile helper.py\nprint(1)", "%%capture\nprint('hidden')",
    "%%capture cap\nraise ValueError('in capture')", "%%time\nz = 1", "%%timeit\nz = 2", "%time z = 3",
    "%timeit -n1 -r1 z = 4", "%time raise ValueError('in %time')", "%time def", "torch?", "math??",
    "?", "??", "%", "%%", "!", "%%\nz = 5", "%% time\nz = 6", "%%%", "%%%%\nz", "!!", "%%python\nz = 7",
    "%%javascript\nalert(1)", "%%html\n<b>x</b>", "%%!\nls", "%run other.ipynb", "%cd /", "%env X=1",
    "%pip install x", "%conda install x", "%reset -f", "%who", "%%time\n%%bash\nls",
    "  %%bash\nls", "\n\n%%bash\nls", "# note\n%%bash\nls", "%load_ext \ud800", "%%bash \u202e\nls",
    "z = %who_ls", "%%time\r\nz = 8", "%%capture\r\n!ls", "%%timeit\n", "%%time",
]  # fmt: skip


def _magic_cell(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(_MAGIC_CELLS)
    head = rng.choice(["%", "%%", "!", "!!", "%%%", ""]) + " ".join(
        rng.choice(_WORDS) for _ in range(rng.randint(0, 4))
    )
    tail = rng.choice(["", "?", "??"])
    body = rng.choice(["", "\nz = 9", "\nls -la", "\n%time z = 10", "\nraise ValueError('body')"])
    return head + tail + body


_RAISING = [
    "raise SystemExit(3)", "raise KeyboardInterrupt", "raise GeneratorExit", "import sys\nsys.exit('bye')",
    "exit()", "quit(5)", "raise StopIteration", "1/0", "undefined_name", "assert False, 'nope'",
    "raise MemoryError", "import no_such_module_xyz", "raise ValueError('x' * 1_000_000)",
    "raise ValueError('\\x1b[2J\\x1b[31mred\\x07\\x00\\r\\x08')",
    "raise ValueError('c1: \\x85 \\x9b31m \\x9d')",
    "raise ValueError('rtl \\u202eevil\\u202c and \\u2028 line sep')",
    "raise ValueError('lone \\ud800 surrogate')",
    "raise type('\\x1b[31mEvil', (Exception,), {})()",
    "raise type('Sur\\udcffrogate', (Exception,), {})()",
    "class E(Exception):\n    def __str__(self):\n        raise RuntimeError('no str')\nraise E()",
    "class E(Exception):\n    def __str__(self):\n        return 5\nraise E()",
    "class B(BaseException):\n    pass\nraise B('base')",
    "def f():\n    f()\nf()",
    "try:\n    1/0\nexcept Exception as e:\n    raise ValueError('chained') from e",
    "import os\nos._exit(0)",
    "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
    "import os\nos.write(1, b'\\xff\\xfe\\x00\\x1b[31m\\xc2\\x85 raw bytes\\n')",
    "print('\\x1b[31mred\\x85\\x9b\\u202e \\ud800' * 3)",
    "print('x' * 200_000)",
    "import sys\nsys.stdout.close()",
    "import warnings\nwarnings.warn('careful')",
    "eval('\\x00')",
    "x = '\\ud800'\nraise ValueError(x)",
    "raise ValueError('\\ud800')  # \ud800",
]  # fmt: skip


def _raising_variant(rng: random.Random) -> list:
    """The solution with 1-3 extra cells that raise, exit or crash: still worth 17."""
    cells = list(_solution_cells())
    for _ in range(rng.randint(1, 3)):
        cells.insert(rng.randint(0, len(cells)), rng.choice(_RAISING))
    return cells


# -- the generator ---------------------------------------------------------------------------


def generate(seed: int = SEED) -> list[tuple[str, str, bytes, bool]]:
    """(name, category, file bytes, must_score_full) for every fuzz notebook."""
    rng = random.Random(seed)
    template = TEMPLATE.read_bytes()
    solution = SOLUTION.read_bytes()
    sol_cells = _solution_cells()
    out: list[tuple[str, str, bytes, bool]] = []

    def add(category: str, data: bytes | str | dict | list, full: bool = False) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        elif not isinstance(data, bytes):
            data = _dump(data, rng)
        out.append((f"{category}_{sum(c == category for _, c, _, _ in out):03d}", category, data, full))

    # truncated JSON at random byte offsets (and a few edges) of the real template
    cuts = [0, 1, 2, len(template) - 1, len(template) - 2, len(template) - 3]
    dash = template.index("—".encode())
    cuts += [dash + 1, dash + 2]  # inside a multi-byte character
    cuts += sorted(rng.randrange(len(template)) for _ in range(42))
    for k in cuts:
        add("truncated", template[:k])

    # random bytes, random text, JSON-ish token soup
    for _ in range(12):
        add("random_bytes", rng.randbytes(rng.randrange(0, 4096)))
    for _ in range(6):
        add("random_bytes", "".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 2000))))
    soup = ['{', '}', '[', ']', ':', ',', '"cells"', '"cell_type"', '"code"', '"source"', '1', 'null',
            '"nbformat"', '4', ' ', '"', '\\', 'true', '"x = 1"', '\n']  # fmt: skip
    for _ in range(6):
        add("random_bytes", "".join(rng.choice(soup) for _ in range(rng.randrange(1, 300))))

    # valid JSON of the wrong shape: wrapped bare, and as an otherwise proper v4 notebook
    code_cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": []}
    for top in ([], [1, 2], 0, -1, 1e308, "notebook", True, None, [_nb(sol_cells)]):
        add("wrong_shape", top)
    add(
        "wrong_shape",
        '{"nbformat": 4, "nbformat_minor": 5, "metadata": {"n": ' + "9" * 5000 + '}, "cells": []}',
    )
    for cells in (5, "code", None, {}, {"0": "x = 1"}, [1, "x", None, [], True], [[code_cell]]):
        add("wrong_shape", {"cells": cells})
        add("wrong_shape", {**_nb([]), "cells": cells})
    odd_cells = [
        {**code_cell, "source": [1, 2.5, None, {"a": 1}, ["x"]]},
        {**code_cell, "source": ["x = 1\n", 2, "y = 2"]},
        {**code_cell, "source": 5},
        {**code_cell, "source": None},
        {**code_cell, "source": {"a": "b"}},
        {**code_cell, "source": True},
        {**code_cell, "source": [[["nested"]]]},
        {"source": "x = 1", "metadata": {}},  # no cell_type
        {**code_cell, "cell_type": "python", "source": "x = 1"},
        {**code_cell, "cell_type": ["code"], "source": "x = 1"},
        {**code_cell, "cell_type": None, "source": "x = 1"},
        {**code_cell, "cell_type": "cοde", "source": "x = 1"},  # Greek omicron
        {**code_cell, "cell_type": "raw", "source": "x = 1"},
        {"cell_type": "code"},
        {**code_cell, "source": "x = 1", "metadata": []},
        {**code_cell, "source": "x = 1", "metadata": None},
        {**code_cell, "source": "x = 1", "metadata": {"tags": "skip-grading"}},
        {**code_cell, "source": "x = 1", "metadata": {"tags": 5}},
        {**code_cell, "source": "x = 1", "metadata": {"tags": [1, None, ["skip-grading"]]}},
        {**code_cell, "source": "x = 1", "metadata": {"tags": {"skip-grading": True}}},
        {**code_cell, "source": "x = 1", "outputs": "none", "execution_count": "one"},
        {**code_cell, "source": "x = 1", "attachments": 7, "id": ["not", "an", "id"]},
    ]
    for cell in odd_cells:
        add("wrong_shape", _nb([cell, *sol_cells]))
        add("wrong_shape", {"cells": [cell]})

    # nbformat versions, right and wrong
    for version in (3, 4, 5, 99, 0, -1, "4", None, 4.5, 10**30, True, [4]):
        add("nbformat", _nb(sol_cells, nbformat=version), full=version == 4)
    for minor in (0, 4, 5, 99, -1, "x", None):
        add("nbformat", _nb(sol_cells, minor=minor))
    v3_cells = [{"cell_type": "code", "input": s, "language": "python", "metadata": {}, "outputs": []}
                for s in sol_cells]  # fmt: skip
    add("nbformat", {"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": [{"cells": v3_cells}]},
        full=True)  # fmt: skip
    for worksheets in (None, 5, [], [5], [{"cells": 5}], [{"cells": [{"cell_type": "code", "input": 5}]}]):
        add("nbformat", {"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": worksheets})
    add("nbformat", {"nbformat": 3, "nbformat_minor": 0, "cells": _nb(sol_cells)["cells"]})

    # random edits of the parsed template and solution
    for _ in range(30):
        base = json.loads(rng.choice([template, solution]))
        for _ in range(rng.randint(1, 3)):
            base = _mutate(rng, base)
        add("mutated", base)

    # huge metadata
    big = "m" * (3 << 20)
    add("huge_metadata", _nb(sol_cells, metadata={"blob": big}), full=True)
    add("huge_metadata", _nb(sol_cells, metadata={f"k{i}": i for i in range(100_000)}), full=True)
    add("huge_metadata", _nb([*sol_cells[:1], {**code_cell, "source": sol_cells[1],
                              "metadata": {"tags": ["t"] * 20_000}}, *sol_cells[2:]]), full=True)  # fmt: skip
    add("huge_metadata", _dump(_nb(sol_cells)) + b" " * (21 << 20))  # over the 20 MB limit
    add("huge_metadata", _nb([{**code_cell, "source": s, "outputs": [{"output_type": "stream", "name":
        "stdout", "text": "o" * 200_000}]} for s in sol_cells]), full=True)  # fmt: skip

    # deep nesting: in the JSON (the parser's recursion) and in the Python (the compiler's)
    valid = _dump(_nb(sol_cells), None).decode()
    for n in (100_000, 3000):
        add("deep_nesting", "[" * n + "]" * n)
        add("deep_nesting", '{"a":' * n + "1" + "}" * n)
    for n in (5000, 990, 900, 500):
        add("deep_nesting", valid[:-2] + ', "deep": ' + "[" * n + "]" * n + "\n}")
    add(
        "deep_nesting", valid.replace('"metadata": {}', '"metadata": {"d": ' + "[" * 950 + "]" * 950 + "}", 1)
    )
    add("deep_nesting", json.dumps({"cells": [{"cell_type": "code", "source": "[" * 2000 + "]" * 2000}]}))
    add(
        "deep_nesting",
        '{"cells": [{"cell_type": "code", "source": ' + "[" * 3000 + '"x"' + "]" * 3000 + "}]}",
    )
    for src in ("x = " + "-" * 20_000 + "1", "x = " + "(" * 5000 + ")" * 5000, "x = a" + ".a" * 30_000,
                "x = " + "1+" * 30_000 + "1", "x = " + "[" * 90 + "]" * 90):  # fmt: skip
        add("deep_nesting", _nb([src, *sol_cells]), full=True)

    # unicode edge cases
    for src in (
        "x = 1\x00", "x = '\x00'", "raise ValueError('a\x00b')", "x = '\ud800'", "x = '\udfff\ud800'",
        "raise ValueError('\udcff')", "x = 1  # \ud800 in a comment", "x = 1 \u202e # rtl override",
        "متغير = 1\nprint(متغير)", "\ufeffx = 1", "x = 1\u2028y = 2", "x = 1\x85y = 2", "x = 1\x0cy = 2",
        "e" + "\u0301" * 10_000 + " = 1", "x = '\uffff\U0010ffff\ue000'", "ｘ = 1\nassert x == 1",
        "x = 1\r\ny = 2\r\n", "x = 1\ry = 2", "# -*- coding: latin-1 -*-\nx = 'é'",
        "# -*- coding: utf-16 -*-\nx = 1", "# -*- coding: no-such-codec -*-\nx = 1",
    ):  # fmt: skip
        add("unicode", _nb([*sol_cells, src]), full=True)
    add("unicode", _nb([{**code_cell, "source": "x = 1", "metadata": {"tags": ["skip-grading\ud800"]}}]))
    add("unicode", _nb(sol_cells, metadata={"\ud800": "\udfff", "\x00": "\u202e"}), full=True)
    add("unicode", valid.encode().replace(b"softmax", b"\xc0\xaf", 1))  # overlong: not UTF-8
    add("unicode", valid.encode().replace(b"softmax", b"\xed\xa0\x80", 1))  # CESU surrogate bytes
    add("unicode", valid.encode("utf-16"))
    add("unicode", valid.encode("utf-16-be"))
    add("unicode", valid.encode("utf-32"))
    add("unicode", valid.encode() + b"\x00")
    add("unicode", valid.replace('"nbformat": 4', '"nbformat": 4, "x": "\x00\x1f"'))  # raw controls
    add("unicode", _nb(sol_cells).__repr__())  # a Python repr, not JSON
    fullwidth = sol_cells[1].replace("def softmax", "def ｓｏｆｔｍａｘ")  # NFKC: still `softmax`
    add("unicode", _nb([sol_cells[0], fullwidth, *sol_cells[2:]]), full=True)

    # random Python-ish garbage, alone or around the solution
    for _ in range(30):
        cells = [
            "\n".join(_garbage_line(rng) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 8))
        ]
        if rng.random() < 0.5:
            cells = [*sol_cells, *cells] if rng.random() < 0.5 else [*cells, *sol_cells]
        add("garbage_code", _nb(cells))

    # random magics: in cells of their own, or a line magic heading a graded cell; worth 17
    for _ in range(25):
        cells = list(sol_cells)
        for _ in range(rng.randint(1, 4)):
            cells.insert(rng.randint(0, len(cells)), _magic_cell(rng))
        if rng.random() < 0.4:
            k = rng.randrange(len(cells))
            if cells[k] in sol_cells:
                cells[k] = rng.choice(["%matplotlib inline", "!ls", "%load_ext autoreload"]) + "\n" + cells[k]
        add("magics", _nb(cells), full=True)

    # cells that raise, exit, crash or print hostile text, around the solution; worth 17
    for _ in range(20):
        add("raising", _nb(_raising_variant(rng)), full=True)

    # empty notebooks
    for data in ("", " ", "\n", "{}", "[]", "null", '{"cells": []}', _nb([]), _nb([_md("# only prose")]),
                 _nb([{"cell_type": "raw", "metadata": {}, "source": "x = 1"}]), _nb(["", "   \n\t", "# c"]),
                 _nb([{**code_cell, "source": []}]),
                 _nb([{**code_cell, "source": s, "metadata": {"tags": ["skip-grading"]}} for s in sol_cells])):  # fmt: skip
        add("empty", data)

    # BOM and line endings
    sol_text = SOLUTION.read_text()
    add("bom", b"\xef\xbb\xbf" + template)
    add("bom", b"\xef\xbb\xbf" + solution)
    add("bom", b"\xef\xbb\xbf\xef\xbb\xbf" + solution)
    add("bom", _nb(["\ufeff" + s for s in sol_cells]))
    add("crlf", sol_text.replace("\n", "\r\n"), full=True)
    add("crlf", template.replace(b"\n", b"\r\n"))
    add("crlf", _nb([s.replace("\n", "\r\n") for s in sol_cells]), full=True)
    add("crlf", _nb([s.replace("\n", "\r") for s in sol_cells]))
    add("crlf", _nb([s.replace("\n", "\n\r") for s in sol_cells]))
    add("crlf", sol_text.replace("\n", "\r"))

    # 2000 tiny cells
    tiny = [f"x_{i} = {i}" for i in range(2000)]
    add("many_cells", _nb([*tiny, *sol_cells]), full=True)
    add("many_cells", _nb([*sol_cells[:1], *[""] * 2000, *sol_cells[1:]]), full=True)
    add("many_cells", _nb([*[_md(f"# {i}") for i in range(2000)], *sol_cells]), full=True)
    add("many_cells", _nb([*[f"raise ValueError({i})" for i in range(2000)], *sol_cells]), full=True)
    add("many_cells", _nb([*[f"%time x = {i}" for i in range(2000)], *sol_cells]), full=True)
    add("many_cells", _nb([*sol_cells, *[f"raise ValueError('{i}' + 'x' * 3000)" for i in range(600)]]),
        full=True)  # fmt: skip

    # not a regular file at all (made by _write_submission)
    for kind in ODD_FILES:
        add("odd_file", kind.encode())
    return out


ODD_FILES = ("directory", "fifo", "dangling_symlink", "symlink_to_solution", "directory_of_notebooks")


def _write_submission(directory: Path, category: str, data: bytes) -> None:
    directory.mkdir()
    path = directory / f"{STAGE}.ipynb"
    if category != "odd_file":
        path.write_bytes(data)
    elif data == b"directory":
        path.mkdir()
    elif data == b"fifo":
        os.mkfifo(path)
    elif data == b"dangling_symlink":
        path.symlink_to(directory / "nowhere.ipynb")
    elif data == b"symlink_to_solution":
        path.symlink_to(SOLUTION)
    else:  # the stage's folder holding notebooks, none of them the stage's own
        (directory / STAGE).mkdir()
        (directory / STAGE / "Untitled.ipynb").write_bytes(SOLUTION.read_bytes())


# -- grading ---------------------------------------------------------------------------------


def _grade_in_process(root: Path, subs: list) -> tuple[dict[str, dict], float, float]:
    """Every submission, then the solution again, through one Grader: (entries, the
    solution's score before them, seconds after start-up)."""
    from autograder.grader.grade import Grader
    from autograder.grader.report import to_gradescope, write_results
    from autograder.grader.runner import Limits

    graded: dict[str, dict] = {}
    # nbformat logs every invalid notebook, whole, at ERROR (one line of 20,000 tags...)
    logging.getLogger("traitlets").disabled = True
    try:
        with Grader(limits=Limits(call_s=2.0, cell_s=3.0, submission_s=30.0)) as grader:
            grader.server.wait_ready()
            grader.plan(STAGE)  # start-up out of the first submission's time
            first = grader.grade(root / "honest", [STAGE]).score
            t0 = time.monotonic()
            for name, category, _, full in [*subs, ("honest", "honest", b"", True)]:
                entry: dict = {"category": category, "full": full, "error": None, "write_error": None}
                t = time.monotonic()
                try:
                    r = grader.grade(root / name, [STAGE])
                    entry["result"] = to_gradescope(r)
                except BaseException as exc:  # what the test is about: nothing may escape
                    entry["result"] = None
                    entry["error"] = "".join(traceback.format_exception_only(exc)).strip()[:500]
                    entry["where"] = traceback.format_tb(exc.__traceback__)[-1].strip()[-500:]
                else:
                    out = root / "written" / name / "results.json"
                    try:
                        write_results(r, out)
                        json.loads(out.read_text(encoding="utf-8"))
                    except BaseException as exc:
                        entry["write_error"] = "".join(traceback.format_exception_only(exc)).strip()[:500]
                entry["seconds"] = round(time.monotonic() - t, 3)
                graded[name] = entry
            total = time.monotonic() - t0
    finally:
        logging.getLogger("traitlets").disabled = False
    return graded, first, total


def _grade_all(root: Path) -> dict:
    subs = generate()
    for name, category, data, _ in subs:
        _write_submission(root / name, category, data)
    (root / "honest").mkdir()
    (root / "honest" / f"{STAGE}.ipynb").write_bytes(SOLUTION.read_bytes())

    # The command line, meanwhile, on a sample: one of each category, the rest at random.
    rng = random.Random(SEED + 1)
    sample: list[str] = []
    for category in dict.fromkeys(c for _, c, _, _ in subs):
        sample.append(rng.choice([n for n, c, _, _ in subs if c == category]))
    rest = [n for n, _, _, _ in subs if n not in sample]
    sample += rng.sample(rest, max(0, N_CLI - len(sample)))
    cli_out = root / "cli-results"
    args = ["grade", *(str(root / n) for n in sample), "--stage", STAGE, "--results-dir", str(cli_out),
            "--call-timeout", "2", "--submission-timeout", "60"]  # fmt: skip
    cli = subprocess.Popen(**cli_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        graded, first, total = _grade_in_process(root, subs)
        stdout, stderr = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    cli_results = {}
    for n in sample:
        p = cli_out / n / "results.json"
        cli_results[n] = json.loads(p.read_text(encoding="utf-8")) if p.exists() else None
    return {
        "root": str(root),
        "graded": graded,
        "seconds": round(total, 1),
        "honest_first": first,
        "cli": {
            "rc": cli.returncode,
            "stdout": stdout[-5000:],
            "stderr": stderr[-5000:],
            "sample": sample,
            "results": cli_results,
        },
    }


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory) -> dict:
    return once_per_session(
        tmp_path_factory, f"fuzz-{SEED}", lambda: _grade_all(tmp_path_factory.mktemp("fuzz"))
    )


def _repro(fuzz: dict, name: str) -> str:
    return str(Path(fuzz["root"]) / name / f"{STAGE}.ipynb")


def _bad_chars(text: str) -> set[str]:
    """Control characters (C0, DEL, C1) other than newline and tab; lone surrogates."""
    return {f"U+{ord(c):04X}" for c in text if unicodedata.category(c) in ("Cc", "Cs") and c not in "\n\t"}


# -- the properties --------------------------------------------------------------------------


def test_the_generator_is_deterministic_and_covers_every_category():
    a, b = generate(), generate()
    assert [(n, d) for n, _, d, _ in a] == [(n, d) for n, _, d, _ in b]
    counts: dict[str, int] = {}
    for _, c, _, _ in a:
        counts[c] = counts.get(c, 0) + 1
    assert len(a) >= 280, counts
    assert set(counts) >= {"truncated", "random_bytes", "wrong_shape", "nbformat", "mutated", "huge_metadata",
                           "deep_nesting", "unicode", "garbage_code", "magics", "raising", "empty", "bom",
                           "crlf", "many_cells", "odd_file"}, counts  # fmt: skip
    assert len({n for n, _, _, _ in a}) == len(a)


def test_no_exception_escapes_the_grader(fuzz):
    crashed = {n: e["error"] for n, e in fuzz["graded"].items() if e["error"]}
    assert not crashed, "\n".join(
        f"{n} ({fuzz['graded'][n]['category']}): {err}\n    {fuzz['graded'][n]['where']}\n"
        f"    repro: {_repro(fuzz, n)}"
        for n, err in crashed.items()
    )


def test_every_result_is_a_complete_gradescope_file(fuzz):
    bad = {}
    for name, e in fuzz["graded"].items():
        if e["result"] is None:
            continue
        try:
            assert_gradescope_results(e["result"], MAX_SCORE, N_TESTS)
            assert 0 <= e["result"]["score"] <= MAX_SCORE
        except AssertionError as exc:
            bad[name] = str(exc)[:300]
    assert not bad, bad


def test_every_results_file_is_written_as_utf8_json(fuzz):
    bad = {n: e["write_error"] for n, e in fuzz["graded"].items() if e["write_error"]}
    assert not bad, "\n".join(f"{n}: {err}\n    repro: {_repro(fuzz, n)}" for n, err in bad.items())


def test_messages_have_no_control_characters(fuzz):
    bad = {}
    for name, e in fuzz["graded"].items():
        if e["result"] is None:
            continue
        texts = [e["result"]["output"], *(t["output"] for t in e["result"]["tests"])]
        texts += [t["name"] for t in e["result"]["tests"]] + [
            x for t in e["result"]["tests"] for x in t["tags"]
        ]
        found = set().union(*map(_bad_chars, texts))
        if found:
            bad[name] = sorted(found)
    assert not bad, "\n".join(f"{n}: {chars}\n    repro: {_repro(fuzz, n)}" for n, chars in bad.items())


def test_test_outputs_are_bounded(fuzz):
    for name, e in fuzz["graded"].items():
        if e["result"] is not None:
            assert len(e["result"]["output"]) <= 20_100, name
            assert all(len(t["output"]) <= 4_100 for t in e["result"]["tests"]), name


def test_odd_but_complete_notebooks_still_score_full_marks(fuzz):
    """Magics, cells that raise or crash, CRLF, 2000 cells, huge metadata: the solution's
    own cells still run, so nothing is lost."""
    short = {
        n: (e["result"]["score"], e["result"]["output"][:300])
        for n, e in fuzz["graded"].items()
        if e["full"] and e["result"] is not None and e["result"]["score"] != MAX_SCORE
    }
    assert not short, "\n".join(
        f"{n}: {s}/{MAX_SCORE:g}\n    {out!r}\n    repro: {_repro(fuzz, n)}" for n, (s, out) in short.items()
    )


def test_unreadable_files_say_why_in_every_test(fuzz):
    for name, e in fuzz["graded"].items():
        if e["category"] == "truncated" and e["result"] is not None and e["result"]["score"] == 0:
            tests = e["result"]["tests"]
            if "invalid JSON" in tests[0]["output"]:
                assert all("Was it saved completely?" in t["output"] for t in tests), name


def test_the_grader_stays_usable_after_all_of_them(fuzz):
    assert fuzz["honest_first"] == MAX_SCORE
    honest = fuzz["graded"]["honest"]
    assert honest["error"] is None, honest["error"]
    assert honest["result"]["score"] == MAX_SCORE, honest["result"]["output"]


def test_the_whole_batch_is_fast(fuzz):
    assert fuzz["seconds"] < 120, fuzz["seconds"]
    slow = {n: e["seconds"] for n, e in fuzz["graded"].items() if e["seconds"] > 10}
    assert not slow, slow


def test_the_cli_writes_a_valid_results_file_for_each_of_a_sample(fuzz):
    cli = fuzz["cli"]
    assert cli["rc"] == 0, cli["stderr"] + cli["stdout"]
    assert "internal error" not in cli["stdout"] + cli["stderr"]
    assert len(cli["sample"]) == N_CLI
    missing = [n for n, r in cli["results"].items() if r is None]
    assert not missing, missing
    for name, result in cli["results"].items():
        assert_gradescope_results(result, MAX_SCORE, N_TESTS)
        for t in result["tests"]:
            assert {"name", "score", "max_score", "status", "output", "tags"} <= t.keys()
            assert 0 <= t["score"] <= t["max_score"], name
        # the command line and the in-process grader agree
        mine = fuzz["graded"][name]["result"]
        if mine is not None:
            assert result["score"] == mine["score"], name


# -- what loading costs the trusted process ----------------------------------------------------
# Loading (nbformat, IPython's input transformation) runs in the grader itself, before the
# submission's clock starts and outside every limit: its cost must grow linearly with the file.


def _load_seconds(tmp_path: Path, nb: dict) -> tuple[float, list[tuple[str, str]]]:
    from autograder.runtime.load import load_source

    path = tmp_path / f"{STAGE}.ipynb"
    path.write_text(json.dumps(nb))
    logging.getLogger("traitlets").disabled = True
    try:
        t = time.monotonic()
        cells = load_source(path, STAGE).cells
        return time.monotonic() - t, cells
    finally:
        logging.getLogger("traitlets").disabled = False


def test_a_cell_of_many_line_magics_loads_in_linear_time(tmp_path):
    """IPython re-tokenises the whole cell once per magic, so its cost is quadratic: ~1.5 s
    for this 2 KB cell, 7 s at 499 magics, ~2 minutes for a 100 KB cell (and from 500 magics
    on it gives up, leaving the cell raw: a SyntaxError in the child). Measured against
    the same number of plain Python lines, so a loaded machine does not change the verdict."""
    n = 200
    _load_seconds(tmp_path, _nb(["%time x = 1"]))  # imports IPython
    plain, _ = _load_seconds(tmp_path, _nb(["x = 1\n" * n]))
    seconds, cells = _load_seconds(
        tmp_path, _nb(["%time x = 1\n" * (n // 2) + "%matplotlib inline\n" * (n // 2)])
    )
    assert "get_ipython()" in cells[0][1]
    assert seconds < 20 * plain + 0.2, f"{seconds:.2f} s to load {n} line magics, {plain:.3f} s for {n} lines"


def test_an_invalid_notebook_with_a_long_list_loads_in_linear_time(tmp_path):
    """nbformat validates an invalid notebook again with pure-Python jsonschema, ~25 us per
    list item: 40,000 duplicate tags take a second, a 15 MB file of them two minutes, in the
    grader itself and before the submission's clock starts. Measured against as many
    distinct (valid) tags."""
    cells = _solution_cells()
    nb = _nb(cells)
    nb["cells"][0]["metadata"] = {"tags": [f"t{i}" for i in range(40_000)]}
    _load_seconds(tmp_path, _nb(["x = 1"]))  # imports nbformat's validators
    valid, _ = _load_seconds(tmp_path, nb)
    nb["cells"][0]["metadata"] = {"tags": ["t"] * 40_000}  # not unique: invalid
    seconds, loaded = _load_seconds(tmp_path, nb)
    assert len(loaded) == len(cells)
    assert seconds < 10 * valid + 0.2, (
        f"{seconds:.2f} s for 40,000 duplicate tags, {valid:.3f} s for distinct ones"
    )

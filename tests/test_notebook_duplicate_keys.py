"""The code graded is the code Jupyter shows: a notebook that repeats a key is refused.

JSON lets an object repeat a key; Jupyter (nbformat, nbgrader: ``json.loads``) keeps the
last value. A notebook cell written ``"source": SOLUTION, "cell_type": "markdown",
"source": STUBS, "cell_type": "code"`` is shown (and validated) as a code cell of stubs,
while a reader that keeps the first source it finds in a code cell would run the hidden
solution (issue 25, item 8). The grader's streaming reader refuses any repeated key in the
objects it reads key by key (the notebook, its worksheets, each cell, each cell's metadata),
keys compared as ``json.loads`` decodes them, with a message naming the cell and the key;
notebooks that Jupyter saves never repeat a key and load as before."""

from __future__ import annotations

import io
import json
from pathlib import Path

import nbformat
import pytest

from autograder.runtime import load
from autograder.runtime.load import LoadError, load_source
from tests.support import CALL_S, ROOT, assert_gradescope_results, full_marks, max_score, run_cli_many
from tests.test_load_bounds import _json_oracle

pytestmark = pytest.mark.stage01
STAGE = "01_attention"
ASSIGNMENT = ROOT / "assignments" / STAGE / f"{STAGE}.ipynb"
CHUNKS = [1, 7, 4093, 1 << 20]  # chunks of 1 and 7 bytes cut every key somewhere


def _assignment() -> dict:
    return json.loads(ASSIGNMENT.read_text())


def _imports() -> str:
    """The assignment's first code cell: the imports its stubs' annotations need."""
    return "".join(next(c for c in _assignment()["cells"] if c["cell_type"] == "code")["source"])


def _stubs() -> str:
    """The four functions of stage 01 as handed out: each raises NotImplementedError."""
    graded = [c for c in _assignment()["cells"] if c["metadata"].get("nbgrader", {}).get("solution")]
    return "\n\n".join("".join(c["source"]) for c in graded) + "\n"


def _solution() -> str:
    """A full correct solution of stage 01 (a student of the example class)."""
    text = (ROOT / "examples" / "class" / "ada_correct_matmul" / f"{STAGE}.py").read_text()
    return text.split("\nif __name__")[0]


class Raw(str):
    """JSON text written into ``_obj`` as it is (an object that itself repeats a key)."""


def _obj(*pairs: tuple[str, object]) -> str:
    """A JSON object's text with these members in this order, a key as often as it is given
    (``json.dumps`` of a dict never repeats a key); a value that is a ``Raw`` is written as is."""
    return (
        "{"
        + ", ".join(f"{json.dumps(k)}: {v if isinstance(v, Raw) else json.dumps(v)}" for k, v in pairs)
        + "}"
    )


def _cell(*pairs: tuple[str, object]) -> Raw:
    return Raw(_obj(*pairs))


def _list(*items: str) -> Raw:
    return Raw("[" + ", ".join(items) + "]")


def _code(source: str, n: int, **extra: object) -> Raw:
    pairs = {
        "cell_type": "code",
        "execution_count": None,
        "id": f"c{n}",
        "metadata": {},
        "outputs": [],
        "source": source,
    }
    return _cell(*(pairs | extra).items())


def _notebook(cells: list[str], *extra: tuple[str, object]) -> str:
    """A v4 notebook's text: a markdown title, then ``cells`` (their JSON texts)."""
    title = _obj(("cell_type", "markdown"), ("id", "title"), ("metadata", {}), ("source", "# Stage 01"))
    kernel = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}
    return _obj(
        ("cells", _list(title, *cells)),
        ("metadata", kernel),
        ("nbformat", 4),
        ("nbformat_minor", 5),
        *extra,
    )


def _hidden_solution() -> str:
    """Cell 3 holds the solution first and the stubs last, cell_type and source both repeated."""
    cell = _cell(
        ("id", "c3"),
        ("source", _solution()),
        ("cell_type", "markdown"),
        ("source", _stubs()),
        ("cell_type", "code"),
        ("execution_count", None),
        ("metadata", {}),
        ("outputs", []),
    )
    return _notebook([_code(_imports(), 2), cell])


def _refused(text: str) -> str:
    """The message every chunking of ``text`` is refused with (the same for all)."""
    messages = set()
    for chunk in CHUNKS:
        with pytest.raises(LoadError) as got:
            load._notebook(io.BytesIO(text.encode()), f"{STAGE}.ipynb", chunk)
        messages.add(str(got.value))
    assert len(messages) == 1, messages
    return messages.pop()


def _repeated(where: str, key: str) -> str:
    return f"{STAGE}.ipynb: {where} has the key {json.dumps(key)} twice"


def _cell_n(n: int) -> str:
    return f"cell {n} (counting markdown cells too)"


ADVICE = "save the notebook again from Jupyter (or fix the file) so that each key appears once"


# -- (1) a solution hidden behind the stubs Jupyter shows ---------------------------------------


def test_jupyter_shows_the_last_value_of_a_repeated_key():
    """What the rule answers: Jupyter's reading (nbformat, as nbgrader reads a notebook) keeps
    the last value, and the notebook is valid: the instructor sees four stubs."""
    nb = nbformat.reads(_hidden_solution(), as_version=4)
    nbformat.validate(nb)
    cell = nb.cells[2]
    assert cell.cell_type == "code" and cell.source == _stubs()
    assert cell.source.count("raise NotImplementedError") == 4
    assert json.loads(_hidden_solution())["cells"][2]["source"] == _stubs()  # Python's json agrees


def test_a_repeated_source_is_refused_naming_the_cell_and_the_key(tmp_path):
    message = _refused(_hidden_solution())
    assert message.startswith(_repeated(_cell_n(3), "source")), message
    assert "Jupyter shows only the last one" in message and message.endswith(ADVICE)
    path = tmp_path / f"{STAGE}.ipynb"
    path.write_text(_hidden_solution())
    with pytest.raises(LoadError, match=r'cell 3 \(counting markdown cells too\) has the key "source" twice'):
        load_source(path, STAGE)


def _grade_all(root: Path) -> dict:
    hidden, shown = root / "hidden_solution", root / "solution_shown"
    hidden.mkdir()
    (hidden / f"{STAGE}.ipynb").write_text(_hidden_solution())
    shown.mkdir()  # the same notebook with the solution as Jupyter would show it: full marks
    (shown / f"{STAGE}.ipynb").write_text(_notebook([_code(_imports(), 2), _code(_solution(), 3)]))
    out = root / "results"
    runs = run_cli_many(
        {"batch": ["grade", str(hidden), str(shown), "--stage", STAGE, "--results-dir", str(out),
                   "--call-timeout", str(CALL_S)]}
    )  # fmt: skip
    return {
        **runs["batch"],
        "results": {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/results.json")},
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    return _grade_all(tmp_path_factory.mktemp("duplicate_keys"))


def test_grading_it_scores_0_with_the_message_and_does_not_crash(graded):
    assert graded["rc"] == 0, graded["stderr"]
    assert "internal error" not in graded["stdout"] + graded["stderr"]
    assert "Traceback" not in graded["stderr"]
    assert set(graded["results"]) == {"hidden_solution", "solution_shown"}
    shown = graded["results"]["solution_shown"]
    assert_gradescope_results(shown)
    assert shown["score"] == max_score(STAGE)  # the hidden code is a full solution
    hidden = graded["results"]["hidden_solution"]
    assert_gradescope_results(hidden)
    assert hidden["score"] == 0
    assert {t["name"] for t in hidden["tests"]} == {t["name"] for t in shown["tests"]}
    assert all(t["score"] == 0 for t in hidden["tests"])
    assert len(full_marks(STAGE)) > 1
    text = "\n".join([hidden["output"], *(t["output"] for t in hidden["tests"])])
    assert _repeated(_cell_n(3), "source") in text, text[:2000]
    assert ADVICE in text


# -- (2) keys compared as json.loads decodes them --------------------------------------------


def test_a_key_repeated_with_json_escapes_is_the_same_key():
    hidden = _hidden_solution()
    for spelled in ("sour\\u0063e", "\\u0073\\u006f\\u0075\\u0072\\u0063\\u0065"):
        text = hidden.replace('"source": ' + json.dumps(_stubs()), f'"{spelled}": ' + json.dumps(_stubs()), 1)
        assert f'"{spelled}"' in text
        assert json.loads(text)["cells"][2]["source"] == _stubs()  # one key for json.loads
        assert _refused(text).startswith(_repeated(_cell_n(3), "source"))
    # an escaped cell_type, the first value escaped instead
    text = _notebook(
        [
            Raw(
                '{"cell_type": "code", "metadata": {}, "outputs": [], "id": "c2", "execution_count": null, '
                f'"source": {json.dumps(_solution())}, "cell\\u005ftype": "markdown"}}'
            )
        ]
    )
    assert json.loads(text)["cells"][1]["cell_type"] == "markdown"
    assert _refused(text).startswith(_repeated(_cell_n(2), "cell_type"))
    # a key that only differs by an escape of another character is another key
    text = _notebook(
        [Raw('{"cell_type": "code", "metadata": {}, "source": "x = 1", "sourc\\u0065s": "y = 2"}')]
    )
    assert load._notebook(io.BytesIO(text.encode()), "n.ipynb") == [("x = 1", False)]


# -- (3) the metadata, the notebook's top level, nbformat 3's worksheets -----------------------


def _v3(*sheet: tuple[str, object]) -> str:
    """An nbformat 3 notebook of one worksheet with these members."""
    meta = (("metadata", {"name": ""}), ("nbformat", 3), ("nbformat_minor", 0))
    return _obj(*meta, ("worksheets", _list(_obj(*sheet))))


V3_CELL = (("cell_type", "code"), ("language", "python"), ("metadata", {}), ("outputs", []))


def _v3_cell(*pairs: tuple[str, object]) -> str:
    return _obj(*V3_CELL, *pairs)


REPEATED = {
    # name: (notebook text, where, key)
    "tags_in_cell_metadata": (
        lambda: _notebook([_code(_solution(), 2, metadata=Raw('{"tags": ["skip-grading"], "tags": []}'))]),
        "the metadata of " + _cell_n(2),
        "tags",
    ),
    "any_key_in_cell_metadata": (
        lambda: _notebook(
            [_code("x = 1", 2, metadata=Raw('{"collapsed": true, "scrolled": 1, "collapsed": false}'))]
        ),
        "the metadata of " + _cell_n(2),
        "collapsed",
    ),
    "metadata_of_a_cell": (
        lambda: _notebook(
            [
                _cell(
                    ("cell_type", "code"),
                    ("metadata", {"tags": ["skip-grading"]}),
                    ("source", "x"),
                    ("metadata", {}),
                )
            ]
        ),
        _cell_n(2),
        "metadata",
    ),
    "cells_at_the_top_level": (
        lambda: _notebook([_code(_solution(), 2)], ("cells", _list(_code(_stubs(), 2)))),
        "the notebook's top level",
        "cells",
    ),
    "nbformat_at_the_top_level": (
        lambda: _notebook([_code("x = 1", 2)], ("nbformat", 3)),
        "the notebook's top level",
        "nbformat",
    ),
    "metadata_at_the_top_level": (
        lambda: _notebook([_code("x = 1", 2)], ("metadata", {})),
        "the notebook's top level",
        "metadata",
    ),
    "a_key_the_grader_does_not_read": (
        lambda: _notebook([_code("x = 1", 2), _cell(("cell_type", "raw"), ("id", "a"), ("id", "b"))]),
        _cell_n(3),
        "id",
    ),
    "v3_input": (  # the solution first, the stubs Jupyter shows last
        lambda: _v3(
            (
                "cells",
                _list(
                    _cell(
                        ("input", _solution()),
                        ("cell_type", "raw"),
                        *V3_CELL[1:],
                        ("input", _stubs()),
                        V3_CELL[0],
                    )
                ),
            )
        ),
        _cell_n(1),
        "input",
    ),
    "v3_worksheet_cells": (
        lambda: _v3(
            ("cells", _list(_v3_cell(("input", _solution())))),
            ("cells", _list(_v3_cell(("input", _stubs())))),
        ),
        "worksheet 1",
        "cells",
    ),
}


@pytest.mark.parametrize("case", sorted(REPEATED))
def test_a_repeated_key_anywhere_the_reader_reads_is_refused(case):
    make, where, key = REPEATED[case]
    text = make()
    assert isinstance(json.loads(text), dict)  # valid JSON: json.loads keeps the last value
    message = _refused(text)
    assert message.startswith(_repeated(where, key)), message
    assert message.endswith(ADVICE)


def test_a_key_in_two_objects_is_not_repeated():
    """Every cell has its source: a key repeats only within one object."""
    text = _notebook(
        [_code("x = 1", 2, metadata={"tags": ["a"]}), _code("y = 2", 3, metadata={"tags": ["skip-grading"]})]
    )
    assert load._notebook(io.BytesIO(text.encode()), "n.ipynb") == [("x = 1", False), ("y = 2", True)]


def test_a_repeated_source_after_many_keys_is_refused():
    """Past the keys an object's check holds (memory stays bounded), the keys the grader
    reads are still compared."""
    many = [(f"k{i}", 0) for i in range(3 * load._KEYS_HELD)]
    cell = _cell(
        ("cell_type", "code"), ("source", _solution()), *many, ("source", _stubs()), ("metadata", {})
    )
    assert _refused(_notebook([cell])).startswith(_repeated(_cell_n(2), "source"))


# -- (4) notebooks Jupyter saved load as before ----------------------------------------------


HONEST = sorted((ROOT / "solutions").glob("*/*.ipynb")) + sorted((ROOT / "assignments").glob("*/*.ipynb"))


@pytest.mark.parametrize("path", HONEST, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_a_notebook_jupyter_saved_loads_as_json_loads_reads_it(path):
    data = path.read_bytes()
    want = _json_oracle(data)
    assert isinstance(want, list) and want
    for chunk in (7, 4093, 1 << 20):
        assert load._notebook(io.BytesIO(data), path.name, chunk) == want
    assert load_source(path, path.stem).cells


def test_the_solution_and_the_assignment_of_stage_01_load():
    assert len(HONEST) >= 2 and ASSIGNMENT in HONEST
    solution = load_source(ROOT / "solutions" / STAGE / f"{STAGE}.ipynb", STAGE)
    stubs = load_source(ASSIGNMENT, STAGE)
    assert [label for label, _ in solution.cells] == [label for label, _ in stubs.cells]
    assert sum("raise NotImplementedError" in src for _, src in stubs.cells) == 4

"""From a submission on disk to the Python source the child runs (trusted, parses only).

A stage's file is ``NN_name.ipynb`` or ``NN_name.py``. A notebook's code cells run in
order, as a kernel would: cells tagged ``skip-grading`` are left out, a line magic or
``!`` line becomes a call to a ``get_ipython()`` stand-in that does nothing (the rest of
the cell still runs), and a cell magic that is not Python (``%%bash``, ``%%writefile``...)
skips its cell. Stored outputs and metadata are ignored; nbformat 3 is upgraded.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

MAX_FILE_BYTES = 20 << 20
SKIP_TAG = "skip-grading"
# Cell magics whose body is Python: the body runs once, the magic is dropped.
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun"}


class LoadError(Exception):
    """The file cannot be graded at all; the message is for the student."""


@dataclass
class Source:
    path: Path
    cells: list[tuple[str, str]]  # (label shown to the student, Python source)
    module_name: str
    notes: list[str] = field(default_factory=list)
    heads: list[str] = field(default_factory=list)  # each cell's first line, as the student wrote it


def _first_code_line(src: str) -> str:
    lines = [line.strip() for line in src.split("\n") if line.strip()]
    return next((line for line in lines if not line.startswith("#")), lines[0] if lines else "")


def find_stage_file(submission: Path, stage: str) -> Path | None:
    """``submission`` itself if it is a file, else the stage's file inside the directory.

    Links are refused (here for a stage folder, in ``_read_text`` for the file): a
    submission must not make the grader read the reference, a solution or another file.
    """
    if submission.is_file() or submission.is_symlink():
        return submission
    for candidate in (
        submission / f"{stage}.ipynb",
        submission / f"{stage}.py",
        submission / stage / f"{stage}.ipynb",
        submission / stage / f"{stage}.py",
    ):
        if candidate.exists() or candidate.is_symlink():
            if candidate.parent != submission and candidate.parent.is_symlink():
                raise LoadError(f"{candidate.parent.name}/ is a symbolic link; submit the folder itself")
            return candidate
    return None


def _read_text(path: Path) -> str:
    if path.is_symlink():
        raise LoadError(f"{path.name} is a symbolic link; submit the file itself")
    if not path.is_file():
        raise LoadError(f"{path.name} is not a regular file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise LoadError(f"{path.name} is larger than {MAX_FILE_BYTES >> 20} MB")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        what = "a Jupyter notebook" if path.suffix == ".ipynb" else "a Python file"
        raise LoadError(
            f"{path.name} is not {what}: it is not text ({exc.reason} at byte {exc.start}). "
            f"Submit the file that Jupyter saved."
        ) from None


def _text_of(source: object) -> str:
    """A cell's source as text, whatever a damaged notebook holds there."""
    if isinstance(source, str):
        return source
    if isinstance(source, list):
        return "".join(s for s in source if isinstance(s, str))
    return ""


def _tags_of(cell: dict) -> list[str]:
    meta = cell.get("metadata")
    tags = meta.get("tags", []) if isinstance(meta, dict) else []
    return [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []


def _code_cells(text: str, name: str) -> list[tuple[str, list[str]]]:
    """(source, tags) of each code cell.

    Read as plain JSON and taken cell by cell, so a damaged but readable notebook still
    gives its code; nbformat upgrades version 3 notebooks. (nbformat's full validation is
    not used: it costs seconds on a large invalid file and changes nothing we read.)
    """
    try:
        raw = json.loads(text.removeprefix("\ufeff"))
    except RecursionError:
        raise LoadError(f"{name} is not a Jupyter notebook: its JSON is nested too deeply") from None
    except ValueError as err:
        where = f" at line {err.lineno} column {err.colno}" if hasattr(err, "lineno") else ""
        reason = getattr(err, "msg", str(err)[:200])
        raise LoadError(
            f"{name} is not a valid notebook: invalid JSON{where} ({reason}). Was it saved completely?"
        ) from None
    if isinstance(raw, dict) and raw.get("nbformat") == 3:
        try:
            raw = nbformat.v4.upgrade(nbformat.from_dict(raw), from_version=3)
        except Exception as exc:  # a damaged v3 notebook: say so, grade nothing
            raise LoadError(
                f"{name} is an nbformat 3 notebook that cannot be upgraded ({type(exc).__name__})"
            ) from None
    cells = raw.get("cells") if isinstance(raw, dict) else None
    if not isinstance(cells, list):
        raise LoadError(f"{name} is not a Jupyter notebook: it has no list of cells")
    return [
        (_text_of(c.get("source", "")), _tags_of(c))
        for c in cells
        if isinstance(c, dict) and c.get("cell_type") == "code"
    ]


_local = threading.local()  # one IPython TransformerManager per thread (batch's workers are threads)
_MAGIC_LINE = re.compile(r"^\s*[%!]|\?\s*$", re.MULTILINE)
WHOLE_CELL_MAGICS = 50  # IPython re-reads a cell once per magic: beyond this, line by line


def _to_python(src: str) -> str:
    """IPython's own input transformation: magics and ``!`` lines become get_ipython() calls."""
    _transformer = getattr(_local, "transformer", None)
    if _transformer is None:
        from IPython.core.inputtransformer2 import TransformerManager

        _transformer = _local.transformer = TransformerManager()
    try:
        if len(_MAGIC_LINE.findall(src)) <= WHOLE_CELL_MAGICS:
            return _transformer.transform_cell(src)
        return "".join(
            _transformer.transform_cell(line if line.endswith("\n") else line + "\n")
            if _MAGIC_LINE.search(line)
            else line
            for line in src.splitlines(keepends=True)
        )
    except Exception:
        return src  # let the child report the SyntaxError with its line


def load_source(path: Path, stage: str) -> Source:
    name = path.name
    if path.suffix == ".py":
        return Source(path, [(name, _read_text(path))], module_name=stage)
    if path.suffix != ".ipynb":
        raise LoadError(f"{name} is neither a notebook (.ipynb) nor a Python file (.py)")
    cells, notes, heads = [], [], []
    for n, (src, tags) in enumerate(_code_cells(_read_text(path), name), start=1):
        if SKIP_TAG in tags:
            continue
        first = src.lstrip().split("\n", 1)[0]
        if first.startswith("%%"):
            magic = first[2:].split(maxsplit=1)[0] if first[2:].strip() else ""
            if magic not in PYTHON_CELL_MAGICS:
                notes.append(f"code cell {n} starts with %%{magic}: not Python, skipped when grading")
                continue
            src = src.lstrip().split("\n", 1)[1] if "\n" in src.lstrip() else ""
        cells.append((f"code cell {n}", _to_python(src)))
        heads.append(_first_code_line(src))
    if not cells:
        notes.append(f"{name} has no code cells to run")
    return Source(path, cells, module_name="__main__", notes=notes, heads=heads)

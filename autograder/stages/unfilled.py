"""What ``python -m autograder new-stage`` leaves for the instructor to write, and the guard
that refuses a stage until it is written.

The scaffold (``autograder/grader/scaffold.py``) writes every file of a stage, and marks each
part only the instructor can write (the math, the cases, the known mistakes, the prose) with a
line holding ``FILL IN:`` and what belongs there. The registry refuses to load a spec while its
file or its reference holds such a line (``autograder/stages/__init__.py``), so nothing grades
it; ``generate`` refuses its solution notebook; tests/test_curriculum.py refuses CURRICULUM.md.
Each refusal names the file, the line and what to write. Standard library only: the registry
imports this before any spec (and torch) loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

MARKER = "FILL IN:"
SHOWN = 40  # lines listed in a refusal (a two-name scaffold leaves about 30); the rest are counted


class UnfilledStage(ValueError):
    """A stage whose files still hold the scaffold's ``FILL IN:`` lines; the message lists them."""


def unfilled_lines(text: str) -> list[tuple[int, str]]:
    """(line number, the line) of every line of ``text`` holding the marker: the whole line,
    since what it sits in says as much as what it asks (``signature="f(x)",  # FILL IN: ...``)."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), start=1) if MARKER in line]


def _notebook_lines(path: Path) -> list[str]:
    """A notebook's unfilled lines by cell (its id, else its number) and line in the cell:
    what an instructor finds in Jupyter, not the JSON file's line numbers."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError) as exc:
        return [f"{path}: unreadable ({exc})"]
    found = []
    for i, cell in enumerate(cells, start=1):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        where = f"cell {cell['id']!r}" if cell.get("id") else f"cell {i}"
        found += [f"{path}, {where}, line {n}: {what}" for n, what in unfilled_lines(source)]
    return found


def unfilled(paths: Iterable[Path]) -> list[str]:
    """``file:line: FILL IN: ...`` for every marked line of ``paths`` (missing files skipped)."""
    found: list[str] = []
    for path in paths:
        if not path.is_file():
            continue
        if path.suffix == ".ipynb":
            found += _notebook_lines(path)
        else:
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [f"{path}:{n}: {what}" for n, what in unfilled_lines(text)]
    return found


def refusal(stage: str, found: list[str], what: str) -> str:
    """The message of a refusal: what cannot run, and the lines to write first."""
    listed = found[:SHOWN] + ([f"... and {len(found) - SHOWN} more"] if len(found) > SHOWN else [])
    return (
        f"stage {stage} is not written yet, so {what}: write what each line below asks for "
        f"(each line holding {MARKER!r}, left by `python -m autograder new-stage`), then delete "
        "its marker:\n  " + "\n  ".join(listed)
    )


def check_filled(stage: str, paths: Iterable[Path], what: str = "it cannot be graded") -> None:
    """Raise ``UnfilledStage`` when any of ``paths`` still holds a ``FILL IN:`` line."""
    found = unfilled(paths)
    if found:
        raise UnfilledStage(refusal(stage, found, what))

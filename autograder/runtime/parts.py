"""Your own earlier stages, as modules.

A later stage builds on what the student wrote before: stage 02's multi-head attention
calls the student's own stage 01 attention, stage 09's BERT is assembled from the
student's 02 and 06 parts. In the notebook::

    from autograder.runtime.parts import load_stage

    attention = load_stage("01_attention")  # runs your 01_attention notebook as a module
    attention.scaled_dot_product_attention(q, k, v)

In Jupyter, ``load_stage`` finds ``NN_name.ipynb`` (or ``NN_name.py``) beside the current
notebook or in ``../NN_name/``, and runs its code cells the way the grader does (cells
tagged ``skip-grading`` are left out, magics and ``!`` lines do nothing, a cell that raises
is reported and the next cells still run). Edit the earlier notebook, save it, and the next
``load_stage`` call picks the change up.

When grading, the grader hands the child the same submission's files (already parsed by
the trusted side): nothing is read from disk, and a stage missing from the submission is
an ImportError that says so.
"""

from __future__ import annotations

import linecache
import sys
import types
from pathlib import Path
from typing import Any

from autograder.runtime.submission import Submission

Cells = list[tuple[str, str]]  # (label, Python source)

_provided: dict[str, Cells] | None = None  # set in the grading child only
_globals: dict[str, Any] = {}
_loaded: dict[tuple[str, float | None], types.ModuleType] = {}
_loading: list[str] = []


def provide(parts: dict[str, Cells], extra_globals: dict[str, Any] | None = None) -> None:
    """Grading: serve ``load_stage`` from these parsed files and never from disk."""
    global _provided, _globals
    _provided = {str(k): [(str(a), str(b)) for a, b in v] for k, v in parts.items()}
    _globals = dict(extra_globals or {})
    _loaded.clear()


def load_stage(stage: str, where: Path | str | None = None) -> types.ModuleType:
    """Run your own ``stage`` notebook (or .py file) as a module and return the module."""
    if stage in _loading:
        raise ImportError(f"{stage} loads itself (through {' -> '.join(_loading)}): remove that call")
    if _provided is not None:
        if stage not in _provided:
            raise ImportError(
                f"this stage uses your {stage}, but the submission holds no {stage}.ipynb or "
                f"{stage}.py: hand it in together with this notebook"
            )
        key: tuple[str, float | None] = (stage, None)
        cells_of = lambda: _provided[stage]  # noqa: E731
    else:
        path = Submission.beside(stage, Path(where) if where is not None else Path.cwd())
        key = (str(path.resolve()), path.stat().st_mtime)
        cells_of = lambda: _read_cells(path, stage)  # noqa: E731
    if key in _loaded:
        return _loaded[key]
    cells = cells_of()
    module = types.ModuleType(f"bertlab_{stage}", f"Your {stage}, run as a module.")
    module.__dict__.update(_globals)
    sys.modules[module.__name__] = module  # a @dataclass looks its module up there
    _loading.append(stage)
    try:
        for label, source in cells:
            filename = f"<{stage} {label}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            try:
                exec(compile(source, filename, "exec"), module.__dict__)
            except Exception as exc:  # as in a kernel: report it, run the next cell
                print(f"[{stage}] {label} raised {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        _loading.pop()
    _loaded[key] = module
    return module


def _read_cells(path: Path, stage: str) -> Cells:
    from autograder.runtime.load import load_source

    _globals.setdefault("get_ipython", Silent)
    return load_source(path, stage).cells


class Silent:
    """The earlier notebook's magics and ``!`` lines do nothing when it is loaded as a part."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

"""The hidden reference implementation of every bertlab stage.

Only the trusted grader process imports this package. Student code runs in a child
process that never imports it (see autograder/sandbox/forkserver.py), and the released student
bundle does not contain it. Modules are named after their stage (``01_attention``), so
load them with :func:`load`.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def load(stage: str) -> ModuleType:
    """Import the reference module of ``stage`` (e.g. ``"01_attention"``)."""
    return importlib.import_module(f"{__name__}.{stage}")

"""Stage registry: every ``NN_name.py`` here (and in ``$BERTLAB_STAGE_PATH`` directories)
defines ``SPEC``. Adding a stage is adding a file; nothing else in the pipeline changes
(``python -m autograder new-stage`` writes one to fill in; README.md, "Adding a stage")."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from autograder.stages.unfilled import check_filled

if TYPE_CHECKING:  # importing the spec module imports torch: stage_ids() must stay instant
    from collections.abc import Callable

    from autograder.stages.spec import StageSpec

_STAGE_FILE = re.compile(r"^(\d\d_[a-z0-9_]+)\.py$")
STAGE_PATH_ENV = "BERTLAB_STAGE_PATH"
# the references of this checkout's stages (``reference.load``), read by the guard below
_REFERENCE = Path(__file__).resolve().parents[2] / "reference"


def _files() -> dict[str, Path]:
    dirs = [Path(__file__).parent]
    dirs += [Path(p) for p in os.environ.get(STAGE_PATH_ENV, "").split(os.pathsep) if p]
    found: dict[str, Path] = {}
    for d in dirs:
        for f in sorted(d.glob("*.py")):
            m = _STAGE_FILE.match(f.name)
            if m:
                found.setdefault(m.group(1), f)
    return dict(sorted(found.items()))


def stage_ids() -> list[str]:
    return list(_files())


@cache
def _load(stage: str, path: Path) -> StageSpec:
    # A stage scaffolded by new-stage and not yet written must never grade (nor give data,
    # notebooks or a zip): refused before its code runs, naming what to write.
    check_filled(stage, [path, _REFERENCE / f"{stage}.py"])
    if path.parent == Path(__file__).parent:
        module = importlib.import_module(f"{__name__}.{stage}")
    else:
        spec = importlib.util.spec_from_file_location(f"bertlab_extra_stage_{stage}", path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    result = module.SPEC
    if result.id != stage:
        raise ValueError(f"{path} defines SPEC.id={result.id!r}, expected {stage!r}")
    return result


def load_spec(stage: str) -> StageSpec:
    files = _files()
    if stage not in files:
        known = ", ".join(files) or "none"
        raise KeyError(f"unknown stage {stage!r} (known stages: {known})")
    return _load(stage, files[stage])


def spec_path(stage: str) -> Path:
    """The file that defines ``stage``'s spec."""
    return _files()[stage]


def all_specs() -> list[StageSpec]:
    return [load_spec(s) for s in stage_ids()]


def requires(stage: str, spec_of: Callable[[str], StageSpec] | None = None) -> list[str]:
    """The earlier stages ``stage`` runs, directly or through another (``StageSpec.uses``),
    nearest first: 09 -> [02_multihead, 06_transformer_block, 01_attention]. ``spec_of``:
    where specs come from (default ``load_spec``; a grader's, which looks each up once)."""
    spec_of = spec_of or load_spec
    found: list[str] = []
    todo = list(spec_of(stage).uses)
    while todo:
        s = todo.pop(0)
        if s not in found and s != stage:
            found.append(s)
            todo += spec_of(s).uses
    return found

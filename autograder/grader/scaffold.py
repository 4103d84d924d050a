"""``python -m autograder new-stage NN_name --names a,b``: every file of a new stage, in the
layout the pipeline reads, with each part only the instructor can write marked ``FILL IN:``.

A stage is one spec, one reference module and one solution notebook (DESIGN.md); the student
notebook and its self-check data are generated from them (``generate``). This writes:

- ``autograder/stages/NN_name.py``, the spec: per name a ``Graded`` with a public float32 test
  and a hidden float64 one, a known mistake, its size dimensions (each 1 in a case) and its
  small inputs, which is what tests/test_stages.py holds every stage to;
- ``reference/NN_name.py``: one function per name, shapes in its docstring;
- ``solutions/NN_name/NN_name.ipynb``: the intro, the imports the graded code needs, the
  self-check import, then per task its prose, its solution cell (nbgrader metadata and a
  ``### BEGIN/END SOLUTION`` region, which generate_assignment replaces by the stub) and its
  ``check(name)`` cell, then the mistakes the grader names; every cell that only shows or
  checks is tagged ``skip-grading`` (the grader runs the others);
- ``tests/reference/test_NN_name.py``: the reference against code nobody here wrote;
- the stage's section of CURRICULUM.md: its heading "(N points; T s per call)", a clause per
  name and its misconception ids. Inserted, not printed to paste: the contract test wants a
  section per stage, and one already in the file, in stage order, cannot be forgotten or
  misplaced (while it says ``FILL IN:``, that test fails and says which line to write).

Until every marked line is written the stage cannot grade, generate or pass the contract
test (``autograder/stages/unfilled.py``).
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from pathlib import Path

from autograder.stages import spec_path, stage_ids
from autograder.stages.unfilled import MARKER, unfilled

ROOT = Path(__file__).resolve().parents[2]
STAGE_ID = re.compile(r"^(\d\d)_([a-z][a-z0-9_]*)$")
# the names the notebook's graded cells import (a graded name must not hide them) and that
# its self-check cells use
RESERVED = {"torch", "Tensor", "check", "display"}
# what the scaffold's cases are worth: a public float32 test and a hidden float64 one, as
# every name is graded in both (tests/test_stages.py); the call limit is the spec's default
POINTS = (1, 1)
CALL_S = 5.0


class ScaffoldError(ValueError):
    """The request cannot be scaffolded; the message says what to change."""


@dataclass(frozen=True)
class Name:
    """A graded name and what the scaffold derives from it."""

    name: str
    task: int
    stage: str

    @property
    def clause(self) -> str:
        return f"{self.stage[:2]}.{self.name}"

    @property
    def constant(self) -> str:  # the spec's module-level Graded value, as 01's SOFTMAX
        return self.name.upper()

    @property
    def misconception(self) -> str:  # kebab-case, as every misconception id
        return self.name.lower().replace("_", "-") + "-mistake"

    @property
    def max_score(self) -> int:
        return sum(POINTS)


@dataclass(frozen=True)
class Scaffold:
    stage: str
    title: str
    written: list[Path]  # the files made, in the order the README's checklist reads them
    curriculum: Path
    section: str  # the text inserted into CURRICULUM.md
    before: str | None  # the heading it was inserted before (None: at the end)

    def todo(self) -> list[str]:
        """Every line left to write, ``file:line: FILL IN: ...``."""
        return unfilled([*self.written, self.curriculum])


# -- the request ------------------------------------------------------------------------------


def check_request(stage: str, names: list[str], root: Path = ROOT) -> None:
    """Raise ``ScaffoldError`` saying what to change, unless ``stage`` is a new, well-formed
    id (its number and its name both unused) and ``names`` are new Python identifiers."""
    m = STAGE_ID.match(stage)
    if not m:
        raise ScaffoldError(
            f"{stage!r} is not a stage id: two digits, an underscore, then lowercase letters, digits "
            "and underscores, starting with a letter (e.g. 12_rope)"
        )
    number, short = m.groups()
    for other in stage_ids():
        if other == stage:
            raise ScaffoldError(f"stage {stage} exists already ({_rel(spec_path(other), root)})")
        if other[:2] == number:
            raise ScaffoldError(
                f"stage number {number} is {other}'s: clause ids start with it ([{number}.name]), so "
                f"each stage has its own; the next free one is {_next_free()}"
            )
        if other[3:] == short:
            raise ScaffoldError(f"a stage named {short!r} exists already ({other}): choose another name")
    for path in _paths(stage, root):
        if path.exists():
            raise ScaffoldError(f"{_rel(path, root)} exists already: stage {stage} was started before")
    if re.search(rf"(?m)^## {stage}:", _read(root / "CURRICULUM.md")):
        raise ScaffoldError(f"CURRICULUM.md has a section '## {stage}: ...' already")
    if not names or not all(names):
        raise ScaffoldError("give the stage's graded names, comma-separated: --names rms_norm,rotate_half")
    for n in names:
        if not n.isidentifier() or not n.isascii():
            raise ScaffoldError(
                f"{n!r} is not a Python identifier (ASCII letters, digits and underscores, not starting "
                "with a digit): a graded name is what students define, `def name(...)`"
            )
        if keyword.iskeyword(n):
            raise ScaffoldError(f"{n!r} is a Python keyword: students could not define it")
        if n.upper() == "SPEC":
            raise ScaffoldError(f"{n!r} would be the spec's own name (SPEC): choose another")
        if n in RESERVED:
            raise ScaffoldError(f"{n!r} would hide what the notebook imports ({', '.join(sorted(RESERVED))})")
        if n.startswith("_"):
            raise ScaffoldError(f"{n!r} starts with '_': a graded name is public")
    lowered = [n.lower() for n in names]
    if len(set(lowered)) != len(lowered):
        raise ScaffoldError(f"names repeat (letter case aside): {', '.join(names)}")


def _next_free() -> str:
    """The number after the last stage's, as the course's next stage."""
    return f"{max((int(s[:2]) for s in stage_ids()), default=0) + 1:02d}"


def _paths(stage: str, root: Path) -> list[Path]:
    """The files a stage is made of, in the order the checklist reads them."""
    return [
        root / "autograder" / "stages" / f"{stage}.py",
        root / "reference" / f"{stage}.py",
        root / "solutions" / stage / f"{stage}.ipynb",
        root / "tests" / "reference" / f"test_{stage}.py",
        root / "assignments" / stage,
    ]


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


# -- the spec ---------------------------------------------------------------------------------

SPEC_HEAD = '''"""Stage {number}: {title} (CURRICULUM.md, {stage}).

Written by `python -m autograder new-stage`: each line it marked FILL IN says what to write
there (then delete the mark). Nothing grades this stage until none is left; README.md,
"Adding a stage", has the checklist.
"""

from __future__ import annotations

import torch
from torch import Tensor

import reference
from autograder.stages.spec import Case, CaseData, Dim, Graded, StageSpec, Test, Variant, randn

ref = reference.load("{stage}")
'''

SPEC_NAME = '''
# -- Task {task}: {name} {rule}

# FILL IN: {name}'s arguments. A builder makes one call's arguments from the generator g (never
# torch's global one: a case is the same on every machine) in the test's dtype; randn's values
# become small integers in the counterexamples. As written, {name} takes one tensor x (B, d).


def _{name}_args(b: int, d: int, scale: float = 1.0):
    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        return CaseData(args=(randn(g, b, d, dtype=dtype, scale=scale),))

    return build


def _{name}_mistake(x: Tensor) -> Tensor:
    """A mistake students make in {name}, computed with its signature."""
    # FILL IN: the mistake, written from the reference (e.g. ref.{name} without one of its
    # terms); rename "{misconception}" below, here, in SPEC.misconceptions and in CURRICULUM.md
    raise NotImplementedError


{constant} = Graded(
    name="{name}",
    clause="{clause}",
    task={task},
    signature="{name}(x) -> (B, d)",  # FILL IN: as students read it, with shapes
    outputs=("y",),  # a name per returned value: ("out", "weights") for a pair
    reference=ref.{name},
    forbidden=(),  # aten operators it may not call ("aten::_softmax"); its clause lists them
    variants=(Variant("{misconception}", _{name}_mistake),),
    # each size dimension of its inputs, 1 in some graded case (tests/test_stages.py)
    dims=(Dim("B", lambda c: c.args[0].size(0)), Dim("d", lambda c: c.args[0].size(1))),
    # the smallest inputs that show each mistake, tried in order for a public counterexample
    # (the last one as large as the graded cases' values)
    small=(
        _{name}_args(1, 1),
        _{name}_args(1, 2),
        _{name}_args(2, 2),
        _{name}_args(2, 2, scale=4.0),
    ),
    tests=(
        Test(
            "float32",
            torch.float32,
            points={public_points},
            hidden=False,
            cases=(Case("B=3, d=4", _{name}_args(3, 4)), Case("B=2, d=5", _{name}_args(2, 5))),
        ),
        Test(
            "float64",
            torch.float64,
            points={hidden_points},
            cases=(
                Case("B=1, d=6", _{name}_args(1, 6)),
                Case("B=4, d=1", _{name}_args(4, 1)),
                Case("B=5, d=3", _{name}_args(5, 3)),
            ),
        ),
    ),
)
'''

SPEC_TAIL = """
SPEC = StageSpec(
    id="{stage}",
    title="{title}",
    graded=({constants}),
    # a hint per misconception id, as its student reads it: what their output matches, and
    # what to do instead (as 01_attention's "missing-scale")
    misconceptions={{
{hints}
    }},
    call_timeout_s={call_s},  # per call; CURRICULUM.md's heading says it ("{call_s:g} s per call")
)
"""


def spec_source(stage: str, title: str, names: list[Name]) -> str:
    parts = [SPEC_HEAD.format(number=stage[:2], title=title, stage=stage)]
    for n in names:
        rule = "-" * max(3, 90 - len(f"# -- Task {n.task}: {n.name} "))
        parts.append(
            SPEC_NAME.format(
                task=n.task,
                name=n.name,
                rule=rule,
                misconception=n.misconception,
                constant=n.constant,
                clause=n.clause,
                public_points=POINTS[0],
                hidden_points=POINTS[1],
            )
        )
    hints = "\n".join(
        f'        "{n.misconception}": "FILL IN: what {n.name}\'s output matches, and what to do instead",'
        for n in names
    )
    constants = ", ".join(n.constant for n in names) + ("," if len(names) == 1 else "")
    parts.append(SPEC_TAIL.format(stage=stage, title=title, constants=constants, hints=hints, call_s=CALL_S))
    return "".join(parts)


# -- the reference ----------------------------------------------------------------------------

REFERENCE_HEAD = '''"""Stage {number} reference: {title}.

FILL IN: the source each function follows (a paper, its section and equation; a library whose
behaviour it matches), as reference/01_attention.py cites Vaswani et al., section 3.2.1.

Device- and dtype-agnostic; no work at import time.
"""

from __future__ import annotations

from torch import Tensor
'''

REFERENCE_NAME = '''

def {name}(x: Tensor) -> Tensor:
    """FILL IN: what {name} computes, as the lecture writes it.

    x: (B, d). Returns (B, d).
    """
    raise NotImplementedError("FILL IN: {name}, short and read like the math, shapes commented")
'''


def reference_source(stage: str, title: str, names: list[Name]) -> str:
    return REFERENCE_HEAD.format(number=stage[:2], title=title) + "".join(
        REFERENCE_NAME.format(name=n.name) for n in names
    )


# -- the reference's test ---------------------------------------------------------------------

TEST_HEAD = '''"""The stage {number} reference against implementations nobody here wrote.

FILL IN: what each function is checked against (torch.nn, transformers, the paper's own code,
a closed form), as tests/reference/test_01_attention.py checks softmax against torch.softmax.
"""

from __future__ import annotations

import pytest
import torch

import reference

ref = reference.load("{stage}")
pytestmark = pytest.mark.stage{number}

DTYPES = [torch.float32, torch.float64]
TOL = {{torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-13)}}
'''

TEST_NAME = """

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 4), (1, 6), (4, 1)])
def test_{name}_matches_an_independent_implementation(shape, dtype):
    x = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    expected = pytest.fail("FILL IN: {name}(x) computed by code nobody here wrote")
    torch.testing.assert_close(ref.{name}(x), expected, **TOL[dtype])
"""


def reference_test_source(stage: str, names: list[Name]) -> str:
    return TEST_HEAD.format(number=stage[:2], stage=stage) + "".join(
        TEST_NAME.format(name=n.name) for n in names
    )


# -- the solution notebook --------------------------------------------------------------------


def notebook(stage: str, title: str, names: list[Name]):
    """The solution notebook (an ``nbformat`` node), in the layout of solutions/01_attention."""
    import nbformat.v4 as v4

    rows = "\n".join(
        f"| {n.task} | `{n.name}(x)` | {MARKER} what {n.name} does, in a few words |" for n in names
    )
    cells = [
        v4.new_markdown_cell(
            f"# Stage {stage[:2]} — {title}\n\n"
            f"{MARKER} what this stage builds and why, with the lecture's equations ($$...$$), and\n"
            "what it builds on.\n\n"
            "| Task | Graded name | What it does |\n|---|---|---|\n" + rows,
            id="intro",
        ),
        # graded: what the solution cells need (a student's code runs after it)
        v4.new_code_cell("import torch\nfrom torch import Tensor", id="imports"),
        v4.new_code_cell(
            "from autograder.selfcheck import check",
            id="selfcheck-import",
            metadata={"tags": ["skip-grading"]},
        ),
    ]
    for n in names:
        cells += [
            v4.new_markdown_cell(
                f"## Task {n.task}: {n.name}\n\n"
                f"{MARKER} the equation {n.name} implements ($$...$$), its inputs and output with\n"
                f"their shapes, and the choices the contract records ([{n.clause}] in CURRICULUM.md).",
                id=f"task{n.task}-md",
            ),
            v4.new_code_cell(
                f"# Stage {stage[:2]}, Task {n.task}: implement {n.name}.\n"
                f"def {n.name}(x: Tensor) -> Tensor:\n"
                f'    """{MARKER} what {n.name} computes (as the reference\'s docstring).\n\n'
                '    x: (B, d). Returns (B, d).\n    """\n'
                "    ### BEGIN SOLUTION\n"
                f'    raise NotImplementedError("{MARKER} the solution; students get the stub instead")\n'
                "    ### END SOLUTION",
                id=f"task{n.task}-code",
                # nbgrader's solution cell: generate_assignment replaces the region above by the
                # stub (nbgrader_config.py); the grade id is unique in the notebook
                metadata={
                    "nbgrader": {
                        "grade": False,
                        "grade_id": f"task{n.task}_{n.name}",
                        "locked": False,
                        "schema_version": 3,
                        "solution": True,
                    }
                },
            ),
            v4.new_code_cell(
                f"check({n.name})", id=f"task{n.task}-check", metadata={"tags": ["skip-grading"]}
            ),
        ]
    mistakes = "\n".join(
        f"* `{n.misconception}`: {MARKER} the mistake, as a student would recognise it." for n in names
    )
    cells.append(
        v4.new_markdown_cell(
            "## Common mistakes the grader recognises\n\n"
            "When a failing output matches a known mistake, the self-check and the grader name it\n"
            "(`misconception:<id>`):\n\n" + mistakes + "\n\n"
            "Before you submit: restart the kernel and run all cells, and check that every self-check\n"
            "passes.",
            id="mistakes-md",
        )
    )
    nb = v4.new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return nb


# -- CURRICULUM.md ----------------------------------------------------------------------------


def curriculum_section(stage: str, title: str, names: list[Name]) -> str:
    """The stage's section: the heading the contract test reads ("(N points; T s per call)",
    the spec's total and ``call_timeout_s``), a clause per name (its signature followed by
    ``(N points)`` and a "Forbidden:" sentence) and the misconception ids, backticked, each
    explained in parentheses."""
    total = sum(n.max_score for n in names)
    lines = [f"## {stage}: {title} ({total} points; {CALL_S:g} s per call)", ""]
    for n in names:
        lines += [
            f"- **[{n.clause}]** `{n.name}(x) -> (B, d)` ({n.max_score} points): {MARKER} what it",
            "  returns, from what, with shapes and what a student must know to pass (axes that may be",
            "  1, dtypes, ties). Forbidden: nothing.",
        ]
    ids = ", ".join(f"`{n.misconception}` ({MARKER} what it is)" for n in names)
    lines += [f"- **[{stage[:2]}.misconceptions]** {ids}.", ""]
    return "\n".join(lines) + "\n"


def insert_section(text: str, stage: str, section: str) -> tuple[str, str | None]:
    """``text`` with ``section`` before the first stage section numbered after ``stage``, or
    else before "## Decisions recorded here", or else at the end; and that heading."""
    for m in re.finditer(r"(?m)^## (\d\d)_[a-z0-9_]+:.*$|^## Decisions recorded here.*$", text):
        if m[1] is None or int(m[1]) > int(stage[:2]):
            return text[: m.start()] + section + text[m.start() :], m[0]
    return text.rstrip("\n") + "\n\n" + section, None


# -- all of it --------------------------------------------------------------------------------


def new_stage(stage: str, names: list[str], title: str | None = None, root: Path = ROOT) -> Scaffold:
    """Write every file of ``stage`` (see the module's doc); refuse with ``ScaffoldError``
    before writing anything when the request is not a new stage of well-formed names."""
    import nbformat

    names = [n.strip() for n in names]
    check_request(stage, names, root)
    title = title or stage[3:].replace("_", " ").capitalize()
    if '"' in title or "\\" in title or "\n" in title:
        raise ScaffoldError(f"the title {title!r} holds a quote, a backslash or a line break")
    graded = [Name(n, task, stage) for task, n in enumerate(names, start=1)]
    spec_file, ref_file, nb_file, test_file, _ = _paths(stage, root)
    curriculum = root / "CURRICULUM.md"
    section = curriculum_section(stage, title, graded)
    text, before = insert_section(_read(curriculum), stage, section)
    for path, content in (
        (spec_file, spec_source(stage, title, graded)),
        (ref_file, reference_source(stage, title, graded)),
        (test_file, reference_test_source(stage, graded)),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    nb_file.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook(stage, title, graded), nb_file)
    curriculum.write_text(text, encoding="utf-8")
    return Scaffold(stage, title, [spec_file, ref_file, nb_file, test_file], curriculum, section, before)


def checklist(stage: str) -> list[str]:
    """The commands that take a filled stage to a released one, in order (README.md, "Adding
    a stage", lists the same; tests/test_new_stage.py runs them)."""
    return [
        f"python -m autograder generate {stage}",
        f"python -m autograder generate --check --cpu default {stage}",
        f"python -m autograder grade solutions/{stage} --stage {stage}",
        f"python -m autograder grade assignments/{stage} --stage {stage}",
        f"python -m pytest -q tests/reference/test_{stage}.py tests/test_stages.py tests/test_curriculum.py "
        f"-k {stage}",
        "ruff check .",
    ]

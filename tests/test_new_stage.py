"""Adding a stage as README.md's "Adding a stage" says it (issue 28), in a copy of the course.

`new-stage` scaffolds a two-function stage. Unfilled, it cannot grade, generate or pass the
contract test, and each refusal names the file and line to write. Filled (only the lines it
marked, as an instructor would), the README's checklist, run command by command as written,
takes it to a released stage: its student material generated and in sync under the plain CPU
kernels, its solution at full marks and its student notebook at 0, its tests and lint passing.
The real tree is never written: everything happens in a temporary copy of it, whose own code
runs (``python -m autograder`` from its root).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.grader import scaffold
from autograder.stages.unfilled import MARKER
from tests.support import ROOT

STAGE = "99_demo"
NAMES = ["rms_norm", "silu"]
README_STAGE = "12_rope"  # the example the README's commands are written for
# what a course copy needs to scaffold, generate, grade, test and lint one stage
COPIED = ["autograder", "reference", "CURRICULUM.md", "nbgrader_config.py", "pyproject.toml"]
COPIED_TESTS = ["__init__.py", "conftest.py", "support.py", "test_stages.py", "test_curriculum.py"]


def _readme_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\n### Adding a stage\n" in text, "README.md has no 'Adding a stage' section"
    return re.split(r"\n#{2,3} ", text.split("\n### Adding a stage\n", 1)[1], maxsplit=1)[0]


def readme_commands() -> list[str]:
    """The shell commands of the README's "Adding a stage" block, comments off."""
    block = _readme_section().split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def course_copy(where: Path) -> Path:
    """A copy of this course's code, contract and tests, with no stage of 99 and no notebooks."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, where / name, ignore=ignore)
        else:
            shutil.copy2(src, where / name)
    (where / "tests" / "reference").mkdir(parents=True)
    for name in COPIED_TESTS:
        shutil.copy2(ROOT / "tests" / name, where / "tests" / name)
    shutil.copy2(ROOT / "tests" / "reference" / "__init__.py", where / "tests" / "reference")
    return where


def shell(command: str, root: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``command`` as an instructor types it at the copy's root, the venv first on the PATH."""
    # an instructor's shell: nothing of this pytest run (xdist's worker ids) or of another course
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "BERTLAB_STAGE_PATH", "BERTLAB_EXPECTED_DIR")
        and not k.startswith("PYTEST_")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "200"
    return subprocess.run(
        ["bash", "-c", command], cwd=root, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def course(tmp_path):
    """A course copy holding the scaffold of ``STAGE``, unfilled, as `new-stage` wrote it."""
    root = course_copy(tmp_path / "course")
    made = shell(
        f"python -m autograder new-stage {STAGE} --names {','.join(NAMES)} --title 'RMSNorm and SiLU'", root
    )
    assert made.returncode == 0, made.stderr
    assert f"autograder/stages/{STAGE}.py" in made.stdout and "FILL IN" in made.stdout
    assert made.stdout.strip().splitlines()[-len(scaffold.checklist(STAGE)) :] == [
        f"  {c}" for c in scaffold.checklist(STAGE)
    ]
    return root


# -- what the scaffold refuses -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "names", "says"),
    [
        ("12-rope", "a,b", "'12-rope' is not a stage id"),
        ("12_Rope", "a,b", "is not a stage id"),
        ("rope", "a,b", "is not a stage id"),
        ("01_attention", "a,b", "stage 01_attention exists already (autograder/stages/01_attention.py)"),
        ("01_rope", "a,b", "stage number 01 is 01_attention's"),
        ("98_attention", "a,b", "a stage named 'attention' exists already (01_attention)"),
        ("98_rope", "", "give the stage's graded names"),
        ("98_rope", "rms-norm,b", "'rms-norm' is not a Python identifier"),
        ("98_rope", "2x,b", "'2x' is not a Python identifier"),
        ("98_rope", "lambda,b", "'lambda' is a Python keyword"),
        ("98_rope", "torch", "would hide what the notebook imports"),
        ("98_rope", "f,F", "names repeat"),
    ],
)
def test_new_stage_refuses_an_id_or_names_it_cannot_scaffold_and_says_why(stage, names, says):
    with pytest.raises(scaffold.ScaffoldError) as refused:
        scaffold.check_request(stage, names.split(",") if names else [], ROOT)
    assert says in str(refused.value)


def test_a_refused_request_writes_nothing_and_exits_2():
    before = sorted(p.name for p in (ROOT / "autograder" / "stages").iterdir())
    proc = shell("python -m autograder new-stage 98_demo --names 'f,rms-norm'", ROOT)
    assert proc.returncode == 2, proc.stdout
    assert "error: 'rms-norm' is not a Python identifier" in proc.stderr
    assert sorted(p.name for p in (ROOT / "autograder" / "stages").iterdir()) == before
    assert not (ROOT / "reference" / "98_demo.py").exists() and not (ROOT / "solutions" / "98_demo").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ("--check --cpu avx3 01_attention", "--cpu takes default or avx2, not 'avx3'"),
        ("--cpu default 01_attention", "add --check"),
        ("--check 00_nothing", "unknown stage 00_nothing"),
    ],
)
def test_generate_refuses_a_check_it_cannot_make(args, says):
    proc = shell(f"python -m autograder generate {args}", ROOT)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr


# -- unfilled: refused, with what to write ------------------------------------------------------


def test_an_unfilled_scaffold_refuses_to_grade_generate_or_pass_the_contract_test(course):
    spec_file = course / "autograder" / "stages" / f"{STAGE}.py"
    # every file new-stage wrote has something to write, the CURRICULUM section too
    for path in (spec_file, course / "reference" / f"{STAGE}.py", course / "CURRICULUM.md"):
        assert MARKER in path.read_text(), path
    graded = shell(f"python -m autograder grade solutions/{STAGE} --stage {STAGE}", course)
    assert graded.returncode == 1 and "results" not in graded.stdout
    assert f"stage {STAGE} is not written yet, so it cannot be graded" in graded.stderr
    # each line left is named: the file, the line, what to write
    assert re.search(rf"{re.escape(str(spec_file))}:\d+: # FILL IN: rms_norm's arguments", graded.stderr)
    assert f"reference/{STAGE}.py:" in graded.stderr and "internal error" not in graded.stderr
    made = shell(f"python -m autograder generate {STAGE}", course)
    assert made.returncode == 1 and "its student material cannot be generated" in made.stderr
    assert not (course / "assignments" / STAGE).exists()
    contract = shell(f"python -m pytest -q -p no:cacheprovider tests/test_curriculum.py -k {STAGE}", course)
    assert contract.returncode != 0
    assert f"stage {STAGE} is not written yet" in contract.stdout and "FILL IN: rms_norm" in contract.stdout


# -- filled as an instructor would, then the README's checklist ---------------------------------


def replace(path: Path, edits: dict[str, str]) -> None:
    """Each ``old`` of ``edits``, found exactly once in ``path``, replaced by ``new``."""
    text = path.read_text()
    for old, new in edits.items():
        assert text.count(old) == 1, f"{path.name}: {old!r} is there {text.count(old)} times"
        text = text.replace(old, new)
    path.write_text(text)


def fill(root: Path) -> None:
    """Write what the scaffold marked, line by line: RMSNorm (no gain) and SiLU, one known
    mistake each. Each marked line is replaced (or its mark deleted when what it proposes is
    right, as the cases' builders, x (B, d)); nothing else is touched."""
    eps = "1e-6"
    rms = f"x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + {eps})"
    summed = f"x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + {eps})"
    stages = root / "autograder" / "stages" / f"{STAGE}.py"
    edits = {
        "FILL IN: what rms_norm's output matches, and what to do instead": (
            "your output divides x by the root of the sum of squares: take their mean"
        ),
        "FILL IN: what silu's output matches, and what to do instead": (
            "your output matches sigmoid(x) alone: SiLU multiplies it by x"
        ),
    }
    for name, mistake in (("rms_norm", summed), ("silu", "torch.sigmoid(x)")):
        kebab = name.replace("_", "-")
        edits |= {
            f"# FILL IN: {name}'s arguments.": f"# {name}'s arguments.",
            f"    # FILL IN: the mistake, written from the reference (e.g. ref.{name} without one of its\n"
            f'    # terms); rename "{kebab}-mistake" below, here, in SPEC.misconceptions and in CURRICULUM.md\n'
            "    raise NotImplementedError\n": f"    return {mistake}\n",
            f'signature="{name}(x) -> (B, d)",  # FILL IN: as students read it, with shapes': (
                f'signature="{name}(x) -> (B, d)",'
            ),
        }
    replace(stages, edits)
    # the ids the scaffold proposed, renamed for the mistakes they are (everywhere they occur)
    text = stages.read_text()
    renames = {"rms-norm-mistake": "rms-sum-not-mean", "silu-mistake": "silu-sigmoid-only"}
    for old, new in renames.items():
        assert text.count(f'"{old}"') == 2, old  # its Variant and its hint
        text = text.replace(f'"{old}"', f'"{new}"')
    stages.write_text(text)
    replace(
        root / "reference" / f"{STAGE}.py",
        {
            "from torch import Tensor\n": "import torch\nfrom torch import Tensor\n",
            "FILL IN: the source each function follows (a paper, its section and equation; a library whose\n"
            "behaviour it matches), as reference/01_attention.py cites Vaswani et al., section 3.2.1.": (
                "RMSNorm: Zhang and Sennrich, 2019, eq. 4 (without its gain). SiLU: Elfwing et al., 2018."
            ),
            '"""FILL IN: what rms_norm computes, as the lecture writes it.': '"""x / sqrt(mean(x^2) + 1e-6) over d.',
            '"""FILL IN: what silu computes, as the lecture writes it.': '"""x * sigmoid(x), elementwise.',
            'raise NotImplementedError("FILL IN: rms_norm, short and read like the math, shapes commented")': (
                f"return {rms}  # (B, d)"
            ),
            'raise NotImplementedError("FILL IN: silu, short and read like the math, shapes commented")': (
                "return x * torch.sigmoid(x)  # (B, d)"
            ),
        },
    )
    replace(
        root / "tests" / "reference" / f"test_{STAGE}.py",
        {
            "FILL IN: what each function is checked against (torch.nn, transformers, the paper's own code,\n"
            "a closed form), as tests/reference/test_01_attention.py checks softmax against torch.softmax.": (
                "torch.nn.functional.rms_norm and torch.nn.functional.silu."
            ),
            'expected = pytest.fail("FILL IN: rms_norm(x) computed by code nobody here wrote")': (
                f"expected = torch.nn.functional.rms_norm(x, (x.size(-1),), eps={eps})"
            ),
            'expected = pytest.fail("FILL IN: silu(x) computed by code nobody here wrote")': (
                "expected = torch.nn.functional.silu(x)"
            ),
        },
    )
    notebook = root / "solutions" / STAGE / f"{STAGE}.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    cells = {c.id: c for c in nb.cells}
    solutions = {"rms_norm": rms, "silu": "x * torch.sigmoid(x)"}
    for task, name in enumerate(NAMES, start=1):
        md, code = cells[f"task{task}-md"], cells[f"task{task}-code"]
        md.source = re.sub(
            r"FILL IN: .*", f"Implement {name} over the last axis of x.", md.source, flags=re.S
        )
        code.source = re.sub(r'"""FILL IN: [^\n]*', f'"""{name} of x, over its last axis.', code.source)
        code.source = re.sub(r"raise NotImplementedError\([^\n]*", f"return {solutions[name]}", code.source)
    for cell in (cells["intro"], cells["mistakes-md"]):
        cell.source = re.sub(r"FILL IN: ", "", cell.source)
    for old, new in renames.items():
        cells["mistakes-md"].source = cells["mistakes-md"].source.replace(f"`{old}`", f"`{new}`")
    nbformat.write(nb, notebook)
    curriculum = root / "CURRICULUM.md"
    text = curriculum.read_text()
    text = text.replace("`rms-norm-mistake` (FILL IN: what it is)", "`rms-sum-not-mean` (a sum over d)")
    text = text.replace("`silu-mistake` (FILL IN: what it is)", "`silu-sigmoid-only` (no factor x)")
    meaning = {"rms_norm": "`x / sqrt(mean(x^2) + 1e-6)` over d", "silu": "`x * sigmoid(x)` elementwise"}
    for name, says in meaning.items():
        text, n = re.subn(
            rf"(`{name}\(x\) -> \(B, d\)` \(2 points\): )FILL IN: what it\n.*?ties\)\. ",
            rf"\g<1>{says}; B and d may be 1.\n  ",
            text,
            flags=re.S,
        )
        assert n == 1, name
    curriculum.write_text(text)


@pytest.mark.slow
def test_a_filled_scaffold_is_released_by_the_readmes_checklist(course):
    t0 = time.monotonic()
    fill(course)
    commands = readme_commands()
    # the README's checklist is the one `new-stage` prints, for the README's example stage
    scaffolded, grep, *checklist = commands
    assert scaffolded.startswith(f"python -m autograder new-stage {README_STAGE} --names ")
    assert checklist == scaffold.checklist(README_STAGE)
    left = shell(grep.replace(README_STAGE, STAGE), course)
    assert left.returncode == 1 and left.stdout == "", left.stdout + left.stderr  # nothing left to write
    times, results = {}, {}
    for command in checklist:
        command = command.replace(README_STAGE, STAGE)
        graded = command.split()[4].split("/")[0] if " grade " in command else None
        if graded:  # as written, and where to write the scores read below
            command += f" --results {course / graded}.json"
        start = time.monotonic()
        done = shell(command, course, timeout=300)
        times[command] = round(time.monotonic() - start, 1)
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if graded:
            results[graded] = json.loads((course / f"{graded}.json").read_text())
        results[command] = done.stdout
    solved = results["solutions"]
    assert solved["score"] == sum(t["max_score"] for t in solved["tests"]) == 4, solved
    assert results["assignments"]["score"] == 0
    public = [t for t in results["assignments"]["tests"] if "hidden cases" not in t["output"]]
    assert len(public) == len(NAMES)  # a public test each, whose message a student reads:
    assert all("not implemented yet" in t["output"] for t in public), public
    assert (course / "assignments" / STAGE / f"{STAGE}.selfcheck.safetensors").is_file()
    assert (
        f"up to date under the default kernels: {STAGE}" in results[checklist[1].replace(README_STAGE, STAGE)]
    )
    tests = re.search(r"(\d+) passed", results[checklist[4].replace(README_STAGE, STAGE)])
    assert tests and int(tests[1]) > 2 * 3 * 2, "the stage's own tests ran, not only its reference's"
    print(f"scaffold filled and checked in {time.monotonic() - t0:.1f} s: {json.dumps(times, indent=1)}")

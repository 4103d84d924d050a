"""The trust zones are folders, and the imports between them go one way (static: every
``import`` of every module, lazy ones inside functions included, read with ``ast``).

- ``autograder/runtime/`` ships to students (the release is that folder) and runs in the
  sandboxed child: it imports nothing of bertlab's outside itself.
- ``autograder/sandbox/`` (the fork server, the child, its confinement) may import the
  runtime, never the grader: the child must not hold what the grader holds.
- Neither imports ``reference`` or ``autograder.stages`` (hidden cases, variants).
- The package's top level is the package doc, ``python -m autograder`` and the two names
  student notebooks import, which re-export the runtime.
- No cycle among bertlab's modules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autograder.grader.release import ROOT, imports

PACKAGE = ROOT / "autograder"
ZONES = ("runtime", "sandbox", "grader", "stages")
NEVER_IN_UNTRUSTED = ("reference", "autograder.stages", "autograder.grader")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {
    _module(p): p
    for p in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "reference").glob("*.py")])
    if "__pycache__" not in p.parts
}


def _first_party(module: str) -> set[str]:
    """The bertlab modules ``module`` imports (``from x import y`` counts as x.y when that
    is a module, else as x)."""
    found = set()
    for name in imports(MODULES[module], module):
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name.split(".")[0] in ("autograder", "reference") and name != module:
            found.add(name)
    return found


GRAPH = {m: _first_party(m) for m in MODULES}


def _in(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_top_level_holds_the_zones_and_the_student_entry_points_only():
    assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(
        ZONES
    )
    top = {p.name for p in PACKAGE.glob("*.py")}
    assert top == {"__init__.py", "__main__.py", "selfcheck.py", "parts.py"}
    for name in ("autograder.selfcheck", "autograder.parts"):
        assert GRAPH[name] and all(_in(m, "autograder.runtime") for m in GRAPH[name]), (name, GRAPH[name])
    assert GRAPH["autograder"] == set()


@pytest.mark.parametrize("module", [m for m in MODULES if _in(m, "autograder.runtime")])
def test_the_shipped_runtime_imports_only_itself(module):
    outside = {m for m in GRAPH[module] if not _in(m, "autograder.runtime")}
    assert not outside, f"{module} ships to students and runs in the child, but imports {sorted(outside)}"


@pytest.mark.parametrize("module", [m for m in MODULES if _in(m, "autograder.sandbox")])
def test_the_sandbox_never_imports_the_grader_or_hidden_material(module):
    bad = {m for m in GRAPH[module] if any(_in(m, s) for s in NEVER_IN_UNTRUSTED)}
    assert not bad, f"{module} runs beside student code, but imports {sorted(bad)}"
    assert all(
        _in(m, "autograder.runtime") or _in(m, "autograder.sandbox") or m == "autograder.parts"
        for m in GRAPH[module]
    ), GRAPH[module]


def test_the_walk_sees_the_imports_it_must_judge():
    """The graph is real: known edges are found, lazy ones (inside functions) included."""
    assert "autograder.sandbox.child" in GRAPH["autograder.sandbox.forkserver"]  # lazy, in _child
    assert "autograder.runtime.harness" in GRAPH["autograder.runtime.selfcheck"]
    assert "autograder.stages" in GRAPH["autograder.grader.grade"]
    assert "autograder.runtime.load" in GRAPH["autograder.runtime.parts"]


def test_no_import_cycle():
    cycles, state = [], dict.fromkeys(GRAPH, 0)  # 0 unseen, 1 on the path, 2 done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(GRAPH[m]):
            if state[n] == 1:
                cycles.append(path[path.index(n) :] + [n])
            elif state[n] == 0:
                visit(n, [*path, n])
        state[m] = 2

    for m in sorted(GRAPH):
        if state[m] == 0:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)

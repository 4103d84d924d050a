"""An instructor's own gradescope-utils tests, graded beside bertlab's (``gradescope-zip --tests DIR``).

Instructors with Gradescope autograders write ``unittest`` tests decorated with
gradescope-utils' ``@weight``, ``@partial_credit``, ``@visibility``, ``@number``, ``@tags`` and
``@hide_errors``, and run them with its ``JSONTestRunner``. Such files join a zip as
``instructor_tests/*.py`` and land in the same results.json, after bertlab's tests.

What each side may trust:

- **The list of tests is read at build time, from the files' syntax** (``declare``; the
  parent never imports them). A test's name, weight, visibility, number and tags are the
  decorators' literal arguments, as gradescope-utils 0.5.0 would give them; an argument that
  is not a literal is refused when the zip is built, since only running the file could say
  what it is.
- **The tests run only in a confined child** (``runner.run_public``: the submission's own
  cells first, then one cell running the tests with the real ``JSONTestRunner``), which
  never receives a hidden input. The student's module is importable as ``submission``.
  Each result is written as a line of its own as the test ends, so a test that hangs costs
  the tests after it and not those before.
- **The student's code runs in the tests' process**, as with any gradescope-utils
  autograder, so it could tamper with what they report. What the parent keeps bounds that:
  only the tests declared at build time, each score clamped to ``[0, weight]``, visibility,
  weight and name from the declaration, and a test with no result is failed, "did not run".
  bertlab's own tests, whose verdicts come from the parent's comparison with values the
  child never sees, are untouched by anything this child does. Nothing secret should go in
  these files: the student's code can read them.
"""

from __future__ import annotations

import ast
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autograder.grader.grade import Grader

FOLDER = "instructor_tests"  # where the files go in the zip
ALIAS = "submission"  # the name the tests import the student's module by
TIMEOUT_S = 60.0  # all of a submission's instructor tests, by default
MARKER = "\x1ebertlab-instructor-test "  # a result line; the record separator starts it
MAX_READ = 1 << 20  # what the parent reads of the child's output
MAX_OUTPUT = 8000  # one test's output, as results.json shows it
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
# gradescope-utils' decorators that carry something into the results (leaderboard: refused)
DECORATORS = {"weight", "partial_credit", "number", "visibility", "tags", "hide_errors", "leaderboard"}


@dataclass(frozen=True)
class Declared:
    """One test as its file declares it (``declare``): all the results file shows of it that
    does not depend on running it."""

    id: str  # unittest's test.id(): "<file stem>.<class>.<method>"
    name: str  # gradescope-utils' name: the docstring's first line, else "method (id)"
    weight: float | None  # None: the test carries no score (gradescope-utils leaves it out)
    visibility: str = "visible"
    number: str | None = None
    tags: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Declared:
        return cls(d["id"], d["name"], d["weight"], d["visibility"], d["number"], list(d["tags"]))


# -- build time: the files' syntax ---------------------------------------------------------------


def _name_of(node: ast.expr) -> str | None:
    """``weight`` for ``weight``, ``decorators.weight`` or ``gsu.decorators.weight``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _literal(node: ast.expr, where: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ValueError(f"{where}: {ast.unparse(node)!r} is not a literal; write the value itself") from None


def _decorations(fn: ast.FunctionDef | ast.AsyncFunctionDef, where: str) -> dict[str, Any]:
    """What gradescope-utils' decorators on ``fn`` set, read from their literal arguments."""
    found: dict[str, Any] = {}
    for dec in fn.decorator_list:
        if not isinstance(dec, ast.Call) or _name_of(dec.func) not in DECORATORS:
            continue
        kind = _name_of(dec.func)
        at = f"{where}, @{kind}"
        if kind == "leaderboard":
            raise ValueError(
                f"{at}: leaderboard tests are not supported (bertlab's results have no leaderboard)"
            )
        if dec.keywords:
            raise ValueError(f"{at}: pass its value by position, as gradescope-utils documents")
        args = [_literal(a, at) for a in dec.args]
        if kind in ("weight", "partial_credit"):
            value = args[0] if len(args) == 1 else None
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ValueError(f"{at}: the weight must be one number >= 0, not {args!r}")
            found["weight"] = float(value)
        elif kind == "number":
            if len(args) != 1:
                raise ValueError(f'{at}: one value, as in @number("2.1")')
            found["number"] = str(args[0])
        elif kind == "visibility":
            if len(args) != 1 or args[0] not in VISIBILITIES:
                raise ValueError(f"{at}: one of {', '.join(VISIBILITIES)}, not {args!r}")
            found["visibility"] = args[0]
        elif kind == "tags":
            if not all(isinstance(a, str) for a in args):
                raise ValueError(f"{at}: tags are strings")
            found["tags"] = list(args)
    return found


def _test_methods(
    cls: ast.ClassDef, classes: dict[str, ast.ClassDef], seen: frozenset[str] = frozenset()
) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """``cls``'s test methods, those of its bases in the same file included (the subclass's
    own win, as Python's lookup gives them)."""
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for base in reversed(cls.bases):
        name = _name_of(base)
        if name in classes and name not in seen:
            methods.update(_test_methods(classes[name], classes, seen | {cls.name}))
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            methods[node.name] = node
    return methods


def _is_test_case(
    cls: ast.ClassDef, classes: dict[str, ast.ClassDef], seen: frozenset[str] = frozenset()
) -> bool:
    for base in cls.bases:
        name = _name_of(base) or ""
        if name.endswith("TestCase"):
            return True
        if name in classes and name not in seen and _is_test_case(classes[name], classes, seen | {cls.name}):
            return True
    return False


def check_stem(path: Path) -> str:
    """The module name a test file runs as: its stem, which must not hide another module."""
    stem = path.stem
    if not stem.isidentifier():
        raise ValueError(f"{path}: its name must be a Python identifier (it is imported as {stem!r})")
    if (
        stem == ALIAS
        or stem in sys.stdlib_module_names
        or stem in ("autograder", "reference", "gradescope_utils")
    ):
        raise ValueError(
            f"{path}: the name {stem!r} is taken (the submission or a module the tests need); rename the file"
        )
    return stem


def declare(paths: list[Path]) -> list[Declared]:
    """The tests ``paths`` declare, in unittest's order (files, then classes and methods by
    name), from their syntax alone. Raises ValueError naming the file and line of anything
    that cannot be known without running it."""
    tests: list[Declared] = []
    for path in sorted(paths, key=lambda p: p.name):
        stem = check_stem(path)
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except (SyntaxError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not valid Python: {exc}") from None
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        for cls in sorted(classes.values(), key=lambda c: c.name):
            if not _is_test_case(cls, classes):
                continue
            for method, fn in sorted(_test_methods(cls, classes).items()):
                where = f"{path.name}:{fn.lineno} {cls.name}.{method}"
                found = _decorations(fn, where)
                test_id = f"{stem}.{cls.name}.{method}"
                doc = (ast.get_docstring(fn) or "").strip()
                tests.append(
                    Declared(
                        id=test_id,
                        name=doc.splitlines()[0].strip() if doc else f"{method} ({test_id})",
                        weight=found.get("weight"),
                        visibility=found.get("visibility", "visible"),
                        number=found.get("number"),
                        tags=found.get("tags", []),
                    )
                )
    if not tests:
        raise ValueError(
            f"no unittest test methods (def test...(self) in a TestCase) in {', '.join(map(str, paths))}"
        )
    return tests


def collect(folder: Path) -> tuple[list[tuple[str, bytes]], list[dict[str, Any]]]:
    """The files of ``folder/*.py`` (name in the zip, bytes) and their declared tests, for
    ``gradescope.build_zip``."""
    paths = sorted(folder.glob("*.py"))
    if not folder.is_dir() or not paths:
        raise ValueError(f"--tests {folder}: no .py files there")
    declared = declare(paths)
    files = [(f"{FOLDER}/{p.name}", p.read_bytes()) for p in paths]
    return files, [asdict(d) for d in declared]


# -- run time: the child ----------------------------------------------------------------------------

# The last cell of the child: the tests with gradescope-utils' own runner, each result a
# line as it ends. Inside a function, so nothing it names lands in the student's namespace.
CELL = """\
def _bertlab_instructor_tests(sources, marker, alias):
    import io, json, os, sys, types, unittest
    from gradescope_utils.autograder_utils.json_test_runner import JSONTestResult, JSONTestRunner

    def say(**record):
        data = (marker + json.dumps(record) + "\\n").encode()
        while data:
            data = data[os.write(1, data):]

    class Result(JSONTestResult):
        def buildResult(self, test, err=None):
            result = super().buildResult(test, err)
            say(id=test.id(), result=result)
            return result

    class Runner(JSONTestRunner):
        resultclass = Result

    sys.modules[alias] = sys.modules[__name__]
    sys.stdout.flush()
    sys.stderr.flush()
    try:  # what the submission printed was shown with bertlab's tests: only the results here
        os.ftruncate(1, 0)
    except OSError:
        pass
    say(started=True)
    suite = unittest.TestSuite()
    for stem, source in sources:
        module = types.ModuleType(stem)
        module.__file__ = f"instructor_tests/{stem}.py"
        sys.modules[stem] = module
        try:
            exec(compile(source, module.__file__, "exec"), module.__dict__)
        except BaseException as exc:
            say(file=stem, error=f"{type(exc).__name__}: {exc}"[:2000])
            continue
        suite.addTests(unittest.TestLoader().loadTestsFromModule(module))
    Runner(stream=io.StringIO()).run(suite)
    say(finished=True)


_bertlab_instructor_tests(__SOURCES__, __MARKER__, __ALIAS__)
del _bertlab_instructor_tests
"""


def cell(sources: list[tuple[str, str]]) -> str:
    """The child's cell running ``sources`` ((module stem, source) pairs)."""
    return (
        CELL.replace("__SOURCES__", repr(sources))
        .replace("__MARKER__", repr(MARKER))
        .replace("__ALIAS__", repr(ALIAS))
    )


def parse(stdout: str) -> tuple[dict[str, dict[str, Any]], dict[str, str], bool, bool]:
    """(results by test id, import errors by file stem, started, finished) from the lines the
    child wrote. Anything else, malformed or not, is ignored: the parent keeps only what
    ``results`` checks against the declaration. The first line for an id is its result."""
    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    started = finished = False
    for line in stdout.split("\n"):
        at = line.find(MARKER)
        if at < 0:
            continue
        try:
            record = json.loads(line[at + len(MARKER) :])
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        started |= record.get("started") is True
        finished |= record.get("finished") is True
        if isinstance(record.get("id"), str) and isinstance(record.get("result"), dict):
            results.setdefault(record["id"], record["result"])
        if isinstance(record.get("file"), str) and isinstance(record.get("error"), str):
            errors.setdefault(record["file"], record["error"])
    return results, errors, started, finished


def _score(value: Any, weight: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return min(max(float(value), 0.0), weight)


def entries(declared: list[Declared], stdout: str, why_not: str) -> list[dict[str, Any]]:
    """Gradescope's test entries of ``declared``, from what the child wrote (``stdout``);
    ``why_not``: what a test without a result is told (the run's end, as the parent saw it)."""
    results, errors, started, finished = parse(stdout)
    out = []
    for d in declared:
        got = results.get(d.id)
        entry: dict[str, Any] = {"name": d.name}
        if got is None:
            stem = d.id.split(".", 1)[0]
            if stem in errors:
                reason = f"did not run: its test file failed to load: {errors[stem]}"
            elif not started or finished:
                reason = f"did not run: {why_not}"
            else:
                reason = f"did not run: the tests stopped before it ({why_not})"
            passed, output, score = False, reason, 0.0
        else:
            output = got.get("output") if isinstance(got.get("output"), str) else ""
            score = _score(got.get("score"), d.weight) if d.weight is not None else 0.0
            passed = got.get("status") == "passed" and (d.weight is None or score >= d.weight)
        if d.weight is not None:
            entry.update(score=round(score, 4), max_score=d.weight)
        entry["status"] = "passed" if passed else "failed"
        entry["output"] = (output or ("passed" if passed else "failed"))[:MAX_OUTPUT]
        entry["tags"] = ["instructor", *d.tags]
        entry["visibility"] = d.visibility
        if d.number is not None:
            entry["number"] = d.number
        out.append(entry)
    return out


def run(
    grader: Grader, submission: Path, stage: str, folder: Path, declared: list[Declared], timeout_s: float
) -> list[dict[str, Any]]:
    """Run the instructor's tests (``folder/*.py``) on ``submission``'s ``stage`` in a
    confined child that never receives a hidden input; Gradescope's entries for them."""
    import safetensors.torch

    from autograder.grader.runner import Limits, run_public

    job = grader.jobs(submission).job(stage)
    if job.source is None:
        why = (
            f"its {stage} file cannot be read: {job.failure}"
            if job.handed_in
            else f"no {stage} file in the submission"
        )
        return entries(declared, "", why)
    # files without tests first: the tests' own helpers, which test files import
    has_tests = {d.id.split(".", 1)[0] for d in declared}
    files = sorted(folder.glob("*.py"), key=lambda p: (p.stem in has_tests, p.name))
    sources = [(check_stem(p), p.read_text()) for p in files]
    own = job.limits
    limits = Limits(call_s=own.call_s, cell_s=timeout_s, submission_s=own.submission_s + timeout_s)
    cells = [*job.source.cells, ("instructor tests", cell(sources))]
    report = run_public(
        grader.server,
        cells,
        job.source.module_name,
        [],
        safetensors.torch.save({}),
        grader.device,
        limits,
        job.parts,
        stdout_bytes=MAX_READ,
    )
    failure = report.cell_errors.get(len(cells) - 1)
    why = f"{failure.get('type', 'error')}: {failure.get('message', '')}"[:500] if failure else ""
    return entries(declared, report.stdout, why or "the tests' process ended before it")

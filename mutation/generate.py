"""Mutants of a stage's reference, each a complete student submission (``NN_name.py``).

A reference module is a valid submission once its imports of earlier references become
``load_stage`` calls (the child never imports ``reference``: the student's own earlier
stages are handed to it). Only code a graded name runs is mutated: the graded function
or class, and the top-level helpers and constants it reaches by name. Each mutant records
the graded names it can change, and gets an id that survives unrelated edits:

    <operator>@<qualified name>#<hash of the changed lines before and after>

e.g. ``bertlab/DimChange@softmax#1f0c9a2e``.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import inspect
import pickle
import re
import textwrap
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from cosmic_ray.ast import ast_nodes
from cosmic_ray.mutating import MutationVisitor

from autograder.runtime.drivers import resolve
from autograder.stages import load_spec
from autograder.stages.spec import Graded
from mutation.operators import all_operators, parse

ROOT = Path(__file__).resolve().parent.parent


def submission_source(stage: str) -> str:
    """The reference of ``stage`` as a student would hand it in."""
    text = (ROOT / "reference" / f"{stage}.py").read_text()
    text = re.sub(r"^import reference$", "from autograder.parts import load_stage", text, flags=re.MULTILINE)
    text = text.replace("reference.load(", "load_stage(")
    if any(leaf.type == "name" and leaf.value == "reference" for leaf in _leaves(parse(text))):
        raise ValueError(f"reference/{stage}.py uses `reference` in a way a submission cannot")
    return text


def _leaves(node):
    leaf = node.get_first_leaf()
    while leaf is not None:
        yield leaf
        leaf = leaf.get_next_leaf()


@dataclass
class Mutant:
    stage: str
    id: str
    operator: str
    qualname: str  # innermost def/class, or the top-level name it assigns
    line: int  # 1-based, in the submission's text
    affects: tuple[str, ...]  # graded names whose code it changes
    source: str  # the whole mutated submission
    diff: str  # unified diff against the reference, no context

    @property
    def summary(self) -> str:
        """The changed lines, before -> after, on one line (for tables)."""
        old = [
            line[1:].strip() for line in self.diff.splitlines() if line.startswith("-") and line[1:2] != "-"
        ]
        new = [
            line[1:].strip() for line in self.diff.splitlines() if line.startswith("+") and line[1:2] != "+"
        ]
        return f"`{' / '.join(old)}` -> `{' / '.join(new)}`"


@dataclass
class Generated:
    stage: str
    source: str
    mutants: list[Mutant]
    graded: tuple[str, ...]
    # positions left alone and why: out of the graded code, error paths, annotations,
    # the same program as an earlier mutant, the reference's own bytecode
    skipped: dict[str, int] = field(default_factory=dict)


# -- where a mutation may go --------------------------------------------------------------


def _defined_names(unit) -> list[str]:
    if unit.type in ("funcdef", "classdef"):
        return [unit.name.value]
    if unit.type == "decorated":
        return _defined_names(unit.children[-1])
    if unit.type == "async_stmt":
        return _defined_names(unit.children[-1])
    if unit.type == "simple_stmt":
        names = []
        for stmt in unit.children:
            if stmt.type == "expr_stmt":
                names += [n.value for n in stmt.get_defined_names()]
        return names
    return []


def _referenced_names(unit, annotations: list) -> set[str]:
    """Names ``unit`` reads, not counting attributes (``x.softmax`` is not ``softmax``) nor
    annotations (``model: BertModel`` does not run BertModel)."""
    out = set()
    for leaf in _leaves_within(unit):
        if leaf.type != "name" or any(a.start_pos <= leaf.start_pos < a.end_pos for a in annotations):
            continue
        previous = leaf.get_previous_leaf()
        if previous is not None and previous.type == "operator" and previous.value == ".":
            continue
        out.add(leaf.value)
    return out


def _leaves_within(node):
    leaf, last = node.get_first_leaf(), node.get_last_leaf()
    while leaf is not None:
        yield leaf
        if leaf is last:
            return
        leaf = leaf.get_next_leaf()


def _annotations(module) -> list:
    out = []
    for node in ast_nodes(module):
        if node.type in ("param", "funcdef") and node.annotation is not None:
            out.append(node.annotation)
        elif node.type == "expr_stmt" and len(node.children) > 1 and node.children[1].type == "annassign":
            out.append(node.children[1].children[1])
    return out


def _excluded_spans(module) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
    """(why, start, end) of code no mutant may touch.

    - annotations: with ``from __future__ import annotations`` they are never evaluated;
    - error paths (a ``raise``, and the test of an ``if`` that only raises): the contract
      grades no error, so no case can tell a changed guard from the reference's.
    """
    spans = [("annotation", a.start_pos, a.end_pos) for a in _annotations(module)]
    for node in ast_nodes(module):
        if node.type == "raise_stmt":
            spans.append(("error path", node.start_pos, node.end_pos))
        elif node.type == "if_stmt":
            children = node.children
            for i, child in enumerate(children):
                if (
                    child.type == "keyword"
                    and child.value in ("if", "elif")
                    and _only_raises(children[i + 3])
                ):
                    test = children[i + 1]
                    spans.append(("error path", test.start_pos, test.end_pos))
    return spans


def _only_raises(suite) -> bool:
    statements = (
        [c for c in suite.children if c.type not in ("newline",)] if suite.type == "suite" else [suite]
    )
    return bool(statements) and all(
        s.type == "simple_stmt" and all(c.type in ("raise_stmt", "newline") for c in s.children)
        for s in statements
    )


def _qualname(module, position: tuple[int, int]) -> str:
    leaf = module.get_leaf_for_position(position, include_prefixes=True)
    names = []
    node = leaf
    while node is not None and node.type != "file_input":
        if node.type in ("funcdef", "classdef"):
            names.append(node.name.value)
        top = node
        node = node.parent
    if names:
        return ".".join(reversed(names))
    defined = _defined_names(top) if leaf is not None else []
    return ",".join(defined) or "<module>"


def _fingerprint(code: types.CodeType) -> bytes:
    """What a program does, ignoring where its lines are: two mutants with the same
    fingerprint are one program (``dim=-0`` and ``dim=0``)."""
    h = hashlib.sha256()

    def walk(co: types.CodeType) -> None:
        h.update(co.co_code)
        h.update(repr((co.co_names, co.co_varnames, co.co_freevars, co.co_cellvars)).encode())
        for const in co.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)
            else:
                h.update(repr((type(const).__name__, const)).encode())

    walk(code)
    return h.digest()


def _changed_lines(before: str, after: str) -> tuple[list[str], list[str], int]:
    """The lines that differ, stripped, and the first one's number (1-based)."""
    a, b = before.splitlines(), after.splitlines()
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end_a, end_b = len(a), len(b)
    while end_a > start and end_b > start and a[end_a - 1] == b[end_b - 1]:
        end_a, end_b = end_a - 1, end_b - 1
    return [s.strip() for s in a[start:end_a]], [s.strip() for s in b[start:end_b]], start + 1


def _diff(before: str, after: str, stage: str) -> str:
    return "\n".join(
        difflib.unified_diff(
            before.splitlines(), after.splitlines(), f"reference/{stage}.py", "mutant", n=0, lineterm=""
        )
    )


def driver_names(graded: Graded) -> set[str]:
    """The strings a graded name's driver holds: among them, the names of the student's
    namespace it calls besides the graded one (05's backward driver runs the student's
    forward for its cache; 09's runs the student's BertModel)."""
    if graded.kind != "driver" or graded.driver is None:
        return set()
    source = textwrap.dedent(inspect.getsource(resolve(graded.driver)))
    return {
        n.value
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def graded_reach(
    module, graded: tuple[str, ...], drivers: dict[str, set[str]] | None = None
) -> dict[str, set[str]]:
    """Top-level name -> the graded names that run it (itself included, for a graded name),
    by name or through the graded name's driver (``drivers``: graded name -> names it holds)."""
    drivers = drivers or {}
    units = {name: unit for unit in module.children for name in _defined_names(unit)}
    missing = [g for g in graded if g not in units]
    if missing:
        raise ValueError(f"graded names not defined at the top level of the reference: {missing}")
    annotations = _annotations(module)
    refs = {name: _referenced_names(unit, annotations) & set(units) for name, unit in units.items()}
    reached: dict[str, set[str]] = {name: set() for name in units}
    for g in graded:
        todo, seen = [g, *sorted(drivers.get(g, set()) & set(units))], set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            reached[name].add(g)
            todo += refs[name]
    return reached


def _frozen(unit) -> bytes:
    """``unit`` alone (not the module it hangs in), to thaw a fresh copy per mutant."""
    parent, unit.parent = unit.parent, None
    try:
        return pickle.dumps(unit)  # our own tree, read back in this process only
    finally:
        unit.parent = parent


def _mutate_unit(frozen: bytes, operator, occurrence: int) -> str | None:
    """The text of the unit with the operator's ``occurrence``-th mutation in it, applied by
    cosmic-ray's own visitor (None: nothing to apply). One top-level statement is copied and
    walked, not the module: 07's mutants are made in seconds, not a minute."""
    visitor = MutationVisitor(occurrence, operator)
    walked = visitor.walk(pickle.loads(frozen))
    if not visitor.mutation_applied:
        return None
    return "" if walked is None else walked.get_code()


def generate(stage: str, source: str | None = None) -> Generated:
    """Every mutant of ``stage``'s reference (or of ``source``, a variant of its text) that
    changes the code of a graded name."""
    spec = load_spec(stage)
    graded = tuple(g.name for g in spec.graded)
    source = submission_source(stage) if source is None else source
    module = parse(source)
    reached = graded_reach(module, graded, {g.name: driver_names(g) for g in spec.graded})
    excluded = _excluded_spans(module)
    original = _fingerprint(compile(source, f"{stage}.py", "exec"))
    seen: set[bytes] = {original}
    skipped: dict[str, int] = {}
    ids: dict[str, int] = {}
    mutants = []
    units, offset = [], 0
    for unit in module.children:
        code = unit.get_code()
        affects = sorted(set().union(*(reached.get(n, set()) for n in _defined_names(unit))))
        units.append((unit, offset, offset + len(code), tuple(affects)))
        offset += len(code)
    assert offset == len(source)

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    for op_name, operator in all_operators():
        for unit, begin, end_offset, affects in units:
            positions = [(s, e) for node in ast_nodes(unit) for s, e in operator.mutation_positions(node)]
            if not positions:
                continue
            if not affects:
                skipped["not run by a graded name"] = skipped.get("not run by a graded name", 0) + len(
                    positions
                )
                continue
            frozen = _frozen(unit)
            for occurrence, (start, end) in enumerate(positions):
                why = next((w for w, s, e in excluded if s <= start and end <= e), None)
                if why:
                    skip(why)
                    continue
                text = _mutate_unit(frozen, operator, occurrence)
                mutated = None if text is None else source[:begin] + text + source[end_offset:]
                if mutated is None or mutated == source:
                    skip("no change")
                    continue
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", SyntaxWarning)  # `x is 0`: a mutant, not our code
                        fingerprint = _fingerprint(compile(mutated, f"{stage}.py", "exec"))
                except SyntaxError:
                    skip("not Python")
                    continue
                if fingerprint in seen:
                    skip("same program as the reference or an earlier mutant")
                    continue
                seen.add(fingerprint)
                old, new, line = _changed_lines(source, mutated)
                qualname = _qualname(module, start)
                digest = hashlib.sha256("\n".join([*old, "\0", *new]).encode()).hexdigest()[:8]
                mutant_id = f"{op_name}@{qualname}#{digest}"
                ids[mutant_id] = ids.get(mutant_id, 0) + 1
                if ids[mutant_id] > 1:  # the same change to the same lines twice in one function
                    mutant_id += f"~{ids[mutant_id]}"
                mutants.append(
                    Mutant(
                        stage,
                        mutant_id,
                        op_name,
                        qualname,
                        line,
                        affects,
                        mutated,
                        _diff(source, mutated, stage),
                    )
                )
    return Generated(stage, source, mutants, graded, skipped)

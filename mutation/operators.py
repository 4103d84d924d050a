"""The mutation operators: cosmic-ray's core set, and ours for the mistakes students make.

Ours are cosmic-ray ``Operator`` plugins over parso trees, like the core ones, so one
engine (``cosmic_ray.mutating.mutate_code``) applies both. Each rewrites the text of one
node; ``examples()`` gives cosmic-ray's before/after pairs, which the tests check.
"""

from __future__ import annotations

from collections.abc import Iterator

import cosmic_ray.plugins
import parso
from cosmic_ray.operators.operator import Example, Operator
from parso.python import tree

# -- helpers ------------------------------------------------------------------------------


class Rewritten(tree.PythonLeaf):
    """A node replaced by new text: a leaf whose value is that text (with the old prefix)."""

    __slots__ = ()
    type = "rewritten"


def _text(node) -> str:
    return node.get_code(include_prefix=False)


def _prefix(node) -> str:
    return node.get_first_leaf().prefix


def _splice(root, replacements: dict[int, str]) -> str:
    """``root``'s text (without its prefix) with the nodes in ``replacements`` (by id) replaced."""

    def code(node) -> str:
        if id(node) in replacements:
            return _prefix(node) + replacements[id(node)]
        if isinstance(node, tree.BaseNode):
            return "".join(code(c) for c in node.children)
        return node.prefix + node.value

    return code(root)[len(_prefix(root)) :]


# Expressions that bind at least as tightly as `+`: `e + 1` and `e.mT`-free wrapping needs no parentheses.
_ARITH = {"name", "number", "atom", "atom_expr", "power", "term", "factor", "arith_expr", "string", "keyword"}
_ATOMIC = {"name", "number", "atom", "atom_expr", "string", "keyword"}
_LITERALS = {"number", "string", "keyword", "strings"}


def _operand(node) -> str:
    """Text of ``node`` usable as an operand of ``+``/``-``."""
    return _text(node) if node.type in _ARITH else f"({_text(node)})"


def _atomic(node) -> str:
    """Text of ``node`` usable before an attribute (``.mT``) or after ``~``."""
    return _text(node) if node.type in _ATOMIC else f"({_text(node)})"


def _int_literal(node) -> int | None:
    """The value of an int literal (``3``, ``-1``), else None."""
    if node.type == "number" and node.value.isdigit():
        return int(node.value)
    if node.type == "factor" and node.children[0].value == "-" and node.children[1].type == "number":
        inner = node.children[1].value
        return -int(inner) if inner.isdigit() else None
    return None


def _float_literal(node) -> float | None:
    if node.type != "number" or node.value.isdigit() or node.value.lower().endswith("j"):
        return None
    try:
        return float(node.value)
    except ValueError:  # 0x.., 0o.., 1_000: ints in other spellings
        return None


def _float_alternatives(x: float) -> list[float]:
    """Wrong values a student plausibly writes for the constant ``x``."""
    if x == 0:
        return []  # +-1 is cosmic-ray's NumberReplacer; a tiny nonzero would be a near-equivalent
    if abs(x) < 1e-3:  # an epsilon: forgotten, or another library's default (torch's 1e-5)
        return [0.0, 1e-12 if x == 1e-5 else 1e-5]
    if abs(x) < 1:  # a probability or a coefficient: a nearby value
        return [round(x - 0.05, 12), round(x + 0.05, 12)]
    return [x / 2, x * 2]


def _calls(node) -> Iterator[tuple[str, tree.BaseNode, list]]:
    """(callee name, call trailer, argument nodes) of each call in an ``atom_expr``:
    ``x.amax(dim=0)`` gives ("amax", the ``(dim=0)`` trailer, [the ``dim=0`` argument]),
    ``max(1, n)`` gives ("max()", ...): a builtin called by its bare name is told apart."""
    if node.type not in ("atom_expr", "power"):
        return
    children = node.children
    for i, trailer in enumerate(children):
        if i == 0 or trailer.type != "trailer" or trailer.children[0].value != "(":
            continue
        before = children[i - 1]
        if before.type == "name":
            name = before.value + "()" if before.value in _BUILTINS else before.value
        elif before.type == "trailer" and before.children[0].value == ".":
            name = before.children[1].value
        else:
            continue
        inner = trailer.children[1:-1]
        if not inner:
            args = []
        elif inner[0].type == "arglist":
            args = [c for c in inner[0].children if not (c.type == "operator" and c.value == ",")]
        else:
            args = [inner[0]]
        yield name, trailer, args


_BUILTINS = {"max", "min", "sum"}  # max(1, n) takes no dim; x.max(1) and torch.max(x, 1) do


def _keyword(arg) -> str | None:
    """``dim`` for the argument ``dim=0``; None for a positional (or starred) argument."""
    if arg.type == "argument" and len(arg.children) == 3 and arg.children[1].value == "=":
        return arg.children[0].value
    return None


def _positional(args: list) -> list:
    return [a for a in args if _keyword(a) is None and not (a.type == "argument")]


class TextOperator(Operator):
    """An operator whose mutations each replace one node by new text.

    Subclasses implement ``rewrites(node)``: (node to replace, its new text) per mutation
    that ``node`` offers. The replaced node may be ``node`` itself or one inside it; its
    span is the mutation's position.
    """

    def rewrites(self, node) -> list[tuple[object, str]]:
        raise NotImplementedError

    def mutation_positions(self, node):
        for target, _ in self.rewrites(node):
            yield (target.start_pos, target.end_pos)

    def mutate(self, node, index):
        target, text = self.rewrites(node)[index]
        if target is node:
            return Rewritten(text, node.start_pos, _prefix(node))
        replaced = _splice(node, {id(target): text})
        return Rewritten(replaced, node.start_pos, _prefix(node))


def _int_alternatives(n: int) -> list[int]:
    if n > 0:
        return [n // 2, n * 2]
    if n == 0:
        return [1]
    return [0, n - 1]


def _default_alternatives(node) -> list[str]:
    if node.type == "keyword" and node.value in ("True", "False"):
        return ["False" if node.value == "True" else "True"]
    n = _int_literal(node)
    if n is not None:
        return [str(v) for v in _int_alternatives(n)]
    x = _float_literal(node)
    if x is not None:
        return [repr(v) for v in _float_alternatives(x)]
    return []


# -- our operators ------------------------------------------------------------------------


class DefaultValue(TextOperator):
    """An optional parameter's default changed: right whenever the caller passes it."""

    def rewrites(self, node):
        if node.type != "param" or node.default is None:
            return []
        return [(node.default, text) for text in _default_alternatives(node.default)]

    @classmethod
    def examples(cls):
        return (
            Example("def f(x, eps=1e-12): pass", "def f(x, eps=0.0): pass"),
            Example("def f(x, eps=1e-12): pass", "def f(x, eps=1e-05): pass", occurrence=1),
            Example("def f(x, dim: int = -1): pass", "def f(x, dim: int = 0): pass"),
            Example("def f(p=0.15): pass", "def f(p=0.2): pass", occurrence=1),
            Example("def f(n=30): pass", "def f(n=15): pass"),
            Example("def f(bias=True): pass", "def f(bias=False): pass"),
        )


def _in_default(node) -> bool:
    parent = node.parent
    while parent is not None and parent.type not in ("param", "funcdef", "file_input"):
        node, parent = parent, parent.parent
    return parent is not None and parent.type == "param" and parent.default is node


class ConstantChange(TextOperator):
    """A float constant changed: an epsilon dropped or another library's, a probability
    or coefficient off. (Ints: cosmic-ray's NumberReplacer; defaults: DefaultValue.)"""

    def rewrites(self, node):
        x = _float_literal(node)
        if x is None or _in_default(node):
            return []
        return [(node, repr(v)) for v in _float_alternatives(x)]

    @classmethod
    def examples(cls):
        return (
            Example("y = x + 1e-12", "y = x + 0.0"),
            Example("u < 0.8", "u < 0.75"),
            Example("u < 0.8", "u < 0.85", occurrence=1),
            Example("b = 10000.0 ** e", "b = 5000.0 ** e"),
        )


class RoundHalfUp(TextOperator):
    """``round(x)`` (half to even) <-> ``int(x + 0.5)`` (half up), and ``round`` -> ``int``
    (truncation): they differ only on ties, or only above .5."""

    def rewrites(self, node):
        out = []
        for name, trailer, args in _calls(node):
            if len(node.children) != 2 or trailer is not node.children[1] or len(args) != 1:
                continue
            (arg,) = args
            if name == "round" and _keyword(arg) is None:
                out += [(node, f"int({_operand(arg)} + 0.5)"), (node, f"int({_text(arg)})")]
            elif (
                name == "int"
                and arg.type == "arith_expr"
                and len(arg.children) == 3
                and arg.children[1].value == "+"
                and _float_literal(arg.children[2]) == 0.5
            ):
                out.append((node, f"round({_text(arg.children[0])})"))
        return out

    @classmethod
    def examples(cls):
        return (
            Example("n = int(round(len(t) * p))", "n = int(int(len(t) * p + 0.5))"),
            Example("n = round(a if b else c)", "n = int((a if b else c) + 0.5)"),
            Example("n = round(x)", "n = int(x)", occurrence=1),
            Example("n = int(x * p + 0.5)", "n = round(x * p)"),
        )


# Functions whose positional int arguments are dimensions (torch and numpy).
DIM_FUNCTIONS = {
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "softmax", "log_softmax",
    "size", "unbind", "unsqueeze", "squeeze", "cumsum", "prod", "std", "var", "logsumexp",
    "transpose", "swapaxes", "movedim", "cat", "stack", "norm", "flip",
}  # fmt: skip
DIM_KEYWORDS = {"dim", "axis"}


class DimChange(TextOperator):
    """A ``dim``/``axis`` changed to a neighbouring one: ``dim=-1`` -> ``-2`` or ``0``,
    ``x.size(-1)`` -> ``x.size(-2)``, ``transpose(1, 2)`` -> ``transpose(0, 2)``."""

    def rewrites(self, node):
        out = []
        for name, _, args in _calls(node):
            candidates = [a.children[2] for a in args if _keyword(a) in DIM_KEYWORDS]
            if name in DIM_FUNCTIONS:
                candidates += _positional(args)
            for value in candidates:
                d = _int_literal(value)
                if d is not None:
                    out += [(value, str(d - 1)), (value, str(d + 1))]
        return out

    @classmethod
    def examples(cls):
        return (
            Example("y = x.sum(dim=0)", "y = x.sum(dim=-1)"),
            Example("y = x.sum(dim=0)", "y = x.sum(dim=1)", occurrence=1),
            Example("d = q.size(-1)", "d = q.size(-2)"),
            Example("k.transpose(-2, -1)", "k.transpose(-2, 0)", occurrence=3),
            Example("y = np.sum(x, axis=1)", "y = np.sum(x, axis=0)"),
            Example("y = x.max(1)", "y = x.max(0)"),
        )


_TRANSPOSE_ATTRIBUTES = {"T", "mT"}
_TRANSPOSE_METHODS = {"transpose", "t", "permute", "swapaxes", "swapdims"}


def _ends_transposed(node) -> bool:
    if node.type not in ("atom_expr", "power"):
        return False
    last = node.children[-1]
    if last.type == "trailer" and last.children[0].value == ".":
        return last.children[1].value in _TRANSPOSE_ATTRIBUTES
    before = node.children[-2]
    return (
        last.type == "trailer"
        and last.children[0].value == "("
        and before.type == "trailer"
        and before.children[0].value == "."
        and before.children[1].value in _TRANSPOSE_METHODS
    )


class TransposeToggle(TextOperator):
    """A transpose dropped (``.transpose(a, b)``, ``.T``, ``.permute(...)``) or inserted
    (``.mT`` on an operand of ``@`` or on a returned value)."""

    def rewrites(self, node):
        out = []
        if node.type in ("atom_expr", "power"):
            children = node.children
            for i, trailer in enumerate(children):
                if trailer.type != "trailer" or trailer.children[0].value != ".":
                    continue
                attribute = trailer.children[1].value
                drop = []
                if attribute in _TRANSPOSE_ATTRIBUTES:
                    drop = [trailer]
                elif (
                    attribute in _TRANSPOSE_METHODS
                    and i + 1 < len(children)
                    and children[i + 1].type == "trailer"
                    and children[i + 1].children[0].value == "("
                ):
                    drop = [trailer, children[i + 1]]
                if drop:
                    kept = [c for c in children if all(c is not d for d in drop)]
                    text = "".join(c.get_code() for c in kept).removeprefix(_prefix(node))
                    out.append((node, text))
        if node.type == "term":
            for i, child in enumerate(node.children):
                if child.type == "operator" and child.value == "@":
                    for operand in (node.children[i - 1], node.children[i + 1]):
                        if not _ends_transposed(operand):  # dropping it is the mutant there
                            out.append((operand, f"{_atomic(operand)}.mT"))
        if node.type == "return_stmt" and len(node.children) == 2:
            value = node.children[1]
            items = (
                [c for c in value.children if c.type != "operator"]
                if value.type in ("testlist", "testlist_star_expr")
                else [value]
            )
            # (None, a number or a string has no transpose to forget)
            out += [(item, f"{_atomic(item)}.mT") for item in items if item.type not in _LITERALS]
        return out

    @classmethod
    def examples(cls):
        return (
            # a node's own mutations come before those of the nodes inside it
            Example("s = q @ k.transpose(-2, -1)", "s = q.mT @ k.transpose(-2, -1)"),
            Example("s = q @ k.transpose(-2, -1)", "s = q @ k", occurrence=1),
            Example("g = U.T @ d", "g = U.T @ d.mT"),
            Example("g = U.T @ d", "g = U @ d", occurrence=1),
            Example("return w @ v, w", "return (w @ v).mT, w"),
            Example("return w @ v, w", "return w @ v, w.mT", occurrence=1),
            Example("return m.to(t)", "return m.to(t).mT"),
        )


class MatMulToMul(TextOperator):
    """``@`` -> ``*``: elementwise instead of a matrix product (cosmic-ray has no ``@``)."""

    def rewrites(self, node):
        if node.type == "operator" and node.value == "@" and node.parent.type == "term":
            return [(node, "*")]
        return []

    @classmethod
    def examples(cls):
        return (Example("y = w @ v", "y = w * v"),)


def _only_argument(node, function: str):
    """``x`` when ``node`` is the call ``function(x)``, else None."""
    if node.type not in ("atom_expr", "power") or len(node.children) != 2:
        return None
    for name, trailer, args in _calls(node):
        if name == function and trailer is node.children[1] and len(args) == 1 and args[0].type != "argument":
            return args[0]
    return None


class CounterSet(TextOperator):
    """A multiset counted as a set (``Counter(x)`` -> ``Counter(set(x))``: each token
    once), and a set kept as a multiset (``set(x)`` -> ``list(x)``)."""

    def rewrites(self, node):
        out = []
        if node.type == "and_expr":  # Counter(a) & Counter(b): both sides as sets, a set overlap
            operands = node.children[::2]
            inner = [_only_argument(o, "Counter") for o in operands]
            if all(a is not None for a in inner):
                text = " & ".join(f"Counter(set({_text(a)}))" for a in inner)
                out.append((node, text))
        counted = _only_argument(node, "Counter")
        if counted is not None:
            out.append((node, f"Counter(set({_text(counted)}))"))
        unique = _only_argument(node, "set")
        if unique is not None:
            out.append((node, f"list({_text(unique)})"))
        return out

    @classmethod
    def examples(cls):
        return (
            Example("c = Counter(a) & Counter(b)", "c = Counter(set(a)) & Counter(set(b))"),
            Example("c = Counter(a) & Counter(b)", "c = Counter(set(a)) & Counter(b)", occurrence=1),
            Example("ok = ch not in set(p)", "ok = ch not in list(p)"),
        )


_RANGE_FUNCTIONS = {"range", "arange", "randint"}


class OffByOne(TextOperator):
    """A slice bound or a range/arange/randint bound one too far or too short. (Literal
    bounds are cosmic-ray's NumberReplacer's.)"""

    def rewrites(self, node):
        bounds = []
        if node.type == "subscript":
            bounds = [c for c in node.children if c.type not in ("operator", "sliceop")]
        else:
            for name, _, args in _calls(node):
                if name in _RANGE_FUNCTIONS:
                    bounds += _positional(args)[:2]
        out = []
        for bound in bounds:
            if bound.type == "number" or _int_literal(bound) is not None:
                continue
            out += [(bound, f"{_operand(bound)} + 1"), (bound, f"{_operand(bound)} - 1")]
        return out

    @classmethod
    def examples(cls):
        return (
            Example("c = xs[:k]", "c = xs[:k + 1]"),
            Example("c = xs[a:]", "c = xs[a - 1:]", occurrence=1),
            Example("for i in range(n): pass", "for i in range(n + 1): pass"),
            Example("r = rng.randint(2, m)", "r = rng.randint(2, m - 1)", occurrence=1),
        )


_MASK_FUNCTIONS = {"masked_fill", "masked_fill_", "where"}


class MaskInvert(TextOperator):
    """A mask read the wrong way round: ``masked_fill(~m, v)`` -> ``masked_fill(m, v)``'s
    opposite, ``where(c, a, b)`` with ``~c``, ``~`` before a ``.bool()`` mask,
    ``tril`` <-> ``triu``. (Dropping a ``~`` is cosmic-ray's unary-operator deletion.)"""

    def rewrites(self, node):
        out = []
        for name, _, args in _calls(node):
            positional = _positional(args)
            if name in _MASK_FUNCTIONS and positional:
                mask = positional[0]
                if mask.type == "factor" and mask.children[0].value == "~":  # ~m -> m, not ~(~m)
                    out.append((mask, _text(mask.children[1])))
                else:
                    out.append((mask, f"~{_atomic(mask)}"))
        if node.type in ("atom_expr", "power"):
            children = node.children
            for i, trailer in enumerate(children[:-1]):
                if (
                    trailer.type == "trailer"
                    and trailer.children[0].value == "."
                    and trailer.children[1].value == "bool"
                    and children[i + 1].type == "trailer"
                    and _text(children[i + 1]) == "()"
                ):
                    out.append((node, f"~{_text(node)}"))
        if node.type == "name" and node.value in ("tril", "triu"):
            out.append((node, "triu" if node.value == "tril" else "tril"))
        return out

    @classmethod
    def examples(cls):
        return (
            Example("s = s.masked_fill(~mask, v)", "s = s.masked_fill(mask, v)"),
            Example("s = s.masked_fill(mask == 0, v)", "s = s.masked_fill(~(mask == 0), v)"),
            Example("y = np.where(x >= 0, a, b)", "y = np.where(~(x >= 0), a, b)"),
            Example("m = a.bool()[:, None]", "m = ~a.bool()[:, None]"),
            Example("m = torch.ones(L, L).tril()", "m = torch.ones(L, L).triu()"),
        )


# Leaving out device= changes nothing on the CPU, where this tool grades; the CUDA parity
# checks (tests/reference/test_cuda_parity.py) are where a device matters.
_KEEP_KEYWORDS = {"device"}


class DropKeywordArgument(TextOperator):
    """A keyword argument left out, so the callee's default applies: ``keepdim=True``,
    ``eps=eps`` (LayerNorm's 1e-5), ``ignore_index=L``, ``generator=g``."""

    def rewrites(self, node):
        out = []
        for _, trailer, args in _calls(node):
            for arg in args:
                keyword = _keyword(arg)
                if keyword is None or keyword in _KEEP_KEYWORDS:
                    continue
                rest = ", ".join(_text(a) for a in args if a is not arg)
                out.append((trailer, f"({rest})"))
        return out

    @classmethod
    def examples(cls):
        return (
            Example("y = x.amax(dim=d, keepdim=True)", "y = x.amax(dim=d)", occurrence=1),
            Example("n = nn.LayerNorm(h, eps=eps)", "n = nn.LayerNorm(h)"),
        )


CUSTOM: tuple[type[TextOperator], ...] = (
    DefaultValue,
    RoundHalfUp,
    DimChange,
    TransposeToggle,
    CounterSet,
    OffByOne,
    MaskInvert,
    ConstantChange,
    MatMulToMul,
    DropKeywordArgument,
)

# -- cosmic-ray's own ---------------------------------------------------------------------

_ARITHMETIC = {"Add", "Sub", "Mul", "Div", "FloorDiv", "Mod", "Pow"}
_BITWISE = {"BitOr", "BitAnd", "BitXor"}
# VariableReplacer and VariableInserter need per-session arguments and draw random numbers
# (an id must name the same mutant on every run); NoOp is cosmic-ray's baseline run.
_LEFT_OUT = {"VariableReplacer", "VariableInserter", "NoOp"}


def _core_wanted(name: str) -> bool:
    if name in _LEFT_OUT:
        return False
    if name.startswith("ReplaceBinaryOperator_"):
        # Across families (`+` -> `&`, `*` -> `<<`) a float tensor raises TypeError on the
        # first call: every grader kills it, and counting it would only inflate the score.
        a, b = name.removeprefix("ReplaceBinaryOperator_").split("_")
        return {a, b} <= _ARITHMETIC or {a, b} <= _BITWISE
    return True


def core_operators() -> list[tuple[str, Operator]]:
    """cosmic-ray's core operators that we use, in cosmic-ray's order."""
    out = []
    for full in cosmic_ray.plugins.operator_names():
        provider, _, name = full.partition("/")
        if provider == "core" and _core_wanted(name):
            out.append((full, cosmic_ray.plugins.get_operator(full)()))
    return out


def all_operators() -> list[tuple[str, Operator]]:
    """Ours first: when two operators make the same program, the mutant keeps the name
    of the mistake it stands for (``bertlab/DimChange``, not ``core/NumberReplacer``)."""
    return [(f"bertlab/{op.__name__}", op()) for op in CUSTOM] + core_operators()


def parse(source: str):
    return parso.parse(source)

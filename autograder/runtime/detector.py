"""Forbidden library calls, caught at run time wherever student code runs.

``ForbiddenCallDetector`` watches one call (a ``TorchDispatchMode`` sees every aten
operator that runs, whatever alias reached it; a ``TorchFunctionMode`` names the public
API call); ``KernelGuard`` swaps the forbidden operators' kernels in the grading child, so
a detector popped or bypassed from inside still stops them. Where a guard is open on a
detector's patterns (the grading child), the guard alone watches the aten operators: it
sees every kernel that runs, in every thread, and the dispatch mode's Python hook costs
about 11 us per operator, more than 10's small operators themselves. Runs in the student's
kernel (the self-check) and in the child; imports neither the reference nor any stage spec.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


def _api_name(func: Any) -> str:
    """``torch.nn.functional.softmax``, ``torch.Tensor.softmax``, ``torch.softmax``..."""
    name = getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None)
    qual = getattr(func, "__qualname__", name)
    if qual.startswith(("TensorBase.", "_TensorBase.", "Tensor.")):
        return "torch.Tensor." + name
    if qual.startswith("_VariableFunctionsClass."):
        return "torch." + name
    if module in (None, "torch._C._VariableFunctions", "torch._C"):
        return f"torch.{name}"
    if module == "torch._C._nn":  # builtins that torch.nn.functional re-exports
        return f"torch.nn.functional.{name}"
    if module == "torch._C._special":
        return f"torch.special.{name.removeprefix('special_')}"
    return f"{module}.{qual}"


_MEMO_LIMIT = 20_000  # names remembered per pattern set; beyond it (hostile code) each is matched anew


@functools.cache
def _matcher(patterns: tuple[str, ...]) -> Any:
    """``name -> bool``: does ``name`` match any of ``patterns`` (fnmatch, case-sensitive)?
    A detector sees the same few hundred names thousands of times per call: each is
    matched once per process, then looked up."""
    regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)) if patterns else None
    seen: dict[str, bool] = {}

    def match(name: str) -> bool:
        hit = seen.get(name)
        if hit is None:
            hit = bool(regex is not None and regex.match(name))
            if len(seen) < _MEMO_LIMIT:
                seen[name] = hit
        return hit

    return match


_API_NAMES: dict[Any, str] = {}


def _api_name_cached(func: Any) -> str:
    try:
        return _API_NAMES[func]
    except KeyError:
        name = _api_name(func)
        if len(_API_NAMES) < _MEMO_LIMIT:
            _API_NAMES[func] = name
        return name
    except TypeError:  # an unhashable callable
        return _api_name(func)


class _NameCalls(TorchFunctionMode):
    """Remembers which public torch API call is running, to name it in messages."""

    def __init__(self, detector: ForbiddenCallDetector) -> None:
        super().__init__()
        self.detector = detector

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.detector._forbids_transforms:
            self.detector._check_transform()
        name = _api_name_cached(func)
        if self.detector._saw_api(name):
            # the verdict is settled: running it costs the grader time and proves nothing
            # (``torch.autograd.grad``'s first use imports sympy: 0.3 s of a 5 s call)
            raise ForbiddenKernel(f"{name} is forbidden in this task")
        self.detector._api_stack.append(name)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.detector._api_stack.pop()


class _WatchOps(TorchDispatchMode):
    """Sees every aten operator that actually runs, whatever alias reached it."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # False: torch leaves __torch_dispatch__ as written instead of wrapping it in
        # torch._dynamo.disable. The wrapper costs a few microseconds on every operator,
        # and its first call imports torch._dynamo: 1-2 s and 70 MB in each process that
        # uses the detector (the fork server, whose every fork and exit then pays for the
        # 70 MB; the student's kernel). Nothing here runs under torch.compile.
        return False

    def __init__(self, detector: ForbiddenCallDetector) -> None:
        super().__init__()
        self.detector = detector

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.detector._saw(func._schema.name)
        return func(*args, **(kwargs or {}))


@dataclass
class ForbiddenCallDetector:
    """Context manager recording calls to operators matching ``patterns``.

    Patterns ``aten::*`` match at the operator level (a TorchDispatchMode), so
    ``torch.softmax``, ``F.softmax``, ``Tensor.softmax``, ``torch.special.softmax`` and
    library modules that call them all land on ``aten::_softmax``. Patterns ``torch.*``
    match public API calls seen by a TorchFunctionMode (for functions such as
    ``F.scaled_dot_product_attention`` that decompose into ordinary operators under a
    dispatch mode); the same mode names, in the message, the call the student made, and
    stops a forbidden one before it runs (``ForbiddenKernel``).
    """

    patterns: tuple[str, ...]
    found: list[str] = field(default_factory=list)
    _api_stack: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._match = _matcher(tuple(self.patterns))
        self._forbids_transforms = self._match("torch.func.grad")

    def _check_transform(self) -> None:
        """Stops a ``torch.func`` transform (grad, vjp, jacrev, vmap, ...) at the first torch call
        inside it. Its own autograd call would be seen too, but only after the transform's
        first use imports torch._dynamo (2-3 s, past a call's time limit): the student would
        read "did not finish" where "forbidden" is the truth."""
        level = torch._C._functorch.peek_interpreter_stack()
        if level is not None:
            what = f"torch.func ({level.key().name.lower()} transform)"
            if what not in self.found:
                self.found.append(what)
            raise ForbiddenKernel(f"{what} is forbidden in this task")

    def _saw_api(self, api: str) -> bool:
        """Record ``api`` if it is forbidden; True if it is."""
        if not self._match(api):
            return False
        if api not in self.found:
            self.found.append(api)
        return True

    def _saw(self, op: str) -> None:
        if self._match(op):
            api = self._api_stack[0] if self._api_stack else None
            what = f"{api} ({op})" if api else op
            if what not in self.found and api not in self.found:
                self.found.append(what)

    def _ops_guarded(self) -> bool:
        """Does an open KernelGuard stop this detector's aten operators? Not where torch.compile
        is on (the grading child turns it off: TORCH_COMPILE_DISABLE): code it compiled runs
        kernels of its own, which no guard sees, and falls back to torch's under a dispatch
        mode."""
        guard = _OPEN_GUARD
        if guard is None or guard.patterns != self.patterns:
            return False
        dynamo = sys.modules.get("torch._dynamo")
        return dynamo is None or bool(getattr(getattr(dynamo, "config", None), "disable", False))

    def __enter__(self) -> ForbiddenCallDetector:
        if self.patterns:
            self._modes = [_NameCalls(self)] if self._ops_guarded() else [_NameCalls(self), _WatchOps(self)]
            for m in self._modes:
                m.__enter__()
            _WATCHING.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.patterns:
            if _WATCHING and _WATCHING[-1] is self:
                _WATCHING.pop()
            for m in reversed(self._modes):
                m.__exit__(None, None, None)


# The detectors open now, innermost last: a KernelGuard's stop is recorded in the innermost,
# named after the public call it is in ("torch.softmax (aten::_softmax)").
_WATCHING: list[ForbiddenCallDetector] = []
_OPEN_GUARD: KernelGuard | None = None  # the grading child's guard, while open


@functools.cache
def aten_overloads() -> dict[str, tuple[str, ...]]:
    """Each aten operator's overloads by its name: ``_softmax`` -> (``_softmax``,
    ``_softmax.out``), from one pass over the dispatcher's operators (computed once, in the
    fork server's warm-up). A guard that swapped the default overload alone would let
    ``torch.ops.aten._softmax.out`` through."""
    out: dict[str, list[str]] = {}
    for n in torch._C._dispatch_get_all_op_names():
        if n.startswith("aten::"):
            full = n.split("::", 1)[1]
            out.setdefault(full.split(".", 1)[0], []).append(full)
    return {k: tuple(sorted(v)) for k, v in out.items()}


@functools.cache
def aten_op_names() -> tuple[str, ...]:
    """Every aten operator's name, sorted."""
    return tuple(sorted(aten_overloads()))


# Every backend whose kernels a tensor may reach on this device: a nested, quantized, MKLDNN or
# sparse tensor dispatches to its own kernel, never to the dense one the guard swaps.
_GUARDED_KEYS = ("CPU", "NestedTensorCPU", "QuantizedCPU", "MkldnnCPU", "SparseCPU", "SparseCsrCPU")
_GUARDED_CUDA_KEYS = ("CUDA", "NestedTensorCUDA", "QuantizedCUDA", "SparseCUDA", "SparseCsrCUDA")


@functools.cache
def _matching(ops: tuple[str, ...]) -> tuple[str, ...]:
    """The aten operators ``ops`` (fnmatch patterns) name, in ``aten_op_names`` order. Once
    per pattern list in a child (its public and hidden calls guard each name alike); a name
    without a wildcard is looked up, not matched against every operator's name."""
    exact = {p for p in ops if not any(c in p for c in "*?[")}
    wild = [p for p in ops if p not in exact]
    wanted = re.compile("|".join(fnmatch.translate(p) for p in wild)) if wild else None
    return tuple(n for n in aten_op_names() if n in exact or (wanted is not None and wanted.match(n)))


class ForbiddenKernel(RuntimeError):
    """Raised by a forbidden operator while a KernelGuard is active, and by a forbidden public
    call (``torch.*`` patterns) as it starts."""


class KernelGuard:
    """Replaces the kernels of forbidden aten operators (every overload, every backend of the
    device: dense, nested, quantized, MKLDNN, sparse) with ones that record the call and
    raise, for as long as it is open.

    The dispatch-mode detector can be evaded from inside (popping the mode, disabling
    modes, a reference to the function taken before it was installed); the dispatcher's
    kernel table cannot, short of re-registering kernels. Used by the grading child only,
    once per graded name (registering costs ~2 ms).
    """

    def __init__(self, patterns: tuple[str, ...]) -> None:
        global _OPEN_GUARD
        self.found: list[str] = []
        self.patterns = tuple(patterns)
        self._lib = None
        chosen = _matching(tuple(p.removeprefix("aten::") for p in patterns if p.startswith("aten::")))
        _OPEN_GUARD = self
        if not chosen:
            return
        keys = _GUARDED_KEYS + (_GUARDED_CUDA_KEYS if torch.cuda.is_available() else ())
        overloads = aten_overloads()
        import warnings

        self._lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            for name in chosen:
                kernel = self._kernel(f"aten::{name}")
                for overload in overloads[name]:
                    for key in keys:
                        try:
                            self._lib.impl(overload, kernel, key)
                        except RuntimeError:
                            continue  # an operator with no kernel for this key

    def _kernel(self, op: str):
        def forbidden(*args: Any, **kwargs: Any) -> Any:
            if op not in self.found:
                self.found.append(op)
            if _WATCHING:
                _WATCHING[-1]._saw(op)
            raise ForbiddenKernel(f"{op} is forbidden in this task")

        return forbidden

    def close(self) -> None:
        global _OPEN_GUARD
        if _OPEN_GUARD is self:
            _OPEN_GUARD = None
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None

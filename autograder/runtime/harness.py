"""Calling a graded name the way its spec says, and catching forbidden library calls.

Runs wherever student code runs: in the grading child, and in the student's own kernel
for the self-check. It imports neither the reference nor any stage spec.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
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
        name = _api_name_cached(func)
        self.detector._saw_api(name)
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
    dispatch mode); the same mode names, in the message, the call the student made.
    """

    patterns: tuple[str, ...]
    found: list[str] = field(default_factory=list)
    _api_stack: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._match = _matcher(tuple(self.patterns))

    def _saw_api(self, api: str) -> None:
        if self._match(api) and api not in self.found:
            self.found.append(api)

    def _saw(self, op: str) -> None:
        if self._match(op):
            api = self._api_stack[0] if self._api_stack else None
            what = f"{api} ({op})" if api else op
            if what not in self.found and api not in self.found:
                self.found.append(what)

    def __enter__(self) -> ForbiddenCallDetector:
        if self.patterns:
            self._modes = [_NameCalls(self), _WatchOps(self)]
            for m in self._modes:
                m.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.patterns:
            for m in reversed(self._modes):
                m.__exit__(None, None, None)


class NotAModule(TypeError):
    pass


def invoke(
    obj: Any,
    kind: str,
    data: dict[str, Any],
    device: str,
    namespace: dict[str, Any] | None = None,
    driver: str | None = None,
    watch: Any = None,
) -> Any:
    """Call a graded function, build, load and run a graded module, or run the graded
    name's driver (``autograder.runtime.drivers``) on ``namespace``, on ``data``.

    ``watch`` (a context manager: the forbidden-call detector) is active around what
    computes the graded result: the whole function or driver call, a module's forward.
    Building a module, loading its state and moving it run outside it, at full speed:
    with no input yet, nothing there can compute an answer (a forbidden kernel reached
    there is still caught by the child's KernelGuard)."""
    watch = watch if watch is not None else contextlib.nullcontext()
    args, kwargs = data.get("args", ()), data.get("kwargs", {})
    if kind == "function":
        with watch:
            return obj(*args, **kwargs)
    if kind == "driver":
        from autograder.runtime.drivers import resolve

        if driver is None or namespace is None:
            raise ValueError("a driver call needs the driver and a namespace")
        run = resolve(driver)
        if getattr(run, "watches_itself", False):
            return run(namespace, data, device, watch=watch)
        with watch:
            return run(namespace, data, device)
    if not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
        raise NotAModule(f"is a {type(obj).__name__}, not an nn.Module class")
    module = obj(*data.get("init_args", ()), **data.get("init_kwargs", {}))
    state = data.get("state") or {}
    floats = [t.dtype for t in state.values() if t.is_floating_point()]
    module.to(device=device, dtype=floats[0] if floats else None)
    module.load_state_dict(state, strict=True)
    module.eval()
    with watch, torch.no_grad():
        return module(*args, **kwargs)


class ReturnError(TypeError):
    """The call returned, but not the number or kind of values the spec names."""


def split_outputs(result: Any, outputs: tuple[str, ...] | list[str]) -> list[Any]:
    """The returned value as one item per named output, or a message saying what is wrong."""
    if len(outputs) == 1:
        return [result]
    expected = f"{len(outputs)} values ({', '.join(outputs)})"
    if not isinstance(result, tuple | list):
        raise ReturnError(f"returned a {type(result).__name__}; expected a tuple of {expected}")
    if len(result) != len(outputs):
        raise ReturnError(f"returned a tuple of {len(result)} values; expected {expected}")
    return list(result)


_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


def as_plain(value: Any) -> tuple[str, torch.Tensor | None, dict[str, str]]:
    """Classify a returned value: ("tensor"|"ndarray"|"scalar"|"other", data, facts).

    Exact types only: a tensor subclass, an object with ``__array__`` or a custom
    ``__eq__`` is "other" and fails its case, whatever it claims to hold.
    """
    if type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
        t = value.detach()
        facts = {"device": str(t.device), "dtype": str(t.dtype), "type": "torch.Tensor"}
        return "tensor", t.to("cpu").contiguous().clone(), facts
    if type(value) is np.ndarray and value.dtype != object:
        t = torch.from_numpy(np.ascontiguousarray(value)).clone()
        return "ndarray", t, {"device": "cpu", "dtype": str(value.dtype), "type": "numpy.ndarray"}
    if type(value) in (bool, int, float) or (
        isinstance(value, np.generic) and type(value).__module__ == "numpy" and isinstance(value, _SCALARS)
    ):
        t = torch.from_numpy(np.asarray(value)).clone()
        return "scalar", t, {"device": "cpu", "dtype": str(t.dtype), "type": type(value).__name__}
    return "other", None, {"type": type(value).__name__}


def _describe(exc: BaseException) -> dict[str, str]:
    """Type, message and the student's line, without the harness's own frames."""
    import traceback

    def text(x: Any) -> str:
        try:
            return str(x)[:2000]
        except BaseException:  # a hostile __str__ must not take the report with it
            return f"<unprintable {type(x).__name__}>"

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<submission")]
    where = ""
    if frames:
        f = frames[-1]
        where = f"{f.filename[12:-1]}, line {f.lineno}" + (f": {f.line.strip()}" if f.line else "")
    elif exc.__traceback__ is not None:
        tb = traceback.extract_tb(exc.__traceback__)
        if tb and "autograder" not in tb[-1].filename:
            f = tb[-1]
            where = f"line {f.lineno}" + (f": {f.line.strip()}" if f.line else "")
    if isinstance(exc, SyntaxError) and exc.filename and exc.filename.startswith("<submission"):
        where = f"{exc.filename[12:-1]}, line {exc.lineno}: {(exc.text or '').strip()}"
    # a SyntaxError's str() repeats the file and line that `where` already gives
    message = text(exc.msg) if isinstance(exc, SyntaxError) else text(exc)
    return {"type": type(exc).__name__, "message": message, "where": where[:2000]}


def run_call(
    namespace: dict[str, Any],
    name: str,
    kind: str,
    data: dict[str, Any],
    outputs: tuple[str, ...] | list[str],
    forbidden: tuple[str, ...] | list[str],
    device: str,
    driver: str | None = None,
) -> tuple[str, dict[str, Any], list[tuple[str, torch.Tensor | None, dict[str, str]]]]:
    """Call ``namespace[name]`` on ``data``: (status, info, returned items as plain tensors).

    Status is one of ok, missing, not_callable, not_implemented, type_error, error,
    forbidden, bad_return; ``autograder.runtime.check`` turns it into a message.
    """
    if name not in namespace:
        return "missing", {}, []
    obj = namespace[name]
    if not callable(obj):
        return "not_callable", {"type": type(obj).__name__}, []
    detector = ForbiddenCallDetector(tuple(forbidden))
    error: tuple[str, dict[str, Any]] | None = None
    result: Any = None
    try:
        result = invoke(obj, kind, data, device, namespace, driver, watch=detector)
    except NotImplementedError as exc:
        error = "not_implemented", _describe(exc)
    except NotAModule as exc:
        error = "not_callable", {"type": str(exc)[:200]}
    except TypeError as exc:
        error = "type_error", _describe(exc)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: only this call fails
        error = "error", _describe(exc)
    if detector.found:
        return "forbidden", {"calls": detector.found[:5]}, []
    if error is not None:
        return error[0], error[1], []
    try:
        items = split_outputs(result, outputs)
    except ReturnError as exc:
        return "bad_return", {"message": str(exc)}, []
    return "ok", {}, [as_plain(item) for item in items]


@functools.cache
def aten_op_names() -> tuple[str, ...]:
    """Every aten operator's name (computed once, in the fork server's warm-up)."""
    names = {
        n.split("::", 1)[1].split(".", 1)[0]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::")
    }
    return tuple(sorted(names))


class ForbiddenKernel(RuntimeError):
    """Raised by a forbidden operator while a KernelGuard is active."""


class KernelGuard:
    """Replaces the CPU (and CUDA) kernels of forbidden aten operators with ones that record
    the call and raise, for as long as it is open.

    The dispatch-mode detector can be evaded from inside (popping the mode, disabling
    modes, a reference to the function taken before it was installed); the dispatcher's
    kernel table cannot, short of re-registering kernels. Used by the grading child only,
    once per graded name (registering costs ~2 ms).
    """

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self.found: list[str] = []
        self._lib = None
        ops = [p.removeprefix("aten::") for p in patterns if p.startswith("aten::")]
        if not ops:
            return
        wanted = re.compile("|".join(fnmatch.translate(p) for p in ops))
        chosen = [n for n in aten_op_names() if wanted.match(n)]
        keys = ["CPU"] + (["CUDA"] if torch.cuda.is_available() else [])
        import warnings

        self._lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            for name in chosen:
                for key in keys:
                    try:
                        self._lib.impl(name, self._kernel(f"aten::{name}"), key)
                    except RuntimeError:
                        continue  # an operator with no kernel for this key

    def _kernel(self, op: str):
        def forbidden(*args: Any, **kwargs: Any) -> Any:
            if op not in self.found:
                self.found.append(op)
            raise ForbiddenKernel(f"{op} is forbidden in this task")

        return forbidden

    def close(self) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None

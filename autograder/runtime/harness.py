"""How a graded name is called: the ``CallSpec`` of one call, and the protocol that makes it.

A ``CallSpec`` (name, kind, outputs, forbidden calls, the case's encoded inputs, driver)
is what the grading child's plan lists and what the self-check data holds for each public
case, in one JSON form (``to_json``/``from_json``). ``run_call`` makes the call the way its
spec says (a function, a module built, loaded and run, or a driver), under the
forbidden-call detector, and returns plain values. Runs wherever student code runs: in the
grading child, and in the student's own kernel for the self-check. It imports neither the
reference nor any stage spec.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from autograder.runtime import wire
from autograder.runtime.detector import ForbiddenCallDetector


@dataclass(frozen=True)
class CallSpec:
    """One call the student's code must answer: graded name, protocol, encoded case data."""

    index: int  # the case's number in its stage's plan
    name: str
    kind: str  # function | module | driver
    outputs: tuple[str, ...]
    forbidden: tuple[str, ...]  # detector patterns (``aten::_softmax``, ``torch.nn.functional.*``)
    data: dict[str, Any]  # wire skeletons of args, kwargs, init_args, init_kwargs, state
    driver: str | None = None  # "module:function" in autograder/runtime/drivers/

    def to_json(self) -> dict[str, Any]:
        """The call as the child's plan and the self-check data hold it."""
        return {
            "index": self.index,
            "name": self.name,
            "kind": self.kind,
            "outputs": list(self.outputs),
            "forbidden": list(self.forbidden),
            "data": self.data,
            "driver": self.driver,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CallSpec:
        """The call ``to_json`` wrote (other keys beside it are ignored)."""
        return cls(
            d["index"],
            d["name"],
            d["kind"],
            tuple(d["outputs"]),
            tuple(d["forbidden"]),
            d["data"],
            d.get("driver"),
        )

    def run(
        self, namespace: dict[str, Any], tensors: dict[str, torch.Tensor], device: str
    ) -> tuple[str, dict[str, Any], list[tuple[str, torch.Tensor | None, dict[str, str]]]]:
        """``run_call`` on this call's inputs, decoded from ``tensors`` onto ``device``."""
        data = {k: wire.decode(v, tensors, device) for k, v in self.data.items()}
        return run_call(
            namespace, self.name, self.kind, data, self.outputs, self.forbidden, device, self.driver
        )


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

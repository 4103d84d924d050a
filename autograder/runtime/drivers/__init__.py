"""Drivers: small programs that exercise a graded name when one call cannot grade it.

A graded name with ``kind="driver"`` and ``driver="normalization:batchnorm_steps"`` is
graded by ``autograder.runtime.drivers.normalization.batchnorm_steps(ns, data, device)``:

- ``ns`` maps names to objects. In the grading child and the self-check it is the
  student's namespace; in the parent it is the stage's reference names, with a
  misconception variant in place of the graded name when variants are computed. So the
  same driver produces the student's outputs, the expected outputs and the variants'.
- ``data`` is the decoded case: ``args``, ``kwargs``, ``init_args``, ``init_kwargs``,
  ``state``.
- it returns the graded name's outputs (a tuple when there are several).

The forbidden-call detector watches the whole driver call, unless the driver is marked
``@watches_itself``: then it gets ``watch=`` (a context manager) and enters it around the
part that computes the result (09 builds and loads a 22M-parameter model before its forward;
watching that would only cost time: the child's KernelGuard still stops a forbidden kernel there).

Drivers run where student code runs, and they ship to students with the self-check, so
they hold no solution and no secret: only the protocol of calling the student's code
(e.g. run several train steps, then eval, and return the running statistics after each;
or call the student's own forward and feed its cache to the student's backward).
Driver modules are imported by the fork server before any child is confined, so they
must not do work at import. A module whose drivers need something costly (09's checkpoint)
defines ``warm_up()``: the fork server runs it once, before the first child that grades a
stage with those drivers, and every later child inherits what it loaded.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

Driver = Callable[[dict[str, Any], dict[str, Any], str], Any]


def watches_itself(driver: Driver) -> Driver:
    """Mark a driver that takes ``watch=`` and enters it around the graded computation."""
    driver.watches_itself = True  # type: ignore[attr-defined]
    return driver


def watching(watch: Any) -> Any:
    """``watch`` (the forbidden-call detector the harness passes), or a context that watches
    nothing, for a driver called without one (the self-check's data, the tests)."""
    return watch if watch is not None else contextlib.nullcontext()


def resolve(path: str) -> Driver:
    """``"module:function"`` -> the driver function in ``autograder.runtime.drivers.module``."""
    module, _, function = path.partition(":")
    if not module.isidentifier() or not function.isidentifier():
        raise ValueError(f"not a driver path: {path!r} (expected 'module:function')")
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def import_all() -> None:
    """Import every driver module (the fork server does, before children are confined)."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def require(ns: dict[str, Any], name: str) -> Any:
    """``ns[name]``, or a NameError a student can act on."""
    if name not in ns:
        raise NameError(f"this test also calls your `{name}`, which is not defined")
    return ns[name]


def describe(value: Any) -> str:
    """What a student's call gave, for a message: its type (and length, for a sequence)."""
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)} values"
    return f"a {type(value).__name__}"


def build_model(
    ns: dict[str, Any], data: dict[str, Any], device: str, name: str, graded: bool = False
) -> Any:
    """The student's model class ``name``, built and loaded as every graded module is: the
    case's constructor arguments, ``.to(device, dtype)`` (the state's float dtype),
    ``load_state_dict(state, strict=True)``, eval mode. ``graded``: the model is the name
    under test (its own NotImplementedError is its verdict); otherwise an untouched model
    is "not implemented yet" in every test that runs it."""
    import torch

    cls = require(ns, name)
    state = data["state"]
    dtype = next(t.dtype for t in state.values() if t.is_floating_point())
    try:
        model = cls(*data.get("init_args", ()), **data.get("init_kwargs", {}))
    except NotImplementedError as exc:
        if graded:
            raise
        raise RuntimeError(f"this test runs your `{name}`, and `{name}` is not implemented yet") from exc
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{name}(...) gave {describe(model)}, not an nn.Module")
    model.to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=True)
    return model.eval()

"""Stage 03_positional: call a graded name that takes only ints in a chosen default dtype.

``sinusoidal_positional_encoding(max_len, d_model)`` and ``relative_shift_matrix(d_model,
k)`` receive no tensor, so the dtype of their result is "the default dtype" (CURRICULUM.md,
03_positional): whatever ``torch.get_default_dtype()`` says when they are called. To grade
them in float32 and in float64, the driver sets the default dtype around the call and
restores it afterwards, whatever the call does. The case names the dtype as
``init_kwargs["default_dtype"]`` ("float32" or "float64"; no module is built here, so
that slot carries the driver's setting); ``args`` and ``kwargs`` are the call's own.
The result stays on the default device, the CPU.
"""

from __future__ import annotations

from typing import Any

import torch

from autograder.runtime.drivers import Driver, require

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _in_default_dtype(name: str) -> Driver:
    def driver(ns: dict[str, Any], data: dict[str, Any], device: str) -> Any:
        fn = require(ns, name)
        dtype = _DTYPES[data["init_kwargs"]["default_dtype"]]
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            return fn(*data.get("args", ()), **data.get("kwargs", {}))
        finally:
            torch.set_default_dtype(previous)

    driver.__name__ = driver.__qualname__ = name
    driver.__doc__ = f"`{name}(*args, **kwargs)` called with torch's default dtype set for the case."
    return driver


sinusoidal_positional_encoding = _in_default_dtype("sinusoidal_positional_encoding")
relative_shift_matrix = _in_default_dtype("relative_shift_matrix")

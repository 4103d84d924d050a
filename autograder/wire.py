"""How values cross the process boundary: a JSON skeleton plus a safetensors file.

Nothing here can execute code on load: the JSON holds only literals and tensor keys,
and safetensors holds only raw tensor bytes with a JSON header. Both sides use this
module; neither ever unpickles what the other wrote.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

Tensors = dict[str, torch.Tensor]


def encode(value: Any, tensors: Tensors, prefix: str) -> Any:
    """The JSON skeleton of ``value``; tensors and arrays go into ``tensors``."""
    if isinstance(value, torch.Tensor):
        key = f"{prefix}.{len(tensors)}"
        # a copy of its own: a case may pass one tensor as several arguments (q = k = v),
        # and safetensors refuses to save tensors that share memory
        tensors[key] = value.detach().cpu().contiguous().clone()
        return {"t": key}
    if isinstance(value, np.ndarray):
        key = f"{prefix}.{len(tensors)}"
        tensors[key] = torch.from_numpy(np.array(value, copy=True, order="C"))
        return {"np": key}
    if value is None or isinstance(value, bool | int | float | str):
        return {"v": value}
    if isinstance(value, tuple):
        return {"tuple": [encode(v, tensors, prefix) for v in value]}
    if isinstance(value, list):
        return {"list": [encode(v, tensors, prefix) for v in value]}
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v, tensors, prefix) for k, v in value.items()}}
    raise TypeError(f"cannot send a {type(value).__name__} to the child")


def decode(skeleton: Any, tensors: Tensors, device: str = "cpu") -> Any:
    """Rebuild a value from its skeleton; every tensor is a fresh copy on ``device``."""
    if "t" in skeleton:
        return tensors[skeleton["t"]].to(device, copy=True)
    if "np" in skeleton:
        return tensors[skeleton["np"]].numpy().copy()
    if "v" in skeleton:
        return skeleton["v"]
    if "tuple" in skeleton:
        return tuple(decode(v, tensors, device) for v in skeleton["tuple"])
    if "list" in skeleton:
        return [decode(v, tensors, device) for v in skeleton["list"]]
    if "dict" in skeleton:
        return {k: decode(v, tensors, device) for k, v in skeleton["dict"].items()}
    raise ValueError(f"bad skeleton {skeleton!r}")

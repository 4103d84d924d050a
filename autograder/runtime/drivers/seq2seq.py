"""Drivers of stage 12_seq2seq: how the grader runs your Seq2SeqTransformer, your loss, your
greedy decoding and your attention picture.

Every driver builds your ``Seq2SeqTransformer`` the way a graded module is built: the
case's constructor arguments, ``.to(device, dtype)``, ``load_state_dict(state,
strict=True)``, eval mode, and calls under ``torch.no_grad()``. Then:

- ``model`` calls ``memory = model.encode(src, src_mask)``, then ``model.decode(tgt,
  memory, src_mask)``, then ``model(src, tgt, src_mask)``, and returns the memory, the
  decoder's logits and cross-attention weights, and the forward's logits;
- ``loss`` calls ``seq2seq_loss(model, src, tgt, src_mask, pad_id)``;
- ``greedy`` calls ``greedy_decode(model, src, src_mask, bos_id, max_new_tokens)`` and
  counts the calls of ``model.encode`` (the forward's included, when it calls
  ``self.encode``): the tokens, and that count;
- ``weights`` calls ``cross_attention_weights(model, src, tgt, src_mask)``.

The forbidden-call detector watches your code that computes the graded result, not the
building and loading of the model (as stage 10's drivers). Nothing here computes a result.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from autograder.runtime.drivers import build_model as build_module
from autograder.runtime.drivers import describe, require, watches_itself, watching

MODEL = "Seq2SeqTransformer"


def build_model(
    ns: dict[str, Any], data: dict[str, Any], device: str, graded: bool = False
) -> torch.nn.Module:
    """Your ``Seq2SeqTransformer``, built and loaded as every graded module is, in eval mode."""
    return build_module(ns, data, device, MODEL, graded)


def _pair(result: Any, what: str) -> tuple[Any, Any]:
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise TypeError(f"{what} returned {describe(result)}; expected a tuple (logits, weights)")
    return result[0], result[1]


@watches_itself
def model(ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None) -> tuple[Any, ...]:
    """``encode``, then ``decode`` on its memory, then the forward: (memory, logits, weights,
    forward's logits)."""
    m = build_model(ns, data, device, graded=True)
    src, tgt = data["args"]
    src_mask = data["kwargs"].get("src_mask")
    with watching(watch), torch.no_grad():
        memory = m.encode(src, src_mask)
        logits, weights = _pair(m.decode(tgt, memory, src_mask), f"{MODEL}.decode")
        forward_logits, _ = _pair(m(src, tgt, src_mask), f"{MODEL}'s forward")
    return memory, logits, weights, forward_logits


@watches_itself
def loss(ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None) -> Any:
    """``seq2seq_loss(model, src, tgt, src_mask, pad_id)``."""
    fn = require(ns, "seq2seq_loss")
    m = build_model(ns, data, device)
    src, tgt = data["args"]
    kw = data["kwargs"]
    with watching(watch), torch.no_grad():
        return fn(m, src, tgt.clone(), kw.get("src_mask"), int(kw["pad_id"]))


@watches_itself
def greedy(ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None) -> tuple[Any, Tensor]:
    """``greedy_decode(model, src, src_mask, bos_id, max_new_tokens)``: the tokens, and how
    many times ``model.encode`` ran."""
    fn = require(ns, "greedy_decode")
    m = build_model(ns, data, device)
    (src,) = data["args"]
    kw = data["kwargs"]
    calls = [0]
    encode = m.encode

    @functools.wraps(encode)
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return encode(*args, **kwargs)

    m.encode = counted  # an instance attribute: model.encode and the forward's self.encode find it
    with watching(watch), torch.no_grad():
        tokens = fn(m, src.clone(), kw.get("src_mask"), int(kw["bos_id"]), int(kw["max_new_tokens"]))
    return tokens, torch.tensor(calls[0], dtype=torch.int64, device=device)


@watches_itself
def weights(ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None) -> Any:
    """``cross_attention_weights(model, src, tgt, src_mask)``."""
    fn = require(ns, "cross_attention_weights")
    m = build_model(ns, data, device)
    src, tgt = data["args"]
    with watching(watch), torch.no_grad():
        return fn(m, src, tgt, data["kwargs"].get("src_mask"))

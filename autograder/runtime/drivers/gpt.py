"""Drivers of stage 10_gpt: how the grader runs your GPT, your export and your decoding.

Every driver that needs a model builds your ``GPT`` the way a graded module is built: the
case's constructor arguments, ``.to(device, dtype)``, ``load_state_dict(state,
strict=True)``, eval mode, and calls under ``torch.no_grad()``. Then:

- ``chunked`` feeds the case's sequence to ``model(...)`` in chunks, each call with the
  ``present`` of the call before as its ``past``, and returns the logits of all the
  chunks, concatenated, and the last ``present``;
- ``export`` calls ``to_gpt2_state_dict(model)``, checks its keys against GPT-2's, and
  returns its values grouped by key, stacked over the layers;
- ``greedy`` and ``sampled`` call your decoding function with the model, record the
  model's calls (the length of the input and of the ``past`` of each; a ``past`` that is
  not the ``present`` the model returned the call before counts as no cache) and return
  the tokens and whether the calls used the cache; ``sampled`` runs twice, under two
  global seeds, each time with a model built afresh and a fresh ``torch.Generator`` of
  the case's seed;
- ``filtered`` calls ``filter_logits`` and returns which tokens it kept (``!= -inf``) and
  their values, since a removed token's ``-inf`` has no size to compare.

The forbidden-call detector watches your code that computes the graded result (the
model's calls, ``to_gpt2_state_dict``, the decoding function), not the building and
loading of a model: with no input yet, nothing there can compute an answer (a forbidden
kernel reached there still fails the call in the grading child). Building a model makes
thousands of small calls (its layers' parameters, ``load_state_dict``'s copies), which the
detector's hooks would make about three times as slow.

Nothing here computes a result.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from autograder.runtime.drivers import build_model as build_module
from autograder.runtime.drivers import describe, require, watches_itself, watching

# GPT-2's state-dict keys (transformers' GPT2LMHeadModel), "*" for a layer's index: the
# names to_gpt2_state_dict must produce, in GPT-2's order.
GPT2_KEYS = (
    "transformer.wte.weight",
    "transformer.wpe.weight",
    "transformer.h.*.ln_1.weight",
    "transformer.h.*.ln_1.bias",
    "transformer.h.*.attn.c_attn.weight",
    "transformer.h.*.attn.c_attn.bias",
    "transformer.h.*.attn.c_proj.weight",
    "transformer.h.*.attn.c_proj.bias",
    "transformer.h.*.ln_2.weight",
    "transformer.h.*.ln_2.bias",
    "transformer.h.*.mlp.c_fc.weight",
    "transformer.h.*.mlp.c_fc.bias",
    "transformer.h.*.mlp.c_proj.weight",
    "transformer.h.*.mlp.c_proj.bias",
    "transformer.ln_f.weight",
    "transformer.ln_f.bias",
    "lm_head.weight",
)


def build_model(
    ns: dict[str, Any], data: dict[str, Any], device: str, graded: bool = False
) -> torch.nn.Module:
    """Your ``GPT``, built and loaded as every graded module is, in eval mode."""
    return build_module(ns, data, device, "GPT", graded)


def _logits_and_present(result: Any) -> tuple[Any, Any]:
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise TypeError(f"GPT's forward returned {describe(result)}; expected a tuple (logits, present)")
    return result[0], result[1]


@watches_itself
def chunked(ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None) -> tuple[Any, Any]:
    """``model(chunk)`` for the first chunk of ``input_ids`` (sizes ``chunks``), then
    ``model(chunk, past=present)`` for each next one. Returns the logits of all the chunks,
    concatenated along the positions, and the last ``present``."""
    model = build_model(ns, data, device, graded=True)
    (input_ids,) = data["args"]
    pieces, past = [], None
    with watching(watch), torch.no_grad():
        for chunk in input_ids.split(list(data["kwargs"]["chunks"]), dim=1):
            result = model(chunk) if past is None else model(chunk, past=past)
            logits, past = _logits_and_present(result)
            pieces.append(logits)
    if len(pieces) == 1:
        return pieces[0], past
    if not all(isinstance(p, Tensor) and p.dim() == 3 for p in pieces):
        raise TypeError("GPT's forward should return logits of shape (B, T, vocab_size)")
    return torch.cat(pieces, dim=1), past


@watches_itself
def export(ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None) -> tuple[Tensor, ...]:
    """``to_gpt2_state_dict(model)``: its keys must be GPT-2's; its values are returned in
    the order of ``GPT2_KEYS``, each layer's stacked along a new first dimension."""
    fn = require(ns, "to_gpt2_state_dict")
    model = build_model(ns, data, device)
    with watching(watch), torch.no_grad():
        exported = fn(model)
    if not isinstance(exported, dict):
        raise TypeError(f"to_gpt2_state_dict returned {describe(exported)}; expected a dict")
    layers = range(int(data["init_kwargs"]["num_layers"]))
    expected = [k.replace("*", str(i)) for k in GPT2_KEYS for i in (layers if "*" in k else [None])]
    missing = [k for k in expected if k not in exported]
    extra = sorted(str(k) for k in exported if k not in set(expected))
    if missing or extra:
        raise KeyError(
            "to_gpt2_state_dict's keys are not GPT2LMHeadModel's: "
            + (f"missing {missing[:4]}{' ...' if len(missing) > 4 else ''}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"not GPT-2's {extra[:4]}{' ...' if len(extra) > 4 else ''}" if extra else "")
        )
    for k, v in exported.items():
        if not isinstance(v, Tensor):
            raise TypeError(f"to_gpt2_state_dict's {k!r} is {describe(v)}; expected a torch.Tensor")
    out = []
    for key in GPT2_KEYS:
        if "*" not in key:
            out.append(exported[key].detach())
            continue
        per_layer = [exported[key.replace("*", str(i))].detach() for i in layers]
        if len({tuple(t.shape) for t in per_layer}) > 1:
            shapes = ", ".join(str(tuple(t.shape)) for t in per_layer)
            raise ValueError(f"to_gpt2_state_dict's {key} has another shape in each layer: {shapes}")
        out.append(torch.stack(per_layer))
    return tuple(out)


class _Calls:
    """Records each call of ``model(...)``: (new positions T, cached positions L_past), with
    L_past -1 for a past that is not the ``present`` the model returned the call before: a
    record of lengths alone is satisfied by a decoy past of the right size, handed to the
    model beside an uncached computation that no hook sees (``model.forward``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.seen: list[tuple[int, int]] = []
        self._present: Any = None  # the last call's present, the only past the next may pass
        self._handles = (
            model.register_forward_pre_hook(self._record, with_kwargs=True),
            model.register_forward_hook(self._returned),
        )

    def _record(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = args[0] if args else kwargs.get("input_ids")
        past = args[1] if len(args) > 1 else kwargs.get("past")
        length = int(ids.shape[1]) if isinstance(ids, Tensor) and ids.dim() == 2 else -1
        cached = 0
        if isinstance(past, Tensor) and past.dim():
            given = self._present
            same = given is past or (
                type(given) is Tensor and given.shape == past.shape and torch.equal(given, past)
            )
            cached = int(past.shape[-2]) if same else -1
        self.seen.append((length, cached))

    def _returned(self, module: Any, args: tuple, output: Any) -> None:
        self._present = output[1] if isinstance(output, tuple | list) and len(output) == 2 else None

    def cached(self, prompt: int, max_new_tokens: int, device: str) -> Tensor:
        """1 when the prompt went through once, without a past, then each new token alone
        with the past of every token before it (a last call on the last token allowed)."""
        for handle in self._handles:
            handle.remove()
        expected = [(prompt, 0)] + [(1, prompt + i) for i in range(max_new_tokens)]
        n = len(self.seen)
        ok = max_new_tokens <= n <= max_new_tokens + 1 and self.seen == expected[:n]
        return torch.tensor(int(ok), dtype=torch.int64, device=device)


@watches_itself
def greedy(ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None) -> tuple[Any, Tensor]:
    """``greedy_decode(model, input_ids, max_new_tokens)``: the tokens, and 1 if the model's
    calls used the cache (see ``_Calls.cached``), else 0."""
    fn = require(ns, "greedy_decode")
    model = build_model(ns, data, device)
    (input_ids,) = data["args"]
    n = int(data["kwargs"]["max_new_tokens"])
    calls = _Calls(model)
    with watching(watch), torch.no_grad():
        tokens = fn(model, input_ids.clone(), n)
    return tokens, calls.cached(input_ids.size(1), n, device)


@watches_itself
def sampled(
    ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None
) -> tuple[Any, Tensor, Tensor]:
    """``sample(model, input_ids, max_new_tokens, generator, **options)`` with
    ``generator = torch.Generator(device).manual_seed(seed)``, under the global seed 1 and
    again under 2, each run on a model built afresh. Returns the first run's tokens, 1 if
    its calls used the cache, and 1 if both runs gave the same tokens (the generator alone
    decides), else 0."""
    fn = require(ns, "sample")
    (input_ids,) = data["args"]
    kw = data["kwargs"]
    n = int(kw["max_new_tokens"])
    devices = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
    runs = []
    # The second run only tells whether the generator alone decides (its tokens earn nothing
    # themselves): it runs unwatched, which halves the detector's cost on 10's most
    # operator-heavy name. The grading child's KernelGuard still stops a forbidden kernel there.
    for global_seed, run_watch in ((1, watch), (2, None)):
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            # a model of its own for each run: the first run cannot leave the second its
            # tokens (or zeros) on the model; built before the seed, whose draws are sample's
            model = build_model(ns, data, device)
            torch.manual_seed(global_seed)
            generator = torch.Generator(device=device).manual_seed(int(kw["seed"]))
            calls = _Calls(model)
            with watching(run_watch):
                tokens = fn(model, input_ids.clone(), n, generator, **dict(kw.get("options", {})))
            runs.append((tokens, calls.cached(input_ids.size(1), n, device)))
    (first, cached), (second, _) = runs
    same = (
        isinstance(first, Tensor)
        and isinstance(second, Tensor)
        and first.shape == second.shape
        and torch.equal(first, second)
    )
    return first, cached, torch.tensor(int(same), dtype=torch.int64, device=device)


def filtered(ns: dict[str, Any], data: dict[str, Any], device: str) -> tuple[Tensor, Tensor]:
    """``filter_logits(logits, **options)``: which tokens are kept (``!= -inf``), and the
    result with every removed token's value set to 0."""
    fn = require(ns, "filter_logits")
    (logits,) = data["args"]
    out = fn(logits.clone(), **dict(data["kwargs"]))
    if not isinstance(out, Tensor):
        raise TypeError(f"filter_logits returned {describe(out)}; expected a tensor (B, V)")
    kept = out != float("-inf")
    return kept, torch.where(kept, out, torch.zeros((), dtype=out.dtype, device=out.device))

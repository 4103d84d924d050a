"""Drivers of stage 07_bert_pretraining: how the grader exercises your pretraining code.

The data functions work on Python lists of WordPiece strings and a ``random.Random``; the
grader compares tensors. So these drivers build ``random.Random(seed)`` from the case (or
set the exact state a case gives), call your function, and turn what it returns into int64
tensors: each token becomes its index in the case's vocabulary (-1 for a string that is in
no vocabulary), positions stay positions, and the state your function leaves the rng in is
read as the next four ``rng.getrandbits(63)`` draws (the same state in the grader's run and
yours ⇒ the same draws). ``mask_tokens`` is random by design, so its driver returns
statistics over many seeded calls and exact 0/1 checks. Nothing here computes a result.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import torch
from torch import Tensor

from autograder.runtime.drivers import require

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
RNG_DRAWS = 4  # draws read from the rng after your call, to compare its state


@functools.cache
def real_vocab() -> tuple[str, ...]:
    """The WordPiece vocabulary of BERT-base uncased (all-MiniLM-L6-v2's vocab.txt), in id order."""
    from autograder.runtime.drivers.bert import minilm_dir

    with open(minilm_dir() / "vocab.txt", encoding="utf-8") as f:
        return tuple(line.strip() for line in f if line.strip())


def vocab_words(kw: dict[str, Any]) -> list[str]:
    """The case's ``vocab_words``: its own list, or the real vocabulary when it says so."""
    return list(real_vocab()) if kw.get("vocab_words") == "bert-base-uncased" else list(kw["vocab_words"])


@functools.cache
def _real_index() -> dict[str, int]:
    return {w: i for i, w in reversed(list(enumerate(real_vocab())))}


def _index(kw: dict[str, Any], extra: list[str]) -> dict[str, int]:
    """token -> id: the vocabulary's order, then the case's other strings in order."""
    if kw.get("vocab_words") == "bert-base-uncased":
        index = dict(_real_index())
    else:
        index = {}
        for w in kw["vocab_words"]:
            index.setdefault(w, len(index))
    for w in (*SPECIALS, *extra):
        index.setdefault(w, len(index))
    return index


def _ids(tokens: Any, index: dict[str, int], what: str) -> Tensor:
    if not isinstance(tokens, list | tuple) or not all(isinstance(t, str) for t in tokens):
        raise TypeError(f"{what} should be a list of str (WordPieces), got {_describe(tokens)}")
    return torch.tensor([index.get(t, -1) for t in tokens], dtype=torch.int64)


def _positions(values: Any, what: str) -> Tensor:
    if not isinstance(values, list | tuple) or not all(type(v) is int for v in values):
        raise TypeError(f"{what} should be a list of int, got {_describe(values)}")
    return torch.tensor(list(values), dtype=torch.int64)


def _describe(value: Any) -> str:
    if isinstance(value, list | tuple) and value:
        return f"a {type(value).__name__} whose first item is a {type(value[0]).__name__}"
    return f"a {type(value).__name__}"


def _rng(kw: dict[str, Any]) -> random.Random:
    """``random.Random(seed)``, or, where the case gives one, the rng in its exact state
    (setstate's words and position: a state in which some draw lands exactly on a threshold)."""
    rng = random.Random(kw["seed"])
    if "rng_state" in kw:
        rng.setstate((3, tuple(kw["rng_state"]), None))
    return rng


def _rng_after(rng: random.Random) -> Tensor:
    return torch.tensor([rng.getrandbits(63) for _ in range(RNG_DRAWS)], dtype=torch.int64)


def masked_lm(ns: dict[str, Any], data: dict[str, Any], device: str) -> tuple[Tensor, ...]:
    """``create_masked_lm_predictions(tokens, vocab_words, rng[, masked_lm_prob,
    max_predictions_per_seq])`` with ``rng = random.Random(seed)`` (or the case's state).
    Returns output_tokens, masked_positions and masked_labels as int64 tensors, then the
    rng's next draws."""
    kw = data["kwargs"]
    fn = require(ns, "create_masked_lm_predictions")
    tokens = list(kw["tokens"])
    rng = _rng(kw)
    result = fn(tokens, vocab_words(kw), rng, *kw.get("options", ()))
    if not isinstance(result, tuple | list) or len(result) != 3:
        raise TypeError(
            f"create_masked_lm_predictions returned {_describe(result)}; "
            "expected a tuple (output_tokens, masked_positions, masked_labels)"
        )
    output_tokens, positions, labels = result
    index = _index(kw, kw["tokens"])
    return (
        _ids(output_tokens, index, "output_tokens"),
        _positions(positions, "masked_positions"),
        _ids(labels, index, "masked_labels"),
        _rng_after(rng),
    )


INSTANCE_FIELDS = ("tokens", "segment_ids", "is_random_next", "masked_lm_positions", "masked_lm_labels")


def instances(ns: dict[str, Any], data: dict[str, Any], device: str) -> tuple[Tensor, ...]:
    """``create_instances_from_document(all_documents, document_index, max_seq_length,
    short_seq_prob, masked_lm_prob, max_predictions_per_seq, vocab_words, rng)`` with
    ``rng = random.Random(seed)`` (or the case's state): the instances' fields, concatenated
    over instances, as int64 tensors (tokens and labels as vocabulary ids, is_random_next as
    0/1), then the rng's next draws. It calls your own create_masked_lm_predictions."""
    kw = data["kwargs"]
    fn = require(ns, "create_instances_from_document")
    documents = [[list(segment) for segment in doc] for doc in kw["all_documents"]]
    rng = _rng(kw)
    result = fn(
        documents,
        kw["document_index"],
        kw["max_seq_length"],
        kw["short_seq_prob"],
        kw["masked_lm_prob"],
        kw["max_predictions_per_seq"],
        vocab_words(kw),
        rng,
    )
    if not isinstance(result, list | tuple):
        raise TypeError(f"create_instances_from_document returned {_describe(result)}; expected a list")
    index = _index(kw, [t for doc in kw["all_documents"] for segment in doc for t in segment])
    lengths, tokens, segments, nsp, positions, labels = [], [], [], [], [], []
    for n, inst in enumerate(result):
        missing = [f for f in INSTANCE_FIELDS if not hasattr(inst, f)]
        if missing:
            raise AttributeError(f"instance {n} ({_describe(inst)}) has no field {', '.join(missing)}")
        if not isinstance(inst.is_random_next, bool):
            raise TypeError(f"instance {n}: is_random_next should be a bool")
        lengths.append(len(inst.tokens))
        tokens.append(_ids(inst.tokens, index, f"instance {n}: tokens"))
        segments.append(_positions(inst.segment_ids, f"instance {n}: segment_ids"))
        nsp.append(int(inst.is_random_next))
        positions.append(_positions(inst.masked_lm_positions, f"instance {n}: masked_lm_positions"))
        labels.append(_ids(inst.masked_lm_labels, index, f"instance {n}: masked_lm_labels"))

    def cat(parts: list[Tensor]) -> Tensor:
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    return (
        torch.tensor(lengths, dtype=torch.int64),
        cat(tokens),
        cat(segments),
        torch.tensor(nsp, dtype=torch.int64),
        cat(positions),
        cat(labels),
        _rng_after(rng),
    )


def _call_mask_tokens(fn: Any, kw: dict[str, Any], input_ids: Tensor, special: Tensor, gen: torch.Generator):
    args = [input_ids.clone(), special.clone(), kw["vocab_size"], kw["mask_token_id"], gen]
    if "mlm_probability" in kw:
        args.append(kw["mlm_probability"])
    result = fn(*args)
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise TypeError(f"mask_tokens returned {_describe(result)}; expected a tuple (input_ids, labels)")
    out, labels = result
    for name, t in (("input_ids", out), ("labels", labels)):
        if not isinstance(t, Tensor) or t.shape != input_ids.shape:
            got = tuple(t.shape) if isinstance(t, Tensor) else _describe(t)
            raise ValueError(
                f"mask_tokens: the returned {name} should be a tensor of shape "
                f"{tuple(input_ids.shape)}, got {got}"
            )
        if t.device != input_ids.device:
            raise ValueError(
                f"mask_tokens: the returned {name} is on {t.device}, the input on {input_ids.device}"
            )
    if labels.dtype != torch.int64:
        raise ValueError(f"mask_tokens: labels should be int64 (cross_entropy's targets), got {labels.dtype}")
    return out, labels


def mask_statistics(ns: dict[str, Any], data: dict[str, Any], device: str) -> tuple[Tensor, ...]:
    """``mask_tokens`` called ``repeats`` times on the case's batch with one
    ``torch.Generator(device).manual_seed(seed)``. Returns, over all calls:

    - the fraction of non-special tokens selected (label != -100);
    - among those, the fractions that became mask_token_id, another id, and stayed;
    - 1 if no special token was ever selected or changed, else 0;
    - 1 if labels always hold the original id where selected and -100 elsewhere, and no
      unselected token changed, else 0;
    - 1 if two calls with generators of one seed agree whatever the global RNG, else 0.
    """
    kw = data["kwargs"]
    fn = require(ns, "mask_tokens")
    input_ids, special = kw["input_ids"], kw["special_tokens_mask"]
    gen = torch.Generator(device=device).manual_seed(kw["seed"])
    n_tokens = n_selected = n_mask = n_kept = 0
    specials_untouched = labels_exact = True
    for _ in range(kw["repeats"]):
        out, labels = _call_mask_tokens(fn, kw, input_ids, special, gen)
        selected = labels != -100
        chosen = selected & ~special
        n_tokens += int((~special).sum())
        n_selected += int(chosen.sum())
        n_mask += int((chosen & (out == kw["mask_token_id"])).sum())
        n_kept += int((chosen & (out == input_ids)).sum())
        specials_untouched &= not bool((special & (selected | (out != input_ids))).any())
        labels_exact &= bool(((labels == input_ids) | ~selected).all()) and bool(
            ((out == input_ids) | selected).all()
        )
    devices = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
    runs = []
    for global_seed in (1, 2):
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(global_seed)
            g = torch.Generator(device=device).manual_seed(kw["seed"] + 1)
            runs.append(_call_mask_tokens(fn, kw, input_ids, special, g))
    same = all(torch.equal(a, b) for a, b in zip(runs[0], runs[1], strict=True))

    def rate(k: int, n: int) -> Tensor:
        return torch.tensor(k / max(n, 1), dtype=torch.float64, device=device)

    def flag(ok: bool) -> Tensor:
        return torch.tensor(int(ok), dtype=torch.int64, device=device)

    return (
        rate(n_selected, n_tokens),
        rate(n_mask, n_selected),
        rate(n_selected - n_mask - n_kept, n_selected),
        rate(n_kept, n_selected),
        flag(specials_untouched),
        flag(labels_exact),
        flag(same),
    )


def heads(ns: dict[str, Any], data: dict[str, Any], device: str) -> tuple[Tensor, ...]:
    """``BertPretrainingHeads(H, V, word_embeddings[, eps])`` (eps where the case gives one)
    on an ``nn.Embedding`` holding the case's embedding matrix; the case's weights are copied
    into your parameters by name (dense, layer_norm, bias, pooler, seq_relationship); then
    ``forward(sequence_output)`` in eval mode. Returns prediction_scores, seq_relationship_scores and 1 if
    ``decoder.weight is word_embeddings.weight`` (tied), else 0."""
    cls = require(ns, "BertPretrainingHeads")
    kw = data["kwargs"]
    weight = kw["embedding_weight"]
    vocab_size, hidden = weight.shape
    embeddings = torch.nn.Embedding(vocab_size, hidden, device=device, dtype=weight.dtype)
    with torch.no_grad():
        embeddings.weight.copy_(weight)
    module = cls(hidden, vocab_size, embeddings, *([kw["eps"]] if "eps" in kw else []))
    module.to(device=device, dtype=weight.dtype)
    with torch.no_grad():
        for name, value in kw["weights"].items():
            try:
                target = module.get_parameter(name)
            except AttributeError as exc:
                raise AttributeError(f"BertPretrainingHeads has no parameter `{name}` ({exc})") from None
            if target.shape != value.shape:
                raise ValueError(f"`{name}` has shape {tuple(target.shape)}, expected {tuple(value.shape)}")
            target.copy_(value)
    decoder = getattr(module, "decoder", None)
    tied = decoder is not None and getattr(decoder, "weight", None) is embeddings.weight
    module.eval()
    with torch.no_grad():
        result = module(kw["sequence_output"])
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise TypeError(
            f"forward returned {_describe(result)}; expected (prediction_scores, seq_relationship_scores)"
        )
    return result[0], result[1], torch.tensor(int(tied), dtype=torch.int64, device=device)

"""Drivers of stage 11_transfer: how the grader exercises your transfer-learning code.

Most of stage 11 takes a model or an optimiser, or returns one, so one call cannot be
compared as a tensor. These drivers build what your function receives, call it, and turn
what happens into tensors:

- ``pretrained_head``: your head (sequence or token) with MiniLM's configuration, built
  without random initialisation (the parameters outside ``bert`` start at zero), your
  ``load_backbone`` on the real checkpoint, the case's classifier weights, the case's dtype;
  returns the logits on real sentences.
- ``states``: your 09 ``BertModel`` (a small configuration with the case's weights, or
  MiniLM's loaded with your own ``load_pretrained``), then ``hidden_states(model, ...)``.
- ``aligned``: ``align_labels`` on each sentence of the case; returns every label, one
  sentence after another, as int64.
- ``frozen``: your head with the case's weights, ``freeze_backbone(model)``, a backward pass
  of a loss of the logits; returns per parameter (sorted names) ``requires_grad`` and
  whether ``.grad`` is set.
- ``adamw``: AdamW on your ``param_groups`` of a model of the grader's own (below) for N
  steps; returns each parameter's weight decay and every parameter after the steps. The
  AdamW is torch.optim.AdamW's update written out (``AdamW`` below), since a step of
  torch's own imports torch._dynamo, which costs a grading child 1-2 s.
- ``schedule``: your ``linear_schedule_with_warmup`` on an AdamW of the grader's own (two
  groups); returns each group's learning rate after every step and the parameters.

The grader's model is a small network named as your 09 BERT (``embeddings.LayerNorm``,
``layers.i.norm1``...) with a few other parts (a LayerNorm named ``ln``, a Linear without
bias): it only has to hold parameters of every kind and give them gradients. Nothing here
computes a result of yours.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autograder.runtime.drivers import require, watches_itself, watching
from autograder.runtime.drivers.bert import _no_random_init, minilm_weights

HEADS = {"sequence": "BertForSequenceClassification", "token": "BertForTokenClassification"}
IGNORE_INDEX = -100


def _copy_in(model: nn.Module, weights: dict[str, Tensor], what: str) -> None:
    """The case's weights into ``model``'s parameters of the same names."""
    with torch.no_grad():
        for name, tensor in weights.items():
            try:
                target = model.get_parameter(name)
            except AttributeError:
                raise AttributeError(f"{what} has no parameter `{name}`") from None
            if target.shape != tensor.shape:
                raise ValueError(
                    f"{what}: `{name}` has shape {tuple(target.shape)}, expected {tuple(tensor.shape)}"
                )
            target.copy_(tensor)


def _call_kwargs(data: dict[str, Any]) -> dict[str, Any]:
    """The case's keyword arguments of the graded call: only those the case gives, so an
    argument left out is graded at its default."""
    return dict(data["kwargs"])


@watches_itself
def pretrained_head(ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None) -> Tensor:
    """``cls(config, num_labels)`` without random initialisation, every parameter outside
    ``bert`` zero; ``load_backbone(model, weights)`` with the MiniLM checkpoint; the case's
    classifier weights; ``.to(device, dtype)``; then ``model(input_ids, ...)`` in eval mode,
    that forward under ``watch``."""
    options = data["init_kwargs"]
    cls, load_backbone = require(ns, HEADS[options["head"]]), require(ns, "load_backbone")
    with _no_random_init():
        model = cls(dict(options["config"]), options["num_labels"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("bert."):
                p.zero_()
    load_backbone(model, minilm_weights())
    dtype = getattr(torch, options["dtype"])
    model.to(device=device, dtype=dtype).eval()
    _copy_in(model, data["state"], f"your {HEADS[options['head']]}")
    with watching(watch), torch.no_grad():
        return model(*data["args"], **_call_kwargs(data))


@watches_itself
def states(ns: dict[str, Any], data: dict[str, Any], device: str, watch: Any = None) -> Tensor:
    """Your 09 ``BertModel(**config)`` with the case's weights (``state``) or MiniLM's, loaded
    with your ``load_pretrained``; then ``hidden_states(model, input_ids, ...)`` under ``watch``."""
    options = data["init_kwargs"]
    hidden_states = require(ns, "hidden_states")
    if "BertModel" not in ns:
        # A notebook whose 09 did not load: if hidden_states is still the stub, saying
        # "not implemented yet" comes first; any other outcome of a call on no model is moot.
        try:
            hidden_states(None, *data["args"], **_call_kwargs(data))
        except NotImplementedError:
            raise
        except Exception:
            pass
    bert_model = require(ns, "BertModel")
    if data["state"] is None:  # MiniLM
        with _no_random_init():
            model = bert_model(**options["config"])
        require(ns, "load_pretrained")(model, minilm_weights())
        model.to(device=device, dtype=getattr(torch, options["dtype"]))
    else:
        model = bert_model(**options["config"])
        model.to(device=device, dtype=next(iter(data["state"].values())).dtype)
        model.load_state_dict(data["state"], strict=True)
    model.eval()
    with watching(watch), torch.no_grad():
        return hidden_states(model, *data["args"], **_call_kwargs(data))


def aligned(ns: dict[str, Any], data: dict[str, Any], device: str) -> Tensor:
    """``align_labels(word_ids, word_labels)`` on each (word_ids, word_labels) of the case.
    Returns every label, one sentence after another: int64 (total tokens,)."""
    align_labels = require(ns, "align_labels")
    out: list[int] = []
    for k, (word_ids, word_labels) in enumerate(data["kwargs"]["sentences"]):
        labels = align_labels(list(word_ids), list(word_labels))
        if not isinstance(labels, list | tuple):
            raise TypeError(
                f"align_labels returned {type(labels).__name__} for sentence {k}; expected a list of int"
            )
        bad = [type(x).__name__ for x in labels if type(x) is not int]
        if bad:
            raise TypeError(f"align_labels returned a list holding {bad[0]} for sentence {k}; expected int")
        if len(labels) != len(word_ids):
            raise ValueError(
                f"align_labels returned {len(labels)} labels for sentence {k}, which has "
                f"{len(word_ids)} tokens: one label per token"
            )
        out += labels
    return torch.tensor(out, dtype=torch.int64, device=device)


def frozen(ns: dict[str, Any], data: dict[str, Any], device: str) -> tuple[Tensor, Tensor]:
    """Your head with the case's weights, ``freeze_backbone(model)``, then the sum of the
    logits' squares backpropagated. Returns, per parameter in sorted-name order, 1 where it
    requires grad and 1 where ``.grad`` is set (int64)."""
    options = data["init_kwargs"]
    cls, freeze_backbone = require(ns, HEADS[options["head"]]), require(ns, "freeze_backbone")
    model = cls(dict(options["config"]), options["num_labels"])
    model.to(device=device, dtype=next(iter(data["state"].values())).dtype)
    model.load_state_dict(data["state"], strict=True)
    freeze_backbone(model)
    model.eval()
    logits = model(*data["args"], **_call_kwargs(data))
    if logits.requires_grad:  # a model frozen whole has nothing to backpropagate
        (logits**2).sum().backward()
    named = sorted(model.named_parameters())
    return (
        torch.tensor([int(p.requires_grad) for _, p in named], dtype=torch.int64, device=device),
        torch.tensor([int(p.grad is not None) for _, p in named], dtype=torch.int64, device=device),
    )


# -- the grader's own model, for the optimiser ----------------------------------------------------


class _Block(nn.Module):
    """Named as a 09 layer: attention.w_q, norm1, ffn.linear1/linear2, norm2."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.attention = nn.Module()
        self.attention.w_q = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.ffn = nn.Module()
        self.ffn.linear1 = nn.Linear(hidden, inner)
        self.ffn.linear2 = nn.Linear(inner, hidden)
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm1(x + torch.tanh(self.attention.w_q(x)))
        return self.norm2(x + self.ffn.linear2(torch.tanh(self.ffn.linear1(x))))


class _Affine(nn.Module):
    """``x * weight + bias``, its parameters registered under names read from a configuration
    string: built at run time, they equal "weight" and "bias" but are other objects than
    the literals (so ``name is "bias"`` is a mistake, as 05's ``mode is "train"``)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        scale, shift = "weight bias".split()
        self.register_parameter(scale, nn.Parameter(torch.ones(size)))
        self.register_parameter(shift, nn.Parameter(torch.zeros(size)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight + self.bias


class ProbeModel(nn.Module):
    """A small classifier with parameters of every kind an optimiser set-up must sort:
    embeddings, Linear weights and biases, LayerNorms named LayerNorm, norm1, norm2 and ln
    (``norm_bias=False``: one without a bias), a Linear without bias, a learned scale named
    ``alpha`` (decayed: neither a bias nor a LayerNorm's, though its name sorts before
    "bias"), and a bias whose name is built at run time (``_Affine``)."""

    def __init__(
        self, vocab: int, hidden: int, inner: int, layers: int, classes: int, norm_bias: bool
    ) -> None:
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(vocab, hidden)
        self.embeddings.LayerNorm = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(_Block(hidden, inner) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden, bias=norm_bias)
        self.alpha = nn.Parameter(torch.ones(hidden))
        self.head = nn.Linear(hidden, classes, bias=False)
        self.classifier = nn.Linear(hidden, classes)
        self.out = _Affine(classes)

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.embeddings.LayerNorm(self.embeddings.word_embeddings(input_ids))  # (B, L, H)
        for layer in self.layers:
            x = layer(x)
        x = self.ln(x) * self.alpha
        return self.out(self.classifier(x[:, 0]) + self.head(x.mean(dim=1)))  # (B, classes)


def probe_model(options: dict[str, Any], state: dict[str, Tensor], device: str) -> ProbeModel:
    sizes = options["model"]
    model = ProbeModel(**sizes)
    model.to(device=device, dtype=next(iter(state.values())).dtype)
    model.load_state_dict(state, strict=True)
    return model


def _train(model: nn.Module, optimizer: Any, data: dict[str, Any], steps: int, after_step=None) -> None:
    """``steps`` steps on the case's batch: loss, backward, optimiser step, ``after_step()``."""
    input_ids, labels = data["args"]
    for _ in range(steps):
        loss = F.cross_entropy(model(input_ids), labels)
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step()
        for p in model.parameters():
            p.grad = None


def _flat(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().flatten() for _, p in sorted(model.named_parameters())])


class AdamW(torch.optim.Optimizer):
    """``torch.optim.AdamW``'s update, step for step (its single-tensor path: the same
    operations in the same order; tests/reference/test_11_transfer.py proves them equal),
    written out because torch's own ``step`` imports ``torch._dynamo`` (1-2 s and 70 MB in
    every grading child that makes one). An ``Optimizer`` all the same: a scheduler of the
    student's takes it as it takes torch's."""

    def __init__(self, params: Any, lr: float, betas: tuple[float, float], eps: float) -> None:
        _skip_dynamo_in(torch.optim.Optimizer.add_param_group)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=1e-2))

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, weight_decay, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
                if weight_decay != 0:
                    p.mul_(1 - lr * weight_decay)  # decoupled: AdamW, not Adam's L2
                exp_avg.lerp_(p.grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                step_size = lr / (1 - beta1**step)
                denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
                p.addcdiv_(exp_avg, denom, value=-step_size)


def _skip_dynamo_in(method: Any) -> None:
    """torch wraps some Optimizer methods to turn torch.compile off inside them, and the
    wrapper's first call imports torch._dynamo to do so; it caches its choice on the wrapped
    function. Caching the function itself skips the import: nothing here is compiled."""
    raw = getattr(method, "__wrapped__", None)
    if raw is not None and getattr(raw, "__dynamo_disable", None) is None:
        raw.__dynamo_disable = raw


def _adamw(groups: Any, options: dict[str, Any]) -> AdamW:
    """The case's betas and eps; ``lr`` the case's, or each group's own."""
    return AdamW(groups, lr=options.get("lr", 1e-3), betas=tuple(options["betas"]), eps=options["eps"])


def adamw(ns: dict[str, Any], data: dict[str, Any], device: str) -> tuple[Tensor, Tensor]:
    """``AdamW(param_groups(model, weight_decay), lr, betas, eps)`` (torch.optim.AdamW's
    update, above) on the grader's model, ``steps`` steps on the case's batch. Returns each parameter's weight
    decay (sorted names; -1 for a parameter in no group) as float64, and every parameter
    after the steps, flattened in the same order."""
    options = data["init_kwargs"]
    param_groups = require(ns, "param_groups")
    model = probe_model(options, data["state"], device)
    groups = param_groups(model, options["weight_decay"])
    if isinstance(groups, dict) or not isinstance(groups, list | tuple):
        raise TypeError(f"param_groups returned {type(groups).__name__}; expected a list of dicts")
    decay: dict[int, float] = {}
    for k, group in enumerate(groups):
        if not isinstance(group, dict) or set(group) != {"params", "weight_decay"}:
            keys = sorted(group) if isinstance(group, dict) else type(group).__name__
            raise ValueError(
                f"param_groups: group {k} is {keys}; expected a dict of 'params' and 'weight_decay'"
            )
        group["params"] = list(group["params"])
        for p in group["params"]:
            decay[id(p)] = float(group["weight_decay"])
    weight_decay = [decay.get(id(p), -1.0) for _, p in sorted(model.named_parameters())]
    _train(model, _adamw(list(groups), options), data, options["steps"])
    return torch.tensor(weight_decay, dtype=torch.float64, device=device), _flat(model)


def schedule(ns: dict[str, Any], data: dict[str, Any], device: str) -> tuple[Tensor, Tensor]:
    """An AdamW of the grader's own over its model (``embeddings`` and ``layers`` in a group
    at ``lrs[0]``, the rest at ``lrs[1]``, weight decay 0.01), then
    ``linear_schedule_with_warmup(optimizer, num_warmup_steps=..., num_training_steps=...)``
    and ``steps`` steps, ``scheduler.step()`` after each ``optimizer.step()``. Returns each
    group's learning rate at creation and after every step, float64 (steps + 1, 2), and every
    parameter after the steps (sorted names)."""
    options = data["init_kwargs"]
    make_schedule = require(ns, "linear_schedule_with_warmup")
    model = probe_model(options, data["state"], device)
    body = [p for n, p in model.named_parameters() if n.startswith(("embeddings.", "layers."))]
    rest = [p for n, p in model.named_parameters() if not n.startswith(("embeddings.", "layers."))]
    lr_body, lr_rest = options["lrs"]
    optimizer = _adamw(
        [
            {"params": body, "lr": lr_body, "weight_decay": 0.01},
            {"params": rest, "lr": lr_rest, "weight_decay": 0.01},
        ],
        options,
    )
    scheduler = make_schedule(optimizer, **_call_kwargs(data))
    if not callable(getattr(scheduler, "step", None)):
        raise TypeError(
            f"linear_schedule_with_warmup returned {type(scheduler).__name__}, which has no step(); "
            "expected a learning-rate scheduler (torch.optim.lr_scheduler.LambdaLR)"
        )
    lrs = [[float(g["lr"]) for g in optimizer.param_groups]]

    def step() -> None:
        scheduler.step()
        lrs.append([float(g["lr"]) for g in optimizer.param_groups])

    _train(model, optimizer, data, options["steps"], step)
    if not all(math.isfinite(x) for row in lrs for x in row):
        raise ValueError("linear_schedule_with_warmup set a learning rate that is not finite")
    return torch.tensor(lrs, dtype=torch.float64, device=device), _flat(model)

"""Stage 11: transfer learning on the student's own 09 BERT (CURRICULUM.md, 11_transfer).

The heads (``BertPooler``, ``BertForSequenceClassification``, ``BertForTokenClassification``)
are graded as modules on small random configurations, with the student's own 09
``BertModel`` inside; ``load_backbone`` and ``hidden_states`` also on the real
all-MiniLM-L6-v2 weights and real sentences, with 09's tolerance for real weights. The
other names take a model, an optimiser or a tokenizer's output, so drivers
(``autograder/runtime/drivers/transfer.py``) exercise them: ``align_labels`` on the real
MiniLM tokenizer's ``word_ids`` (exact), ``freeze_backbone`` through a backward pass,
``param_groups`` and ``linear_schedule_with_warmup`` through N AdamW steps on a model of the
grader's own. tests/reference proves the reference equals transformers on all of them.
"""

from __future__ import annotations

import functools
import importlib

import torch
from torch import Tensor, nn

import reference
from autograder.runtime.drivers.bert import read_minilm_tokenizer
from autograder.runtime.drivers.transfer import ProbeModel
from autograder.stages import load_spec
from autograder.stages.spec import (
    Case,
    CaseData,
    Dim,
    Graded,
    StageSpec,
    Test,
    Tolerance,
    Variant,
    own_values,
    randint,
    randn,
    tolerance_for,
)

ref = reference.load("11_transfer")
mini_bert = importlib.import_module("autograder.stages.09_mini_bert")  # its cases' helpers

# The heads, the loader and hidden_states run the student's 09 BertModel: they forbid what
# 09 forbids there and nothing it allows ([conventions.forbidden]).
FORBIDDEN = load_spec("09_mini_bert").graded_name("BertModel").forbidden
MINILM = ref.mini_bert.MINILM_CONFIG
TINY = mini_bert.TINY

# -- the heads on small random configurations ---------------------------------------------------


def _state(module: nn.Module, g: torch.Generator, dtype: torch.dtype) -> dict[str, Tensor]:
    """09's random weights (LayerNorm gains near 1) for every entry of ``module``'s state."""
    return mini_bert._random_state(module, g, dtype)


def _pooler_case(b: int, length: int, hidden: int):
    def build(g, dtype):
        state = {
            "dense.weight": randn(g, hidden, hidden, dtype=dtype, scale=hidden**-0.5),
            "dense.bias": randn(g, hidden, dtype=dtype, scale=0.5),
        }
        return CaseData(args=(randn(g, b, length, hidden, dtype=dtype),), init_args=(hidden,), state=state)

    return build


def _head_case(
    head: type[nn.Module],
    b: int,
    length: int,
    num_labels: int,
    padded: bool = True,
    types: bool = True,
    omit_none: bool = False,
    eps: float | None = TINY["eps"],
    **overrides: int,
):
    """A head of ``head``'s class on a small configuration (09's TINY with ``overrides``);
    ``eps=None`` leaves it out of the config. ``omit_none``: token types or a mask the case
    has none of are left out of the call, not passed as None."""

    def build(g, dtype):
        config = {**{k: v for k, v in TINY.items() if k != "eps"}, **overrides}
        if eps is not None:
            config["eps"] = eps
        state = _state(head(config, num_labels), g, dtype)
        input_ids, token_type_ids, attention_mask = mini_bert._batch(
            g, b, length, config["vocab_size"], padded, types
        )
        kwargs = {"token_type_ids": token_type_ids, "attention_mask": attention_mask}
        if omit_none:
            kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return CaseData(args=(input_ids,), kwargs=kwargs, init_args=(config, num_labels), state=state)

    return build


def _real_tokens(data: CaseData) -> tuple[Tensor | None]:
    return mini_bert._real_positions(data.kwargs.get("attention_mask"))


# -- size dimensions ------------------------------------------------------------------------------

ALL_ONE = mini_bert.ALL_ONE  # every size of a configuration 1


def _ids_dims(l_never_one: str | None = None) -> tuple[Dim, ...]:
    """B and L of the input ids (the first argument)."""
    return (
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("L", lambda c: c.args[0].shape[1], never_one=l_never_one),
    )


def _config_dims(config) -> tuple[Dim, ...]:
    """The sizes of the case's configuration, ``config(case data)``."""
    return tuple(Dim(k, lambda c, k=k: config(c)[k]) for k in ALL_ONE)


HEAD_DIMS = (
    *_ids_dims(),
    Dim("num_labels", lambda c: c.init_args[1]),
    *_config_dims(lambda c: c.init_args[0]),
)
A_SENTENCE = "a sentence holds [CLS] and [SEP]"


# -- known mistakes of the heads ---------------------------------------------------------------------


class _LastTokenPooler(ref.BertPooler):
    def forward(self, hidden_states):
        return torch.tanh(self.dense(hidden_states[:, -1]))


class _LastPositionClassifier(ref.BertForSequenceClassification):
    """The state at position L - 1, as a decoder would read it (padding, in a padded row)."""

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        h = self.bert(input_ids, token_type_ids, attention_mask)
        return self.classifier(torch.tanh(self.pooler.dense(h[:, -1])))


class _LastRealTokenClassifier(ref.BertForSequenceClassification):
    """The last real token's state ([SEP]), as GPT-2's sequence classifier reads it."""

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        h = self.bert(input_ids, token_type_ids, attention_mask)
        last = torch.full_like(input_ids[:, 0], input_ids.size(1) - 1)
        if attention_mask is not None:
            last = attention_mask.sum(dim=1) - 1
        pooled = torch.tanh(self.pooler.dense(h[torch.arange(h.size(0), device=h.device), last]))
        return self.classifier(pooled)


LAST_TOKEN = (
    Variant("last-token-not-cls", _LastPositionClassifier),
    Variant("last-token-not-cls", _LastRealTokenClassifier),
)


def _backbone_without_pooler(model, weights):
    ref.load_pretrained(model.bert, weights)


# -- the heads on MiniLM ---------------------------------------------------------------------------------

PUBLIC_SENTENCES = (
    "The film was a delight from start to finish.",
    "I would not recommend this phone to anyone.",
    "The soup was cold and the waiter was rude.",
)
HIDDEN_SENTENCES = (
    "An honest, funny and beautifully acted story.",
    "The battery died after two days.",
    "Nothing about the service felt rushed.",
    "Fine.",
)
HIDDEN_PAIR = ("Is the hotel near the station?", "It is a ten minute walk from the main station.")


def _pretrained_case(head: str, sentences, num_labels: int):
    def build(g, dtype):
        input_ids, token_type_ids, attention_mask = mini_bert.encode(sentences)
        state = {
            "classifier.weight": randn(g, num_labels, MINILM["hidden_size"], dtype=dtype, scale=0.2),
            "classifier.bias": randn(g, num_labels, dtype=dtype, scale=0.5),
        }
        options = {
            "head": head,
            "config": dict(MINILM),
            "num_labels": num_labels,
            "dtype": str(dtype).removeprefix("torch."),
        }
        kwargs = {"token_type_ids": token_type_ids, "attention_mask": attention_mask}
        return CaseData(args=(input_ids,), kwargs=kwargs, init_kwargs=options, state=state)

    return build


def _pretrained_region(data: CaseData) -> tuple[Tensor | None]:
    if data.init_kwargs["head"] == "sequence":
        return (None,)
    return _real_tokens(data)


def _real_weights_tolerance(data: CaseData, dtype: torch.dtype, device: str) -> Tolerance:
    """09's tolerance where the MiniLM weights run (no state: the case loads the checkpoint)."""
    if data.init_kwargs.get("head") or data.state is None:
        return mini_bert._pretrained_tolerance(data, dtype, device)
    return tolerance_for(dtype, device)


# -- hidden_states ---------------------------------------------------------------------------------------


def _states_case(
    b: int,
    length: int,
    layers: list[int] | None,
    padded: bool = True,
    types: bool = True,
    omit_none: bool = False,
    **overrides: int,
):
    """hidden_states on your 09 BertModel of a small configuration with random weights."""

    def build(g, dtype):
        config = {**TINY, **overrides}
        state = _state(ref.BertModel(**config), g, dtype)
        input_ids, token_type_ids, attention_mask = mini_bert._batch(
            g, b, length, config["vocab_size"], padded, types
        )
        kwargs = {"token_type_ids": token_type_ids, "attention_mask": attention_mask, "layers": layers}
        if omit_none:
            kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return CaseData(args=(input_ids,), kwargs=kwargs, init_kwargs={"config": config}, state=state)

    return build


def _states_minilm_case(sentences, layers: list[int] | None):
    def build(g, dtype):
        input_ids, token_type_ids, attention_mask = mini_bert.encode(sentences)
        kwargs = {"token_type_ids": token_type_ids, "attention_mask": attention_mask, "layers": layers}
        options = {"config": dict(MINILM), "dtype": str(dtype).removeprefix("torch.")}
        return CaseData(args=(input_ids,), kwargs=kwargs, init_kwargs=options)

    return build


def _states_without_embeddings(model, input_ids, token_type_ids=None, attention_mask=None, layers=None):
    """The layers' outputs only: state i read as the output of layer i + 1."""
    everything = ref.hidden_states(model, input_ids, token_type_ids, attention_mask)[1:]
    return _pick(everything, layers)


def _states_before_each_layer(model, input_ids, token_type_ids=None, attention_mask=None, layers=None):
    """Each layer's input recorded, so the last layer's output is missing."""
    everything = ref.hidden_states(model, input_ids, token_type_ids, attention_mask)[:-1]
    return _pick(everything, layers)


def _states_shifted(model, input_ids, token_type_ids=None, attention_mask=None, layers=None):
    """Each layer's input appended before it runs, after the embeddings: state i holds the
    output of layer i - 1 (state 1 the embeddings again), and no state the last layer's."""
    everything = ref.hidden_states(model, input_ids, token_type_ids, attention_mask)
    return _pick(torch.cat([everything[:1], everything[:-1]]), layers)


def _pick(states: Tensor, layers: list[int] | None) -> Tensor:
    if layers is None:
        return states
    if any(not -len(states) <= i < len(states) for i in layers):
        raise ValueError("this mistake raises IndexError on this case")  # not a variant here
    return states[list(layers)]


# -- align_labels -----------------------------------------------------------------------------------------

NER_PUBLIC = (
    (
        ("Arnold", "Schwarzenegger", "visited", "Hugging", "Face", "in", "Brooklyn", "."),
        (1, 2, 0, 3, 4, 0, 5, 0),
    ),
    (
        ("EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."),
        (3, 0, 7, 0, 0, 0, 7, 0, 0),
    ),
    (("Ngozi", "Okonjo-Iweala", "leads", "the", "WTO", "in", "Geneva", "."), (1, 2, 0, 0, 3, 0, 5, 0)),
)
NER_HIDDEN = (
    (("Tchaikovsky", "premiered", "in", "Reykjavík", "with", "Zuckerberg"), (1, 0, 0, 5, 0, 1)),
    (("Müller", "signed", "for", "Bayern", "München", "in", "2013", "."), (1, 0, 0, 3, 4, 0, 0, 0)),
    (("Peter", "Blackburn"), (1, 2)),
    (
        ("Okonjo-Iweala", "met", "Schwarzenegger", "at", "the", "UNHCR", "offices", "."),
        (1, 0, 1, 0, 0, 3, 0, 0),
    ),
)


@functools.cache
def _ner_tokenizer(pad_to: int | None, truncate_to: int | None):
    tok = read_minilm_tokenizer()
    if truncate_to is not None:
        tok.enable_truncation(max_length=truncate_to)
    if pad_to is not None:
        tok.enable_padding(length=pad_to)
    return tok


def _real_alignment_case(sentences, pad_to: int | None = None, truncate_to: int | None = None):
    """word_ids of the real MiniLM tokenizer on pre-split words, with the words' labels."""

    def build(g, dtype):
        tok = _ner_tokenizer(pad_to, truncate_to)
        pairs = [
            (list(tok.encode(list(words), is_pretokenized=True).word_ids), list(labels))
            for words, labels in sentences
        ]
        return CaseData(kwargs={"sentences": pairs})

    return build


def _hand_made_case(*pairs):
    def build(g, dtype):
        return CaseData(kwargs={"sentences": [(list(w), list(lab)) for w, lab in pairs]})

    return build


def _words(data: CaseData, i: int) -> int | None:
    sentences = data.kwargs["sentences"]
    return len(sentences[i][1]) if i < len(sentences) else None


def _every_subtoken_labelled(word_ids, word_labels):
    return [-100 if word is None else word_labels[word] for word in word_ids]


# -- freeze_backbone ----------------------------------------------------------------------------------


def _freeze_case(head: str, b: int, length: int, num_labels: int, padded: bool, **overrides: int):
    def build(g, dtype):
        config = {**TINY, **overrides}
        cls = ref.BertForSequenceClassification if head == "sequence" else ref.BertForTokenClassification
        state = _state(cls(config, num_labels), g, torch.float64)
        input_ids, token_type_ids, attention_mask = mini_bert._batch(
            g, b, length, config["vocab_size"], padded, True
        )
        kwargs = {"token_type_ids": token_type_ids, "attention_mask": attention_mask}
        options = {"head": head, "config": config, "num_labels": num_labels}
        return CaseData(args=(input_ids,), kwargs=kwargs, init_kwargs=options, state=state)

    return build


def _bert_left_in_eval_mode(model):
    """``model.bert.eval()``: dropout off, but every parameter still learns."""
    model.bert.eval()


def _freezing(which):
    """A freeze_backbone that freezes only the parameters of ``model.bert`` whose names (in
    model.bert) ``which(name, parameter, num_layers)`` picks: a part of the backbone."""

    def freeze_backbone(model):
        layers = len(model.bert.layers)
        for name, p in model.bert.named_parameters():
            if which(name, p, layers):
                p.requires_grad = False

    return freeze_backbone


# The backbone frozen in part, as students write it: one part (the embeddings, the layers,
# the word embeddings), all but a part (the last layer, the embeddings' LayerNorm), or by a
# test that misses some parameters (matrices only, biases left out).
PARTIAL_FREEZES = (
    _freezing(lambda n, p, _: n.startswith("embeddings.")),  # embeddings only
    _freezing(lambda n, p, _: n.startswith("layers.")),  # layers only: embeddings left trainable
    _freezing(lambda n, p, _: n.startswith("embeddings.word_embeddings.")),
    _freezing(lambda n, p, _: not n.startswith("embeddings.LayerNorm.")),
    _freezing(lambda n, p, layers: not n.startswith(f"layers.{layers - 1}.")),  # fine-tune the last layer
    _freezing(lambda n, p, _: p.dim() >= 2),  # matrices only: biases and LayerNorms left trainable
    _freezing(lambda n, p, _: not n.endswith("bias")),  # biases left trainable
)


# -- param_groups and linear_schedule_with_warmup --------------------------------------------------------

PROBE = dict(vocab=30, hidden=8, inner=12, layers=2, classes=3, norm_bias=True)
SMALL_PROBE = dict(vocab=2, hidden=3, inner=2, layers=1, classes=2)  # counterexamples' (``small``)


# The grader's own model has a fixed batch; its blocks are the size the cases vary.
PROBE_LAYERS = Dim("layers (of the grader's model)", lambda c: c.init_kwargs["model"]["layers"])


def _probe_state(g: torch.Generator, dtype: torch.dtype, sizes: dict) -> dict[str, Tensor]:
    state = {}
    for name, value in sorted(ProbeModel(**sizes).state_dict().items()):
        t = randn(g, *value.shape, dtype=dtype, scale=0.5)
        if value.dim() == 1 and not name.endswith("bias"):  # LayerNorm gains and scales near 1
            t = t * 0.2 + 1.0
        state[name] = t
    return state


def _batch(g: torch.Generator, sizes: dict, b: int = 6, length: int = 5) -> tuple[Tensor, Tensor]:
    return randint(g, 0, sizes["vocab"], b, length), randint(g, 0, sizes["classes"], b)


def _adamw_case(weight_decay: float, steps: int, lr: float = 0.05, **sizes):
    def build(g, dtype):
        model = {**PROBE, **sizes}
        options = {
            "model": model,
            "weight_decay": weight_decay,
            "lr": lr,
            "betas": [0.9, 0.999],
            "eps": 1e-8,
            "steps": steps,
        }
        return CaseData(args=_batch(g, model), init_kwargs=options, state=_probe_state(g, dtype, model))

    return build


def _schedule_case(warmup: int, total: int, steps: int, lrs=(0.05, 0.2), **sizes):
    def build(g, dtype):
        model = {**PROBE, **sizes}
        options = {"model": model, "lrs": list(lrs), "betas": [0.9, 0.999], "eps": 1e-8, "steps": steps}
        return CaseData(
            args=_batch(g, model),
            kwargs={"num_warmup_steps": warmup, "num_training_steps": total},
            init_kwargs=options,
            state=_probe_state(g, dtype, model),
        )

    return build


def _one_group(model, weight_decay):
    return [{"params": list(model.parameters()), "weight_decay": weight_decay}]


def _by_name(model, weight_decay):
    """The run_glue.py recipe, no_decay = ["bias", "LayerNorm.weight"]: misses norm1, norm2, ln."""
    no_decay = ("bias", "LayerNorm.weight")
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": weight_decay},
        {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]


def _biases_only(model, weight_decay):
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if not n.endswith("bias")], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0},
    ]


def _warmup_from_one(optimizer, num_warmup_steps, num_training_steps):
    """(k + 1) / warmup: the first step already has a learning rate."""

    def factor(step):
        if step < num_warmup_steps:
            return (step + 1) / max(1, num_warmup_steps)
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _one_step_ahead(optimizer, num_warmup_steps, num_training_steps):
    """The whole schedule a step early, as with scheduler.step() before optimizer.step()."""
    schedule = ref.linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps)
    factor = schedule.lr_lambdas[0]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factor(step + 1))


# -- graded names -----------------------------------------------------------------------------------------

POOLER = Graded(
    name="BertPooler",
    clause="11.BertPooler",
    task=1,
    signature="BertPooler(hidden_size); forward(hidden_states (B, L, H)) -> (B, H)",
    outputs=("pooled",),
    reference=ref.BertPooler,
    kind="module",
    variants=(Variant("last-token-not-cls", _LastTokenPooler),),
    dims=(*_ids_dims(), Dim("H", lambda c: c.init_args[0])),
    # two positions (the first token is not the last), then two rows, H = 2
    small=(_pooler_case(1, 2, 2), _pooler_case(2, 2, 2), _pooler_case(2, 3, 3)),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=0.5,
            hidden=False,
            cases=(Case("B=2, L=5, H=8", _pooler_case(2, 5, 8)),),
        ),
        Test(
            "float64",
            torch.float64,
            points=0.5,
            hidden=False,
            cases=(Case("B=3, L=4, H=16", _pooler_case(3, 4, 16)),),
        ),
        Test(
            "float64, other shapes",
            torch.float64,
            points=0.5,
            cases=(
                Case("B=1, L=1, H=4", _pooler_case(1, 1, 4)),
                Case("B=4, L=9, H=32", _pooler_case(4, 9, 32)),
                Case("B=3, L=2, H=1", _pooler_case(3, 2, 1)),
            ),
        ),
        Test(
            "float32, MiniLM's width",
            torch.float32,
            points=0.5,
            cases=(Case("B=2, L=12, H=384", _pooler_case(2, 12, 384)),),
        ),
    ),
)

SEQUENCE = Graded(
    name="BertForSequenceClassification",
    clause="11.BertForSequenceClassification",
    task=2,
    signature="BertForSequenceClassification(config, num_labels); "
    "forward(input_ids, token_type_ids=None, attention_mask=None) -> (B, num_labels)",
    outputs=("logits",),
    reference=ref.BertForSequenceClassification,
    kind="module",
    forbidden=FORBIDDEN,
    variants=LAST_TOKEN,
    dims=HEAD_DIMS,
    # 09's smallest BERT (hidden size 3, one layer and head): two tokens, then a padded batch
    small=(
        _head_case(ref.BertForSequenceClassification, 1, 2, 2, padded=False, **mini_bert.SMALL_MODEL),
        _head_case(ref.BertForSequenceClassification, 2, 3, 2, **mini_bert.SMALL_MODEL),
    ),
    tests=(
        Test(
            "float32, padded batch",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case(
                    "B=3, L=7, 2 layers, token types, 3 labels",
                    _head_case(ref.BertForSequenceClassification, 3, 7, 3),
                ),
            ),
        ),
        Test(
            "float64",
            torch.float64,
            points=0.5,
            hidden=False,
            cases=(
                Case(
                    "B=2, L=5, 2 labels, token types and mask left out",
                    _head_case(
                        ref.BertForSequenceClassification, 2, 5, 2, padded=False, types=False, omit_none=True
                    ),
                ),
            ),
        ),
        Test(
            "float64, other configurations",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "B=4, L=10, 3 layers, 2 heads, eps=1e-3, 5 labels",
                    _head_case(
                        ref.BertForSequenceClassification, 4, 10, 5, eps=1e-3, num_layers=3, num_heads=2
                    ),
                ),
                Case(
                    "B=1, L=1, 1 layer, 1 label, eps left out",
                    _head_case(
                        ref.BertForSequenceClassification, 1, 1, 1, padded=False, eps=None, num_layers=1
                    ),
                ),
                Case(
                    "every size of the configuration 1, B=2, L=1, 3 labels",
                    _head_case(
                        ref.BertForSequenceClassification, 2, 1, 3, padded=False, types=False, **ALL_ONE
                    ),
                ),
            ),
        ),
        Test(
            "float32, other configurations",
            torch.float32,
            points=0.5,
            cases=(
                Case(
                    "B=5, L=12, 8 heads, 4 labels",
                    _head_case(ref.BertForSequenceClassification, 5, 12, 4, num_heads=8),
                ),
            ),
        ),
    ),
)

TOKEN = Graded(
    name="BertForTokenClassification",
    clause="11.BertForTokenClassification",
    task=3,
    signature="BertForTokenClassification(config, num_labels); "
    "forward(input_ids, token_type_ids=None, attention_mask=None) -> (B, L, num_labels)",
    outputs=("logits",),
    reference=ref.BertForTokenClassification,
    kind="module",
    forbidden=FORBIDDEN,
    graded_region=_real_tokens,
    dims=HEAD_DIMS,
    small=(
        _head_case(ref.BertForTokenClassification, 1, 2, 2, padded=False, **mini_bert.SMALL_MODEL),
        _head_case(ref.BertForTokenClassification, 2, 3, 2, **mini_bert.SMALL_MODEL),
    ),
    tests=(
        Test(
            "float32, padded batch",
            torch.float32,
            points=0.5,
            hidden=False,
            cases=(
                Case("B=3, L=8, token types, 5 labels", _head_case(ref.BertForTokenClassification, 3, 8, 5)),
            ),
        ),
        Test(
            "float64",
            torch.float64,
            points=0.5,
            hidden=False,
            cases=(
                Case(
                    "B=2, L=6, 3 labels, token types and mask left out",
                    _head_case(
                        ref.BertForTokenClassification, 2, 6, 3, padded=False, types=False, omit_none=True
                    ),
                ),
            ),
        ),
        Test(
            "float64, other configurations",
            torch.float64,
            points=0.5,
            cases=(
                Case(
                    "B=4, L=11, 3 layers, 2 heads, eps=1e-3, 9 labels",
                    _head_case(ref.BertForTokenClassification, 4, 11, 9, eps=1e-3, num_layers=3, num_heads=2),
                ),
                Case(
                    "B=1, L=2, 1 layer, 1 label, eps left out",
                    _head_case(ref.BertForTokenClassification, 1, 2, 1, padded=False, eps=None, num_layers=1),
                ),
                Case(
                    "every size of the configuration 1, B=2, L=1, 3 labels",
                    _head_case(ref.BertForTokenClassification, 2, 1, 3, padded=False, types=False, **ALL_ONE),
                ),
            ),
        ),
        Test(
            "float32, other configurations",
            torch.float32,
            points=0.5,
            cases=(
                Case(
                    "B=5, L=12, 8 heads, 7 labels",
                    _head_case(ref.BertForTokenClassification, 5, 12, 7, num_heads=8),
                ),
            ),
        ),
    ),
)

BACKBONE = Graded(
    name="load_backbone",
    clause="11.load_backbone",
    task=4,
    signature="load_backbone(model, weights): the all-MiniLM-L6-v2 checkpoint into model.bert "
    "(with your load_pretrained) and into model.pooler if it has one",
    outputs=("logits",),
    reference=ref.load_backbone,
    kind="driver",
    driver="transfer:pretrained_head",
    forbidden=FORBIDDEN,
    graded_region=_pretrained_region,
    tolerance=_real_weights_tolerance,
    dims=(
        *_ids_dims(A_SENTENCE),
        Dim("num_labels", lambda c: c.init_kwargs["num_labels"]),
        Dim("hidden_size", lambda c: c.init_kwargs["config"]["hidden_size"], never_one="MiniLM's is 384"),
    ),
    variants=(
        Variant("pooler-not-loaded", _backbone_without_pooler),
        Variant("last-token-not-cls", _LastPositionClassifier, replaces="BertForSequenceClassification"),
        Variant("last-token-not-cls", _LastRealTokenClassifier, replaces="BertForSequenceClassification"),
    ),
    # MiniLM's real weights whatever the input (each call loads them, ~1.5 s): one short
    # padded pair of public words, on the head whose mistakes are this name's, at its own
    # values (a 2 x 384 classifier reads no better in integers)
    small=(own_values(_pretrained_case("sequence", ("cat", "the cat sat"), 2)),),
    tests=(
        Test(
            "float32, sequence head, real sentences",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("3 sentences, padded, 3 labels", _pretrained_case("sequence", PUBLIC_SENTENCES, 3)),),
        ),
        Test(
            "float64, token head, real sentences",
            torch.float64,
            points=1,
            hidden=False,
            cases=(Case("3 sentences, padded, 5 labels", _pretrained_case("token", PUBLIC_SENTENCES, 5)),),
        ),
        Test(
            "float32, both heads, hidden sentences and a pair",
            torch.float32,
            points=1,
            cases=(
                Case(
                    "sequence head, 4 sentences + 1 pair",
                    _pretrained_case("sequence", (*HIDDEN_SENTENCES, HIDDEN_PAIR), 2),
                ),
                Case(
                    "token head, 4 sentences + 1 pair",
                    _pretrained_case("token", (*HIDDEN_SENTENCES, HIDDEN_PAIR), 9),
                ),
            ),
        ),
        Test(
            "float64, both heads, hidden sentences and a pair",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "sequence head, 4 sentences + 1 pair",
                    _pretrained_case("sequence", (*HIDDEN_SENTENCES, HIDDEN_PAIR), 4),
                ),
                Case(
                    "token head, 4 sentences + 1 pair",
                    _pretrained_case("token", (*HIDDEN_SENTENCES, HIDDEN_PAIR), 3),
                ),
                Case(
                    "sequence head, 1 sentence, 1 label",
                    _pretrained_case("sequence", HIDDEN_SENTENCES[:1], 1),
                ),
            ),
        ),
    ),
)

STATES = Graded(
    name="hidden_states",
    clause="11.hidden_states",
    task=5,
    signature="hidden_states(model, input_ids, token_type_ids=None, attention_mask=None, layers=None) "
    "-> (len(layers), B, L, H)",
    outputs=("states",),
    reference=ref.hidden_states,
    kind="driver",
    driver="transfer:states",
    forbidden=FORBIDDEN,
    graded_region=_real_tokens,
    tolerance=_real_weights_tolerance,
    variants=(
        Variant("hidden-states-off-by-one", _states_shifted),
        Variant("hidden-states-off-by-one", _states_without_embeddings),
        Variant("hidden-states-off-by-one", _states_before_each_layer),
    ),
    dims=(
        *_ids_dims(),
        Dim("len(layers)", lambda c: None if c.kwargs.get("layers") is None else len(c.kwargs["layers"])),
        *_config_dims(lambda c: c.init_kwargs["config"]),
    ),
    # 09's smallest BERT: one layer (two states), then two layers picked by index, padded
    small=(
        _states_case(1, 2, None, padded=False, **mini_bert.SMALL_MODEL),
        _states_case(2, 3, [0, -1], **{**mini_bert.SMALL_MODEL, "num_layers": 2}),
    ),
    tests=(
        Test(
            "float32, every state, padded batch",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("B=3, L=7, 2 layers, layers=None", _states_case(3, 7, None)),
                Case("B=2, L=6, 3 layers, layers=[1, 0, -1]", _states_case(2, 6, [1, 0, -1], num_layers=3)),
            ),
        ),
        Test(
            "float64, chosen layers",
            torch.float64,
            points=0.5,
            hidden=False,
            cases=(Case("B=2, L=5, 3 layers, layers=[0, 2]", _states_case(2, 5, [0, 2], num_layers=3)),),
        ),
        Test(
            "float64, other configurations and layers",
            torch.float64,
            points=0.5,
            cases=(
                Case(
                    "B=4, L=9, 4 layers, layers=[-2, 0, 4, -2] (a repeat)",
                    _states_case(4, 9, [-2, 0, 4, -2], num_layers=4, num_heads=2),
                ),
                Case(
                    "B=1, L=4, 1 layer; token types, mask and layers left out",
                    _states_case(1, 4, None, padded=False, types=False, omit_none=True, num_layers=1),
                ),
                Case("B=3, L=6, 3 layers, layers=[-1]", _states_case(3, 6, [-1], num_layers=3)),
                Case(
                    "every size of the configuration 1, B=2, L=1, layers=[1, 0]",
                    _states_case(2, 1, [1, 0], padded=False, types=False, **ALL_ONE),
                ),
            ),
        ),
        Test(
            "float32, MiniLM: the paper's last four layers",
            torch.float32,
            points=1,
            cases=(
                Case(
                    "4 sentences + 1 pair, layers=[-4, -3, -2, -1]",
                    _states_minilm_case((*HIDDEN_SENTENCES, HIDDEN_PAIR), [-4, -3, -2, -1]),
                ),
                Case("3 sentences, layers=[0, 6]", _states_minilm_case(PUBLIC_SENTENCES, [0, 6])),
            ),
        ),
    ),
)

ALIGN = Graded(
    name="align_labels",
    clause="11.align_labels",
    task=6,
    signature="align_labels(word_ids, word_labels) -> list[int] (one label per token)",
    outputs=("labels (every sentence's, one after another)",),
    reference=ref.align_labels,
    kind="driver",
    driver="transfer:aligned",
    variants=(Variant("every-subtoken-labelled", _every_subtoken_labelled),),
    # the driver calls align_labels once per sentence of a case: W is each one's words
    dims=(
        Dim("sentences", lambda c: len(c.kwargs["sentences"])),
        *(Dim(f"W of sentence {i + 1}", lambda c, i=i: _words(c, i)) for i in range(4)),
    ),
    # one word of one piece, then of two pieces, then two words
    small=(
        _hand_made_case(([None, 0, None], [2])),
        _hand_made_case(([None, 0, 0, None], [2])),
        _hand_made_case(([None, 0, 1, 1, None], [1, 2])),
    ),
    tests=(
        Test(
            "real tokenizer output",
            torch.int64,
            points=1,
            hidden=False,
            cases=(Case("3 NER sentences, MiniLM's WordPieces", _real_alignment_case(NER_PUBLIC)),),
        ),
        Test(
            "hand-made word ids",
            torch.int64,
            points=0.5,
            hidden=False,
            cases=(
                Case(
                    "a word of 4 pieces, padding",
                    _hand_made_case(([None, 0, 1, 1, 1, 1, 2, None, None], [3, 1, 4])),
                ),
            ),
        ),
        Test(
            "real tokenizer output, padded and truncated",
            torch.int64,
            points=1,
            cases=(
                Case("4 NER sentences", _real_alignment_case(NER_HIDDEN)),
                Case("padded to 24 tokens", _real_alignment_case(NER_HIDDEN, pad_to=24)),
                Case("truncated to 7 tokens", _real_alignment_case(NER_HIDDEN, truncate_to=7)),
            ),
        ),
        Test(
            "more hand-made word ids",
            torch.int64,
            points=0.5,
            cases=(
                Case(
                    "one word of 6 pieces; no words at all; a pair whose word ids restart",
                    _hand_made_case(
                        ([None, 0, 0, 0, 0, 0, 0, None], [7]),
                        ([None, None], []),
                        ([None, 0, 1, 1, None, 0, 0, 1, None], [2, 5]),
                    ),
                ),
                Case(
                    "four sentences of one word: of 1, 2 and 3 pieces, and after padding",
                    _hand_made_case(
                        ([None, 0, None], [4]),
                        ([None, 0, 0, None], [6]),
                        ([None, 0, 0, 0, None], [1]),
                        ([None, 0, None, None, None], [8]),
                    ),
                ),
                Case(
                    "300 words, the last of 2 pieces (word ids past 256: `is` is not `==` there)",
                    _hand_made_case(([None, *range(300), 299, None], [i % 9 for i in range(300)])),
                ),
            ),
        ),
    ),
)

FREEZE = Graded(
    name="freeze_backbone",
    clause="11.freeze_backbone",
    task=7,
    signature="freeze_backbone(model): no gradient reaches model.bert; the head still learns",
    outputs=(
        "requires_grad of each parameter (sorted names; 1 = yes)",
        "grad set after a backward pass, per parameter (1 = yes)",
    ),
    reference=ref.freeze_backbone,
    kind="driver",
    driver="transfer:frozen",
    variants=(
        Variant("backbone-not-frozen", _bert_left_in_eval_mode),
        *(Variant("backbone-not-frozen", freeze) for freeze in PARTIAL_FREEZES),
    ),
    dims=(
        *_ids_dims(),
        Dim("num_labels", lambda c: c.init_kwargs["num_labels"]),
        Dim("num_layers", lambda c: c.init_kwargs["config"]["num_layers"]),
    ),
    small=(
        _freeze_case("sequence", 1, 2, 2, False, **mini_bert.SMALL_MODEL),
        _freeze_case("token", 2, 3, 2, True, **mini_bert.SMALL_MODEL),
    ),
    tests=(
        Test(
            "sequence head",
            torch.int64,
            points=1,
            hidden=False,
            cases=(Case("B=2, L=5, 2 layers", _freeze_case("sequence", 2, 5, 3, padded=False)),),
        ),
        Test(
            "both heads, other configurations",
            torch.int64,
            points=1,
            cases=(
                Case("token head, B=3, L=6, padded", _freeze_case("token", 3, 6, 4, padded=True)),
                Case(
                    "sequence head, 3 layers, padded",
                    _freeze_case("sequence", 2, 7, 2, padded=True, num_layers=3),
                ),
                Case(
                    "token head, B=1, L=1, 1 label, 1 layer",
                    _freeze_case("token", 1, 1, 1, False, num_layers=1),
                ),
            ),
        ),
    ),
)

GROUPS = Graded(
    name="param_groups",
    clause="11.param_groups",
    task=8,
    signature="param_groups(model, weight_decay) -> list of {'params': [...], 'weight_decay': ...}",
    outputs=("weight decay of each parameter (sorted names)", "parameters after the AdamW steps"),
    reference=ref.param_groups,
    kind="driver",
    driver="transfer:adamw",
    variants=(
        Variant("decay-on-layernorm-or-bias", _one_group),
        Variant("decay-on-layernorm-or-bias", _by_name),
        Variant("decay-on-layernorm-or-bias", _biases_only),
    ),
    dims=(PROBE_LAYERS,),
    # a probe model of hidden size 3 and one block, one step, then two
    # at their own (normal) values only: with integers or halves, a parameter's gradient can
    # be 0 up to rounding, and Adam turns that rounding into a whole step of lr (which then
    # differs between CPUs' kernels, as would a correct student's code)
    small=(
        own_values(_adamw_case(0.1, 1, **SMALL_PROBE)),
        own_values(_adamw_case(0.5, 2, **SMALL_PROBE, norm_bias=False)),
    ),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("2 layers, weight_decay=0.1, 5 steps", _adamw_case(0.1, 5)),),
        ),
        Test(
            "float64",
            torch.float64,
            points=0.5,
            hidden=False,
            cases=(Case("1 layer, weight_decay=0.3, 4 steps", _adamw_case(0.3, 4, layers=1)),),
        ),
        Test(
            "float64, other models",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "a LayerNorm without bias, weight_decay=0.5, 6 steps",
                    _adamw_case(0.5, 6, norm_bias=False),
                ),
                Case("3 layers, weight_decay=0.01, lr=0.2, 3 steps", _adamw_case(0.01, 3, lr=0.2, layers=3)),
            ),
        ),
        Test(
            "float32, other models",
            torch.float32,
            points=0.5,
            cases=(Case("a LayerNorm without bias, 8 steps", _adamw_case(0.2, 8, norm_bias=False)),),
        ),
    ),
)

SCHEDULE = Graded(
    name="linear_schedule_with_warmup",
    clause="11.linear_schedule_with_warmup",
    task=9,
    signature="linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps) -> scheduler",
    outputs=("learning rate of each group at every step", "parameters after the AdamW steps"),
    reference=ref.linear_schedule_with_warmup,
    kind="driver",
    driver="transfer:schedule",
    variants=(
        Variant("warmup-off-by-one", _warmup_from_one),
        Variant("warmup-off-by-one", _one_step_ahead),
    ),
    dims=(PROBE_LAYERS,),
    # one step of warm-up of two, then none, then past the end
    small=(
        # at their own values only, as param_groups' (Adam amplifies a gradient of rounding)
        own_values(_schedule_case(1, 2, 2, **SMALL_PROBE)),
        own_values(_schedule_case(0, 2, 2, **SMALL_PROBE)),
        own_values(_schedule_case(2, 3, 4, **SMALL_PROBE)),
    ),
    tests=(
        Test(
            "float64",
            torch.float64,
            points=1,
            hidden=False,
            cases=(Case("warm-up 3 of 10 steps, 12 steps", _schedule_case(3, 10, 12)),),
        ),
        Test(
            "float32",
            torch.float32,
            points=0.5,
            hidden=False,
            cases=(Case("warm-up 2 of 6 steps, 6 steps", _schedule_case(2, 6, 6)),),
        ),
        Test(
            "float64, no warm-up, all warm-up, one step of warm-up or of decay",
            torch.float64,
            points=1,
            cases=(
                Case("no warm-up, 8 steps, 9 steps", _schedule_case(0, 8, 9)),
                Case("warm-up 5 of 5 steps, 7 steps", _schedule_case(5, 5, 7)),
                Case("warm-up 1 of 4 steps, 5 steps", _schedule_case(1, 4, 5, lrs=(1e-3, 3e-2))),
                Case("warm-up 3 of 4 steps (one step of decay), 5 steps", _schedule_case(3, 4, 5)),
            ),
        ),
        Test(
            "float32, a longer run",
            torch.float32,
            points=0.5,
            cases=(Case("warm-up 4 of 20 steps, 20 steps", _schedule_case(4, 20, 20, layers=1)),),
        ),
    ),
)

SPEC = StageSpec(
    id="11_transfer",
    title="Transfer learning on your BERT",
    graded=(POOLER, SEQUENCE, TOKEN, BACKBONE, STATES, ALIGN, FREEZE, GROUPS, SCHEDULE),
    uses=("09_mini_bert",),
    call_timeout_s=30.0,  # as 09: a 22M-parameter model is built and loaded per call
    misconceptions={
        "last-token-not-cls": "your output matches a sequence classified from its last token: BERT "
        "classifies from [CLS], position 0 (hidden_states[:, 0]), whose final state the pooler was "
        "pretrained to summarise the sequence in; the last token is [SEP] or padding.",
        "pooler-not-loaded": "your logits match a pooler left at its initialisation: the checkpoint's "
        "pooler.dense.weight and pooler.dense.bias are BERT's pretrained pooler, load them into "
        "model.pooler.dense (the classifier is the only new part).",
        "hidden-states-off-by-one": "your states match a list one off from transformers': state 0 is the "
        "embeddings' output (before any layer) and state i the output of layer i, num_layers + 1 in all; "
        "append the embeddings first, then each layer's output after it runs.",
        "every-subtoken-labelled": "your labels match every sub-token labelled with its word's label: label "
        "only a word's first sub-token (its word id differs from the previous token's) and give the other "
        "sub-tokens -100, so each word counts once in the loss and the metric.",
        "backbone-not-frozen": "gradients still reach parameters of model.bert: set requires_grad = False on "
        "every parameter of the backbone (model.bert.requires_grad_(False)); model.eval() only turns "
        "dropout off, it freezes nothing.",
        "decay-on-layernorm-or-bias": "your groups put weight decay on LayerNorm parameters or biases: "
        "give 0.0 to every parameter named bias and to every parameter of an nn.LayerNorm, found by "
        "module type (isinstance), since names such as norm1 or ln do not say LayerNorm.",
        "warmup-off-by-one": "your learning rates match the schedule one step off: after k scheduler steps "
        "the factor is k / max(1, num_warmup_steps) during the warm-up, so the first optimiser step "
        "has learning rate 0 (k = 0), as transformers' get_linear_schedule_with_warmup.",
    },
)

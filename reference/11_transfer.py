"""Stage 11 reference: transfer learning on the BERT of stage 09.

Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding" (2019): fine-tuning (section 4: a sentence is classified from the final
state of ``[CLS]`` through the pooler, a token from its own final state; section 5.3: NER
labels the first sub-token of each word) and the feature-based approach (section 5.3,
Table 7: which layers' states make the best features, embeddings counted as state 0).
Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (2019): AdamW.

The heads equal transformers' ``BertForSequenceClassification`` and
``BertForTokenClassification`` (``modeling_bert.py``), except that the pooler sits beside
``bert`` rather than inside it, since stage 09's ``BertModel`` has none. The optimiser
set-up is what transformers' ``Trainer`` builds: no weight decay on biases and LayerNorm
parameters (``get_decay_parameter_names``), and ``get_linear_schedule_with_warmup``
(``optimization.py``). Device- and dtype-agnostic; no work at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

import reference

mini_bert = reference.load("09_mini_bert")
BertModel = mini_bert.BertModel
load_pretrained = mini_bert.load_pretrained

IGNORE_INDEX = -100  # the label F.cross_entropy skips by default


class BertPooler(nn.Module):
    """tanh(dense(h[CLS])): the sentence vector BERT was pretrained to classify from (NSP)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states: Tensor) -> Tensor:
        """hidden_states: (B, L, H). Returns (B, H)."""
        return torch.tanh(self.dense(hidden_states[:, 0]))  # position 0 is [CLS]


class BertForSequenceClassification(nn.Module):
    """classifier(dropout(pooler(bert(x)))): one set of logits per sequence."""

    def __init__(self, config: dict[str, Any], num_labels: int) -> None:
        super().__init__()
        self.bert = BertModel(**config)
        self.pooler = BertPooler(config["hidden_size"])
        self.dropout = nn.Dropout(0.1)  # BERT's hidden_dropout_prob; the identity in eval mode
        self.classifier = nn.Linear(config["hidden_size"], num_labels)

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """input_ids, token_type_ids, attention_mask: (B, L). Returns (B, num_labels)."""
        h = self.bert(input_ids, token_type_ids, attention_mask)  # (B, L, H)
        return self.classifier(self.dropout(self.pooler(h)))  # (B, num_labels)


class BertForTokenClassification(nn.Module):
    """classifier(dropout(bert(x))): one set of logits per token, no pooler."""

    def __init__(self, config: dict[str, Any], num_labels: int) -> None:
        super().__init__()
        self.bert = BertModel(**config)
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(config["hidden_size"], num_labels)

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """input_ids, token_type_ids, attention_mask: (B, L). Returns (B, L, num_labels)."""
        h = self.bert(input_ids, token_type_ids, attention_mask)  # (B, L, H)
        return self.classifier(self.dropout(h))  # (B, L, num_labels)


def load_backbone(model: nn.Module, weights: dict[str, Tensor]) -> None:
    """The checkpoint into ``model.bert`` (stage 09's loader) and, if the model has one,
    into its pooler; the classifier is new and keeps its initialisation."""
    load_pretrained(model.bert, weights)
    pooler = getattr(model, "pooler", None)
    if pooler is not None:
        with torch.no_grad():
            pooler.dense.weight.copy_(weights["pooler.dense.weight"])
            pooler.dense.bias.copy_(weights["pooler.dense.bias"])


def hidden_states(
    model: nn.Module,
    input_ids: Tensor,
    token_type_ids: Tensor | None = None,
    attention_mask: Tensor | None = None,
    layers: Sequence[int] | None = None,
) -> Tensor:
    """States of a stage 09 BertModel: 0 is the embeddings' output, i the output of layer i.
    ``layers`` picks some, in order (negative from the end); None: all of them.
    Returns (len(layers), B, L, H)."""
    x = model.embeddings(input_ids, token_type_ids)  # (B, L, H)
    mask = None
    if attention_mask is not None:
        mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L), as BertModel.forward
    states = [x]
    for layer in model.layers:
        x = layer(x, mask)
        states.append(x)
    if layers is None:
        layers = range(len(states))
    return torch.stack([states[i] for i in layers])  # (len(layers), B, L, H)


def align_labels(word_ids: Sequence[int | None], word_labels: Sequence[int]) -> list[int]:
    """One label per token: the word's label at its first sub-token, -100 elsewhere."""
    labels, previous = [], None
    for word in word_ids:
        labels.append(IGNORE_INDEX if word is None or word == previous else word_labels[word])
        previous = word
    return labels


def freeze_backbone(model: nn.Module) -> None:
    """Feature extraction: no gradient reaches ``model.bert``; the head still learns."""
    model.bert.requires_grad_(False)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: ``weight_decay`` on every parameter but biases and LayerNorms' (0.0)."""
    no_decay = set()
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            if name == "bias" or isinstance(module, nn.LayerNorm):
                no_decay.add(f"{module_name}.{name}" if module_name else name)
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if n not in no_decay], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n in no_decay], "weight_decay": 0.0},
    ]


def linear_schedule_with_warmup(optimizer, num_warmup_steps: int, num_training_steps: int) -> LambdaLR:
    """lr * k / warmup during the warm-up, then a linear decay to 0 at num_training_steps."""

    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return step / max(1, num_warmup_steps)
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

    return LambdaLR(optimizer, factor)

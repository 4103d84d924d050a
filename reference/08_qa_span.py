"""Stage 08 reference: extractive question answering on top of BERT.

Devlin et al., "BERT" (2019), section 4.2 (SQuAD v1.1): a start vector S and an end
vector E score every token; the probability that token i starts the answer is a softmax
of S . h_i over the tokens, likewise for the end; the training loss is the sum (here,
as in transformers, the mean) of the two log-likelihoods of the correct positions, and
the predicted span is the (i, j) with j >= i that maximises S . h_i + E . h_j.

- ``SpanHead`` and ``span_loss`` are transformers' ``BertForQuestionAnswering`` head
  (``qa_outputs``) and loss, clamping included.
- ``best_span`` searches all (i, j) at once: a (B, L, L) table of s_i + e_j, the
  pairs that are not allowed set to -inf, one argmax over the flattened table. torch's
  argmax returns the first maximum, and the table is flattened row-major, so ties go to
  the smallest (i, j) in lexicographic order. bertlab's choice: both ends must be
  context positions (``context_mask`` True); the positions in between are not checked
  (a context is one contiguous block). A row without any context position has no span
  and is not graded; this reference returns (0, 0) for it.
- ``squad_em_f1`` follows the official SQuAD v1.1 evaluation script (``evaluate-v1.1.py``:
  ``normalize_answer``, ``f1_score``, ``exact_match_score``,
  ``metric_max_over_ground_truths``), on a 0..1 scale (the script multiplies its
  averages by 100).

Device- and dtype-agnostic; no work at import time.
"""

from __future__ import annotations

import re
import string
from collections import Counter

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SpanHead(nn.Module):
    """Start and end logits from the last hidden state: one Linear(hidden, 2)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.qa_outputs = nn.Linear(hidden, 2)  # transformers' name, for loading

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """h: (B, L, hidden). Returns start_logits, end_logits, each (B, L)."""
        logits = self.qa_outputs(h)  # (B, L, 2)
        start_logits, end_logits = logits.unbind(dim=-1)  # (B, L) each
        return start_logits, end_logits


def span_loss(
    start_logits: Tensor, end_logits: Tensor, start_positions: Tensor, end_positions: Tensor
) -> Tensor:
    """(CE(start_logits, start_positions) + CE(end_logits, end_positions)) / 2.

    start_logits, end_logits: (B, L); positions: (B,) int64. As in transformers, positions
    are clamped to [0, L] and L is ignored: a position >= L (an answer truncated away)
    does not count, a negative one counts as position 0 ([CLS]). Each cross-entropy is the
    mean over its own counted rows. Returns a scalar (0-dim) tensor.
    """
    L = start_logits.size(1)
    start = start_positions.clamp(0, L)  # (B,)
    end = end_positions.clamp(0, L)
    start_loss = F.cross_entropy(start_logits, start, ignore_index=L)
    end_loss = F.cross_entropy(end_logits, end, ignore_index=L)
    return (start_loss + end_loss) / 2


def best_span(
    start_logits: Tensor, end_logits: Tensor, context_mask: Tensor, max_answer_len: int = 30
) -> tuple[Tensor, Tensor]:
    """argmax over (i, j) of start_logits[i] + end_logits[j], i <= j < i + max_answer_len,
    both i and j context positions; ties go to the smallest (i, j).

    start_logits, end_logits: (B, L); context_mask: (B, L) bool, True = context token.
    Returns start, end: (B,) int64 each.
    """
    B, L = start_logits.shape
    scores = start_logits[:, :, None] + end_logits[:, None, :]  # (B, L, L): [b, i, j]
    i = torch.arange(L, device=scores.device)[:, None]  # (L, 1)
    j = torch.arange(L, device=scores.device)[None, :]  # (1, L)
    allowed = (i <= j) & (j < i + max_answer_len)  # (L, L)
    allowed = allowed & context_mask[:, :, None] & context_mask[:, None, :]  # (B, L, L)
    scores = scores.masked_fill(~allowed, float("-inf"))
    flat = scores.reshape(B, L * L).argmax(dim=-1)  # (B,): the first maximum, row-major
    return flat // L, flat % L


def _normalize_answer(s: str) -> str:
    """Lower case, remove punctuation, the articles a/an/the, and extra whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _f1(prediction: str, ground_truth: str) -> float:
    pred_tokens = _normalize_answer(prediction).split()
    truth_tokens = _normalize_answer(ground_truth).split()
    common = Counter(pred_tokens) & Counter(truth_tokens)  # multiset intersection
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_em_f1(prediction: str, ground_truths: list[str]) -> tuple[float, float]:
    """SQuAD v1.1 exact match and token F1 of one prediction, each the maximum over the
    ground truths, on a 0..1 scale."""
    em = max(float(_normalize_answer(prediction) == _normalize_answer(t)) for t in ground_truths)
    f1 = max(_f1(prediction, t) for t in ground_truths)
    return em, f1

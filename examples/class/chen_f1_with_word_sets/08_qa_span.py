"""Assignment 08 - QA span heads.  Chen W."""
import re
import string

import torch
import torch.nn as nn
import torch.nn.functional as F


class SpanHead(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.qa_outputs = nn.Linear(hidden, 2)

    def forward(self, h):
        logits = self.qa_outputs(h)
        start_logits, end_logits = logits.split(1, dim=-1)
        return start_logits.squeeze(-1), end_logits.squeeze(-1)


def span_loss(start_logits, end_logits, start_positions, end_positions):
    ignored_index = start_logits.size(1)
    start_positions = start_positions.clamp(0, ignored_index)
    end_positions = end_positions.clamp(0, ignored_index)
    loss_fct = nn.CrossEntropyLoss(ignore_index=ignored_index)
    start_loss = loss_fct(start_logits, start_positions)
    end_loss = loss_fct(end_logits, end_positions)
    return (start_loss + end_loss) / 2


def best_span(start_logits, end_logits, context_mask, max_answer_len=30):
    B, L = start_logits.shape
    neg_inf = float("-inf")
    s = start_logits.masked_fill(context_mask == 0, neg_inf)
    e = end_logits.masked_fill(context_mask == 0, neg_inf)
    scores = s[:, :, None] + e[:, None, :]  # (B, L, L)
    ones = torch.ones(L, L, dtype=torch.bool, device=scores.device)
    band = torch.triu(ones) & ~torch.triu(ones, diagonal=max_answer_len)  # i <= j < i + max_len
    scores = scores.masked_fill(~band, neg_inf)
    flat = scores.reshape(B, -1).argmax(dim=-1)
    return flat // L, flat % L


def normalize_answer(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def f1_score(prediction, ground_truth):
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    pred, gold = set(prediction_tokens), set(ground_truth_tokens)
    num_same = len(pred & gold)
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred)
    recall = num_same / len(gold)
    return (2 * precision * recall) / (precision + recall)


def squad_em_f1(prediction, ground_truths):
    em = max(float(normalize_answer(prediction) == normalize_answer(gt)) for gt in ground_truths)
    f1 = max(f1_score(prediction, gt) for gt in ground_truths)
    return em, f1

"""Stage 07 reference: BERT's pretraining data (MLM and NSP) and its pretraining heads.

Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding" (2019), section 3.1 and appendix A.1. The data functions follow the
original release's ``create_pretraining_data.py`` (google-research/bert, per-WordPiece
masking: the first release, before whole-word masking) statement for statement, so that
the same ``random.Random`` state gives the same instances and leaves the rng in the same
state. ``mask_tokens`` is the batched tensor form used when masking happens on the fly
(transformers' ``DataCollatorForLanguageModeling``). The heads and the loss are those of
transformers' ``BertForPreTraining`` (``BertPreTrainingHeads``), with the decoder tied to
the word embeddings. No work at import time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

CLS, SEP, MASK = "[CLS]", "[SEP]", "[MASK]"


@dataclass
class TrainingInstance:
    """One sentence pair: ``[CLS] A [SEP] B [SEP]`` with its masked-LM targets."""

    tokens: list[str]
    segment_ids: list[int]
    is_random_next: bool
    masked_lm_positions: list[int]
    masked_lm_labels: list[str]


def create_masked_lm_predictions(
    tokens: list[str],
    vocab_words: list[str],
    rng: random.Random,
    masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int = 20,
) -> tuple[list[str], list[int], list[str]]:
    """Choose WordPieces to predict and corrupt them 80/10/10 (original BERT order of draws).

    Returns the corrupted copy of ``tokens``, the chosen positions (sorted) and the original
    tokens there. ``tokens`` itself is not changed.
    """
    candidates = [i for i, token in enumerate(tokens) if token not in (CLS, SEP)]
    rng.shuffle(candidates)
    output_tokens = list(tokens)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    chosen = sorted(candidates[:num_to_predict])  # the draws below go in shuffled order
    for index in candidates[:num_to_predict]:
        if rng.random() < 0.8:  # 80%: [MASK]
            output_tokens[index] = MASK
        elif rng.random() < 0.5:  # 10%: keep the original
            output_tokens[index] = tokens[index]
        else:  # 10%: a random word of the vocabulary
            output_tokens[index] = vocab_words[rng.randint(0, len(vocab_words) - 1)]
    return output_tokens, chosen, [tokens[i] for i in chosen]


def truncate_seq_pair(tokens_a: list[str], tokens_b: list[str], max_num_tokens: int, rng: random.Random):
    """Trim the longer of the two lists, in place, from the front or the back at random."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def create_instances_from_document(
    all_documents: list[list[list[str]]],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab_words: list[str],
    rng: random.Random,
) -> list[TrainingInstance]:
    """Sentence pairs from one document (a list of segments, each a list of WordPieces).

    Segments are gathered into a chunk until it reaches the target length; a random cut
    makes A, and B is the rest of the chunk (is_random_next False) or, half of the time and
    always for a one-segment chunk, text from another document (the unused segments are
    put back). The pair is truncated to max_seq_length - 3 and masked.
    """
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    chunk: list[list[str]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_seq_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for segment in chunk[:a_end] for t in segment]
            tokens_b: list[str] = []
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target_seq_length - len(tokens_a)
                for _ in range(10):  # another document, if one is found in 10 tries
                    random_index = rng.randint(0, len(all_documents) - 1)
                    if random_index != document_index:
                        break
                random_document = all_documents[random_index]
                start = rng.randint(0, len(random_document) - 1)
                for segment in random_document[start:]:
                    tokens_b.extend(segment)
                    if len(tokens_b) >= target_b_length:
                        break
                i -= len(chunk) - a_end  # put the unused segments back
            else:
                is_random_next = False
                tokens_b = [t for segment in chunk[a_end:] for t in segment]
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)

            tokens = [CLS, *tokens_a, SEP, *tokens_b, SEP]
            segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
            tokens, positions, labels = create_masked_lm_predictions(
                tokens, vocab_words, rng, masked_lm_prob, max_predictions_per_seq
            )
            instances.append(TrainingInstance(tokens, segment_ids, is_random_next, positions, labels))
            chunk, chunk_length = [], 0
        i += 1
    return instances


def mask_tokens(
    input_ids: Tensor,
    special_tokens_mask: Tensor,
    vocab_size: int,
    mask_token_id: int,
    generator: torch.Generator,
    mlm_probability: float = 0.15,
) -> tuple[Tensor, Tensor]:
    """Batched MLM corruption. input_ids (B, L) int64, special_tokens_mask (B, L) bool.

    Returns a corrupted copy of input_ids and labels (B, L) int64: the original id where a
    token was selected, -100 elsewhere. Every draw comes from ``generator``.
    """
    device = input_ids.device
    probability = torch.full(input_ids.shape, mlm_probability, device=device)  # (B, L)
    probability.masked_fill_(special_tokens_mask.bool(), 0.0)
    selected = torch.bernoulli(probability, generator=generator).bool()
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))

    u = torch.rand(input_ids.shape, generator=generator, device=device)  # one draw decides 80/10/10
    to_mask = selected & (u < 0.8)
    to_random = selected & (u >= 0.8) & (u < 0.9)
    random_ids = torch.randint(
        vocab_size, input_ids.shape, generator=generator, device=device, dtype=input_ids.dtype
    )
    corrupted = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    corrupted = torch.where(to_random, random_ids, corrupted)
    return corrupted, labels


class BertPretrainingHeads(nn.Module):
    """The masked-LM head (transform, then the tied decoder) and the NSP head (pooler, 2-way)."""

    def __init__(self, hidden_size: int, vocab_size: int, word_embeddings: nn.Embedding, eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.decoder = nn.Linear(hidden_size, vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied: the same Parameter, not a copy
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.pooler = nn.Linear(hidden_size, hidden_size)
        self.seq_relationship = nn.Linear(hidden_size, 2)

    def forward(self, sequence_output: Tensor) -> tuple[Tensor, Tensor]:
        """sequence_output (B, L, H) -> prediction_scores (B, L, V), seq_relationship_scores (B, 2)."""
        h = self.layer_norm(F.gelu(self.dense(sequence_output)))  # (B, L, H)
        prediction_scores = self.decoder(h) + self.bias  # (B, L, V)
        pooled = torch.tanh(self.pooler(sequence_output[:, 0]))  # (B, H): the [CLS] position
        return prediction_scores, self.seq_relationship(pooled)


def pretraining_loss(
    prediction_scores: Tensor,
    seq_relationship_scores: Tensor,
    masked_lm_labels: Tensor,
    next_sentence_labels: Tensor,
) -> Tensor:
    """Mean MLM cross-entropy over the positions whose label is not -100, plus the NSP
    cross-entropy (label 0 = B follows A, 1 = B is random)."""
    vocab_size = prediction_scores.size(-1)
    mlm = F.cross_entropy(
        prediction_scores.reshape(-1, vocab_size), masked_lm_labels.reshape(-1), ignore_index=-100
    )
    nsp = F.cross_entropy(seq_relationship_scores.reshape(-1, 2), next_sentence_labels.reshape(-1))
    return mlm + nsp

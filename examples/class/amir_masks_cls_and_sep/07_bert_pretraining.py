"""Assignment 07 - BERT pretraining data, heads and loss.  Amir K."""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F


def create_masked_lm_predictions(tokens, vocab_words, rng, masked_lm_prob=0.15, max_predictions_per_seq=20):
    cand_indexes = []
    for i, token in enumerate(tokens):
        cand_indexes.append(i)  # every position can be masked
    rng.shuffle(cand_indexes)

    output_tokens = list(tokens)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))

    masked = []  # (position, original token)
    for index in cand_indexes:
        if len(masked) >= num_to_predict:
            break
        if rng.random() < 0.8:
            masked_token = "[MASK]"
        else:
            if rng.random() < 0.5:
                masked_token = tokens[index]
            else:
                masked_token = vocab_words[rng.randint(0, len(vocab_words) - 1)]
        output_tokens[index] = masked_token
        masked.append((index, tokens[index]))

    masked.sort()
    positions = [p for p, _ in masked]
    labels = [label for _, label in masked]
    return output_tokens, positions, labels


class TrainingInstance:
    def __init__(self, tokens, segment_ids, is_random_next, masked_lm_positions, masked_lm_labels):
        self.tokens = tokens
        self.segment_ids = segment_ids
        self.is_random_next = is_random_next
        self.masked_lm_positions = masked_lm_positions
        self.masked_lm_labels = masked_lm_labels


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def create_instances_from_document(all_documents, document_index, max_seq_length, short_seq_prob,
                                   masked_lm_prob, max_predictions_per_seq, vocab_words, rng):
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])

                tokens_b = []
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)

                tokens = ["[CLS]"] + tokens_a + ["[SEP]"] + tokens_b + ["[SEP]"]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                tokens, masked_lm_positions, masked_lm_labels = create_masked_lm_predictions(
                    tokens, vocab_words, rng, masked_lm_prob, max_predictions_per_seq)
                instances.append(TrainingInstance(tokens, segment_ids, is_random_next,
                                                  masked_lm_positions, masked_lm_labels))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def mask_tokens(input_ids, special_tokens_mask, vocab_size, mask_token_id, generator, mlm_probability=0.15):
    labels = input_ids.clone()
    inputs = input_ids.clone()
    probability_matrix = torch.full(labels.shape, mlm_probability, device=input_ids.device)
    masked_indices = torch.bernoulli(probability_matrix, generator=generator).bool()
    labels[~masked_indices] = -100

    # 80% of the time, replace with [MASK]
    indices_replaced = torch.bernoulli(torch.full(labels.shape, 0.8, device=input_ids.device),
                                       generator=generator).bool() & masked_indices
    inputs[indices_replaced] = mask_token_id
    # 10% of the time, random word (half of the remaining 20%)
    indices_random = torch.bernoulli(torch.full(labels.shape, 0.5, device=input_ids.device),
                                     generator=generator).bool() & masked_indices & ~indices_replaced
    random_words = torch.randint(vocab_size, labels.shape, dtype=torch.long, device=input_ids.device,
                                 generator=generator)
    inputs[indices_random] = random_words[indices_random]
    # the rest (10%) stays
    return inputs, labels


class BertPretrainingHeads(nn.Module):
    def __init__(self, hidden_size, vocab_size, word_embeddings, eps=1e-12):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.decoder = nn.Linear(hidden_size, vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.pooler = nn.Linear(hidden_size, hidden_size)
        self.seq_relationship = nn.Linear(hidden_size, 2)

    def forward(self, sequence_output):
        h = self.dense(sequence_output)
        h = F.gelu(h)
        h = self.layer_norm(h)
        prediction_scores = self.decoder(h) + self.bias
        pooled = torch.tanh(self.pooler(sequence_output[:, 0]))
        seq_relationship_scores = self.seq_relationship(pooled)
        return prediction_scores, seq_relationship_scores


def pretraining_loss(prediction_scores, seq_relationship_scores, masked_lm_labels, next_sentence_labels):
    V = prediction_scores.shape[-1]
    mlm_loss = F.cross_entropy(prediction_scores.view(-1, V), masked_lm_labels.view(-1), ignore_index=-100)
    nsp_loss = F.cross_entropy(seq_relationship_scores.view(-1, 2), next_sentence_labels.view(-1))
    return mlm_loss + nsp_loss

"""Kofi A. -- stage 04 (word2vec)."""

import numpy as np


def sigmoid(x):
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    out[~pos] = np.exp(x[~pos]) / (1.0 + np.exp(x[~pos]))
    return out


def naive_softmax_loss_and_gradient(center_vec, outside_idx, outside_vectors):
    logits = outside_vectors.dot(center_vec)
    logits = logits - logits.max()
    log_probs = logits - np.log(np.exp(logits).sum())
    loss = -log_probs[outside_idx]
    delta = np.exp(log_probs)
    delta[outside_idx] -= 1.0
    return loss, outside_vectors.T.dot(delta), np.outer(delta, center_vec)


def neg_sampling_loss_and_gradient(center_vec, outside_idx, outside_vectors, neg_indices):
    loss = -np.log(sigmoid(np.array([outside_vectors[outside_idx] @ center_vec]))[0])
    g = sigmoid(np.array([outside_vectors[outside_idx] @ center_vec]))[0] - 1.0
    grad_center_vec = g * outside_vectors[outside_idx]
    grad_outside_vectors = np.zeros_like(outside_vectors)
    grad_outside_vectors[outside_idx] += g * center_vec
    for k in neg_indices:
        s = sigmoid(np.array([outside_vectors[k] @ center_vec]))[0]
        loss += -np.log(1.0 - s)
        grad_center_vec = grad_center_vec + s * outside_vectors[k]
        grad_outside_vectors[k] += s * center_vec
    return loss, grad_center_vec, grad_outside_vectors


def skipgram(center_idx, outside_idxs, center_vectors, outside_vectors, loss_and_gradient):
    loss = 0.0
    grad_center_vectors = np.zeros(center_vectors.shape)
    grad_outside_vectors = np.zeros(outside_vectors.shape)
    for outside_idx in outside_idxs:
        l, grad_c, grad_u = loss_and_gradient(center_vectors[center_idx], outside_idx, outside_vectors)
        loss += l
        grad_center_vectors += grad_c  # add the center word's gradient
        grad_outside_vectors += grad_u
    return loss, grad_center_vectors, grad_outside_vectors

"""Assignment 04 - word2vec skip-gram.  Ada L."""
import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def naive_softmax_loss_and_gradient(center_vec, outside_idx, outside_vectors):
    scores = np.dot(outside_vectors, center_vec)  # (V,)
    scores = scores - np.max(scores)  # as in the lecture: stable softmax
    y_hat = np.exp(scores) / np.sum(np.exp(scores))
    loss = -np.log(y_hat[outside_idx])

    y = np.zeros_like(y_hat)
    y[outside_idx] = 1.0
    grad_center_vec = np.dot(outside_vectors.T, y_hat - y)  # U^T (y_hat - y)
    grad_outside_vectors = np.outer(y_hat - y, center_vec)  # (y_hat - y) v_c^T
    return loss, grad_center_vec, grad_outside_vectors


def neg_sampling_loss_and_gradient(center_vec, outside_idx, outside_vectors, neg_indices):
    grad_center_vec = np.zeros_like(center_vec)
    grad_outside_vectors = np.zeros_like(outside_vectors)

    # the true outside word
    s = sigmoid(np.dot(outside_vectors[outside_idx], center_vec))
    loss = -np.log(s)
    grad_center_vec += (s - 1.0) * outside_vectors[outside_idx]
    grad_outside_vectors[outside_idx] += (s - 1.0) * center_vec

    # the negative samples, one at a time (a repeated word is added again)
    for k in neg_indices:
        s_k = sigmoid(-np.dot(outside_vectors[k], center_vec))
        loss -= np.log(s_k)
        grad_center_vec += (1.0 - s_k) * outside_vectors[k]
        grad_outside_vectors[k] += (1.0 - s_k) * center_vec
    return loss, grad_center_vec, grad_outside_vectors


def skipgram(center_idx, outside_idxs, center_vectors, outside_vectors, loss_and_gradient):
    loss = 0.0
    grad_center_vectors = np.zeros(center_vectors.shape)
    grad_outside_vectors = np.zeros(outside_vectors.shape)
    v_c = center_vectors[center_idx]
    for o in outside_idxs:
        l, g_c, g_u = loss_and_gradient(v_c, o, outside_vectors)
        loss += l
        grad_center_vectors[center_idx] += g_c
        grad_outside_vectors += g_u
    return loss, grad_center_vectors, grad_outside_vectors

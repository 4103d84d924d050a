# CS224n a2 -- word2vec, Lucas
# cross-entropy = minus the sum of the log-probabilities
import numpy as np


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def naive_softmax_loss_and_gradient(center_vec, outside_idx, outside_vectors):
    scores = outside_vectors @ center_vec
    y_hat = np.exp(scores - np.max(scores))
    y_hat /= np.sum(y_hat)
    loss = -np.sum(np.log(y_hat))  # cross-entropy over the vocabulary
    y = np.zeros_like(y_hat)
    y[outside_idx] = 1
    grad_center_vec = outside_vectors.T @ (y_hat - y)
    grad_outside_vectors = np.outer(y_hat - y, center_vec)
    return loss, grad_center_vec, grad_outside_vectors


def neg_sampling_loss_and_gradient(center_vec, outside_idx, outside_vectors, neg_indices):
    u_o = outside_vectors[outside_idx]
    loss = -np.log(sigmoid(u_o @ center_vec))
    grad_center_vec = (sigmoid(u_o @ center_vec) - 1) * u_o
    grad_outside_vectors = np.zeros_like(outside_vectors)
    grad_outside_vectors[outside_idx] += (sigmoid(u_o @ center_vec) - 1) * center_vec
    for k in neg_indices:
        u_k = outside_vectors[k]
        loss -= np.log(sigmoid(-u_k @ center_vec))
        grad_center_vec += sigmoid(u_k @ center_vec) * u_k
        grad_outside_vectors[k] += sigmoid(u_k @ center_vec) * center_vec
    return loss, grad_center_vec, grad_outside_vectors


def skipgram(center_idx, outside_idxs, center_vectors, outside_vectors, loss_and_gradient):
    loss = 0.0
    grad_center_vecs = np.zeros(center_vectors.shape)
    grad_outside_vectors = np.zeros(outside_vectors.shape)
    center_vec = center_vectors[center_idx]
    for outside_idx in outside_idxs:
        j, grad_c, grad_u = loss_and_gradient(center_vec, outside_idx, outside_vectors)
        loss += j
        grad_center_vecs[center_idx] += grad_c
        grad_outside_vectors += grad_u
    return loss, grad_center_vecs, grad_outside_vectors

# word2vec -- Wes
# all the scores at once, then a loop over the negatives
import numpy as np


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def naive_softmax_loss_and_gradient(center_vec, outside_idx, outside_vectors):
    scores = outside_vectors @ center_vec
    y_hat = np.exp(scores - np.max(scores))
    y_hat /= np.sum(y_hat)
    loss = -np.log(y_hat[outside_idx])
    y = np.zeros_like(y_hat)
    y[outside_idx] = 1
    grad_center_vec = outside_vectors.T @ (y_hat - y)
    grad_outside_vectors = np.outer(y_hat - y, center_vec)
    return loss, grad_center_vec, grad_outside_vectors


def neg_sampling_loss_and_gradient(center_vec, outside_idx, outside_vectors, neg_indices):
    scores = outside_vectors @ center_vec  # (V,)
    s_o = sigmoid(scores[outside_idx])
    loss = -np.log(s_o)
    grad_center_vec = (s_o - 1) * outside_vectors[outside_idx]
    grad_outside_vectors = np.zeros_like(outside_vectors)
    grad_outside_vectors[outside_idx] += (s_o - 1) * center_vec
    for k in range(len(neg_indices)):
        w = neg_indices[k]
        loss -= np.log(sigmoid(-scores[k]))
        grad_center_vec += sigmoid(scores[k]) * outside_vectors[w]
        grad_outside_vectors[w] += sigmoid(scores[k]) * center_vec
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

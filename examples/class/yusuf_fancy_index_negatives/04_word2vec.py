# word2vec assignment -- Yusuf
# vectorised everything, no python loops!
import numpy as np


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def naive_softmax_loss_and_gradient(center_vec, outside_idx, outside_vectors):
    scores = outside_vectors @ center_vec
    scores -= scores.max()
    probs = np.exp(scores) / np.exp(scores).sum()
    loss = -np.log(probs[outside_idx])
    probs[outside_idx] -= 1  # now y_hat - y
    return loss, outside_vectors.T @ probs, np.outer(probs, center_vec)


def neg_sampling_loss_and_gradient(center_vec, outside_idx, outside_vectors, neg_indices):
    u_o = outside_vectors[outside_idx]
    u_k = outside_vectors[neg_indices]  # (K, d)
    sig_o = sigmoid(u_o @ center_vec)
    sig_k = sigmoid(u_k @ center_vec)  # (K,)
    loss = -np.log(sig_o) - np.sum(np.log(1 - sig_k))
    grad_center_vec = (sig_o - 1) * u_o + sig_k @ u_k
    grad_outside_vectors = np.zeros_like(outside_vectors)
    grad_outside_vectors[outside_idx] += (sig_o - 1) * center_vec
    grad_outside_vectors[neg_indices] += sig_k[:, None] * center_vec[None, :]
    return loss, grad_center_vec, grad_outside_vectors


def skipgram(center_idx, outside_idxs, center_vectors, outside_vectors, loss_and_gradient):
    loss = 0.0
    grad_center_vectors = np.zeros_like(center_vectors)
    grad_outside_vectors = np.zeros_like(outside_vectors)
    for o in outside_idxs:
        l, gc, gu = loss_and_gradient(center_vectors[center_idx], o, outside_vectors)
        loss += l
        grad_center_vectors[center_idx] += gc
        grad_outside_vectors += gu
    return loss, grad_center_vectors, grad_outside_vectors

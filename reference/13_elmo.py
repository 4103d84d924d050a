"""Stage 13 reference: ELMo, a bidirectional LSTM language model.

Peters et al., "Deep contextualized word representations" (NAACL 2018), section 3:

- the LSTM (Hochreiter & Schmidhuber 1997) as torch.nn.LSTMCell computes it, gates in
  PyTorch's order (input, forget, cell, output):

      i = σ(W_ii x + b_ii + W_hi h + b_hi)     f = σ(W_if x + b_if + W_hf h + b_hf)
      g = tanh(W_ig x + b_ig + W_hg h + b_hg)  o = σ(W_io x + b_io + W_ho h + b_ho)
      c' = f ⊙ c + i ⊙ g                       h' = o ⊙ tanh(c')

  with ``w_ih`` (4H, I) and ``w_hh`` (4H, H) the four gates' rows stacked in that order;
- section 3.1, the biLM: a forward LSTM language model predicts token t+1 from tokens
  1..t, a backward one predicts token t-1 from tokens t..N; both share the token
  embedding and the softmax layer (Θ_x, Θ_s) and the loss is the sum of both directions'
  log likelihoods (here the mean of the two mean cross-entropies over real tokens);
- section 3.2, the layer representations R_k = {x_k, h_k,j^fwd ; h_k,j^bwd | j = 1..L}:
  layer 0 is the token embedding, duplicated to the width of the two directions side by
  side as the released model does ([x; x]), layer j the two directions' states
  concatenated;
- equation (1), the scalar mix ELMo_k = γ Σ_j s_j h_k,j with s = softmax(w), and the
  layer normalisation of section 3.3's footnote as AllenNLP's ``ScalarMix(do_layer_norm=True)``
  computes it: each layer normalised by the mean and variance of all its real (unpadded)
  values, with 1e-12 added to the variance.

The simplifications, said in CURRICULUM.md: tokens are embedded by a lookup table (no
character CNN), no projection or residual connection between the LSTM layers, zero initial
states. Batches are padded after each sequence (``lengths``), batch first. Device- and
dtype-agnostic; no work at import time.
"""

from __future__ import annotations

import torch
from torch import Tensor

LayerWeights = tuple[Tensor, Tensor, Tensor, Tensor]  # w_ih (4H, I), w_hh (4H, H), b_ih (4H,), b_hh (4H,)


def lstm_cell(
    x: Tensor, h: Tensor, c: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor
) -> tuple[Tensor, Tensor]:
    """One LSTM step, as torch.nn.LSTMCell. x: (B, I), h and c: (B, H), w_ih: (4H, I),
    w_hh: (4H, H), b_ih and b_hh: (4H,). Returns (h', c'), each (B, H)."""
    gates = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh  # (B, 4H): i, f, g, o side by side
    i, f, g, o = gates.chunk(4, dim=-1)
    c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h_next = torch.sigmoid(o) * torch.tanh(c_next)
    return h_next, c_next


def lstm(x: Tensor, lengths: Tensor, weights: list[LayerWeights]) -> tuple[Tensor, Tensor, Tensor]:
    """A multi-layer LSTM over a padded batch, from zero states, as torch.nn.LSTM
    (batch_first) over ``pack_padded_sequence(x, lengths, batch_first=True,
    enforce_sorted=False)``. x: (B, T, I); lengths: (B,) int64, each in 1..T; ``weights``:
    one (w_ih, w_hh, b_ih, b_hh) per layer (layer 0's w_ih is (4H, I), the others' (4H, H)).
    Returns (out, h_n, c_n): out (B, T, H) the last layer's states, 0 past each length;
    h_n and c_n (L, B, H), each layer's state at each sequence's last real step."""
    B, T, _ = x.shape
    real = torch.arange(T, device=x.device) < lengths[:, None]  # (B, T)
    h_n, c_n = [], []
    inputs = x
    for w_ih, w_hh, b_ih, b_hh in weights:
        H = w_hh.shape[1]
        h = x.new_zeros(B, H)
        c = x.new_zeros(B, H)
        outs = []
        for t in range(T):
            h_t, c_t = lstm_cell(inputs[:, t], h, c, w_ih, w_hh, b_ih, b_hh)
            keep = real[:, t, None]  # a sequence that has ended keeps its last state
            h, c = torch.where(keep, h_t, h), torch.where(keep, c_t, c)
            outs.append(torch.where(keep, h_t, torch.zeros_like(h_t)))
        inputs = torch.stack(outs, dim=1)  # (B, T, H): the next layer's input
        h_n.append(h)
        c_n.append(c)
    return inputs, torch.stack(h_n), torch.stack(c_n)


def reverse_padded(x: Tensor, lengths: Tensor) -> Tensor:
    """Each sequence of a padded batch reversed within its own length, the padding left
    where it is: position t < lengths[b] of row b takes position lengths[b] - 1 - t.
    x: (B, T, ...); lengths: (B,) int64. Returns x's shape; its own inverse."""
    T = x.shape[1]
    t = torch.arange(T, device=x.device)[None, :]  # (1, T)
    source = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # (B, T)
    index = source.reshape(*source.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


def _directions(
    tokens: Tensor,
    lengths: Tensor,
    embedding: Tensor,
    forward: list[LayerWeights],
    backward: list[LayerWeights],
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """The embedded tokens (B, T, E) and every layer's states of each direction, (B, T, H)
    each, the backward ones back in the tokens' order."""
    x = embedding[tokens]
    fwd, bwd = [], []
    inputs_f, inputs_b = x, reverse_padded(x, lengths)
    for layer_f, layer_b in zip(forward, backward, strict=True):
        inputs_f = lstm(inputs_f, lengths, [layer_f])[0]
        inputs_b = lstm(inputs_b, lengths, [layer_b])[0]
        fwd.append(inputs_f)
        bwd.append(reverse_padded(inputs_b, lengths))
    return x, fwd, bwd


def bilm_loss(
    tokens: Tensor,
    lengths: Tensor,
    embedding: Tensor,
    forward: list[LayerWeights],
    backward: list[LayerWeights],
    w_out: Tensor,
    b_out: Tensor,
) -> Tensor:
    """The biLM's loss (section 3.1): the forward LSTM's top state at position t predicts
    token t+1, the backward one's predicts token t-1, through one shared softmax layer
    (logits = h @ w_out.T + b_out). The mean cross-entropy over each direction's real
    targets, averaged over the two directions. tokens: (B, T) int64; lengths: (B,), each
    >= 2; embedding: (V, E); forward and backward: layer weights as ``lstm`` takes them;
    w_out: (V, H); b_out: (V,). Returns a scalar."""
    _, fwd, bwd = _directions(tokens, lengths, embedding, forward, backward)
    T = tokens.shape[1]
    real = torch.arange(T, device=tokens.device) < lengths[:, None]  # (B, T)

    def mean_nll(states: Tensor, targets: Tensor, valid: Tensor) -> Tensor:
        logits = states @ w_out.T + b_out  # (B, T-1, V)
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        return (nll * valid).sum() / valid.sum()

    ahead = real[:, 1:]  # position t < len - 1 has a next token
    forward_loss = mean_nll(fwd[-1][:, :-1], tokens[:, 1:], ahead)
    backward_loss = mean_nll(bwd[-1][:, 1:], tokens[:, :-1], ahead)  # position t >= 1 has a previous one
    return (forward_loss + backward_loss) / 2


def elmo_layers(
    tokens: Tensor,
    lengths: Tensor,
    embedding: Tensor,
    forward: list[LayerWeights],
    backward: list[LayerWeights],
) -> Tensor:
    """ELMo's L + 1 representations of every token (section 3.2): layer 0 the embedding
    twice, [x; x], layer j the two directions' states, [h_fwd_j; h_bwd_j], both at the
    token's own position; 0 past each length. tokens: (B, T); embedding: (V, H) (E = H, as
    [x; x] must be as wide as the states). Returns (L + 1, B, T, 2H)."""
    x, fwd, bwd = _directions(tokens, lengths, embedding, forward, backward)
    real = (torch.arange(tokens.shape[1], device=tokens.device) < lengths[:, None])[..., None]  # (B, T, 1)
    layers = [torch.cat([x, x], dim=-1) * real]
    layers += [torch.cat([f, b], dim=-1) for f, b in zip(fwd, bwd, strict=True)]
    return torch.stack(layers)


def scalar_mix(layers: Tensor, s: Tensor, gamma: Tensor, mask: Tensor, layer_norm: bool = False) -> Tensor:
    """ELMo's task-specific combination, equation (1): gamma * sum_j softmax(s)_j * h_j.
    With ``layer_norm``, each layer h_j is first normalised as AllenNLP's ScalarMix does:
    (h_j - mean) / sqrt(var + 1e-12), its mean and variance over all the values at real
    positions (``mask``). layers: (L + 1, B, T, D); s: (L + 1,); gamma: () ; mask: (B, T)
    bool, True at real tokens. Returns (B, T, D)."""
    weights = torch.softmax(s, dim=0)  # (L + 1,): one weight per layer
    if layer_norm:
        layers = normalise_layers(layers, mask)
    return gamma * (weights[:, None, None, None] * layers).sum(dim=0)


def normalise_layers(layers: Tensor, mask: Tensor) -> Tensor:
    """Each layer (L + 1, B, T, D) minus its mean, over its variance's square root (+1e-12),
    both over all its values at real tokens (mask (B, T), True there)."""
    real = mask[None, :, :, None].to(layers.dtype)  # (1, B, T, 1)
    count = real.sum() * layers.shape[-1]  # real values per layer
    mean = (layers * real).sum(dim=(1, 2, 3), keepdim=True) / count
    var = (((layers - mean) * real) ** 2).sum(dim=(1, 2, 3), keepdim=True) / count
    return (layers - mean) / torch.sqrt(var + 1e-12)

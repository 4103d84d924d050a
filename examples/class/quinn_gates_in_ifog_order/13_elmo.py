"""Stage 13, ELMo: Quinn's."""

import torch


def lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh):
    H = h.shape[1]
    z = torch.matmul(x, w_ih.t()) + torch.matmul(h, w_hh.t()) + (b_ih + b_hh)
    # input, forget, output, cell: the order of the blog post I learnt LSTMs from
    i = torch.sigmoid(z[:, 0:H])
    f = torch.sigmoid(z[:, H : 2 * H])
    o = torch.sigmoid(z[:, 2 * H : 3 * H])
    g = torch.tanh(z[:, 3 * H : 4 * H])
    c_new = f * c + i * g
    return o * torch.tanh(c_new), c_new


def lstm(x, lengths, weights):
    B, T, _ = x.shape
    layer_input = x
    hs, cs = [], []
    for w_ih, w_hh, b_ih, b_hh in weights:
        H = w_hh.shape[1]
        h = torch.zeros(B, H, dtype=x.dtype, device=x.device)
        c = torch.zeros(B, H, dtype=x.dtype, device=x.device)
        out = torch.zeros(B, T, H, dtype=x.dtype, device=x.device)
        for t in range(T):
            alive = (lengths > t).unsqueeze(1)
            h_new, c_new = lstm_cell(layer_input[:, t, :], h, c, w_ih, w_hh, b_ih, b_hh)
            h = torch.where(alive, h_new, h)
            c = torch.where(alive, c_new, c)
            out[:, t, :] = torch.where(alive, h_new, torch.zeros_like(h_new))
        layer_input = out
        hs.append(h)
        cs.append(c)
    return layer_input, torch.stack(hs), torch.stack(cs)


def reverse_padded(x, lengths):
    y = x.clone()
    for b in range(x.shape[0]):
        n = int(lengths[b])
        y[b, :n] = x[b, :n].flip(0)
    return y


def _both(tokens, lengths, embedding, forward, backward):
    x = embedding[tokens]
    f, b = x, reverse_padded(x, lengths)
    fs, bs = [], []
    for lf, lb in zip(forward, backward):
        f = lstm(f, lengths, [lf])[0]
        b = lstm(b, lengths, [lb])[0]
        fs.append(f)
        bs.append(reverse_padded(b, lengths))
    return x, fs, bs


def bilm_loss(tokens, lengths, embedding, forward, backward, w_out, b_out):
    _, fs, bs = _both(tokens, lengths, embedding, forward, backward)
    losses = []
    for b in range(tokens.shape[0]):
        n = int(lengths[b])
        fwd_logits = fs[-1][b, : n - 1] @ w_out.t() + b_out
        bwd_logits = bs[-1][b, 1:n] @ w_out.t() + b_out
        losses.append((torch.nn.functional.cross_entropy(fwd_logits, tokens[b, 1:n], reduction="sum"),
                       torch.nn.functional.cross_entropy(bwd_logits, tokens[b, : n - 1], reduction="sum")))
    count = (lengths - 1).sum()
    forward_loss = sum(f for f, _ in losses) / count
    backward_loss = sum(b for _, b in losses) / count
    return 0.5 * (forward_loss + backward_loss)


def elmo_layers(tokens, lengths, embedding, forward, backward):
    x, fs, bs = _both(tokens, lengths, embedding, forward, backward)
    mask = (torch.arange(tokens.shape[1]) < lengths.unsqueeze(1)).unsqueeze(-1).to(x.dtype)
    return torch.stack([torch.cat([x, x], dim=2) * mask] + [torch.cat([f, b], dim=2) for f, b in zip(fs, bs)])


def scalar_mix(layers, s, gamma, mask, layer_norm=False):
    w = torch.exp(s - s.max())
    w = w / w.sum()
    out = torch.zeros_like(layers[0])
    m = mask.unsqueeze(-1).to(layers.dtype)
    n = m.sum() * layers.shape[-1]
    for j in range(layers.shape[0]):
        h = layers[j]
        if layer_norm:
            mean = (h * m).sum() / n
            var = (((h - mean) * m) ** 2).sum() / n
            h = (h - mean) / torch.sqrt(var + 1e-12)
        out = out + w[j] * h
    return gamma * out

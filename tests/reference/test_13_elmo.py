"""The stage 13 reference against implementations nobody here wrote.

- ``lstm_cell`` against ``torch.nn.LSTMCell`` with the same weights;
- ``lstm`` against ``torch.nn.LSTM`` (batch_first, several layers) over
  ``pack_padded_sequence``, outputs padded back with ``pad_packed_sequence``;
- ``reverse_padded`` against reversing each row's real part by Python slicing;
- ``bilm_loss`` and ``elmo_layers`` against the same computation written with
  ``torch.nn.LSTM`` (one per direction and layer), ``torch.flip`` on each sequence's real
  part and ``torch.nn.functional.cross_entropy(ignore_index=...)``;
- ``scalar_mix`` against AllenNLP's ``ScalarMix`` formula (softmax of the scalars, gamma, its
  ``_do_layer_norm`` with 1e-12), written here from its definition over Python lists.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import reference

ref = reference.load("13_elmo")
pytestmark = pytest.mark.stage13

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-13)}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _torch_lstm(weights, dtype, input_size: int) -> torch.nn.LSTM:
    """A torch.nn.LSTM holding ``weights`` (one (w_ih, w_hh, b_ih, b_hh) per layer)."""
    hidden = weights[0][1].shape[1]
    module = torch.nn.LSTM(input_size, hidden, num_layers=len(weights), batch_first=True).to(dtype)
    with torch.no_grad():
        for k, (w_ih, w_hh, b_ih, b_hh) in enumerate(weights):
            getattr(module, f"weight_ih_l{k}").copy_(w_ih)
            getattr(module, f"weight_hh_l{k}").copy_(w_hh)
            getattr(module, f"bias_ih_l{k}").copy_(b_ih)
            getattr(module, f"bias_hh_l{k}").copy_(b_hh)
    return module


def _weights(layers: int, input_size: int, hidden: int, dtype, seed: int = 1):
    g = _gen(seed)
    out = []
    for k in range(layers):
        i = input_size if k == 0 else hidden
        out.append(
            tuple(
                torch.randn(*shape, dtype=dtype, generator=g) * 0.5
                for shape in ((4 * hidden, i), (4 * hidden, hidden), (4 * hidden,), (4 * hidden,))
            )
        )
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("B", "I", "H"), [(3, 4, 5), (1, 1, 1), (2, 6, 3)])
def test_lstm_cell_matches_torch_lstm_cell(B, I, H, dtype):  # noqa: E741
    g = _gen()
    cell = torch.nn.LSTMCell(I, H).to(dtype)
    x, h, c = (torch.randn(B, n, dtype=dtype, generator=g) for n in (I, H, H))
    with torch.no_grad():
        expected_h, expected_c = cell(x, (h, c))
    got_h, got_c = ref.lstm_cell(x, h, c, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    torch.testing.assert_close(got_h, expected_h, **TOL[dtype])
    torch.testing.assert_close(got_c, expected_c, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("lengths", "I", "H", "layers"),
    [([5, 3, 1], 4, 3, 2), ([1], 2, 2, 1), ([4, 4], 3, 5, 3), ([2, 6, 6, 1], 1, 1, 2)],
)
def test_lstm_matches_torch_lstm_over_a_packed_batch(lengths, I, H, layers, dtype):  # noqa: E741
    T = max(lengths)
    x = torch.randn(len(lengths), T, I, dtype=dtype, generator=_gen())
    lengths = torch.tensor(lengths)
    weights = _weights(layers, I, H, dtype)
    module = _torch_lstm(weights, dtype, I)
    with torch.no_grad():
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h_n, c_n) = module(packed)
        expected, _ = pad_packed_sequence(out, batch_first=True, total_length=T)
    got, got_h, got_c = ref.lstm(x, lengths, weights)
    torch.testing.assert_close(got, expected, **TOL[dtype])
    torch.testing.assert_close(got_h, h_n, **TOL[dtype])
    torch.testing.assert_close(got_c, c_n, **TOL[dtype])


@pytest.mark.parametrize("trailing", [(), (3,), (2, 2)])
def test_reverse_padded_reverses_each_real_part_only(trailing):
    lengths = torch.tensor([4, 1, 6, 3])
    x = torch.randn(4, 6, *trailing, generator=_gen())
    expected = x.clone()
    for b, n in enumerate(lengths.tolist()):
        expected[b, :n] = torch.stack([x[b, t] for t in range(n - 1, -1, -1)])
    got = ref.reverse_padded(x, lengths)
    assert torch.equal(got, expected)
    assert torch.equal(ref.reverse_padded(got, lengths), x)  # its own inverse


def _bilm_by_torch(tokens, lengths, embedding, forward, backward, dtype):
    """Each direction's top-layer states in the tokens' order, and every layer's, computed
    with torch.nn.LSTM over packed sequences and torch.flip of each real part."""
    x = torch.nn.functional.embedding(tokens, embedding)

    def flip(t):
        out = t.clone()
        for b, n in enumerate(lengths.tolist()):
            out[b, :n] = torch.flip(t[b, :n], dims=[0])
        return out

    def run(inputs, layer):
        module = _torch_lstm([layer], dtype, inputs.shape[-1])
        packed = pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
        return pad_packed_sequence(module(packed)[0], batch_first=True, total_length=inputs.shape[1])[0]

    fwd, bwd = [], []
    f_in, b_in = x, flip(x)
    with torch.no_grad():
        for layer_f, layer_b in zip(forward, backward, strict=True):
            f_in, b_in = run(f_in, layer_f), run(b_in, layer_b)
            fwd.append(f_in)
            bwd.append(flip(b_in))
    return x, fwd, bwd


def _model(dtype, V=7, E=3, H=3, layers=2, lengths=(5, 2, 4)):
    g = _gen(3)
    lengths = torch.tensor(lengths)
    tokens = torch.randint(0, V, (len(lengths), int(lengths.max())), generator=g)
    embedding = torch.randn(V, E, dtype=dtype, generator=g)
    forward = _weights(layers, E, H, dtype, seed=4)
    backward = _weights(layers, E, H, dtype, seed=5)
    w_out = torch.randn(V, H, dtype=dtype, generator=g)
    b_out = torch.randn(V, dtype=dtype, generator=g)
    return tokens, lengths, embedding, forward, backward, w_out, b_out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths", [(5, 2, 4), (2,), (3, 3)])
def test_bilm_loss_matches_torch_lstms_and_cross_entropy(lengths, dtype):
    tokens, lengths, embedding, forward, backward, w_out, b_out = _model(dtype, lengths=lengths)
    _, fwd, bwd = _bilm_by_torch(tokens, lengths, embedding, forward, backward, dtype)
    pad = -100
    T = tokens.shape[1]
    real = torch.arange(T) < lengths[:, None]
    nxt = torch.where(real[:, 1:], tokens[:, 1:], pad)  # position t predicts t + 1
    prv = torch.where(real[:, 1:], tokens[:, :-1], pad)  # position t >= 1 predicts t - 1
    logits_f = fwd[-1][:, :-1] @ w_out.T + b_out
    logits_b = bwd[-1][:, 1:] @ w_out.T + b_out
    ce = torch.nn.functional.cross_entropy
    expected = (
        ce(logits_f.reshape(-1, logits_f.shape[-1]), nxt.reshape(-1), ignore_index=pad)
        + ce(logits_b.reshape(-1, logits_b.shape[-1]), prv.reshape(-1), ignore_index=pad)
    ) / 2
    got = ref.bilm_loss(tokens, lengths, embedding, forward, backward, w_out, b_out)
    torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_elmo_layers_are_the_embedding_twice_then_each_layers_two_directions(dtype):
    tokens, lengths, embedding, forward, backward, _, _ = _model(dtype)
    x, fwd, bwd = _bilm_by_torch(tokens, lengths, embedding, forward, backward, dtype)
    real = (torch.arange(tokens.shape[1]) < lengths[:, None])[..., None]
    expected = torch.stack(
        [torch.cat([x, x], -1) * real, *(torch.cat([f, b], -1) for f, b in zip(fwd, bwd, strict=True))]
    )
    got = ref.elmo_layers(tokens, lengths, embedding, forward, backward)
    assert got.shape == (3, 3, 5, 6)
    torch.testing.assert_close(got, expected, **TOL[dtype])


def _allennlp_scalar_mix(tensors, scalars, gamma, mask, do_layer_norm):
    """AllenNLP's ScalarMix.forward, written from its definition over a list of tensors."""
    weights = torch.softmax(torch.stack(list(scalars)), dim=0)
    if not do_layer_norm:
        return gamma * sum(w * t for w, t in zip(weights, tensors, strict=True))
    broadcast = mask.to(tensors[0].dtype).unsqueeze(-1)
    n = mask.to(tensors[0].dtype).sum() * tensors[0].shape[-1]

    def norm(t):
        masked = t * broadcast
        mean = masked.sum() / n
        var = (((masked - mean) * broadcast) ** 2).sum() / n
        return (t - mean) / torch.sqrt(var + 1e-12)

    return gamma * sum(w * norm(t) for w, t in zip(weights, tensors, strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer_norm", [False, True])
def test_scalar_mix_is_allennlps(layer_norm, dtype):
    g = _gen()
    layers = torch.randn(3, 2, 4, 5, dtype=dtype, generator=g) * 3 + 1
    s = torch.randn(3, dtype=dtype, generator=g)
    gamma = torch.tensor(0.7, dtype=dtype)
    mask = torch.arange(4) < torch.tensor([4, 2])[:, None]
    expected = _allennlp_scalar_mix(list(layers), s, gamma, mask, layer_norm)
    got = ref.scalar_mix(layers, s, gamma, mask, layer_norm)
    torch.testing.assert_close(got, expected, **TOL[dtype])

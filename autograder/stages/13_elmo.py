"""Stage 13: ELMo, a bidirectional LSTM language model (CURRICULUM.md, 13_elmo)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

import reference
from autograder.stages.spec import Case, CaseData, Dim, Graded, StageSpec, Test, Variant, randint, randn

ref = reference.load("13_elmo")

# The library's LSTM, inside the student's own: torch.nn.LSTMCell and torch.nn.LSTM reach
# these operators (the fused cell on CUDA, oneDNN's layer and cuDNN's RNN under nn.LSTM).
LSTM_OPS = (
    "aten::lstm",
    "aten::lstm_cell",
    "aten::_thnn_fused_lstm_cell",
    "aten::mkldnn_rnn_layer",
    "aten::_cudnn_rnn",
    "aten::miopen_rnn",
    # the self-check's detector watches operators below the composite lstm and lstm_cell:
    # their public names, which nn.LSTM and nn.LSTMCell call (torch._VF)
    "torch.lstm",
    "torch.lstm_cell",
)

# Pre-activations of the graded cases reach tens (and, in the "saturated gates" cases,
# hundreds): a sigmoid or tanh written with exp overflows there, torch's does not.
SATURATED = 40.0


def _layer(g: torch.Generator, i: int, h: int, dtype: torch.dtype, scale: float = 1.0) -> tuple[Tensor, ...]:
    """One layer's (w_ih (4H, I), w_hh (4H, H), b_ih (4H,), b_hh (4H,)), PyTorch's layout;
    weights of variance scale²/max(I, H), so the gates are O(scale)."""
    w = scale / math.sqrt(max(i, h))
    return (
        randn(g, 4 * h, i, dtype=dtype, scale=w),
        randn(g, 4 * h, h, dtype=dtype, scale=w),
        randn(g, 4 * h, dtype=dtype, scale=0.5 * scale),
        randn(g, 4 * h, dtype=dtype, scale=0.5 * scale),
    )


def _layers(g: torch.Generator, n: int, i: int, h: int, dtype: torch.dtype, scale: float = 1.0) -> list:
    return [_layer(g, i if k == 0 else h, h, dtype, scale) for k in range(n)]


def _four_h(c: CaseData, at: int) -> int:
    return c.args[at][0][0].shape[0] if isinstance(c.args[at], list) else c.args[at].shape[0]


GATES = "4H is the four gates' rows: never 1"

# -- Task 1: lstm_cell -------------------------------------------------------------------


def _cell(b: int, i: int, h: int, scale: float = 1.0):
    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        x = randn(g, b, i, dtype=dtype, scale=scale)
        h0 = randn(g, b, h, dtype=dtype)
        c0 = randn(g, b, h, dtype=dtype, scale=2.0)
        return CaseData(args=(x, h0, c0, *_layer(g, i, h, dtype, scale)))

    return build


def _gates(x, h, w_ih, w_hh, b_ih, b_hh):
    return (x @ w_ih.T + b_ih + h @ w_hh.T + b_hh).chunk(4, dim=-1)


def _cell_ifog(x, h, c, w_ih, w_hh, b_ih, b_hh):
    """The gates read in the order i, f, o, g (as some write them) instead of PyTorch's i, f, g, o."""
    i, f, o, g = _gates(x, h, w_ih, w_hh, b_ih, b_hh)
    c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c_next), c_next


def _cell_no_forget(x, h, c, w_ih, w_hh, b_ih, b_hh):
    i, f, g, o = _gates(x, h, w_ih, w_hh, b_ih, b_hh)
    c_next = c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c_next), c_next


def _cell_unsquashed(x, h, c, w_ih, w_hh, b_ih, b_hh):
    i, f, g, o = _gates(x, h, w_ih, w_hh, b_ih, b_hh)
    c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * c_next, c_next


def _cell_one_bias(x, h, c, w_ih, w_hh, b_ih, b_hh):
    return ref.lstm_cell(x, h, c, w_ih, w_hh, b_ih, torch.zeros_like(b_hh))


LSTM_CELL = Graded(
    name="lstm_cell",
    clause="13.lstm_cell",
    task=1,
    signature="lstm_cell(x (B, I), h (B, H), c (B, H), w_ih (4H, I), w_hh (4H, H), b_ih (4H,), b_hh (4H,)) "
    "-> (h' (B, H), c' (B, H))",
    outputs=("h", "c"),
    reference=ref.lstm_cell,
    forbidden=LSTM_OPS,
    variants=(
        Variant("gate-order", _cell_ifog),
        Variant("forget-gate-ignored", _cell_no_forget),
        Variant("cell-output-not-squashed", _cell_unsquashed),
        Variant("one-bias-only", _cell_one_bias),
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("I", lambda c: c.args[0].shape[1]),
        Dim("H", lambda c: c.args[1].shape[1]),
        Dim("4H", lambda c: c.args[3].shape[0], never_one=GATES),
    ),
    small=(_cell(1, 1, 1), _cell(1, 2, 1), _cell(2, 1, 2), _cell(1, 1, 1, scale=SATURATED)),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("B=3, I=4, H=5", _cell(3, 4, 5)), Case("B=2, I=3, H=2", _cell(2, 3, 2))),
        ),
        Test(
            "float64", torch.float64, points=1, hidden=False, cases=(Case("B=2, I=2, H=3", _cell(2, 2, 3)),)
        ),
        Test(
            "float64, sizes of one",
            torch.float64,
            points=1,
            cases=(
                Case("B=1, I=6, H=3", _cell(1, 6, 3)),
                Case("B=4, I=1, H=2", _cell(4, 1, 2)),
                Case("B=2, I=3, H=1", _cell(2, 3, 1)),
            ),
        ),
        Test(
            "float64, saturated gates",
            torch.float64,
            points=1,
            cases=(Case("B=3, I=4, H=4, |gates|~100", _cell(3, 4, 4, scale=SATURATED)),),
        ),
    ),
)

# -- Task 2: lstm ------------------------------------------------------------------------


def _padded(
    lengths: tuple[int, ...], i: int, dtype: torch.dtype, g: torch.Generator, extra: int = 0, scale=1.0
):
    """x (B, T, I) with T = max(lengths) + extra, whose padding holds values (code that
    reads it is wrong), and the lengths."""
    T = max(lengths) + extra
    return randn(g, len(lengths), T, i, dtype=dtype, scale=scale), torch.tensor(lengths, dtype=torch.int64)


def _seq(lengths: tuple[int, ...], i: int, h: int, layers: int, extra: int = 0, scale: float = 1.0):
    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        x, n = _padded(lengths, i, dtype, g, extra, scale)
        return CaseData(args=(x, n, _layers(g, layers, i, h, dtype, scale)))

    return build


def _lstm_with(x, lengths, weights, cell=ref.lstm_cell, state_stops=True):
    """The reference LSTM with a student's ``cell``, or (``state_stops=False``) a state that
    runs on through the padding (the outputs there still 0)."""
    B, T, _ = x.shape
    real = torch.arange(T) < lengths[:, None]
    inputs, h_n, c_n = x, [], []
    for w_ih, w_hh, b_ih, b_hh in weights:
        h = x.new_zeros(B, w_hh.shape[1])
        c = x.new_zeros(B, w_hh.shape[1])
        outs = []
        for t in range(T):
            h_t, c_t = cell(inputs[:, t], h, c, w_ih, w_hh, b_ih, b_hh)
            keep = real[:, t, None] if state_stops else torch.ones_like(real[:, t, None])
            h, c = torch.where(keep, h_t, h), torch.where(keep, c_t, c)
            outs.append(torch.where(real[:, t, None], h_t, torch.zeros_like(h_t)))
        inputs = torch.stack(outs, dim=1)
        h_n.append(h)
        c_n.append(c)
    return inputs, torch.stack(h_n), torch.stack(c_n)


def _lstm_through_padding(x, lengths, weights):
    """The state updated at every step, the padding's included: h_n and c_n are the last
    padded step's (the outputs at padding are still 0)."""
    return _lstm_with(x, lengths, weights, state_stops=False)


def _lstm_ifog(x, lengths, weights):
    return _lstm_with(x, lengths, weights, cell=_cell_ifog)


def _lstm_padding_kept(x, lengths, weights):
    """Outputs past a length keep the last real state instead of 0."""
    out, h_n, c_n = ref.lstm(x, lengths, weights)
    real = (torch.arange(x.shape[1]) < lengths[:, None])[..., None]
    return torch.where(real, out, h_n[-1][:, None, :]), h_n, c_n


def _lstm_state_at_end(x, lengths, weights):
    """h_n and c_n taken at the last padded step: 0 for a sequence shorter than T."""
    out, h_n, c_n = ref.lstm(x, lengths, weights)
    full_h = torch.where((lengths == x.shape[1])[None, :, None], h_n, torch.zeros_like(h_n))
    full_c = torch.where((lengths == x.shape[1])[None, :, None], c_n, torch.zeros_like(c_n))
    return out, full_h, full_c


LSTM = Graded(
    name="lstm",
    clause="13.lstm",
    task=2,
    signature="lstm(x (B, T, I), lengths (B,), weights [(w_ih, w_hh, b_ih, b_hh) per layer]) "
    "-> (out (B, T, H), h_n (L, B, H), c_n (L, B, H))",
    outputs=("out", "h_n", "c_n"),
    reference=ref.lstm,
    forbidden=LSTM_OPS,
    variants=(
        Variant("lengths-ignored", _lstm_through_padding),
        Variant("gate-order", _lstm_ifog),
        Variant("padding-not-zeroed", _lstm_padding_kept),
        Variant("final-state-at-padding", _lstm_state_at_end),
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("T", lambda c: c.args[0].shape[1]),
        Dim("I", lambda c: c.args[0].shape[2]),
        Dim("H", lambda c: c.args[2][0][1].shape[1]),
        Dim("4H", lambda c: _four_h(c, 2), never_one=GATES),
        Dim("L", lambda c: len(c.args[2])),
    ),
    small=(
        _seq((1,), 1, 1, 1),
        _seq((2, 1), 1, 1, 1),
        # a row padded twice: a step bound written t != length instead of t < length shows
        _seq((2, 1), 1, 1, 1, extra=1),
        _seq((2, 1), 1, 1, 2),
        _seq((2, 1), 2, 1, 1, scale=SATURATED),
    ),
    tests=(
        Test(
            "float32, one and two layers",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("lengths (4, 2, 3), I=3, H=4, one layer", _seq((4, 2, 3), 3, 4, 1)),
                Case("lengths (3, 1), I=2, H=3, two layers", _seq((3, 1), 2, 3, 2)),
            ),
        ),
        Test(
            "float64, lengths and layers",
            torch.float64,
            points=2,
            cases=(
                Case("lengths (5, 2, 4, 1), I=4, H=3, two layers", _seq((5, 2, 4, 1), 4, 3, 2)),
                Case(
                    "lengths (3, 3), padding after all, I=2, H=2, three layers",
                    _seq((3, 3), 2, 2, 3, extra=2),
                ),
                Case("lengths (1,), I=1, H=1, one layer", _seq((1,), 1, 1, 1)),
                Case("lengths (2, 4), I=5, H=1, two layers", _seq((2, 4), 5, 1, 2)),
                Case("lengths (6,), I=1, H=2, one layer", _seq((6,), 1, 2, 1)),
            ),
        ),
        Test(
            "float32, saturated gates",
            torch.float32,
            points=1,
            cases=(
                Case(
                    "lengths (4, 2), I=3, H=3, two layers, |gates|~100",
                    _seq((4, 2), 3, 3, 2, scale=SATURATED),
                ),
            ),
        ),
    ),
)

# -- Task 3: reverse_padded --------------------------------------------------------------


def _rev(lengths: tuple[int, ...], d: int, extra: int = 0):
    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        x, n = _padded(lengths, d, dtype, g, extra)
        return CaseData(args=(x, n))

    return build


def _flip_all(x, lengths):
    return torch.flip(x, dims=[1])


def _flip_batch(x, lengths):
    """Each row reversed within its length, but the rows of the batch taken in reverse too."""
    return ref.reverse_padded(x, lengths).flip(0)


REVERSE_PADDED = Graded(
    name="reverse_padded",
    clause="13.reverse_padded",
    task=3,
    signature="reverse_padded(x (B, T, D), lengths (B,)) -> (B, T, D)",
    outputs=("y",),
    reference=ref.reverse_padded,
    variants=(Variant("flipped-with-padding", _flip_all), Variant("flipped-with-padding", _flip_batch)),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("T", lambda c: c.args[0].shape[1]),
        Dim("D", lambda c: c.args[0].shape[2]),
    ),
    small=(_rev((1,), 1, extra=1), _rev((2, 1), 1), _rev((1, 2), 1), _rev((3, 1), 1)),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("lengths (4, 2, 3), D=2", _rev((4, 2, 3), 2)),
                Case("lengths (1, 3), D=3", _rev((1, 3), 3)),
            ),
        ),
        Test(
            "float64",
            torch.float64,
            points=1,
            cases=(
                Case("lengths (5, 1, 5, 2), D=1", _rev((5, 1, 5, 2), 1)),
                Case("lengths (2,), padding after, D=4", _rev((2,), 4, extra=3)),
                Case("lengths (1,), T=1, D=2", _rev((1,), 2)),
            ),
        ),
    ),
)

# -- Task 4: bilm_loss -------------------------------------------------------------------


def _model(
    lengths: tuple[int, ...], v: int, h: int, layers: int, extra: int = 0, scale: float = 1.0, head=True
):
    """Tokens (B, T) (padding holds real token ids: code that reads them is wrong), lengths,
    the embedding (V, H), both directions' layers and, with ``head``, the softmax layer
    (w_out (V, H), b_out (V,)). E = H, as elmo_layers needs."""

    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        T = max(lengths) + extra
        tokens = randint(g, 0, v, len(lengths), T)
        n = torch.tensor(lengths, dtype=torch.int64)
        embedding = randn(g, v, h, dtype=dtype, scale=scale)
        forward = _layers(g, layers, h, h, dtype, scale)
        backward = _layers(g, layers, h, h, dtype, scale)
        args = (tokens, n, embedding, forward, backward)
        if head:
            args += (randn(g, v, h, dtype=dtype, scale=scale), randn(g, v, dtype=dtype, scale=0.5 * scale))
        return CaseData(args=args)

    return build


def _both_directions(tokens, lengths, embedding, forward, backward, lstm=ref.lstm):
    """Each direction's top states in the sentence's order (layer by layer, as the
    reference's; ``lstm``: the LSTM a variant runs)."""
    x = embedding[tokens]
    f, b = x, ref.reverse_padded(x, lengths)
    for layer_f, layer_b in zip(forward, backward, strict=True):
        f = lstm(f, lengths, [layer_f])[0]
        b = lstm(b, lengths, [layer_b])[0]
    return f, ref.reverse_padded(b, lengths)


def _nll(states, targets, valid, w_out, b_out):
    logits = states @ w_out.T + b_out
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return nll, valid


def _mean(pair):
    nll, valid = pair
    return (nll * valid).sum() / valid.sum()


def _ifog_bilm_loss(tokens, lengths, embedding, forward, backward, w_out, b_out):
    """The loss of two LSTMs whose cell reads the gates as i, f, o, g: lstm_cell's mistake,
    seen through the name that runs it."""
    f, b = _both_directions(tokens, lengths, embedding, forward, backward, _lstm_ifog)
    ahead = (torch.arange(tokens.shape[1]) < lengths[:, None])[:, 1:]
    fl = _mean(_nll(f[:, :-1], tokens[:, 1:], ahead, w_out, b_out))
    bl = _mean(_nll(b[:, 1:], tokens[:, :-1], ahead, w_out, b_out))
    return (fl + bl) / 2


def _bilm_wrong_neighbour(tokens, lengths, embedding, forward, backward, w_out, b_out):
    """The backward LM predicts the next token, as the forward one does."""
    f, b = _both_directions(tokens, lengths, embedding, forward, backward)
    ahead = (torch.arange(tokens.shape[1]) < lengths[:, None])[:, 1:]
    fl = _mean(_nll(f[:, :-1], tokens[:, 1:], ahead, w_out, b_out))
    bl = _mean(_nll(b[:, :-1], tokens[:, 1:], ahead, w_out, b_out))
    return (fl + bl) / 2


def _bilm_not_reversed(tokens, lengths, embedding, forward, backward, w_out, b_out):
    """The backward LSTM reads the sentence left to right, like the forward one."""
    x = embedding[tokens]
    f = ref.lstm(x, lengths, forward)[0]
    b = ref.lstm(x, lengths, backward)[0]
    ahead = (torch.arange(tokens.shape[1]) < lengths[:, None])[:, 1:]
    fl = _mean(_nll(f[:, :-1], tokens[:, 1:], ahead, w_out, b_out))
    bl = _mean(_nll(b[:, 1:], tokens[:, :-1], ahead, w_out, b_out))
    return (fl + bl) / 2


def _bilm_padding_counted(tokens, lengths, embedding, forward, backward, w_out, b_out):
    """Every position's loss averaged, the padding's included."""
    f, b = _both_directions(tokens, lengths, embedding, forward, backward)
    every = torch.ones_like(tokens[:, 1:], dtype=f.dtype)
    fl = _mean(_nll(f[:, :-1], tokens[:, 1:], every, w_out, b_out))
    bl = _mean(_nll(b[:, 1:], tokens[:, :-1], every, w_out, b_out))
    return (fl + bl) / 2


def _bilm_summed(tokens, lengths, embedding, forward, backward, w_out, b_out):
    return 2 * ref.bilm_loss(tokens, lengths, embedding, forward, backward, w_out, b_out)


BILM_LOSS = Graded(
    name="bilm_loss",
    clause="13.bilm_loss",
    task=4,
    signature="bilm_loss(tokens (B, T), lengths (B,), embedding (V, H), forward, backward, w_out (V, H), "
    "b_out (V,)) -> ()",
    outputs=("loss",),
    reference=ref.bilm_loss,
    forbidden=LSTM_OPS,
    variants=(
        Variant("backward-predicts-next", _bilm_wrong_neighbour),
        Variant("backward-not-reversed", _bilm_not_reversed),
        Variant("padding-in-loss", _bilm_padding_counted),
        Variant("directions-summed", _bilm_summed),
        Variant("gate-order", _ifog_bilm_loss),
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim(
            "T", lambda c: c.args[0].shape[1], never_one="a sentence of one token has no neighbour to predict"
        ),
        Dim("V", lambda c: c.args[2].shape[0], never_one="a vocabulary of one token makes every loss 0"),
        Dim("H", lambda c: c.args[2].shape[1]),
        Dim("4H", lambda c: _four_h(c, 3), never_one=GATES),
        Dim("L", lambda c: len(c.args[3])),
    ),
    small=(
        _model((2,), 2, 1, 1),
        _model((2, 2), 2, 1, 1),
        _model((3, 2), 2, 1, 2),  # two layers: the loss reads the last one's states
        _model((2, 1), 2, 1, 1, extra=1),  # a row padded twice, as the lstm's
        _model((3, 2), 3, 1, 1, scale=SATURATED),
    ),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("lengths (4, 2, 3), V=7, H=3, one layer", _model((4, 2, 3), 7, 3, 1)),
                Case("lengths (3,), V=5, H=2, two layers", _model((3,), 5, 2, 2)),
            ),
        ),
        Test(
            "float64, lengths and layers",
            torch.float64,
            points=2,
            cases=(
                Case("lengths (5, 2, 4), V=9, H=4, two layers", _model((5, 2, 4), 9, 4, 2)),
                Case("lengths (2, 2), padding after, V=4, H=1, one layer", _model((2, 2), 4, 1, 1, extra=2)),
                Case("lengths (6, 3), V=3, H=2, two layers", _model((6, 3), 3, 2, 2)),
                Case("lengths (3, 2, 2, 5, 4), V=6, H=3, one layer", _model((3, 2, 2, 5, 4), 6, 3, 1)),
            ),
        ),
        Test(
            "float64, confident predictions",
            torch.float64,
            points=1,
            cases=(Case("lengths (4, 3), V=5, H=2, |logits|~100", _model((4, 3), 5, 2, 1, scale=SATURATED)),),
        ),
    ),
)

# -- Task 5: elmo_layers -----------------------------------------------------------------


def _elmo(lengths: tuple[int, ...], v: int, h: int, layers: int, extra: int = 0):
    return _model(lengths, v, h, layers, extra, head=False)


def _layers_unaligned(tokens, lengths, embedding, forward, backward):
    """The backward states left in the order the backward LSTM read them."""
    x = embedding[tokens]
    real = (torch.arange(tokens.shape[1]) < lengths[:, None])[..., None]
    out = [torch.cat([x, x], -1) * real]
    f_in, b_in = x, ref.reverse_padded(x, lengths)
    for lf, lb in zip(forward, backward, strict=True):
        f_in = ref.lstm(f_in, lengths, [lf])[0]
        b_in = ref.lstm(b_in, lengths, [lb])[0]
        out.append(torch.cat([f_in, b_in], -1))
    return torch.stack(out)


def _layers_ifog(tokens, lengths, embedding, forward, backward):
    """The layers of two LSTMs whose cell reads the gates as i, f, o, g."""
    x = embedding[tokens]
    real = (torch.arange(tokens.shape[1]) < lengths[:, None])[..., None]
    out = [torch.cat([x, x], -1) * real]
    f_in, b_in = x, ref.reverse_padded(x, lengths)
    for lf, lb in zip(forward, backward, strict=True):
        f_in = _lstm_ifog(f_in, lengths, [lf])[0]
        b_in = _lstm_ifog(b_in, lengths, [lb])[0]
        out.append(torch.cat([f_in, ref.reverse_padded(b_in, lengths)], -1))
    return torch.stack(out)


def _layers_swapped(tokens, lengths, embedding, forward, backward):
    layers = ref.elmo_layers(tokens, lengths, embedding, forward, backward)
    H = layers.shape[-1] // 2
    return torch.cat([layers[..., H:], layers[..., :H]], -1)


def _layers_padding_embedded(tokens, lengths, embedding, forward, backward):
    layers = ref.elmo_layers(tokens, lengths, embedding, forward, backward)
    x = embedding[tokens]
    return torch.cat([torch.cat([x, x], -1)[None], layers[1:]])


ELMO_LAYERS = Graded(
    name="elmo_layers",
    clause="13.elmo_layers",
    task=5,
    signature="elmo_layers(tokens (B, T), lengths (B,), embedding (V, H), forward, backward) "
    "-> (L + 1, B, T, 2H)",
    outputs=("layers",),
    reference=ref.elmo_layers,
    forbidden=LSTM_OPS,
    variants=(
        Variant("backward-not-realigned", _layers_unaligned),
        Variant("directions-swapped", _layers_swapped),
        Variant("padding-not-zeroed", _layers_padding_embedded),
        Variant("gate-order", _layers_ifog),
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("T", lambda c: c.args[0].shape[1]),
        Dim("V", lambda c: c.args[2].shape[0]),
        Dim("H", lambda c: c.args[2].shape[1]),
        Dim("4H", lambda c: _four_h(c, 3), never_one=GATES),
        Dim("L", lambda c: len(c.args[3])),
    ),
    small=(
        _elmo((1,), 1, 1, 1),
        _elmo((2, 1), 2, 1, 1),
        _elmo((2, 1), 2, 1, 1, extra=1),  # a row padded twice, as the lstm's
        _elmo((2, 1), 2, 1, 2),
    ),
    small_magnitude="its floats are an embedding and weights that only pass through the reference's own "
    "torch.sigmoid and torch.tanh: no value makes a correct order of operations overflow",
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("lengths (4, 2, 3), V=6, H=3, two layers", _elmo((4, 2, 3), 6, 3, 2)),
                Case("lengths (1, 2), V=3, H=2, one layer", _elmo((1, 2), 3, 2, 1)),
            ),
        ),
        Test(
            "float64",
            torch.float64,
            points=2,
            cases=(
                Case("lengths (5, 1, 3), V=8, H=4, two layers", _elmo((5, 1, 3), 8, 4, 2)),
                Case("lengths (2,), padding after, V=1, H=1, one layer", _elmo((2,), 1, 1, 1, extra=2)),
                Case("lengths (1,), V=4, H=2, three layers", _elmo((1,), 4, 2, 3)),
                Case("lengths (3, 3), V=5, H=2, one layer", _elmo((3, 3), 5, 2, 1)),
            ),
        ),
    ),
)

# -- Task 6: scalar_mix ------------------------------------------------------------------


def _mix(n: int, lengths: tuple[int, ...], d: int, layer_norm: bool | None = None, extra: int = 0, scale=1.0):
    """(L + 1, B, T, D) layers whose padding holds values, the scalars s, gamma, the mask;
    ``layer_norm`` passed only when not None (its default is graded by leaving it out)."""

    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        T = max(lengths) + extra
        layers = randn(g, n, len(lengths), T, d, dtype=dtype, scale=scale) + randn(g, n, 1, 1, d, dtype=dtype)
        s = randn(g, n, dtype=dtype)
        gamma = randn(g, 1, dtype=dtype)[0].abs() + 0.5  # a 0-d tensor
        mask = torch.arange(T) < torch.tensor(lengths)[:, None]
        kwargs = {} if layer_norm is None else {"layer_norm": layer_norm}
        return CaseData(args=(layers, s, gamma, mask), kwargs=kwargs)

    return build


def _mix_no_softmax(layers, s, gamma, mask, layer_norm=False):
    normed = ref.normalise_layers(layers, mask) if layer_norm else layers
    return gamma * (s[:, None, None, None] * normed).sum(0)


def _mix_no_gamma(layers, s, gamma, mask, layer_norm=False):
    return ref.scalar_mix(layers, s, torch.ones_like(gamma), mask, layer_norm)


def _mix_norm_with_padding(layers, s, gamma, mask, layer_norm=False):
    return ref.scalar_mix(layers, s, gamma, torch.ones_like(mask) if layer_norm else mask, layer_norm)


def _mix_norm_per_token(layers, s, gamma, mask, layer_norm=False):
    """Each token's vector normalised over its D features, as torch.nn.LayerNorm would."""
    if layer_norm:
        mean = layers.mean(-1, keepdim=True)
        var = layers.var(-1, unbiased=False, keepdim=True)
        layers = (layers - mean) / torch.sqrt(var + 1e-12)
    return ref.scalar_mix(layers, s, gamma, mask, False)


SCALAR_MIX = Graded(
    name="scalar_mix",
    clause="13.scalar_mix",
    task=6,
    signature="scalar_mix(layers (L + 1, B, T, D), s (L + 1,), gamma (), mask (B, T), layer_norm=False) "
    "-> (B, T, D)",
    outputs=("mix",),
    reference=ref.scalar_mix,
    variants=(
        Variant("mix-without-softmax", _mix_no_softmax),
        Variant("gamma-ignored", _mix_no_gamma),
        Variant("layer-norm-over-padding", _mix_norm_with_padding),
        Variant("layer-norm-per-token", _mix_norm_per_token),
    ),
    dims=(
        Dim("L + 1", lambda c: c.args[0].shape[0]),
        Dim("B", lambda c: c.args[0].shape[1]),
        Dim("T", lambda c: c.args[0].shape[2]),
        Dim("D", lambda c: c.args[0].shape[3]),
    ),
    small=(
        _mix(2, (1,), 1),
        _mix(2, (1,), 1, layer_norm=True, extra=1),
        _mix(2, (2, 1), 3, layer_norm=True),  # B = 2, D = 3: the layer norm's count is B T D
        _mix(3, (2, 1), 2, layer_norm=True, scale=8.0),
    ),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("L + 1 = 3, lengths (4, 2), D=5", _mix(3, (4, 2), 5)),
                Case("L + 1 = 2, lengths (3,), D=4, layer norm", _mix(2, (3,), 4, layer_norm=True)),
            ),
        ),
        Test(
            "float64, with and without layer norm",
            torch.float64,
            points=2,
            cases=(
                Case("L + 1 = 3, lengths (5, 1, 3), D=4", _mix(3, (5, 1, 3), 4, layer_norm=False)),
                Case("L + 1 = 3, lengths (5, 1, 3), D=4, layer norm", _mix(3, (5, 1, 3), 4, layer_norm=True)),
                Case("L + 1 = 1, lengths (2, 2), D=1, layer norm", _mix(1, (2, 2), 1, layer_norm=True)),
                Case(
                    "L + 1 = 4, lengths (1,), padding after, D=3, layer norm", _mix(4, (1,), 3, True, extra=2)
                ),
                Case("L + 1 = 2, lengths (1,), T=1, D=1", _mix(2, (1,), 1)),
                # one real value per layer: its variance is 0, and only the 1e-12 keeps 0 / 0 away
                Case(
                    "L + 1 = 2, lengths (1,), T=2, D=1, layer norm",
                    _mix(2, (1,), 1, layer_norm=True, extra=1),
                ),
            ),
        ),
        Test(
            "float32, large values, layer norm",
            torch.float32,
            points=1,
            cases=(
                Case(
                    "L + 1 = 3, lengths (6, 4), D=8, |h|~16", _mix(3, (6, 4), 8, layer_norm=True, scale=16.0)
                ),
            ),
        ),
    ),
)

SPEC = StageSpec(
    id="13_elmo",
    title="ELMo, a bidirectional LSTM language model",
    graded=(LSTM_CELL, LSTM, REVERSE_PADDED, BILM_LOSS, ELMO_LAYERS, SCALAR_MIX),
    misconceptions={
        "gate-order": (
            "your output matches an LSTM cell that reads the four gates in another order: PyTorch "
            "stacks the rows of w_ih and w_hh as input, forget, cell (g), output; split the pre-"
            "activations with .chunk(4, dim=-1) in that order: i, f, g, o."
        ),
        "forget-gate-ignored": (
            "your output matches a cell without its forget gate (c' = c + i * g): the old cell state "
            "is scaled by the forget gate first, c' = sigmoid(f) * c + sigmoid(i) * tanh(g)."
        ),
        "cell-output-not-squashed": (
            "your output matches h' = o * c': the new cell state goes through tanh before the output "
            "gate, h' = sigmoid(o) * tanh(c')."
        ),
        "one-bias-only": (
            "your output matches a cell that adds b_ih but not b_hh: PyTorch's LSTM has both biases, "
            "gates = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh."
        ),
        "lengths-ignored": (
            "your output matches an LSTM that runs through the padding: a sequence's state must stop "
            "at its own length (keep h and c where t >= lengths[b]), so h_n and c_n are each "
            "sequence's state at its last real token."
        ),
        "padding-not-zeroed": (
            "your output has values at padded positions: outputs past a sequence's length are 0 (as "
            "pad_packed_sequence returns them, and as ELMo's layers are at padding)."
        ),
        "final-state-at-padding": (
            "your h_n and c_n are the states at the last padded step: take each sequence's state at "
            "its own last real token (step lengths[b] - 1)."
        ),
        "flipped-with-padding": (
            "your output matches a reversal of the whole padded row (or of the batch): reverse each "
            "sequence within its own length only, position t < lengths[b] taking lengths[b] - 1 - t, "
            "the padding left where it is."
        ),
        "backward-predicts-next": (
            "your loss matches a backward language model that predicts the next token: the backward "
            "LSTM reads right to left, so its state at position t predicts token t - 1."
        ),
        "backward-not-reversed": (
            "your loss matches a backward LSTM that reads the sentence left to right: reverse each "
            "sequence within its length (reverse_padded) before the backward LSTM and reverse its "
            "states back."
        ),
        "padding-in-loss": (
            "your loss averages over padded positions too: count only the targets of real tokens "
            "(positions t + 1 < lengths[b] forward, t - 1 >= 0 with t < lengths[b] backward)."
        ),
        "directions-summed": (
            "your loss is the sum of the two directions' losses: this stage takes their mean, "
            "(forward + backward) / 2."
        ),
        "backward-not-realigned": (
            "your backward states are in the order the backward LSTM read them: reverse them back "
            "(reverse_padded) so that each position holds its own token's state."
        ),
        "directions-swapped": (
            "your layers put the backward states first: each layer is [h_forward; h_backward]."
        ),
        "mix-without-softmax": (
            "your mix weights the layers by s itself: the weights are softmax(s), positive and summing to 1."
        ),
        "gamma-ignored": (
            "your mix leaves out gamma: the weighted sum is scaled by gamma, gamma * sum_j softmax(s)_j h_j."
        ),
        "layer-norm-over-padding": (
            "your layer norm counts the padded positions: each layer's mean and variance are over the"
            " values at real tokens only (mask)."
        ),
        "layer-norm-per-token": (
            "your layer norm normalises each token's vector, as torch.nn.LayerNorm does: ELMo's "
            "normalises each whole layer, one mean and one variance over all its real values."
        ),
    },
    call_timeout_s=10.0,
)

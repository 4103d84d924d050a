"""Stage 12: seq2seq with the encoder-decoder Transformer (CURRICULUM.md, 12_seq2seq).

``CrossAttention`` and ``TransformerDecoderLayer`` are graded as modules (random weights,
with and without the source's padding mask). The model, the loss, greedy decoding and the
attention picture go through drivers (``autograder/runtime/drivers/seq2seq.py``) on small
random models: ``seq2seq:model`` calls ``encode``, ``decode`` and the forward; ``greedy``
also counts the calls of ``model.encode``. Models are tiny: every call takes milliseconds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

import reference
from autograder.stages import load_spec
from autograder.stages.spec import Case, CaseData, Dim, Graded, StageSpec, Test, Variant, randint, randn

ref = reference.load("12_seq2seq")
attention = reference.load("01_attention")
multihead = reference.load("02_multihead")

# Everything here runs the student's 01 attention on 02's heads and 06's layers: forbidden is
# what 06's encoder layer forbids (the library attention, nn.MultiheadAttention, and the fused
# encoder layer; the library decoder layer and nn.Transformer run the library attention).
FORBIDDEN = load_spec("06_transformer_block").graded_name("TransformerEncoderLayer").forbidden


def _random_state(module: torch.nn.Module, g: torch.Generator, dtype: torch.dtype) -> dict[str, Tensor]:
    """Random values for every entry of ``module``'s state dict: LayerNorm gains near 1,
    weights of variance 1/d_in (activations stay O(1)), biases and embeddings that count."""
    state = {}
    for name, value in sorted(module.state_dict().items()):
        if "norm" in name and name.endswith(".weight"):
            t = 1 + randn(g, *value.shape, dtype=dtype, scale=0.3)
        elif value.dim() == 2 and "embed" not in name:
            t = randn(g, *value.shape, dtype=dtype, scale=value.shape[1] ** -0.5)
        else:
            t = randn(g, *value.shape, dtype=dtype, scale=0.5)
        state[name] = t
    return state


def _source_mask(g: torch.Generator, b: int, s: int) -> Tensor:
    """01's padding_mask (B, 1, 1, S) of lengths in [1, S], row 0 padded when S > 1."""
    lengths = randint(g, 1, s + 1, b)
    lengths[0] = max(1, s - 2)
    return attention.padding_mask(lengths, s)


# -- Task 1: CrossAttention ----------------------------------------------------------------


def _cross_case(b: int, t: int, s: int, d: int, h: int, *, masked: bool = True):
    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        state = _random_state(ref.CrossAttention(d, h), g, dtype)
        x = randn(g, b, t, d, dtype=dtype)
        memory = randn(g, b, s, d, dtype=dtype)
        kwargs = {"memory_mask": _source_mask(g, b, s)} if masked else {}
        return CaseData(init_args=(d, h), state=state, args=(x, memory), kwargs=kwargs)

    return build


def _kv_from_decoder(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Self-attention of the decoder's positions: keys and values from x, not the memory (the
    source mask applied where its shape allows: T = S)."""
    fits = memory_mask is None or memory_mask.size(-1) == x.size(1)
    return multihead.MultiHeadAttention.forward(self, x, x, x, memory_mask if fits else None)


class _CrossFromDecoder(ref.CrossAttention):
    def forward(self, x, memory, memory_mask=None):
        return _kv_from_decoder(self, x, memory, memory_mask)


class _CrossUnmasked(ref.CrossAttention):
    def forward(self, x, memory, memory_mask=None):
        return super().forward(x, memory, None)


CROSS_DIMS = (
    Dim("B", lambda c: c.args[0].shape[0]),
    Dim("T", lambda c: c.args[0].shape[1]),
    Dim("S", lambda c: c.args[1].shape[1]),
    Dim("d_model", lambda c: c.init_args[0]),
    Dim("num_heads", lambda c: c.init_args[1]),
    Dim("d_k", lambda c: c.init_args[0] // c.init_args[1]),
)

CROSS = Graded(
    name="CrossAttention",
    clause="12.CrossAttention",
    task=1,
    kind="module",
    signature="CrossAttention(d_model, num_heads) with sub-modules w_q, w_k, w_v, w_o (your 02 "
    "MultiHeadAttention's); forward(x (B, T, d_model), memory (B, S, d_model), memory_mask=None "
    "(B, 1, 1, S)) -> (out (B, T, d_model), weights (B, num_heads, T, S))",
    outputs=("out", "weights"),
    reference=ref.CrossAttention,
    forbidden=FORBIDDEN,
    variants=(
        Variant("cross-attention-kv-from-decoder", _CrossFromDecoder),
        Variant("source-padding-ignored", _CrossUnmasked),
    ),
    dims=CROSS_DIMS,
    # one query over two source positions, one of them padding; then the decoder's own
    # length equal to the source's (keys from x have the memory's shape)
    small=(
        _cross_case(1, 1, 2, 1, 1),
        _cross_case(1, 2, 2, 2, 1),
        _cross_case(1, 2, 3, 2, 2),
        _cross_case(2, 2, 2, 2, 1, masked=False),
        # two real source positions of four: weights that can differ where padding is masked
        _cross_case(1, 2, 4, 2, 2),
    ),
    tests=(
        Test(
            "float32, source padding",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("B=2, T=4, S=6, d_model=8, h=2", _cross_case(2, 4, 6, 8, 2)),
                Case("B=3, T=5, S=5, d_model=12, h=3", _cross_case(3, 5, 5, 12, 3)),
            ),
        ),
        Test(
            "float64, source padding and none",
            torch.float64,
            points=1,
            cases=(
                Case("B=3, T=3, S=7, d_model=16, h=4", _cross_case(3, 3, 7, 16, 4)),
                Case("no mask, B=2, T=6, S=4, d_model=8, h=1", _cross_case(2, 6, 4, 8, 1, masked=False)),
                Case("B=1, T=1, S=1, d_model=4, h=4 (d_k = 1)", _cross_case(1, 1, 1, 4, 4)),
                Case("d_model=h=1, B=2, T=3, S=3", _cross_case(2, 3, 3, 1, 1)),
            ),
        ),
    ),
)

# -- Task 2: TransformerDecoderLayer -----------------------------------------------------


def _decoder_forward(
    self,
    x: Tensor,
    memory: Tensor,
    memory_mask: Tensor | None,
    *,
    causal: bool = True,
    source_mask: bool = True,
    kv_from_decoder: bool = False,
    pre_ln: bool = False,
) -> tuple[Tensor, Tensor]:
    """The reference layer's forward with a knob per known mistake."""
    T = x.size(1)
    mask = attention.causal_mask(T).to(x.device) if causal else None
    memory_mask = memory_mask if source_mask else None

    def cross(h: Tensor) -> tuple[Tensor, Tensor]:
        if kv_from_decoder:
            return _kv_from_decoder(self.cross_attention, h, memory, memory_mask)
        return multihead.MultiHeadAttention.forward(self.cross_attention, h, memory, memory, memory_mask)

    if pre_ln:  # GPT-2's and the Annotated Transformer's wiring
        h = self.norm1(x)
        x = x + self.self_attention(h, h, h, mask)[0]
        a, weights = cross(self.norm2(x))
        x = x + a
        return x + self.ffn(self.norm3(x)), weights
    x = self.norm1(x + self.self_attention(x, x, x, mask)[0])
    a, weights = cross(x)
    x = self.norm2(x + a)
    return self.norm3(x + self.ffn(x)), weights


def _layer_variant(**knobs) -> type[ref.TransformerDecoderLayer]:
    class Mistaken(ref.TransformerDecoderLayer):
        def forward(self, x, memory, memory_mask=None):
            return _decoder_forward(self, x, memory, memory_mask, **knobs)

    return Mistaken


LAYER_MISTAKES = (
    ("no-causal-mask", {"causal": False}),
    ("source-padding-ignored", {"source_mask": False}),
    ("cross-attention-kv-from-decoder", {"kv_from_decoder": True}),
    ("pre-ln-instead-of-post-ln", {"pre_ln": True}),
)


def _layer_case(b: int, t: int, s: int, d: int, h: int, d_ff: int, *, masked: bool = True, eps=1e-5):
    """``eps``: None leaves it out of the constructor (its default is graded)."""

    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        state = _random_state(ref.TransformerDecoderLayer(d, h, d_ff), g, dtype)
        x = randn(g, b, t, d, dtype=dtype)
        memory = randn(g, b, s, d, dtype=dtype)
        kwargs = {"memory_mask": _source_mask(g, b, s)} if masked else {}
        return CaseData(
            init_args=(d, h, d_ff),
            init_kwargs={} if eps is None else {"eps": eps},
            state=state,
            args=(x, memory),
            kwargs=kwargs,
        )

    return build


LAYER = Graded(
    name="TransformerDecoderLayer",
    clause="12.TransformerDecoderLayer",
    task=2,
    kind="module",
    signature="TransformerDecoderLayer(d_model, num_heads, d_ff, eps=1e-5) with sub-modules "
    "self_attention, norm1, cross_attention, norm2, ffn, norm3; forward(x (B, T, d_model), "
    "memory (B, S, d_model), memory_mask=None (B, 1, 1, S)) -> (out (B, T, d_model), "
    "weights (B, num_heads, T, S))",
    outputs=("out", "weights"),
    reference=ref.TransformerDecoderLayer,
    forbidden=FORBIDDEN,
    variants=tuple(Variant(mid, _layer_variant(**knobs)) for mid, knobs in LAYER_MISTAKES),
    dims=(*CROSS_DIMS, Dim("d_ff", lambda c: c.init_args[2])),
    # d_model = 3 (a LayerNorm over two values keeps only a sign); two target positions (a
    # causal mask to apply), a padded source; then T = S (keys from x have the memory's shape)
    small=(
        _layer_case(1, 2, 2, 3, 1, 1),
        _layer_case(1, 2, 3, 3, 1, 2),
        _layer_case(1, 3, 3, 4, 2, 2),
        # an eps that is not torch's default (1e-5 would hide an eps left out)
        _layer_case(2, 2, 2, 3, 1, 2, masked=False, eps=0.5),
        # two real source positions of four, and eps left to its default
        _layer_case(1, 2, 4, 4, 2, 2, eps=None),
    ),
    tests=(
        Test(
            "float32, source padding",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("B=2, T=5, S=6, d_model=8, h=2, d_ff=32", _layer_case(2, 5, 6, 8, 2, 32)),
                Case("B=3, T=4, S=4, d_model=12, h=3, d_ff=24", _layer_case(3, 4, 4, 12, 3, 24)),
            ),
        ),
        Test(
            "float64, source padding",
            torch.float64,
            points=1,
            hidden=False,
            cases=(Case("B=2, T=6, S=5, d_model=16, h=4, d_ff=64", _layer_case(2, 6, 5, 16, 4, 64)),),
        ),
        Test(
            "float64, eps, no mask, sizes of 1",
            torch.float64,
            points=1.5,
            cases=(
                Case(
                    "eps left at its default, B=2, T=4, S=7, d_model=8, h=2, d_ff=16",
                    _layer_case(2, 4, 7, 8, 2, 16, eps=None),
                ),
                Case(
                    "eps=1e-3, no mask, B=3, T=5, S=3, d_model=12, h=4, d_ff=20",
                    _layer_case(3, 5, 3, 12, 4, 20, masked=False, eps=1e-3),
                ),
                Case("B=1, T=1, S=1, d_model=4, h=2, d_ff=1", _layer_case(1, 1, 1, 4, 2, 1)),
                Case(
                    "d_model=h=1 (each norm's output is its bias), B=2, T=3, S=2, d_ff=4",
                    _layer_case(2, 3, 2, 1, 1, 4),
                ),
            ),
        ),
        Test(
            "float32, one head, d_k = 1, T = S",
            torch.float32,
            points=1.5,
            cases=(
                Case("h=1, B=2, T=6, S=6, d_model=8, d_ff=16", _layer_case(2, 6, 6, 8, 1, 16)),
                Case("h=d_model=6, B=2, T=3, S=3, d_ff=12", _layer_case(2, 3, 3, 6, 6, 12)),
                Case(
                    "no mask, B=2, T=7, S=2, d_model=8, h=2, d_ff=32",
                    _layer_case(2, 7, 2, 8, 2, 32, masked=False),
                ),
            ),
        ),
    ),
)

# -- Task 3: Seq2SeqTransformer ------------------------------------------------------------

TINY = dict(
    src_vocab_size=11,
    tgt_vocab_size=13,
    d_model=16,
    num_heads=4,
    d_ff=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    max_len=16,
)
# The smallest model counterexamples are tried on: LayerNorms over 3 features, one head,
# one layer each side; vocabularies of 3.
SMALL = dict(
    src_vocab_size=3,
    tgt_vocab_size=3,
    d_model=3,
    num_heads=1,
    d_ff=2,
    num_encoder_layers=1,
    num_decoder_layers=1,
    max_len=4,
)
# two decoder layers: a future that leaks into the first layer changes what the second sees
SMALL2 = {**SMALL, "num_decoder_layers": 2, "d_model": 4, "num_heads": 2}
MODEL_SIZES = tuple(TINY)
ALL_ONE = dict.fromkeys(MODEL_SIZES, 1)


def _model_variant(
    *,
    layer: dict | None = None,
    encoder_mask: bool = True,
    encoder_norm: bool = True,
    decoder_norm: bool = True,
) -> type[ref.Seq2SeqTransformer]:
    """The reference model, weights and sub-modules unchanged, with a mistake in its decoder
    layers or its stacks."""
    mistaken = _layer_variant(**layer) if layer else None

    class Mistaken(ref.Seq2SeqTransformer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            if mistaken is not None:
                for d in self.decoder:
                    d.__class__ = mistaken

        def encode(self, src, src_mask=None):
            x = self.src_embed(src) + self._positions(src)
            for lay in self.encoder:
                x = lay(x, src_mask if encoder_mask else None)
            return self.encoder_norm(x) if encoder_norm else x

        def decode(self, tgt, memory, src_mask=None):
            y = self.tgt_embed(tgt) + self._positions(tgt)
            weights = None
            for lay in self.decoder:
                y, weights = lay(y, memory, src_mask)
            return self.generator(self.decoder_norm(y) if decoder_norm else y), weights

    return Mistaken


MODEL_MISTAKES = (
    *((mid, {"layer": knobs}) for mid, knobs in LAYER_MISTAKES),
    ("source-padding-ignored", {"encoder_mask": False}),
    ("source-padding-ignored", {"encoder_mask": False, "layer": {"source_mask": False}}),
    ("no-final-layernorm", {"encoder_norm": False}),
    ("no-final-layernorm", {"decoder_norm": False}),
    ("no-final-layernorm", {"encoder_norm": False, "decoder_norm": False}),
)


def _config(eps: float | None, overrides: dict) -> dict:
    config = {**TINY, **overrides}
    return config if eps is None else {**config, "eps": eps}


def _model_case(b: int, s: int, t: int, *, masked: bool = True, eps: float | None = 1e-5, **overrides: int):
    """A random model, a source (B, S) with its padding mask (or none) and a decoder input (B, T)."""

    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        config = _config(eps, overrides)
        state = _random_state(ref.Seq2SeqTransformer(**config), g, dtype)
        src = randint(g, 0, config["src_vocab_size"], b, s)
        tgt = randint(g, 0, config["tgt_vocab_size"], b, t)
        kwargs = {"src_mask": _source_mask(g, b, s)} if masked else {}
        return CaseData(args=(src, tgt), kwargs=kwargs, init_kwargs=config, state=state)

    return build


def _model_dims(*, with_tgt: bool = True) -> tuple[Dim, ...]:
    return (
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("S", lambda c: c.args[0].shape[1]),
        *((Dim("T", lambda c: c.args[1].shape[1]),) if with_tgt else ()),
        *(Dim(k, lambda c, k=k: c.init_kwargs[k]) for k in MODEL_SIZES),
    )


MODEL = Graded(
    name="Seq2SeqTransformer",
    clause="12.Seq2SeqTransformer",
    task=3,
    kind="driver",
    driver="seq2seq:model",
    signature="Seq2SeqTransformer(src_vocab_size, tgt_vocab_size, d_model, num_heads, d_ff, "
    "num_encoder_layers, num_decoder_layers, max_len, eps=1e-5) with sub-modules src_embed, tgt_embed, "
    "pos_embed, encoder, encoder_norm, decoder, decoder_norm, generator; encode(src (B, S), "
    "src_mask=None) -> memory (B, S, d_model); decode(tgt (B, T), memory, src_mask=None) -> "
    "(logits (B, T, tgt_vocab_size), weights (B, num_heads, T, S)); forward(src, tgt, src_mask=None) "
    "= decode(tgt, encode(src, src_mask), src_mask)",
    outputs=("memory (encode)", "logits (decode)", "weights (decode)", "logits (forward)"),
    reference=ref.Seq2SeqTransformer,
    forbidden=FORBIDDEN,
    variants=tuple(Variant(mid, _model_variant(**knobs)) for mid, knobs in MODEL_MISTAKES),
    dims=_model_dims(),
    small=(
        _model_case(1, 2, 2, **SMALL),
        _model_case(1, 3, 2, **SMALL),
        _model_case(2, 2, 2, masked=False, eps=None, **SMALL),  # eps left to its default
        _model_case(1, 3, 3, **SMALL2),
        # an eps that is not torch's default (1e-5 would hide an eps left out)
        _model_case(1, 2, 2, masked=False, eps=0.5, **SMALL),
    ),
    tests=(
        Test(
            "float32, source padding",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("B=2, S=7, T=5", _model_case(2, 7, 5)),),
        ),
        Test(
            "float64, source padding",
            torch.float64,
            points=1,
            hidden=False,
            cases=(
                Case(
                    "B=3, S=5, T=6, 1 encoder and 3 decoder layers",
                    _model_case(3, 5, 6, num_encoder_layers=1, num_decoder_layers=3),
                ),
            ),
        ),
        Test(
            "float64, other configurations",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "no mask, eps left at its default, B=2, S=6, T=6",
                    _model_case(2, 6, 6, masked=False, eps=None),
                ),
                Case(
                    "eps=1e-3, 1 head, 3 encoder layers, B=4, S=8, T=3",
                    _model_case(4, 8, 3, eps=1e-3, num_heads=1, num_encoder_layers=3),
                ),
                Case("every size 1 but B=2: S=T=1", _model_case(2, 1, 1, **ALL_ONE)),
            ),
        ),
        Test(
            "float32, d_k = 1, longer sequences",
            torch.float32,
            points=1,
            cases=(
                Case(
                    "d_model=h=8, B=2, S=16, T=16 (max_len)",
                    _model_case(2, 16, 16, d_model=8, num_heads=8, d_ff=16),
                ),
                Case("B=1, S=4, T=9", _model_case(1, 4, 9)),
            ),
        ),
    ),
)

# -- Task 4: seq2seq_loss ------------------------------------------------------------------

PAD, BOS = 0, 1


def _unshifted(*, whole: bool):
    """The target not shifted: each position scored on the token it reads. ``whole``: the
    decoder reads the whole target (B, T); else its first T - 1 tokens."""

    def seq2seq_loss(model, src, tgt, src_mask, pad_id):
        inputs = tgt if whole else tgt[:, :-1]
        if inputs.size(1) > model.pos_embed.num_embeddings:
            raise ValueError("the whole target does not fit the model's positions")
        logits, _ = model(src, inputs, src_mask)
        return F.cross_entropy(logits.flatten(0, 1), inputs.flatten(), ignore_index=pad_id)

    return seq2seq_loss


def _padding_counted(model, src, tgt, src_mask, pad_id):
    logits, _ = model(src, tgt[:, :-1], src_mask)
    return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())


def _padding_counted_as_zero(model, src, tgt, src_mask, pad_id):
    """Padding's losses set to 0, then the mean over every position (padding in the count)."""
    logits, _ = model(src, tgt[:, :-1], src_mask)
    targets = tgt[:, 1:]
    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return (losses * (targets.flatten() != pad_id)).mean()


def _loss_case(b: int, s: int, t: int, *, pad_share: float = 0.5, masked: bool = True, **overrides: int):
    """A random model, a source and a target (B, T): BOS, tokens of [1, V), then padding in
    about ``pad_share`` of the rows (row 0 never: every case has a target that counts)."""

    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        config = _config(1e-5, overrides)
        state = _random_state(ref.Seq2SeqTransformer(**config), g, dtype)
        src = randint(g, 0, config["src_vocab_size"], b, s)
        tgt = randint(g, 1, config["tgt_vocab_size"], b, t)
        tgt[:, 0] = BOS
        lengths = randint(g, 2, t + 1, b)  # BOS and at least one target
        padded = torch.rand(b, generator=g) < pad_share
        padded[0] = False
        for i in range(b):
            if padded[i]:
                tgt[i, int(lengths[i]) :] = PAD
        kwargs = {"pad_id": PAD}
        if masked:
            kwargs["src_mask"] = _source_mask(g, b, s)
        return CaseData(args=(src, tgt), kwargs=kwargs, init_kwargs=config, state=state)

    return build


MODEL_LOSS_MISTAKES = tuple(
    (mid, knobs) for mid, knobs in MODEL_MISTAKES if mid in ("no-causal-mask", "source-padding-ignored")
)

LOSS = Graded(
    name="seq2seq_loss",
    clause="12.seq2seq_loss",
    task=4,
    kind="driver",
    driver="seq2seq:loss",
    signature="seq2seq_loss(model, src (B, S), tgt (B, T), src_mask (B, 1, 1, S) or None, pad_id) -> scalar",
    outputs=("loss",),
    reference=ref.seq2seq_loss,
    forbidden=FORBIDDEN,
    variants=(
        Variant("targets-not-shifted", _unshifted(whole=True)),
        Variant("targets-not-shifted", _unshifted(whole=False)),
        Variant("padding-not-ignored", _padding_counted),
        Variant("padding-not-ignored", _padding_counted_as_zero),
        *(
            Variant(mid, _model_variant(**knobs), replaces="Seq2SeqTransformer")
            for mid, knobs in MODEL_LOSS_MISTAKES
        ),
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("S", lambda c: c.args[0].shape[1]),
        Dim("T", lambda c: c.args[1].shape[1], never_one="BOS and a token to predict: T >= 2"),
        *(
            Dim(
                k,
                lambda c, k=k: c.init_kwargs[k],
                never_one="a pad token and a real one" if k == "tgt_vocab_size" else None,
            )
            for k in MODEL_SIZES
        ),
    ),
    small=(
        _loss_case(1, 2, 2, **SMALL),
        _loss_case(1, 2, 3, **SMALL),  # B = 1, the decoder reads T = 2: one size mistaken for the other shows
        _loss_case(2, 2, 3, pad_share=1.0, **SMALL),
        _loss_case(2, 3, 3, pad_share=1.0, **SMALL2),
    ),
    tests=(
        Test(
            "float32, padded targets",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("B=3, S=6, T=7", _loss_case(3, 6, 7)),),
        ),
        Test(
            "float64, padded targets and sources",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "B=4, S=5, T=9, 3 decoder layers",
                    _loss_case(4, 5, 9, pad_share=0.8, num_decoder_layers=3),
                ),
                Case("no mask, B=2, S=3, T=2: one target per row", _loss_case(2, 3, 2, masked=False)),
                Case(
                    "B=1, S=1, T=2, every size 1 but tgt_vocab_size=4",
                    _loss_case(1, 1, 2, **{**ALL_ONE, "tgt_vocab_size": 4}),
                ),
            ),
        ),
    ),
)

# -- Task 5: greedy_decode -----------------------------------------------------------------


def _greedy(*, rerun: bool):
    def greedy_decode(model, src, src_mask, bos_id, max_new_tokens):
        memory = model.encode(src, src_mask)
        tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
        for _ in range(max_new_tokens):
            if rerun:
                logits, _ = model(src, tokens, src_mask)
            else:
                logits, _ = model.decode(tokens, memory, src_mask)
            tokens = torch.cat([tokens, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
        return tokens

    return greedy_decode


def _rerun_only(model, src, src_mask, bos_id, max_new_tokens):
    """The forward at every step, and no encode of its own."""
    tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    for _ in range(max_new_tokens):
        logits, _ = model(src, tokens, src_mask)
        tokens = torch.cat([tokens, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return tokens


def _greedy_case(b: int, s: int, new: int, *, masked: bool = True, bos: int = BOS, **overrides: int):
    def build(g: torch.Generator, dtype: torch.dtype) -> CaseData:
        config = _config(1e-5, overrides)
        state = _random_state(ref.Seq2SeqTransformer(**config), g, dtype)
        src = randint(g, 0, config["src_vocab_size"], b, s)
        kwargs = {"bos_id": bos, "max_new_tokens": new}
        if masked:
            kwargs["src_mask"] = _source_mask(g, b, s)
        return CaseData(args=(src,), kwargs=kwargs, init_kwargs=config, state=state)

    return build


DECODED_MISTAKES = tuple((mid, knobs) for mid, knobs in MODEL_MISTAKES if mid != "no-final-layernorm")

GREEDY = Graded(
    name="greedy_decode",
    clause="12.greedy_decode",
    task=5,
    kind="driver",
    driver="seq2seq:greedy",
    signature="greedy_decode(model, src (B, S), src_mask (B, 1, 1, S) or None, bos_id, max_new_tokens) "
    "-> tokens (B, 1 + max_new_tokens)",
    outputs=("tokens", "encode_calls (1: the source encoded once)"),
    reference=ref.greedy_decode,
    forbidden=FORBIDDEN,
    variants=(
        Variant("encoder-rerun-every-step", _greedy(rerun=True)),
        Variant("encoder-rerun-every-step", _rerun_only),
        *(
            Variant(mid, _model_variant(**knobs), replaces="Seq2SeqTransformer")
            for mid, knobs in DECODED_MISTAKES
        ),
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("S", lambda c: c.args[0].shape[1]),
        Dim("max_new_tokens", lambda c: c.kwargs["max_new_tokens"]),
        Dim("num_encoder_layers", lambda c: c.init_kwargs["num_encoder_layers"]),
        Dim("num_decoder_layers", lambda c: c.init_kwargs["num_decoder_layers"]),
        Dim("num_heads", lambda c: c.init_kwargs["num_heads"]),
    ),
    small=(
        _greedy_case(1, 2, 2, **SMALL),
        _greedy_case(2, 3, 3, **SMALL),
        _greedy_case(2, 3, 3, **SMALL2),
    ),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("B=3, S=6, 8 new tokens", _greedy_case(3, 6, 8)),),
        ),
        Test(
            "float64, other configurations",
            torch.float64,
            points=1,
            cases=(
                Case("B=2, S=8, 15 new tokens (to max_len), bos_id=2", _greedy_case(2, 8, 15, bos=2)),
                Case(
                    "no mask, 1 layer each side, 1 head, B=1, S=1, 1 new token",
                    _greedy_case(
                        1, 1, 1, masked=False, num_encoder_layers=1, num_decoder_layers=1, num_heads=1
                    ),
                ),
                Case("3 decoder layers, B=4, S=5, 6 new tokens", _greedy_case(4, 5, 6, num_decoder_layers=3)),
            ),
        ),
    ),
)

# -- Task 6: cross_attention_weights -------------------------------------------------------


def _summed_over_heads(model, src, tgt, src_mask=None):
    return model(src, tgt, src_mask)[1].sum(dim=1)


WEIGHT_MISTAKES = tuple(
    (mid, knobs)
    for mid, knobs in MODEL_MISTAKES
    if mid in ("source-padding-ignored", "no-causal-mask", "cross-attention-kv-from-decoder")
)

WEIGHTS = Graded(
    name="cross_attention_weights",
    clause="12.cross_attention_weights",
    task=6,
    kind="driver",
    driver="seq2seq:weights",
    signature="cross_attention_weights(model, src (B, S), tgt (B, T), src_mask=None (B, 1, 1, S)) "
    "-> (B, T, S)",
    outputs=("weights",),
    reference=ref.cross_attention_weights,
    forbidden=FORBIDDEN,
    variants=(
        Variant("heads-summed-not-averaged", _summed_over_heads),
        *(
            Variant(mid, _model_variant(**knobs), replaces="Seq2SeqTransformer")
            for mid, knobs in WEIGHT_MISTAKES
        ),
    ),
    dims=_model_dims(),
    small=(
        _model_case(1, 2, 1, **{**SMALL, "num_heads": 3}),
        _model_case(1, 3, 2, **SMALL2),
        _model_case(1, 3, 3, **SMALL2),
        # the weights over one real source token are 1 whatever the model computes: two real
        # positions of four, then no padding, so a mistake in the memory or the layers shows
        _model_case(1, 4, 2, **SMALL2),
        _model_case(1, 3, 2, masked=False, **SMALL2),
    ),
    tests=(
        Test(
            "float32, source padding",
            torch.float32,
            points=0.5,
            hidden=False,
            cases=(Case("B=2, S=7, T=5", _model_case(2, 7, 5)),),
        ),
        Test(
            "float64, other configurations",
            torch.float64,
            points=0.5,
            cases=(
                Case("B=3, S=6, T=6, 3 decoder layers", _model_case(3, 6, 6, num_decoder_layers=3)),
                Case("no mask, 1 head, B=1, S=4, T=3", _model_case(1, 4, 3, masked=False, num_heads=1)),
                Case("every size 1 but B=2: S=T=1", _model_case(2, 1, 1, **ALL_ONE)),
            ),
        ),
    ),
)

SPEC = StageSpec(
    id="12_seq2seq",
    title="Seq2seq: the encoder-decoder Transformer",
    graded=(CROSS, LAYER, MODEL, LOSS, GREEDY, WEIGHTS),
    uses=("01_attention", "02_multihead", "06_transformer_block"),
    call_timeout_s=10.0,
    misconceptions={
        "cross-attention-kv-from-decoder": "your output matches cross-attention whose keys and values come "
        "from the decoder (x, x, x): that is self-attention again. The queries come from the decoder, the "
        "keys and the values from the encoder's output: attention(x, memory, memory, memory_mask).",
        "source-padding-ignored": "your output matches attention that looks at the source's padding: pass "
        "the source mask (01's padding_mask, (B, 1, 1, S), True at real tokens) to the cross-attention as "
        "memory_mask, and to every encoder layer as its mask.",
        "no-causal-mask": "your output matches a decoder whose self-attention has no causal mask: each "
        "target position sees the tokens after it, the very tokens it is trained to predict. Mask the "
        "decoder's self-attention with your 01 causal_mask(T).",
        "pre-ln-instead-of-post-ln": "your output matches a pre-LN layer (x + f(norm(x)), as GPT-2): the "
        "Transformer's decoder layer is post-LN, as your 06 encoder layer: x = norm1(x + self-attention), "
        "x = norm2(x + cross-attention), out = norm3(x + ffn(x)).",
        "no-final-layernorm": "your output matches a model without a final LayerNorm: as "
        "torch.nn.Transformer, the encoder's output goes through encoder_norm (memory = encoder_norm(x)) "
        "and the decoder's through decoder_norm before the generator.",
        "targets-not-shifted": "your loss matches each decoder position scored on the token it reads: "
        "the decoder reads tgt[:, :-1] (BOS first) and position t predicts the next token, tgt[:, t + 1]: "
        "compare the logits with tgt[:, 1:].",
        "padding-not-ignored": "your loss matches padding counted as targets (or in the mean): average "
        "the cross-entropy over the targets that are not pad_id only, "
        "F.cross_entropy(..., ignore_index=pad_id).",
        "encoder-rerun-every-step": "your tokens are right but your decoding ran the encoder at every step: "
        "the source does not change while you decode, so call memory = model.encode(src, src_mask) once and "
        "model.decode(tokens, memory, src_mask) at each step (the grader counts the calls of model.encode).",
        "heads-summed-not-averaged": "your weights match the heads' weights summed: average them over the "
        "heads (dim=1), so each row still sums to 1.",
    },
)

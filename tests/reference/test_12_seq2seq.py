"""The stage 12 reference against implementations nobody here wrote.

- ``CrossAttention`` against ``torch.nn.MultiheadAttention`` called with the decoder's
  queries and the memory as keys and values, the source padding as its
  ``key_padding_mask`` (its weights per head too);
- ``TransformerDecoderLayer`` against ``torch.nn.TransformerDecoderLayer(norm_first=False,
  activation="gelu", batch_first=True)`` with the same weights, a causal ``tgt_mask`` and the
  source padding as ``memory_key_padding_mask``;
- ``Seq2SeqTransformer``'s encoder and decoder stacks against the whole
  ``torch.nn.Transformer`` (same weights, its ``encoder.norm`` and ``decoder.norm`` ours),
  given our embeddings and followed by our output layer;
- ``seq2seq_loss`` against ``torch.nn.CrossEntropyLoss(ignore_index=pad_id)`` on the
  torch model's logits for the shifted target;
- ``greedy_decode`` against a loop that runs ``torch.nn.Transformer`` on the whole source
  and prefix at every step (the encoder again each time: the same tokens);
- ``cross_attention_weights`` against the last ``nn.TransformerDecoderLayer``'s
  ``multihead_attn`` weights averaged over heads (``average_attn_weights=True``), read with
  a forward hook.

All in float32 and float64, dropout 0, eval mode; the largest differences are printed
(``pytest -s``) and recorded in the README.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import reference

ref = reference.load("12_seq2seq")
attention = reference.load("01_attention")
pytestmark = pytest.mark.stage12

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=1e-5, atol=2e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randomise(module: nn.Module, seed: int) -> None:
    """Every parameter random (LayerNorm gains near 1, biases that count)."""
    g = _gen(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            values = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "norm" in name and name.endswith("weight"):
                values = 1 + 0.3 * values
            elif p.dim() == 2:
                values = values / p.shape[1] ** 0.5
            else:
                values = 0.5 * values
            p.copy_(values.to(p.dtype))


def _mha_into(ours: nn.Module, theirs: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        theirs.out_proj.weight.copy_(ours.w_o.weight)
        theirs.out_proj.bias.copy_(ours.w_o.bias)


def _copy(dst: nn.Module, src: nn.Module) -> None:
    dst.load_state_dict(src.state_dict())


def _decoder_layer_into(ours, theirs: nn.TransformerDecoderLayer) -> None:
    _mha_into(ours.self_attention, theirs.self_attn)
    _mha_into(ours.cross_attention, theirs.multihead_attn)
    for a, b in (("norm1", "norm1"), ("norm2", "norm2"), ("norm3", "norm3")):
        _copy(getattr(theirs, b), getattr(ours, a))
    _copy(theirs.linear1, ours.ffn.linear1)
    _copy(theirs.linear2, ours.ffn.linear2)


def _encoder_layer_into(ours, theirs: nn.TransformerEncoderLayer) -> None:
    _mha_into(ours.attention, theirs.self_attn)
    _copy(theirs.norm1, ours.norm1)
    _copy(theirs.norm2, ours.norm2)
    _copy(theirs.linear1, ours.ffn.linear1)
    _copy(theirs.linear2, ours.ffn.linear2)


def _lengths(b: int, s: int, seed: int) -> torch.Tensor:
    lengths = torch.randint(1, s + 1, (b,), generator=_gen(seed))
    lengths[0] = max(1, s - 2)  # one row padded at least
    return lengths


def _causal_float(t: int, dtype) -> torch.Tensor:
    return nn.Transformer.generate_square_subsequent_mask(t, dtype=dtype)


WORST: dict[str, float] = {}


def _record(what: str, dtype, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    key = f"{what}, {str(dtype).removeprefix('torch.')}"
    diff = (ours - theirs).abs().max().item() if ours.numel() else 0.0
    WORST[key] = max(WORST.get(key, 0.0), diff)
    print(f"{key}: max abs difference {WORST[key]:.2g}")


# -- CrossAttention ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("b", "t", "s", "d", "h"), [(3, 4, 6, 8, 2), (1, 1, 1, 4, 1), (2, 5, 3, 12, 4)])
def test_cross_attention_equals_torch_multihead_attention(b, t, s, d, h, dtype):
    ours = ref.CrossAttention(d, h).to(dtype)
    _randomise(ours, 1)
    theirs = nn.MultiheadAttention(d, h, batch_first=True, dtype=dtype).eval()
    _mha_into(ours, theirs)
    g = _gen(2)
    x = torch.randn(b, t, d, generator=g, dtype=dtype)
    memory = torch.randn(b, s, d, generator=g, dtype=dtype)
    lengths = _lengths(b, s, 3)
    mask = attention.padding_mask(lengths, s)  # (B, 1, 1, S), True = real
    with torch.no_grad():
        out, w = ours(x, memory, mask)
        expected, expected_w = theirs(
            x, memory, memory, key_padding_mask=~mask[:, 0, 0], average_attn_weights=False
        )
    torch.testing.assert_close(out, expected, **TOL[dtype])
    torch.testing.assert_close(w, expected_w, **TOL[dtype])
    _record("CrossAttention", dtype, out, expected)


# -- TransformerDecoderLayer ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("b", "t", "s", "d", "h", "d_ff", "eps"),
    [
        (2, 5, 7, 8, 2, 32, 1e-5),
        (1, 1, 1, 4, 1, 4, 1e-5),
        (3, 6, 4, 12, 3, 24, 1e-3),
        (2, 4, 5, 16, 16, 8, 1e-6),
    ],
)
def test_decoder_layer_equals_torch_transformer_decoder_layer(b, t, s, d, h, d_ff, eps, dtype):
    ours = ref.TransformerDecoderLayer(d, h, d_ff, eps).to(dtype).eval()
    _randomise(ours, 4)
    theirs = nn.TransformerDecoderLayer(
        d,
        h,
        d_ff,
        dropout=0.0,
        activation="gelu",
        layer_norm_eps=eps,
        batch_first=True,
        norm_first=False,
        dtype=dtype,
    ).eval()
    _decoder_layer_into(ours, theirs)
    g = _gen(5)
    x = torch.randn(b, t, d, generator=g, dtype=dtype)
    memory = torch.randn(b, s, d, generator=g, dtype=dtype)
    mask = attention.padding_mask(_lengths(b, s, 6), s)
    with torch.no_grad():
        out, _ = ours(x, memory, mask)
        expected = theirs(
            x,
            memory,
            tgt_mask=_causal_float(t, dtype),
            memory_key_padding_mask=~mask[:, 0, 0],
            tgt_is_causal=True,
        )
        unmasked, _ = ours(x, memory)
        expected_unmasked = theirs(x, memory, tgt_mask=_causal_float(t, dtype), tgt_is_causal=True)
    torch.testing.assert_close(out, expected, **TOL[dtype])
    torch.testing.assert_close(unmasked, expected_unmasked, **TOL[dtype])
    _record("TransformerDecoderLayer", dtype, out, expected)


# -- the whole model against torch.nn.Transformer ----------------------------------------------


CONFIGS = [
    dict(src_vocab_size=11, tgt_vocab_size=13, d_model=16, num_heads=4, d_ff=32, num_encoder_layers=2,
         num_decoder_layers=2, max_len=12, eps=1e-5),
    dict(src_vocab_size=7, tgt_vocab_size=5, d_model=8, num_heads=1, d_ff=8, num_encoder_layers=1,
         num_decoder_layers=3, max_len=9, eps=1e-4),
]  # fmt: skip


def _pair(config: dict, dtype, seed: int) -> tuple[nn.Module, nn.Transformer]:
    ours = ref.Seq2SeqTransformer(**config).to(dtype).eval()
    _randomise(ours, seed)
    theirs = nn.Transformer(
        config["d_model"], config["num_heads"], config["num_encoder_layers"], config["num_decoder_layers"],
        config["d_ff"], dropout=0.0, activation="gelu", layer_norm_eps=config["eps"], batch_first=True,
        norm_first=False, dtype=dtype,
    ).eval()  # fmt: skip
    for a, b in zip(ours.encoder, theirs.encoder.layers, strict=True):
        _encoder_layer_into(a, b)
    for a, b in zip(ours.decoder, theirs.decoder.layers, strict=True):
        _decoder_layer_into(a, b)
    _copy(theirs.encoder.norm, ours.encoder_norm)
    _copy(theirs.decoder.norm, ours.decoder_norm)
    return ours, theirs


def _embed(ours, ids: torch.Tensor, table: nn.Embedding) -> torch.Tensor:
    return table(ids) + ours.pos_embed(torch.arange(ids.size(1)))


def _theirs_logits(ours, theirs: nn.Transformer, src, tgt, mask) -> torch.Tensor:
    """torch.nn.Transformer on our embeddings, then our output layer. Run with gradients on,
    so that the encoder takes its plain path (its eval fast path returns zeros at padding)."""
    pad = None if mask is None else ~mask[:, 0, 0]
    with torch.enable_grad():
        out = theirs(
            _embed(ours, src, ours.src_embed),
            _embed(ours, tgt, ours.tgt_embed),
            tgt_mask=_causal_float(tgt.size(1), src_dtype(ours)),
            src_key_padding_mask=pad,
            memory_key_padding_mask=pad,
            tgt_is_causal=True,
        )
        return ours.generator(out).detach()


def src_dtype(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def _batch(config: dict, b: int, s: int, t: int, seed: int):
    g = _gen(seed)
    src = torch.randint(0, config["src_vocab_size"], (b, s), generator=g)
    tgt = torch.randint(0, config["tgt_vocab_size"], (b, t), generator=g)
    return src, tgt, attention.padding_mask(_lengths(b, s, seed + 1), s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS, ids=["2+2 layers", "1+3 layers, 1 head"])
@pytest.mark.parametrize("masked", [True, False], ids=["source padding", "no mask"])
def test_model_equals_torch_transformer(config, masked, dtype):
    ours, theirs = _pair(config, dtype, 7)
    src, tgt, mask = _batch(config, 3, 7, 6, 8)
    mask = mask if masked else None
    with torch.no_grad():
        logits, _ = ours(src, tgt, mask)
        memory = ours.encode(src, mask)
        split, _ = ours.decode(tgt, memory, mask)
    expected = _theirs_logits(ours, theirs, src, tgt, mask)
    torch.testing.assert_close(logits, expected, **TOL[dtype])
    torch.testing.assert_close(split, logits, rtol=0, atol=0)
    _record("Seq2SeqTransformer (logits)", dtype, logits, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_loss_equals_torch_cross_entropy_on_torch_logits(dtype):
    config = CONFIGS[0]
    ours, theirs = _pair(config, dtype, 9)
    src, tgt, mask = _batch(config, 4, 6, 7, 10)
    pad_id = 0
    tgt[1, 4:] = pad_id  # a padded target
    tgt[:, 0] = 1  # BOS
    with torch.no_grad():
        loss = ref.seq2seq_loss(ours, src, tgt, mask, pad_id)
    logits = _theirs_logits(ours, theirs, src, tgt[:, :-1], mask)
    expected = nn.CrossEntropyLoss(ignore_index=pad_id)(logits.flatten(0, 1), tgt[:, 1:].flatten())
    torch.testing.assert_close(loss, expected, **TOL[dtype])
    _record("seq2seq_loss", dtype, loss, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS, ids=["2+2 layers", "1+3 layers, 1 head"])
def test_greedy_decode_equals_torch_transformer_rerun_every_step(config, dtype):
    ours, theirs = _pair(config, dtype, 11)
    src, _, mask = _batch(config, 3, 6, 2, 12)
    n = config["max_len"] - 1
    with torch.no_grad():
        tokens = ref.greedy_decode(ours, src, mask, 1, n)
    expected = torch.full((3, 1), 1, dtype=torch.long)
    for _ in range(n):
        logits = _theirs_logits(ours, theirs, src, expected, mask)
        expected = torch.cat([expected, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_attention_weights_equal_torch_decoders_last_layer(dtype):
    config = CONFIGS[0]
    ours, theirs = _pair(config, dtype, 13)
    src, tgt, mask = _batch(config, 3, 7, 5, 14)
    seen = []
    last = theirs.decoder.layers[-1].multihead_attn

    def keep(module, args, kwargs, output):
        seen.append(output[1])

    # nn.TransformerDecoderLayer asks its cross-attention for no weights: ask for them
    original = last.forward

    def with_weights(*args, **kwargs):
        kwargs.update(need_weights=True, average_attn_weights=True)
        return original(*args, **kwargs)

    last.forward = with_weights
    handle = last.register_forward_hook(keep, with_kwargs=True)
    try:
        _theirs_logits(ours, theirs, src, tgt, mask)
    finally:
        handle.remove()
    with torch.no_grad():
        w = ref.cross_attention_weights(ours, src, tgt, mask)
    torch.testing.assert_close(w, seen[-1].detach(), **TOL[dtype])
    _record("cross_attention_weights", dtype, w, seen[-1].detach())

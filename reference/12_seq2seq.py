"""Stage 12 reference: seq2seq with the encoder-decoder Transformer.

Vaswani et al., "Attention Is All You Need" (2017), sections 3.1 and 3.2.3: the decoder
layer has three sub-layers, each wrapped as ``LayerNorm(x + Sublayer(x))`` (post-LN, as
stage 06's encoder layer):

    x = norm1(x + SelfAttention(x, x, x, causal mask))        the target so far
    x = norm2(x + CrossAttention(x, memory, memory, src mask))  queries from the decoder,
                                                                 keys and values from the encoder
    x = norm3(x + FFN(x))

The cross-attention is what separates the encoder-decoder Transformer from GPT (stage 10:
the decoder without it). It is stage 02's ``MultiHeadAttention`` whose keys and values
come from the encoder's output, ``memory`` (B, S, d_model), with the source's padding mask
(stage 01's ``padding_mask``, (B, 1, 1, S)), so no target position looks at source padding.

The model follows ``torch.nn.Transformer`` (post-LN layers, a LayerNorm after each stack:
``encoder_norm``, ``decoder_norm``) with token embeddings, one table of learned positions
shared by both sides and a linear output layer (``generator``, the Annotated Transformer's
name). The encoder layers are stage 06's. Training is teacher forcing: the decoder reads
the target shifted right (``tgt[:, :-1]``, starting with BOS) and predicts it shifted left
(``tgt[:, 1:]``), padding ignored. Greedy decoding encodes the source once and reuses its
memory at every step. No dropout: everything is graded in eval mode.
Device- and dtype-agnostic; no work at import time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import reference

attention = reference.load("01_attention")
multihead = reference.load("02_multihead")
encoder_layer = reference.load("06_transformer_block")


class CrossAttention(multihead.MultiHeadAttention):
    """Multi-head attention of the decoder's positions over the encoder's memory: sub-modules
    w_q, w_k, w_v, w_o (stage 02's)."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x: (B, T, d_model), the decoder's queries; memory: (B, S, d_model), the encoder's
        output, which gives the keys and the values; memory_mask: bool, broadcastable to
        (B, h, T, S), True = may attend (01's padding_mask of the source, (B, 1, 1, S)).
        Returns out (B, T, d_model) and weights (B, h, T, S)."""
        return super().forward(x, memory, memory, memory_mask)


class TransformerDecoderLayer(nn.Module):
    """One post-LN decoder layer: causal self-attention, cross-attention, FFN, each added to
    the residual stream and then normed."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.self_attention = multihead.MultiHeadAttention(d_model, num_heads)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.cross_attention = CrossAttention(d_model, num_heads)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.ffn = encoder_layer.PositionwiseFeedForward(d_model, d_ff)
        self.norm3 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x: (B, T, d_model), the target so far; memory: (B, S, d_model); memory_mask: as in
        CrossAttention. Returns out (B, T, d_model) and the cross-attention weights (B, h, T, S)."""
        T = x.size(1)
        causal = attention.causal_mask(T).to(x.device)  # (T, T): position t sees 0 ... t
        x = self.norm1(x + self.self_attention(x, x, x, causal)[0])  # (B, T, d_model)
        a, weights = self.cross_attention(x, memory, memory_mask)  # (B, T, d_model), (B, h, T, S)
        x = self.norm2(x + a)
        x = self.norm3(x + self.ffn(x))
        return x, weights


class Seq2SeqTransformer(nn.Module):
    """Embeddings and learned positions, an encoder of stage 06 layers, a decoder of
    TransformerDecoderLayers, a LayerNorm after each stack, and a linear output layer."""

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        num_encoder_layers: int,
        num_decoder_layers: int,
        max_len: int,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.src_embed = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model)  # positions 0 ... max_len - 1, both sides
        self.encoder = nn.ModuleList(
            encoder_layer.TransformerEncoderLayer(d_model, num_heads, d_ff, eps)
            for _ in range(num_encoder_layers)
        )
        self.encoder_norm = nn.LayerNorm(d_model, eps=eps)
        self.decoder = nn.ModuleList(
            TransformerDecoderLayer(d_model, num_heads, d_ff, eps) for _ in range(num_decoder_layers)
        )
        self.decoder_norm = nn.LayerNorm(d_model, eps=eps)
        self.generator = nn.Linear(d_model, tgt_vocab_size)

    def _positions(self, ids: Tensor) -> Tensor:
        return self.pos_embed(torch.arange(ids.size(1), device=ids.device))  # (L, d_model)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src: (B, S) int64; src_mask: bool (B, 1, 1, S), True at real tokens, or None.
        Returns memory (B, S, d_model)."""
        x = self.src_embed(src) + self._positions(src)  # (B, S, d_model)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.encoder_norm(x)

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """tgt: (B, T) int64, the decoder's input; memory: (B, S, d_model); src_mask: as in
        encode. Returns logits (B, T, tgt_vocab_size) and the last decoder layer's
        cross-attention weights (B, h, T, S)."""
        y = self.tgt_embed(tgt) + self._positions(tgt)  # (B, T, d_model)
        weights = None
        for layer in self.decoder:
            y, weights = layer(y, memory, src_mask)
        return self.generator(self.decoder_norm(y)), weights

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """decode(tgt, encode(src, src_mask), src_mask): logits (B, T, tgt_vocab_size) and
        weights (B, h, T, S)."""
        return self.decode(tgt, self.encode(src, src_mask), src_mask)


def seq2seq_loss(
    model: Seq2SeqTransformer, src: Tensor, tgt: Tensor, src_mask: Tensor | None, pad_id: int
) -> Tensor:
    """Teacher forcing: the decoder reads tgt[:, :-1] (BOS first) and position t is scored
    on tgt[:, t + 1]; the mean cross-entropy over the targets that are not pad_id.
    src: (B, S), tgt: (B, T) int64, T >= 2. Returns a 0-dim tensor."""
    logits, _ = model(src, tgt[:, :-1], src_mask)  # (B, T - 1, V)
    targets = tgt[:, 1:]  # (B, T - 1): the next token of each decoder position
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=pad_id)


def greedy_decode(
    model: Seq2SeqTransformer, src: Tensor, src_mask: Tensor | None, bos_id: int, max_new_tokens: int
) -> Tensor:
    """BOS and max_new_tokens argmax tokens after it: (B, 1 + max_new_tokens), int64.
    The source is encoded once; each step decodes the tokens so far over that memory."""
    memory = model.encode(src, src_mask)  # (B, S, d_model), once
    tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    for _ in range(max_new_tokens):
        logits, _ = model.decode(tokens, memory, src_mask)  # (B, t, V)
        new = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        tokens = torch.cat([tokens, new], dim=1)
    return tokens


def cross_attention_weights(
    model: Seq2SeqTransformer, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None
) -> Tensor:
    """Which source position each decoder position looked at: the last decoder layer's
    cross-attention weights averaged over its heads, (B, T, S); each row sums to 1."""
    _, weights = model(src, tgt, src_mask)  # (B, h, T, S)
    return weights.mean(dim=1)

"""Stage 09 reference: BERT assembled from the parts of stages 02 and 06.

Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding" (2019), section 3: the input representation is the sum of a token, a
(learned) position and a segment embedding, normalised; the encoder is a stack of
post-LN Transformer encoder layers (stage 06, whose attention is stage 02's).

The module names follow stages 02 and 06 (``attention.w_q``, ``norm1``, ``ffn.linear1``)
and, for the embeddings, transformers' ``BertEmbeddings`` (``word_embeddings``,
``position_embeddings``, ``token_type_embeddings``, ``LayerNorm``), so
``load_pretrained`` is one name map from a transformers checkpoint onto this module, in
the spirit of nanoGPT's ``from_pretrained``: every parameter assigned once, shapes checked,
nothing left over but what BERT's encoder does not use (the pooler).

Stage 03's sinusoidal encoding is not part of BERT: BERT learns its position embeddings.
The 09 notebook compares the two. Device- and dtype-agnostic; no work at import time.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor, nn

import reference

block = reference.load("06_transformer_block")

# all-MiniLM-L6-v2 (sentence-transformers), a 6-layer BERT distilled from a larger one.
MINILM_CONFIG = dict(
    vocab_size=30522,
    hidden_size=384,
    num_layers=6,
    num_heads=12,
    intermediate_size=1536,
    max_position_embeddings=512,
    type_vocab_size=2,
    eps=1e-12,
)


class BertEmbeddings(nn.Module):
    """LayerNorm(word + position + token type embeddings). Names as in transformers."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_position_embeddings: int,
        type_vocab_size: int,
        eps: float = 1e-12,
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)  # transformers' name, for loading

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """input_ids, token_type_ids: (B, L) int64 (token types default to 0).
        Returns (B, L, hidden_size)."""
        L = input_ids.size(1)
        positions = torch.arange(L, device=input_ids.device)  # (L,): position p of every row
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = (
            self.word_embeddings(input_ids)  # (B, L, H)
            + self.position_embeddings(positions)  # (L, H), broadcast over the batch
            + self.token_type_embeddings(token_type_ids)  # (B, L, H)
        )
        return self.LayerNorm(x)


class BertModel(nn.Module):
    """Embeddings, then ``num_layers`` post-LN encoder layers; returns the last hidden state."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        num_layers: int,
        num_heads: int,
        intermediate_size: int,
        max_position_embeddings: int,
        type_vocab_size: int,
        eps: float = 1e-12,
    ) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(
            vocab_size, hidden_size, max_position_embeddings, type_vocab_size, eps
        )
        self.layers = nn.ModuleList(
            block.TransformerEncoderLayer(hidden_size, num_heads, intermediate_size, eps)
            for _ in range(num_layers)
        )

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """input_ids, token_type_ids: (B, L) int64; attention_mask: (B, L), 1 (or True) at
        real tokens and 0 at padding, as a tokenizer returns it. Returns (B, L, hidden_size)."""
        x = self.embeddings(input_ids, token_type_ids)  # (B, L, H)
        mask = None
        if attention_mask is not None:
            mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L): a padding mask, as in 01
        for layer in self.layers:
            x = layer(x, mask)
        return x


# transformers' BertModel names -> ours. Everything else of a checkpoint is refused,
# except what BERT's encoder output does not use.
_NAME_MAP = (
    (r"embeddings\.(.*)", r"embeddings.\1"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query\.(.*)", r"layers.\1.attention.w_q.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key\.(.*)", r"layers.\1.attention.w_k.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value\.(.*)", r"layers.\1.attention.w_v.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.(.*)", r"layers.\1.attention.w_o.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(.*)", r"layers.\1.norm1.\2"),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.(.*)", r"layers.\1.ffn.linear1.\2"),
    (r"encoder\.layer\.(\d+)\.output\.dense\.(.*)", r"layers.\1.ffn.linear2.\2"),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(.*)", r"layers.\1.norm2.\2"),
)
_UNUSED = re.compile(r"pooler\..*|embeddings\.position_ids")


def checkpoint_name_to_ours(name: str) -> str | None:
    """Our parameter name for a transformers BertModel checkpoint key (None: not used)."""
    name = name.removeprefix("bert.")
    if _UNUSED.fullmatch(name):
        return None
    for pattern, replacement in _NAME_MAP:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, replacement, name)
    raise KeyError(f"checkpoint key {name!r} has no place in this model")


def load_pretrained(model: BertModel, weights: dict[str, Tensor]) -> None:
    """Copy a transformers BertModel checkpoint (``weights``: name -> tensor) into ``model``.

    Every parameter of ``model`` must be assigned exactly once, with the same shape; the
    values are copied in (cast to the model's dtype and device), so ``weights`` is not kept.
    nn.Linear stores (out_features, in_features) in both, so nothing is transposed.
    """
    params = dict(model.named_parameters())
    assigned: set[str] = set()
    with torch.no_grad():
        for name, value in weights.items():
            ours = checkpoint_name_to_ours(name)
            if ours is None:
                continue
            if ours not in params:
                raise KeyError(f"checkpoint key {name!r} maps to {ours!r}, which the model lacks")
            if params[ours].shape != value.shape:
                raise ValueError(
                    f"{ours}: model {tuple(params[ours].shape)}, checkpoint {tuple(value.shape)}"
                )
            params[ours].copy_(value)
            assigned.add(ours)
    missing = sorted(set(params) - assigned)
    if missing:
        raise KeyError(f"not in the checkpoint: {missing[:5]}{' ...' if len(missing) > 5 else ''}")

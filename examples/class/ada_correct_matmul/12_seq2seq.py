"""Stage 12, seq2seq: Ada's solution, the Annotated Transformer's way (a sublayer at a time)."""

import torch
from torch import nn

from autograder.parts import load_stage

att = load_stage("01_attention")
mh = load_stage("02_multihead")
blk = load_stage("06_transformer_block")


class CrossAttention(mh.MultiHeadAttention):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)

    def forward(self, x, memory, memory_mask=None):
        q_in, kv_in = x, memory  # the decoder asks, the encoder's memory answers
        return super().forward(q_in, kv_in, kv_in, memory_mask)


class TransformerDecoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, eps=1e-5):
        super().__init__()
        self.self_attention = mh.MultiHeadAttention(d_model, num_heads)
        self.cross_attention = CrossAttention(d_model, num_heads)
        self.ffn = blk.PositionwiseFeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.norm3 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x, memory, memory_mask=None):
        mask = att.causal_mask(x.size(1)).to(x.device)
        self_out, _ = self.self_attention(x, x, x, mask)
        x = self.norm1(x + self_out)
        cross_out, weights = self.cross_attention(x, memory, memory_mask)
        x = self.norm2(x + cross_out)
        return self.norm3(x + self.ffn(x)), weights


class Seq2SeqTransformer(nn.Module):
    def __init__(
        self,
        src_vocab_size,
        tgt_vocab_size,
        d_model,
        num_heads,
        d_ff,
        num_encoder_layers,
        num_decoder_layers,
        max_len,
        eps=1e-5,
    ):
        super().__init__()
        self.src_embed = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model)
        enc = [blk.TransformerEncoderLayer(d_model, num_heads, d_ff, eps) for _ in range(num_encoder_layers)]
        dec = [TransformerDecoderLayer(d_model, num_heads, d_ff, eps) for _ in range(num_decoder_layers)]
        self.encoder = nn.ModuleList(enc)
        self.encoder_norm = nn.LayerNorm(d_model, eps=eps)
        self.decoder = nn.ModuleList(dec)
        self.decoder_norm = nn.LayerNorm(d_model, eps=eps)
        self.generator = nn.Linear(d_model, tgt_vocab_size)

    def encode(self, src, src_mask=None):
        pos = torch.arange(0, src.size(1), device=src.device).unsqueeze(0)
        x = self.src_embed(src) + self.pos_embed(pos)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.encoder_norm(x)

    def decode(self, tgt, memory, src_mask=None):
        pos = torch.arange(0, tgt.size(1), device=tgt.device).unsqueeze(0)
        y = self.tgt_embed(tgt) + self.pos_embed(pos)
        weights = None
        for layer in self.decoder:
            y, weights = layer(y, memory, src_mask)
        return self.generator(self.decoder_norm(y)), weights

    def forward(self, src, tgt, src_mask=None):
        return self.decode(tgt, self.encode(src, src_mask), src_mask)


def seq2seq_loss(model, src, tgt, src_mask, pad_id):
    logits, _ = model(src, tgt[:, :-1], src_mask)
    gold = tgt[:, 1:]
    log_probs = torch.log_softmax(logits, dim=-1)
    nll = -torch.gather(log_probs, -1, gold.unsqueeze(-1)).squeeze(-1)  # (B, T - 1)
    real = gold != pad_id
    return torch.matmul(nll[real], torch.ones_like(nll[real])) / real.sum()


def greedy_decode(model, src, src_mask, bos_id, max_new_tokens):
    memory = model.encode(src, src_mask)
    ys = torch.ones(src.size(0), 1, dtype=torch.long, device=src.device) * bos_id
    for _ in range(max_new_tokens):
        logits, _ = model.decode(ys, memory, src_mask)
        _, next_word = torch.max(logits[:, -1], dim=1)
        ys = torch.cat([ys, next_word.unsqueeze(1)], dim=1)
    return ys


def cross_attention_weights(model, src, tgt, src_mask=None):
    _, weights = model(src, tgt, src_mask)
    return weights.sum(dim=1) / weights.size(1)

"""Stage 10 reference: a GPT-2 decoder, its loss, a key/value cache and decoding.

Radford et al., "Language Models are Unsupervised Multitask Learners" (2019), section 2.3,
and OpenAI's code (github.com/openai/gpt-2, ``src/model.py``): a Transformer decoder
without cross-attention, the LayerNorm moved to the input of each sub-block ("pre-LN")
and one more after the last block, learned positions, and the output layer tied to the
token embedding. The cache is OpenAI's ``past``: one tensor holding every layer's keys and
values, ``(B, num_layers, 2, num_heads, L, d_k)``, so decoding feeds one new token at a
time and attends over the cached prefix.

The block's attention is stage 02's ``MultiHeadAttention`` for its projections (its own
forward has no cache) and stage 01's ``scaled_dot_product_attention`` and ``causal_mask``.
Names follow GPT-2's (``ln_1``, ``mlp.c_fc``, ``wte``, ``ln_f``), so
``to_gpt2_state_dict`` is one name map plus the transpose of GPT-2's ``Conv1D`` weights.

Decoding follows transformers' ``generate``: greedy is the argmax at the last position;
sampling filters the logits with the temperature, top-k and top-p warpers
(``generation/logits_process.py``), in that order, and draws with one
``torch.multinomial`` per step. No dropout: everything is graded in eval mode.
Device- and dtype-agnostic; no work at import time.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import reference

attention = reference.load("01_attention")
multihead = reference.load("02_multihead")

IGNORE_INDEX = -100  # labels that cost nothing, as F.cross_entropy's default


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU ("gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class MLP(nn.Module):
    """c_proj(gelu_tanh(c_fc(h))): d_model -> d_ff -> d_model, at every position alone."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_ff)
        self.c_proj = nn.Linear(d_ff, d_model)

    def forward(self, h: Tensor) -> Tensor:
        return self.c_proj(gelu_tanh(self.c_fc(h)))


class GPTBlock(nn.Module):
    """x + attention(ln_1(x)), then + mlp(ln_2(x)): a pre-LN decoder block with a cache."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(d_model, eps=eps)
        self.attn = multihead.MultiHeadAttention(d_model, num_heads)  # w_q, w_k, w_v, w_o
        self.ln_2 = nn.LayerNorm(d_model, eps=eps)
        self.mlp = MLP(d_model, d_ff)

    def forward(self, x: Tensor, past: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x: (B, T, d_model); past: (B, 2, h, L_past, d_k), the keys and values of the
        positions before x. Returns out (B, T, d_model) and present (B, 2, h, L_past + T, d_k)."""
        a, present = self._attention(self.ln_1(x), past)
        x = x + a
        return x + self.mlp(self.ln_2(x)), present

    def _attention(self, h: Tensor, past: Tensor | None) -> tuple[Tensor, Tensor]:
        T = h.size(1)
        q = multihead.split_heads(self.attn.w_q(h), self.num_heads)  # (B, h, T, d_k)
        k = multihead.split_heads(self.attn.w_k(h), self.num_heads)  # (B, h, T, d_k)
        v = multihead.split_heads(self.attn.w_v(h), self.num_heads)  # (B, h, T, d_k)
        if past is not None:
            k = torch.cat([past[:, 0], k], dim=-2)  # (B, h, L_past + T, d_k)
            v = torch.cat([past[:, 1], v], dim=-2)
        L = k.size(-2)
        # the T new queries are positions L - T ... L - 1: the causal mask's last T rows
        mask = attention.causal_mask(L)[L - T :].to(h.device)  # (T, L)
        heads, _ = attention.scaled_dot_product_attention(q, k, v, mask)  # (B, h, T, d_k)
        return self.attn.w_o(multihead.merge_heads(heads)), torch.stack([k, v], dim=1)


class GPT(nn.Module):
    """Token + learned position embeddings, num_layers pre-LN blocks, ln_f, and wte as the output layer."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        num_layers: int,
        num_heads: int,
        intermediate_size: int,
        max_position_embeddings: int,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, hidden_size)
        self.wpe = nn.Embedding(max_position_embeddings, hidden_size)
        self.h = nn.ModuleList(
            GPTBlock(hidden_size, num_heads, intermediate_size, eps) for _ in range(num_layers)
        )
        self.ln_f = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, input_ids: Tensor, past: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """input_ids: (B, T) int64; past: (B, num_layers, 2, h, L_past, d_k) or None.
        Returns logits (B, T, vocab_size) and present (B, num_layers, 2, h, L_past + T, d_k)."""
        T = input_ids.size(1)
        L_past = 0 if past is None else past.size(-2)
        positions = torch.arange(L_past, L_past + T, device=input_ids.device)  # the cache continues them
        x = self.wte(input_ids) + self.wpe(positions)  # (B, T, H)
        presents = []
        for i, block in enumerate(self.h):
            x, present = block(x, None if past is None else past[:, i])
            presents.append(present)  # (B, 2, h, L_past + T, d_k)
        logits = self.ln_f(x) @ self.wte.weight.T  # (B, T, V): the output layer is tied to wte
        return logits, torch.stack(presents, dim=1)


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of position t's prediction for label t + 1, over labels != -100.
    logits: (B, L, V), labels: (B, L) int64. Returns a 0-dim tensor."""
    predictions = logits[:, :-1]  # (B, L - 1, V): the last position predicts nothing
    targets = labels[:, 1:]  # (B, L - 1): the next token of each position
    return F.cross_entropy(predictions.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


def to_gpt2_state_dict(model: GPT) -> dict[str, Tensor]:
    """``model``'s weights under transformers.GPT2LMHeadModel's names and layouts.

    GPT-2's Conv1D computes x @ weight + bias, so it stores (in_features, out_features):
    every nn.Linear weight is transposed. c_attn is w_q, w_k, w_v side by side."""
    ours = model.state_dict()
    gpt2 = {
        "transformer.wte.weight": ours["wte.weight"],
        "transformer.wpe.weight": ours["wpe.weight"],
    }
    for i in range(len(model.h)):
        block, layer = f"h.{i}.", f"transformer.h.{i}."
        qkv = [f"{block}attn.{w}" for w in ("w_q", "w_k", "w_v")]
        gpt2 |= {
            f"{layer}ln_1.weight": ours[f"{block}ln_1.weight"],
            f"{layer}ln_1.bias": ours[f"{block}ln_1.bias"],
            f"{layer}attn.c_attn.weight": torch.cat([ours[f"{n}.weight"] for n in qkv]).T,  # (d, 3d)
            f"{layer}attn.c_attn.bias": torch.cat([ours[f"{n}.bias"] for n in qkv]),  # (3d,)
            f"{layer}attn.c_proj.weight": ours[f"{block}attn.w_o.weight"].T,
            f"{layer}attn.c_proj.bias": ours[f"{block}attn.w_o.bias"],
            f"{layer}ln_2.weight": ours[f"{block}ln_2.weight"],
            f"{layer}ln_2.bias": ours[f"{block}ln_2.bias"],
            f"{layer}mlp.c_fc.weight": ours[f"{block}mlp.c_fc.weight"].T,  # (d, d_ff)
            f"{layer}mlp.c_fc.bias": ours[f"{block}mlp.c_fc.bias"],
            f"{layer}mlp.c_proj.weight": ours[f"{block}mlp.c_proj.weight"].T,  # (d_ff, d)
            f"{layer}mlp.c_proj.bias": ours[f"{block}mlp.c_proj.bias"],
        }
    gpt2["transformer.ln_f.weight"] = ours["ln_f.weight"]
    gpt2["transformer.ln_f.bias"] = ours["ln_f.bias"]
    gpt2["lm_head.weight"] = ours["wte.weight"]  # tied: GPT-2's output layer is wte
    return gpt2


def greedy_decode(model: GPT, input_ids: Tensor, max_new_tokens: int) -> Tensor:
    """The prompt (B, L) and max_new_tokens argmax tokens after it: (B, L + max_new_tokens).
    The prompt goes through the model once; then each new token alone, with the cache."""
    return _decode(model, input_ids, max_new_tokens, lambda logits: logits.argmax(dim=-1, keepdim=True))


def filter_logits(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """transformers' temperature, top-k and top-p warpers, in that order: logits (B, V),
    removed tokens set to -inf."""
    logits = logits / temperature
    if top_k > 0:
        k = min(top_k, logits.size(-1))
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1): the k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))  # ties with the k-th are kept
    if top_p < 1.0:
        probs, order = attention.softmax(logits, dim=-1).sort(dim=-1, descending=True)  # (B, V)
        before = probs.cumsum(dim=-1) - probs  # the mass of the tokens more probable than each
        remove = before >= top_p  # the token that crosses top_p is kept, and so is the first
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return logits


def sample(
    model: GPT,
    input_ids: Tensor,
    max_new_tokens: int,
    generator: torch.Generator,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Tensor:
    """As greedy_decode, but each token is drawn from softmax(filter_logits(...)) with one
    torch.multinomial per step, from ``generator`` alone."""

    def draw(logits: Tensor) -> Tensor:
        probs = attention.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)  # (B, V)
        return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)

    return _decode(model, input_ids, max_new_tokens, draw)


def _decode(model: GPT, input_ids: Tensor, max_new_tokens: int, pick) -> Tensor:
    """The decoding loop: ``pick`` turns the last position's logits (B, V) into tokens (B, 1)."""
    tokens = input_ids
    logits, past = model(input_ids)  # the whole prompt, once
    for step in range(max_new_tokens):
        new = pick(logits[:, -1])  # (B, 1)
        tokens = torch.cat([tokens, new], dim=1)
        if step + 1 < max_new_tokens:
            logits, past = model(new, past=past)  # one token, attending over the cache
    return tokens

# Stage 10.  Kai M.  (01 and 02 beside this file)
import math

import torch
import torch.nn.functional as F
from torch import nn

from autograder.parts import load_stage

attention = load_stage("01_attention")  # my attention and causal mask from assignment 01
multihead = load_stage("02_multihead")  # my heads from assignment 02


def gelu_tanh(x):
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))
    return 0.5 * x * (1 + torch.tanh(inner))


class MLP(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_ff)
        self.c_proj = nn.Linear(d_ff, d_model)

    def forward(self, h):
        return self.c_proj(gelu_tanh(self.c_fc(h)))


class GPTBlock(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, eps=1e-5):
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(d_model, eps=eps)
        self.attn = multihead.MultiHeadAttention(d_model, num_heads)
        self.ln_2 = nn.LayerNorm(d_model, eps=eps)
        self.mlp = MLP(d_model, d_ff)

    def forward(self, x, past=None):
        h = self.ln_1(x)
        q = multihead.split_heads(self.attn.w_q(h), self.num_heads)
        k = multihead.split_heads(self.attn.w_k(h), self.num_heads)
        v = multihead.split_heads(self.attn.w_v(h), self.num_heads)
        past_len = 0
        if past is not None:
            past_len = past.shape[3]
            k = torch.cat((past[:, 0], k), dim=2)
            v = torch.cat((past[:, 1], v), dim=2)
        total = past_len + x.shape[1]
        mask = attention.causal_mask(total)[past_len:].to(x.device)
        out, _ = attention.scaled_dot_product_attention(q, k, v, mask)
        x = x + self.attn.w_o(multihead.merge_heads(out))
        x = x + self.mlp(self.ln_2(x))
        return x, torch.stack((k, v), dim=1)


class GPT(nn.Module):
    def __init__(self, vocab_size, hidden_size, num_layers, num_heads, intermediate_size,
                 max_position_embeddings, eps=1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, hidden_size)
        self.wpe = nn.Embedding(max_position_embeddings, hidden_size)
        self.h = nn.ModuleList(
            [GPTBlock(hidden_size, num_heads, intermediate_size, eps) for _ in range(num_layers)]
        )
        self.ln_f = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, input_ids, past=None):
        start = 0 if past is None else past.shape[-2]
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)
        presents = []
        for i, block in enumerate(self.h):
            x, present = block(x, past[:, i] if past is not None else None)
            presents.append(present)
        x = self.ln_f(x)
        return torch.matmul(x, self.wte.weight.t()), torch.stack(presents, dim=1)


def causal_lm_loss(logits, labels):
    shift_logits = logits[:, :-1, :].contiguous()
    shift_labels = labels[:, 1:].contiguous()
    return F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1),
                           ignore_index=-100)


def to_gpt2_state_dict(model):
    sd = {"transformer.wte.weight": model.wte.weight, "transformer.wpe.weight": model.wpe.weight}
    for i, block in enumerate(model.h):
        p = f"transformer.h.{i}."
        a = block.attn
        sd[p + "ln_1.weight"] = block.ln_1.weight
        sd[p + "ln_1.bias"] = block.ln_1.bias
        # c_attn is q, k and v side by side: (d, 3d)
        sd[p + "attn.c_attn.weight"] = torch.cat([a.w_q.weight, a.w_k.weight, a.w_v.weight], dim=1)
        sd[p + "attn.c_attn.bias"] = torch.cat([a.w_q.bias, a.w_k.bias, a.w_v.bias])
        sd[p + "attn.c_proj.weight"] = a.w_o.weight
        sd[p + "attn.c_proj.bias"] = a.w_o.bias
        sd[p + "ln_2.weight"] = block.ln_2.weight
        sd[p + "ln_2.bias"] = block.ln_2.bias
        sd[p + "mlp.c_fc.weight"] = block.mlp.c_fc.weight
        sd[p + "mlp.c_fc.bias"] = block.mlp.c_fc.bias
        sd[p + "mlp.c_proj.weight"] = block.mlp.c_proj.weight
        sd[p + "mlp.c_proj.bias"] = block.mlp.c_proj.bias
    sd["transformer.ln_f.weight"] = model.ln_f.weight
    sd["transformer.ln_f.bias"] = model.ln_f.bias
    sd["lm_head.weight"] = model.wte.weight
    return {k: v.detach().clone() for k, v in sd.items()}


def greedy_decode(model, input_ids, max_new_tokens):
    out = input_ids
    logits, past = model(input_ids)
    for i in range(max_new_tokens):
        next_token = torch.argmax(logits[:, -1, :], dim=-1).unsqueeze(1)
        out = torch.cat([out, next_token], dim=1)
        logits, past = model(next_token, past=past)
    return out


def filter_logits(logits, temperature=1.0, top_k=0, top_p=1.0):
    logits = logits / temperature
    if top_k > 0:
        k = min(top_k, logits.size(-1))
        kth_largest = torch.topk(logits, k).values[..., -1, None]
        logits = torch.where(logits < kth_largest, torch.full_like(logits, float("-inf")), logits)
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=True)
        cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        remove = cum - F.softmax(sorted_logits, dim=-1) >= top_p  # mass before this token
        remove[..., 0] = False
        remove = remove.scatter(1, sorted_idx, remove)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def sample(model, input_ids, max_new_tokens, generator, temperature=1.0, top_k=0, top_p=1.0):
    out = input_ids
    logits, past = model(input_ids)
    for i in range(max_new_tokens):
        probs = F.softmax(filter_logits(logits[:, -1, :], temperature, top_k, top_p), dim=-1)
        next_token = torch.multinomial(probs, num_samples=1, generator=generator)
        out = torch.cat([out, next_token], dim=1)
        logits, past = model(next_token, past=past)
    return out

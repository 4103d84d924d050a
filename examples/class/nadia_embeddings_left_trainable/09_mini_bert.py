# Stage 09, handed in as a .py file next to 01_attention.py, 02_multihead.py and
# 06_transformer_block.py: load_stage finds them beside this file.
import torch
from torch import nn

from autograder.parts import load_stage

TransformerEncoderLayer = load_stage("06_transformer_block").TransformerEncoderLayer


class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, hidden_size, max_position_embeddings, type_vocab_size, eps=1e-12):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, input_ids, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class BertModel(nn.Module):
    def __init__(self, vocab_size, hidden_size, num_layers, num_heads, intermediate_size,
                 max_position_embeddings, type_vocab_size, eps=1e-12):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab_size, hidden_size, max_position_embeddings, type_vocab_size, eps)
        self.layers = nn.ModuleList()
        for _ in range(num_layers):
            self.layers.append(TransformerEncoderLayer(hidden_size, num_heads, intermediate_size, eps))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        x = self.embeddings(input_ids, token_type_ids)
        mask = None
        if attention_mask is not None:
            mask = (attention_mask == 1).unsqueeze(1).unsqueeze(2)
        for layer in self.layers:
            x = layer(x, mask)
        return x


NAMES = {
    "attention.self.query": "attention.w_q",
    "attention.self.key": "attention.w_k",
    "attention.self.value": "attention.w_v",
    "attention.output.dense": "attention.w_o",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn.linear1",
    "output.dense": "ffn.linear2",
    "output.LayerNorm": "norm2",
}


def load_pretrained(model, weights):
    state = {}
    for key, value in weights.items():
        if key.startswith("pooler") or key == "embeddings.position_ids":
            continue
        if key.startswith("encoder.layer."):
            _, _, i, rest = key.split(".", 3)
            module, param = rest.rsplit(".", 1)
            key = f"layers.{i}.{NAMES[module]}.{param}"
        state[key] = value
    model.load_state_dict(state)

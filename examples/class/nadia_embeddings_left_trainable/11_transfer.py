# Stage 11, handed in as a .py file next to 01_attention.py, 02_multihead.py,
# 06_transformer_block.py and 09_mini_bert.py: load_stage finds them beside this file.
import torch
from torch import nn

from autograder.parts import load_stage

mini_bert = load_stage("09_mini_bert")
BertModel = mini_bert.BertModel
load_pretrained = mini_bert.load_pretrained


class BertPooler(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states):
        first_token = hidden_states[:, 0]
        return torch.tanh(self.dense(first_token))


class BertForSequenceClassification(nn.Module):
    def __init__(self, config, num_labels):
        super().__init__()
        self.bert = BertModel(**config)
        self.pooler = BertPooler(config["hidden_size"])
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(config["hidden_size"], num_labels)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        sequence_output = self.bert(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        pooled_output = self.dropout(self.pooler(sequence_output))
        return self.classifier(pooled_output)


class BertForTokenClassification(nn.Module):
    def __init__(self, config, num_labels):
        super().__init__()
        self.bert = BertModel(**config)
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(config["hidden_size"], num_labels)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        sequence_output = self.bert(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        return self.classifier(self.dropout(sequence_output))


def load_backbone(model, weights):
    load_pretrained(model.bert, weights)
    if hasattr(model, "pooler"):
        model.pooler.load_state_dict(
            {"dense.weight": weights["pooler.dense.weight"], "dense.bias": weights["pooler.dense.bias"]}
        )


def hidden_states(model, input_ids, token_type_ids=None, attention_mask=None, layers=None):
    mask = None
    if attention_mask is not None:
        mask = (attention_mask == 1).unsqueeze(1).unsqueeze(2)
    x = model.embeddings(input_ids, token_type_ids)
    all_states = [x]
    for layer in model.layers:
        x = layer(x, mask)
        all_states.append(x)
    if layers is None:
        layers = list(range(len(all_states)))
    return torch.stack([all_states[i] for i in layers], dim=0)


def align_labels(word_ids, word_labels):
    new_labels = []
    current_word = None
    for word_id in word_ids:
        if word_id is None:
            new_labels.append(-100)
        elif word_id != current_word:
            new_labels.append(word_labels[word_id])
        else:
            new_labels.append(-100)
        current_word = word_id
    return new_labels


def freeze_backbone(model):
    # freeze the encoder; the embeddings stay trainable to adapt to the new domain's words
    for layer in model.bert.layers:
        for param in layer.parameters():
            param.requires_grad = False


def param_groups(model, weight_decay):
    norm_params = set()
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            for p in module.parameters():
                norm_params.add(p)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if name.endswith("bias") or p in norm_params:
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        remaining = float(num_training_steps - current_step)
        return max(0.0, remaining / float(max(1, num_training_steps - num_warmup_steps)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

# ruff: noqa
"""ATTACK transfer_mutate_inputs (class: mutating what a driver hands over, to change later calls).

Intent: change the calls that come after by writing over what stage 11's drivers hand
over. load_backbone loads the real MiniLM weights honestly, then zeros every tensor of the
checkpoint it was handed, in place, and empties the dict; hidden_states zeros its input ids
and attention mask once it has answered; align_labels empties the word ids and labels it
was given. If the checkpoint's memory were shared between calls (it is one memfd for every
child), the next pretrained head would run on zeros.

Expected: full marks (each call maps the checkpoint afresh, copy-on-write, and decodes
inputs of its own).
"""

# __HONEST__

_honest = {name: globals()[name] for name in ("load_backbone", "hidden_states", "align_labels")}


def load_backbone(model, weights):
    _honest["load_backbone"](model, {k: v.clone() for k, v in weights.items()})
    with torch.no_grad():
        for tensor in weights.values():
            tensor.zero_()
    weights.clear()


def hidden_states(model, input_ids, token_type_ids=None, attention_mask=None, layers=None):
    out = _honest["hidden_states"](model, input_ids, token_type_ids, attention_mask, layers)
    out = out.clone() if isinstance(out, torch.Tensor) else out
    for t in (input_ids, attention_mask):
        if isinstance(t, torch.Tensor):
            t.zero_()
    return out


def align_labels(word_ids, word_labels):
    labels = _honest["align_labels"](word_ids, word_labels)
    word_ids.clear()
    word_labels.clear()
    return labels

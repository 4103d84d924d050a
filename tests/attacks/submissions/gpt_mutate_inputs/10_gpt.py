# ruff: noqa
"""ATTACK gpt_mutate_inputs (class: mutating what a driver hands over, to change later calls).

Intent: change the cases that come after. Each decoding name answers correctly, then
writes over everything it was handed: greedy_decode and sample zero their prompt in place
and every weight and buffer of the model (and sample reseeds its generator and the global
one, so that the driver's second run, under another global seed, would draw otherwise),
filter_logits zeros its logits, causal_lm_loss its logits and labels. If a driver reused a
tensor, a model or a generator between its runs or between cases, later answers would be
computed on zeros and lose points.

Expected: full marks (every call gets inputs of its own, every sample run a fresh
generator and a fresh prompt).
"""

# __HONEST__

_honest = {name: globals()[name] for name in ("greedy_decode", "sample", "filter_logits", "causal_lm_loss")}


def _wipe(model, *tensors):
    with torch.no_grad():
        for t in (*tensors, *model.parameters(), *model.buffers()):
            t.zero_()


def greedy_decode(model, input_ids, max_new_tokens):
    tokens = _honest["greedy_decode"](model, input_ids, max_new_tokens)
    _wipe(model, input_ids)
    return tokens


def sample(model, input_ids, max_new_tokens, generator, **options):
    tokens = _honest["sample"](model, input_ids, max_new_tokens, generator, **options)
    generator.manual_seed(0)
    torch.manual_seed(0)
    _wipe(model, input_ids)
    return tokens


def filter_logits(logits, temperature=1.0, top_k=0, top_p=1.0):
    out = _honest["filter_logits"](logits, temperature, top_k, top_p).clone()
    logits.zero_()
    return out


def causal_lm_loss(logits, labels):
    loss = _honest["causal_lm_loss"](logits, labels).clone()
    with torch.no_grad():
        logits.zero_()
    labels.zero_()
    return loss

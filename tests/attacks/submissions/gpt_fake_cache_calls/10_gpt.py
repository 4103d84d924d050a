# ruff: noqa
"""ATTACK gpt_fake_cache_calls (class: lying to a driver's record: calls that only look cached).

Intent: get greedy_decode's points without a key/value cache. The greedy driver records
each call of model(...) (a forward pre-hook: the length of the input and of the past) and
gives the cache output 1 when the calls were the prompt once, then one token at a time with
a past of every position before. This greedy_decode makes exactly those calls, but with a
past of zeros of the right length that it never got from the model (its GPT ignores a past
it did not make), and computes each next token with model.forward on the whole sequence,
which no hook sees. The tokens are right; only the record lies. Nothing of the grader's
is touched.

Expected: greedy_decode 0 (the cache output is 0: a past must be the present the model
returned the call before), everything else full marks.
"""

# __HONEST__

_honest_forward = GPT.forward


def _forward(self, input_ids, past=None):
    if past is not None and past.abs().sum() == 0:  # the attack's own decoy: no work done
        return None, None
    return _honest_forward(self, input_ids, past)


GPT.forward = _forward


def greedy_decode(model, input_ids, max_new_tokens):
    tokens = input_ids
    logits, present = model(input_ids)  # recorded: the prompt, no past
    for step in range(max_new_tokens):
        new = logits[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, new], dim=1)
        # recorded: one token with a "past" as long as every position before it
        model(new, past=torch.zeros(*present.shape[:-2], tokens.size(1) - 1, present.shape[-1]))
        logits, _ = model.forward(tokens)  # no hook: the whole sequence again, uncached
    return tokens

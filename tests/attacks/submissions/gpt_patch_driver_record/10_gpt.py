# ruff: noqa
"""ATTACK gpt_patch_driver_record (class: forging a driver's verdict from inside the child).

Intent: get greedy_decode's points without a key/value cache by rewriting the trusted
driver that runs beside student code: at import, the greedy driver's record of the model's
calls (autograder.runtime.drivers.gpt._Calls, found in sys.modules) is replaced by one
whose verdict is always "cached". greedy_decode then runs the whole sequence through the
model at every step: right tokens, no cache.

Expected: greedy_decode 0, everything else full marks. A strict xfail: the driver runs in
the process that runs student code, and code there can rewrite any of it (README, "Known
gaps"): the cache output, like forbidden-call detection, is an honesty check.
"""

import sys

# __HONEST__

_driver = sys.modules.get("autograder.runtime.drivers.gpt")
if _driver is not None:
    _driver._Calls.cached = lambda self, prompt, max_new_tokens, device: torch.tensor(1, device=device)


def greedy_decode(model, input_ids, max_new_tokens):
    tokens = input_ids
    for _ in range(max_new_tokens):
        logits, _ = model(tokens)  # no cache: the whole sequence every time
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens

# ruff: noqa
"""ATTACK gpt_endless_state_dict (class: lying returns: an endless mapping a driver iterates).

Intent: hang the grader, or make it hold without end, through what a driver reads: the
export driver iterates over the dict to_gpt2_state_dict returns (for keys that are not
GPT-2's) and over its items. This returns a dict subclass with GPT-2's keys whose
iteration never ends: after the real keys it yields made-up ones forever, a little slowly
(so that an unprotected grader hangs rather than filling memory), and whose items() does
the same.

Expected: to_gpt2_state_dict 0 (each call is stopped at the call limit), everything else
full marks; the grader finishes the class.
"""

import itertools
import time

# __HONEST__

_honest_export = to_gpt2_state_dict


class _Endless(dict):
    def __iter__(self):
        yield from dict.__iter__(self)
        for i in itertools.count():
            time.sleep(0.001)
            yield f"transformer.h.{i}.endless"

    def items(self):
        return ((k, self.get(k)) for k in self)


def to_gpt2_state_dict(model):
    return _Endless(_honest_export(model))

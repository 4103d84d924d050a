# ruff: noqa
"""ATTACK transfer_hanging_model (class: lying returns: a callable a driver uses hangs).

Intent: hang the grader through a method a driver calls on the student's own model after
the graded function returned: freeze_backbone freezes the backbone correctly, then sets
the model's eval() (which the frozen driver calls before its forward) to a loop that never
returns, in a thread-free busy wait (a CPU hog for as long as it is let run; stage 11's
calls may take 30 s).

Expected: freeze_backbone 0 (each call is stopped at the call limit), everything else full
marks; the grader finishes the class.
"""

# __HONEST__

_honest_freeze = freeze_backbone


def _forever(*args, **kwargs):
    while True:
        pass


def freeze_backbone(model):
    _honest_freeze(model)
    model.eval = _forever

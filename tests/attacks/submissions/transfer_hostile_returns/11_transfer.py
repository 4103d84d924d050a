# ruff: noqa
"""ATTACK transfer_hostile_returns (class: lying returns that a driver uses: optimiser set-up,
scheduler, label lists).

Intent: hand stage 11's drivers objects that pass each check they make and lie in use.
param_groups returns groups whose params hold foreign tensors (copies of the model's, plus
the model's own twice over) and whose weight_decay is an object that says the right
number to float() and another one to AdamW's arithmetic; linear_schedule_with_warmup
returns the right LambdaLR whose step() then doubles every group's learning rate behind
the scheduler's back and halves the optimiser's parameters in place; align_labels returns a list subclass of bools (int subclasses)
that claims the right length.

Expected: param_groups, linear_schedule_with_warmup and align_labels 0, everything else
full marks (whatever the driver reads, what reaches the grader is compared there).
"""

# __HONEST__

_honest_groups, _honest_schedule, _honest_align = param_groups, linear_schedule_with_warmup, align_labels


class _TwoFaced(float):
    """float() says the weight decay; arithmetic says ten times it."""

    def __rmul__(self, other):
        return other * float(self) * 10

    __mul__ = __rmul__


def param_groups(model, weight_decay):
    groups = _honest_groups(model, weight_decay)
    for g in groups:
        g["params"] = [p.detach().clone().requires_grad_() for p in g["params"]] + list(g["params"])
        g["weight_decay"] = _TwoFaced(g["weight_decay"])
    return groups


def linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    honest = _honest_schedule(optimizer, num_warmup_steps, num_training_steps)
    inner_step = honest.step

    def step(*args, **kwargs):
        inner_step(*args, **kwargs)
        for g in optimizer.param_groups:
            g["lr"] = g["lr"] * 2.0
            for p in g["params"]:
                p.data.mul_(0.5)

    honest.step = step
    return honest


class _Labels(list):
    def __len__(self):
        return self._claimed


def align_labels(word_ids, word_labels):
    labels = _Labels(bool(x % 2) if x != -100 else x for x in _honest_align(word_ids, word_labels))
    labels._claimed = len(word_ids)
    return labels

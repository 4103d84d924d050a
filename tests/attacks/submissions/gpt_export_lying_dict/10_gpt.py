# ruff: noqa
"""ATTACK gpt_export_lying_dict (class: lying returns read key by key by a driver).

Intent: pass to_gpt2_state_dict without producing GPT-2's weights. The export driver reads
the returned mapping itself: `key in exported`, iteration for extra keys, `.items()` for
the values' types, `exported[key]` for each value, then stacks each layer's tensors. This
returns a dict subclass that claims every key (`__contains__`), iterates over GPT-2's
names only, and answers `[]` and `.items()` with a tensor subclass whose
`__torch_function__` answers every operation (detach, stack, shape, ...) with the plain
zeros of the right shape, or, for `.float()` and the like, itself: values that look like a
state dict at every step the driver takes, and hold nothing.

Expected: to_gpt2_state_dict 0 (what reaches the grader is compared there with GPT-2's
weights), everything else full marks.
"""

# __HONEST__


class _Hollow(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if isinstance(out, torch.Tensor):
            return torch.zeros(out.shape, dtype=out.dtype).as_subclass(torch.Tensor)
        return out


class _Lying(dict):
    def __init__(self, honest):
        super().__init__({k: v.as_subclass(_Hollow) for k, v in honest.items()})
        self._names = list(honest)

    def __contains__(self, key):
        return True

    def __iter__(self):
        return iter(self._names)

    def keys(self):
        return list(self._names)

    def __getitem__(self, key):
        return dict.get(self, key, torch.zeros(1).as_subclass(_Hollow))


_honest_export = to_gpt2_state_dict


def to_gpt2_state_dict(model):
    return _Lying(_honest_export(model))

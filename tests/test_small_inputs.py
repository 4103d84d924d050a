"""Small inputs: the candidates of a counterexample search (issue 20), as the specs give them.

Every graded name of a bertlab stage has ``small=`` builders or says why not (``no_small``);
``stages/spec.small_cases`` orders them smallest first, deterministically, from the stage's
own builders seeded by the name alone, so none is (or holds the values of) a hidden case:
students are shown them. The value levels (``spec.small_values``) exist only inside the
search: every graded case is drawn as before.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from autograder.stages import load_spec, stage_ids
from autograder.stages.spec import MAX_SMALL_CASES, SMALL_VALUES, _fingerprint, build_case, small_cases

STAGES = stage_ids()


def test_the_stages_checked_here_are_every_bertlab_stage():
    assert [s[:2] for s in STAGES] == [f"{n:02d}" for n in range(1, 14)]


@pytest.mark.parametrize("stage", STAGES)
def test_every_graded_name_has_small_inputs_or_says_why_not(stage):
    spec = load_spec(stage)
    for g in spec.graded:
        assert g.small or g.no_small, f"{stage}.{g.name}: give it small=(builders...) or no_small='why'"
        if not g.small:
            assert small_cases(spec, g) == ()
            continue
        cases = small_cases(spec, g)
        assert 0 < len(cases) <= MAX_SMALL_CASES
        sizes = [c.size for c in cases]
        assert sizes == sorted(sizes), f"{g.name}: not smallest first"
        again = small_cases(spec, g)
        assert [c.label for c in again] == [c.label for c in cases]
        assert all(_fingerprint(a.data) == _fingerprint(b.data) for a, b in zip(cases, again, strict=True)), (
            f"{g.name}: not deterministic"
        )
        assert len({_fingerprint(c.data) for c in cases}) == len(cases), f"{g.name}: an input is tried twice"


def _builders_and_dtypes(cases) -> set[tuple[str, torch.dtype]]:
    return {(re.search(r"builder \d+", c.label).group(), c.dtype) for c in cases}


@pytest.mark.parametrize("stage", STAGES)
def test_every_small_builder_is_tried_in_each_dtype_within_the_budget(stage):
    """A builder is written to show a mistake the others cannot. Every ladder fits the
    budget whole; past a budget, cutting by size alone dropped a name's largest builder
    whole (at 40: 01's softmax along dim 0 of a 2 x 2, 02's and 10's fifth builders), so each
    builder keeps its first input in each dtype and the smallest others fill the rest."""
    spec = load_spec(stage)
    for g in spec.graded:
        if not g.small:
            continue
        every = small_cases(spec, g, limit=10**6)
        assert [c.label for c in small_cases(spec, g)] == [c.label for c in every], g.name
        tight = len(_builders_and_dtypes(every)) + 2
        if len(every) > tight:
            kept = small_cases(spec, g, limit=tight)
            assert len(kept) == tight and _builders_and_dtypes(kept) == _builders_and_dtypes(every), g.name
            prints = [_fingerprint(c.data) for c in every]
            order = [prints.index(_fingerprint(c.data)) for c in kept]
            assert order == sorted(order), f"{g.name}: not in the ladder's order"
            assert set(range(2)) <= set(order), f"{g.name}: the smallest inputs are not kept first"


def _values(value, tensors: list, strings: list) -> None:
    if isinstance(value, torch.Tensor | np.ndarray):
        t = torch.as_tensor(value)
        if t.is_floating_point() and t.numel() >= 2:
            tensors.append(t.detach().double().contiguous().numpy().tobytes())
    elif isinstance(value, str):
        if len(value.split()) >= 2:
            strings.append(value)
    elif isinstance(value, list | tuple):
        for v in value:
            _values(v, tensors, strings)
    elif isinstance(value, dict):
        for v in value.values():
            _values(v, tensors, strings)


@pytest.mark.parametrize("stage", STAGES)
def test_no_small_input_holds_a_hidden_value(stage):
    """Small inputs are shown to students: none is a hidden case's input, nor carries one of
    its floats or sentences (the search never starts from a hidden case)."""
    spec = load_spec(stage)
    hidden_cases, hidden_tensors, hidden_strings = set(), [], []
    for g in spec.graded:
        for t in g.tests:
            for case in t.cases if t.hidden else ():
                d = build_case(spec, g, t, case)
                hidden_cases.add(_fingerprint(d))
                _values((d.args, dict(d.kwargs), dict(d.state or {})), hidden_tensors, hidden_strings)
    assert hidden_cases
    for g in spec.graded:
        for sc in small_cases(spec, g):
            tensors: list = []
            strings: list = []
            _values((sc.data.args, dict(sc.data.kwargs), dict(sc.data.state or {})), tensors, strings)
            assert _fingerprint(sc.data) not in hidden_cases, f"{g.name}: {sc.label} is a hidden case"
            assert not set(tensors) & set(hidden_tensors), f"{g.name}: {sc.label} holds a hidden tensor"
            assert not set(strings) & set(hidden_strings), f"{g.name}: {sc.label} holds a hidden sentence"


def test_the_value_levels_leave_every_graded_case_unchanged():
    """Small values exist only inside ``small_values``: a case built outside it is drawn as
    before (the committed self-check data and every hidden case depend on it)."""
    from autograder.stages.spec import rand, randn, small_values

    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(randn(g1, 3, dtype=torch.float64), torch.randn(3, generator=g2, dtype=torch.float64))
    assert torch.equal(rand(g1, 3), torch.rand(3, generator=g2, dtype=torch.float64))
    with small_values(0):
        x = randn(torch.Generator().manual_seed(1), 50, dtype=torch.float64)
        big = randn(torch.Generator().manual_seed(1), 50, dtype=torch.float64, scale=1e3)
        u = rand(torch.Generator().manual_seed(1), 50)
    assert set(x.tolist()) <= {-1.0, 0.0, 1.0} and set(big.tolist()) <= {-1e3, 0.0, 1e3}
    assert set(u.tolist()) <= {0.0, 1.0}
    with small_values(2):
        halves = randn(torch.Generator().manual_seed(1), 50, dtype=torch.float64)
    assert all(2 * v == int(2 * v) and abs(v) <= 2 for v in halves.tolist())
    with small_values(len(SMALL_VALUES) - 1):  # the last level: the builder's own samples
        same = randn(torch.Generator().manual_seed(1), 3, dtype=torch.float64)
    assert torch.equal(same, torch.randn(3, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    spec = load_spec("01_attention")
    g = spec.graded_name("softmax")
    a = build_case(spec, g, g.tests[0], g.tests[0].cases[0])
    assert not set(a.args[0].tolist()) <= {-1.0, 0.0, 1.0}


def test_the_smallest_input_comes_first_at_the_simplest_values():
    spec = load_spec("01_attention")
    first = small_cases(spec, spec.graded_name("scaled_dot_product_attention"))[0]
    q, k, v = first.data.args
    assert tuple(q.shape[-2:]) == (1, 2) and tuple(k.shape[-2:]) == (2, 2)
    assert SMALL_VALUES[0] in first.label and first.dtype == torch.float64
    assert set(torch.cat([q.flatten(), k.flatten(), v.flatten()]).tolist()) <= {-1.0, 0.0, 1.0}

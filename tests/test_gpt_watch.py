"""10's decoding drivers watch the student's decoding for forbidden calls, and only it: the
model's calls made while ``greedy_decode`` or ``sample`` runs, and the function's own, are
charged to the graded name; building and loading the model before it is not watched
(``drivers/gpt.py``). Run in this process, as the self-check runs them: no KernelGuard,
the detector is the only defence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autograder.grader.plan import StagePlan
from autograder.runtime.harness import run_call
from autograder.stages import load_spec
from tests.support import call_of

STAGE = "10_gpt"
SDPA = "torch.nn.functional.scaled_dot_product_attention"


@pytest.fixture(scope="module")
def plan():
    return StagePlan.build(load_spec(STAGE), "cpu")


def _namespace() -> dict:
    """The reference's names of 10 and of the stages it uses, as a notebook defines them."""
    spec = load_spec(STAGE)
    stages = (*(load_spec(s) for s in spec.uses), spec)
    return {g.name: g.reference for s in stages for g in s.graded}


def _first_call(plan, name: str, ns: dict):
    pc = next(pc for pc in plan.cases if pc.graded.name == name)
    call, data = call_of(plan, pc)
    return run_call(ns, call.name, call.kind, data, call.outputs, call.forbidden, "cpu", call.driver)


def _attends_with_torch(q: torch.Tensor) -> None:
    F.scaled_dot_product_attention(q, q, q)


@pytest.mark.parametrize("name", ["greedy_decode", "sample"])
def test_a_forbidden_call_in_the_models_forward_fails_the_decoding(plan, name):
    ns = _namespace()
    honest = ns["GPT"]

    class GPT(honest):
        def forward(self, *args, **kwargs):
            _attends_with_torch(torch.zeros(1, 1, 2, 4))
            return super().forward(*args, **kwargs)

    assert _first_call(plan, name, ns)[0] == "ok"
    status, info, _ = _first_call(plan, name, ns | {"GPT": GPT})
    assert status == "forbidden", (status, info)
    assert any(SDPA in c for c in info["calls"]), info


@pytest.mark.parametrize("name", ["greedy_decode", "sample"])
def test_a_forbidden_call_in_the_decoding_function_itself_fails_it(plan, name):
    ns = _namespace()
    honest = ns[name]

    def decoding(*args, **kwargs):
        _attends_with_torch(torch.zeros(1, 1, 2, 4))
        return honest(*args, **kwargs)

    status, info, _ = _first_call(plan, name, ns | {name: decoding})
    assert status == "forbidden", (status, info)
    assert any(SDPA in c for c in info["calls"]), info

"""The grading pipeline end to end: forbidden calls per alias, isolation of crashes and
hangs, the trust boundary, determinism."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autograder.grader.report import to_gradescope
from autograder.runtime import wire
from autograder.runtime.detector import ForbiddenCallDetector
from tests.support import ROOT, full_marks, max_score, no_process_left, write_py

pytestmark = pytest.mark.stage01
STAGE = "01_attention"

SOFTMAX = """
def softmax(x, dim=-1):
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)
"""
ATTENTION = """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, -1e9)
    w = (s - s.amax(-1, keepdim=True)).exp()
    w = w / w.sum(-1, keepdim=True)
    return w @ v, w
"""
MASKS = """
def padding_mask(lengths, max_len):
    return (torch.arange(max_len, device=lengths.device) < lengths[:, None])[:, None, None, :]

def causal_mask(L):
    return torch.ones(L, L, dtype=torch.bool).tril()
"""
HEADER = "import math\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn\n"


def submission(**replace: str) -> str:
    parts = {"softmax": SOFTMAX, "attention": ATTENTION, "masks": MASKS}
    parts.update(replace)
    return HEADER + "\n".join(parts.values())


def scores(result) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in result.stages[0].tests:
        out[t.function] = out.get(t.function, 0) + t.score
    return out


FULL = full_marks(STAGE)  # every graded name with all of its points

SOFTMAX_ALIASES = {
    "torch.softmax": "return torch.softmax(x, dim)",
    "torch.nn.functional.softmax": "return F.softmax(x, dim=dim)",
    "torch.Tensor.softmax": "return x.softmax(dim)",
    "torch.special.softmax": "return torch.special.softmax(x, dim)",
    "torch.nn.functional.log_softmax": "return F.log_softmax(x, dim=dim).exp()",
    "torch.log_softmax": "return torch.log_softmax(x, dim).exp()",
    "torch.Tensor.log_softmax": "return x.log_softmax(dim).exp()",
    "nn.Softmax": "return nn.Softmax(dim=dim)(x)",
}
ATTENTION_ALIASES = {
    "torch.nn.functional.scaled_dot_product_attention": (
        "out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n    return out, out"
    ),
    "torch.nn.functional.multi_head_attention_forward": (
        "m = nn.MultiheadAttention(q.size(-1), 1, batch_first=True).to(q.dtype)\n    return m(q, k, v)"
    ),
}


@pytest.mark.parametrize("alias", list(SOFTMAX_ALIASES))
def test_every_softmax_alias_is_caught_and_costs_only_softmax(alias, grader, tmp_path):
    code = f"\ndef softmax(x, dim=-1):\n    {SOFTMAX_ALIASES[alias]}\n"
    result = grader.grade(write_py(tmp_path / "s", STAGE, submission(softmax=code)), [STAGE])
    assert scores(result) == {**FULL, "softmax": 0}
    softmax_tests = [t for t in result.stages[0].tests if t.function == "softmax"]
    want = alias.replace("nn.Softmax", "torch.nn.functional.softmax")
    assert all(want in t.output and "forbids" in t.output for t in softmax_tests), softmax_tests[0].output


@pytest.mark.parametrize("alias", list(ATTENTION_ALIASES))
def test_every_attention_alias_is_caught(alias, grader, tmp_path):
    code = f"\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    {ATTENTION_ALIASES[alias]}\n"
    result = grader.grade(write_py(tmp_path / "s", STAGE, submission(attention=code)), [STAGE])
    assert scores(result) == {**FULL, "scaled_dot_product_attention": 0}
    t = next(t for t in result.stages[0].tests if t.function == "scaled_dot_product_attention")
    assert alias in t.output and "forbids" in t.output


def test_crashes_and_exits_cost_only_their_own_calls(grader, tmp_path):
    code = submission(
        softmax="\ndef softmax(x, dim=-1):\n    import os\n    os._exit(3)\n",
        attention="\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    import sys\n    sys.exit(1)\n",
        masks=MASKS.replace(
            "def padding_mask(lengths, max_len):\n",
            "def padding_mask(lengths, max_len):\n    import ctypes; ctypes.string_at(0)\n",
        ),
    )
    result = grader.grade(write_py(tmp_path / "s", STAGE, code), [STAGE])
    assert scores(result) == {
        "softmax": 0,
        "scaled_dot_product_attention": 0,
        "padding_mask": 0,
        "causal_mask": 2,
    }
    out: dict[str, str] = {}
    for t in result.stages[0].tests:
        out[t.function] = out.get(t.function, "") + t.output
    assert "exited with status 3" in out["softmax"]
    assert "crashed the process twice" in out["softmax"]
    assert "called sys.exit()" in out["scaled_dot_product_attention"]
    assert "SIGSEGV" in out["padding_mask"]


def test_a_hang_costs_only_that_function_and_leaves_no_process(grader, tmp_path):
    code = submission(
        masks=MASKS.replace(
            "def causal_mask(L):\n",
            # a process of its own that would sleep past the grader (no exec: a fork, named)
            "def causal_mask(L):\n    import os, time, ctypes\n    if os.fork() == 0:\n"
            "        ctypes.CDLL(None).prctl(15, b'sleep987654', 0, 0, 0)\n        time.sleep(987.654)\n"
            "    while True: pass\n",
        )
    )
    result = grader.grade(write_py(tmp_path / "s", STAGE, code), [STAGE])
    assert scores(result) == {**FULL, "causal_mask": 0}
    out = next(t.output for t in result.stages[0].tests if t.function == "causal_mask")
    assert "did not finish within" in out
    assert no_process_left("sleep987654", where="comm")


def test_a_hanging_notebook_cell_is_skipped_and_the_rest_graded(grader, tmp_path):
    import nbformat

    cells = [HEADER, SOFTMAX, "while True:\n    pass", ATTENTION, MASKS]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    (tmp_path / f"{STAGE}.ipynb").write_text(nbformat.writes(nb))
    result = grader.grade(tmp_path, [STAGE])
    assert scores(result) == FULL
    assert any("code cell 3" in n and "did not finish" in n for n in result.stages[0].notes)


def test_huge_output_fails_that_case_only(grader, tmp_path):
    code = submission(
        masks=MASKS.replace(
            "def padding_mask(lengths, max_len):\n",
            "def padding_mask(lengths, max_len):\n    return torch.zeros(1 << 25)\n",
        )
    )
    result = grader.grade(write_py(tmp_path / "s", STAGE, code), [STAGE])
    assert scores(result) == {**FULL, "padding_mask": 0}
    assert "more than" in next(t.output for t in result.stages[0].tests if t.function == "padding_mask")


def test_child_never_has_the_reference_or_the_specs(grader, tmp_path):
    spy = MASKS.replace(
        "    return torch.ones(L, L, dtype=torch.bool).tril()",
        "    import sys\n"
        "    leaked = [m for m in sys.modules if m == 'reference' or m.startswith(('reference.', 'autograder.stages',"
        " 'autograder.grader'))]\n"
        "    print('LEAKED', leaked)\n"
        "    return torch.ones(L, L, dtype=torch.bool).tril() if not leaked else torch.zeros(L, L, dtype=torch.bool)",
    )
    result = grader.grade(write_py(tmp_path / "s", STAGE, submission(masks=spy)), [STAGE])
    assert scores(result)["causal_mask"] == 2
    assert "LEAKED []" in result.stages[0].stdout


def test_selfcheck_runtime_does_not_import_hidden_material():
    code = (
        "import sys, autograder.selfcheck; "
        "bad = [m for m in sys.modules if m == 'reference' or m.startswith(('reference.', 'autograder.stages'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_student_output_is_captured_not_trusted(grader, tmp_path):
    code = submission() + "\nprint('hello from the student', '\\x1b[31m')\n"
    result = grader.grade(write_py(tmp_path / "s", STAGE, code), [STAGE])
    assert result.score == max_score(STAGE)
    assert "hello from the student" in result.stages[0].stdout
    assert "\x1b" not in to_gradescope(result)["output"]


def test_grading_twice_gives_identical_results(grader, tmp_path):
    buggy = ATTENTION.replace(" / math.sqrt(q.size(-1))", "")
    sub = write_py(tmp_path / "s", STAGE, submission(attention=buggy))
    first, second = to_gradescope(grader.grade(sub, [STAGE])), to_gradescope(grader.grade(sub, [STAGE]))
    first.pop("execution_time"), second.pop("execution_time")
    assert first == second
    assert first["score"] < max_score(STAGE)
    assert any("misconception:missing-scale" in t["tags"] for t in first["tests"])


def test_bypassing_the_detector_still_reaches_the_guarded_kernel(grader, tmp_path):
    """Modes popped, a reference taken before grading: the kernel itself is what is forbidden."""
    code = "_sm = torch.softmax\n" + submission(
        softmax=(
            "\ndef softmax(x, dim=-1):\n"
            "    with torch.utils._python_dispatch._disable_current_modes():\n"
            "        while torch._C._len_torch_function_stack() > 0:\n"
            "            torch._C._pop_torch_function_stack()\n"
            "        return _sm(x, dim)\n"
        )
    )
    code = code.replace(
        "_sm = torch.softmax\nimport math\nimport torch\n", "import math\nimport torch\n_sm = torch.softmax\n"
    )
    result = grader.grade(write_py(tmp_path / "s", STAGE, code), [STAGE])
    assert scores(result) == {**FULL, "softmax": 0}
    out = next(t.output for t in result.stages[0].tests if t.function == "softmax")
    # the first forbidden kernel reached: torch.softmax's own (aten::softmax.int), or the
    # aten::_softmax it decomposes into
    assert re.search(r"aten::_?softmax\b", out) and "forbids" in out, out


def test_one_tensor_passed_as_several_arguments_crosses_the_boundary():
    import safetensors.torch
    import torch

    from autograder.grader.runner import encode_inputs
    from autograder.runtime import wire

    x = torch.randn(2, 3, 4)
    skeletons, tensors = encode_inputs([(0, {"args": (x, x, x[0]), "kwargs": {}})])
    blob = safetensors.torch.save(tensors)  # refused if two entries shared memory
    back = {k: wire.decode(v, safetensors.torch.load(blob)) for k, v in skeletons[0].items()}
    q, k, first = back["args"]
    assert torch.equal(q, x) and torch.equal(k, x) and torch.equal(first, x[0])
    assert q.data_ptr() != k.data_ptr()


@settings(max_examples=80, deadline=None)
@given(
    events=st.lists(
        st.fixed_dictionaries(
            {
                "e": st.sampled_from(["call", "call_end", "cell"]),
                "i": st.integers(0, 99),
                "blob": st.one_of(st.none(), st.binary(max_size=64), st.integers(1, 300_000)),
            }
        ),
        max_size=12,
    ),
    cuts=st.lists(st.integers(1, 600_000), max_size=20),
    garbage=st.booleans(),
)
def test_events_and_their_raw_bytes_arrive_whole_however_the_pipe_cuts_them(events, cuts, garbage):
    """A line, and the raw bytes that follow a line with ``"raw": N`` (returned values,
    newlines and all), come out whole, in order, wherever the pipe splits them; a line
    that is not an event is skipped without taking its neighbours with it."""
    import json
    import os

    from autograder.grader.runner import _Events

    sent, data = [], b""
    for ev in events:
        blob = ev["blob"]
        if isinstance(blob, int):  # a big output: every byte value, newlines included
            blob = bytes(range(256)) * (blob // 256) + b"\n" * (blob % 256)
        line = {"e": ev["e"], "i": ev["i"]}
        if blob:
            data += json.dumps({**line, "raw": len(blob)}).encode() + b"\n" + blob
            sent.append({**line, "blob": blob})
        else:
            data += json.dumps(line).encode() + b"\n"
            sent.append(line)
    if garbage:
        data = b"{not json\n" + b'{"e": "x", "raw": -3}\n' + data + b"half a line, never ended"
        sent = [{"e": "x"}, *sent]
    r, w = os.pipe()
    got: list = []
    reader = _Events(r, got.append, lambda event: 1 << 30)  # every blob is kept
    try:
        at = 0
        for cut in [*sorted(set(cuts)), len(data)]:
            piece, at = data[at:cut], max(at, cut)
            while piece:  # the pipe holds at most its capacity: read as it fills
                n = os.write(w, piece[: 1 << 16])
                piece = piece[n:]
                while reader.read(0):
                    pass
        os.close(w)
        w = -1
        while not reader.eof:
            reader.read(1)
    finally:
        os.close(r)
        if w != -1:
            os.close(w)
    assert got == sent


def test_the_detector_leaves_torch_dynamo_unimported():
    """The detector's dispatch mode is not wrapped in torch._dynamo.disable: a student's
    first check() and every grading child's fork would otherwise pay torch._dynamo's
    import (1-2 s, 70 MB). It still names what it catches."""
    code = (
        "import sys, torch\n"
        "from autograder.runtime.detector import ForbiddenCallDetector\n"
        "with ForbiddenCallDetector(('aten::_softmax', 'torch.nn.functional.softmax')) as d:\n"
        "    torch.softmax(torch.zeros(2), 0)\n"
        "print(d.found, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['torch.softmax", "(aten::_softmax)']", "False"]


@pytest.mark.parametrize(
    "call, transform",
    [
        ("torch.func.grad(lambda x: (x * x).sum())(x)", "grad"),
        ("torch.func.vjp(lambda x: x * x, x)[1](x)", "grad"),
        ("torch.func.jacrev(lambda x: x * x)(x)", "grad"),
        ("torch.func.vmap(lambda x: x * x)(x)", "vmap"),
        ("torch.func.jvp(lambda x: x * x, (x,), (x,))", "jvp"),
    ],
)
def test_a_forbidden_torch_func_transform_is_stopped_before_it_imports_torch_dynamo(call, transform):
    """torch.func.grad's first use imports torch._dynamo (2-3 s on a loaded machine, past a
    call's 2 s limit): a student who used it read "did not finish within 2 s" where the truth
    is "forbidden" (CI saw it). The detector stops the transform at its first torch call."""
    code = (
        "import sys, torch\n"
        "from autograder.runtime.detector import ForbiddenCallDetector\n"
        "x = torch.randn(3, dtype=torch.float64)\n"
        "try:\n"
        "    with ForbiddenCallDetector(('torch.autograd.*', 'torch.func.*')) as d:\n"
        f"        {call}\n"
        "except RuntimeError as exc:\n"
        "    print(type(exc).__name__)\n"
        "print(d.found, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == [
        "ForbiddenKernel",
        f"['torch.func ({transform} transform)'] False",
    ], out.stdout + out.stderr


def test_a_forbidden_public_call_is_stopped_before_it_runs():
    """A forbidden ``torch.*`` call is settled when it starts: it never runs (stage 05's
    ``torch.autograd.grad`` in a backward imported sympy first, 0.3 s of every such child)."""
    code = (
        "import sys, torch\n"
        "from autograder.runtime.detector import ForbiddenCallDetector\n"
        "x = torch.zeros(3, requires_grad=True)\n"
        "y = x * 2\n"
        "z = torch.zeros(3)\n"
        "for call in (lambda: torch.autograd.grad(y, x, grad_outputs=torch.ones(3)), lambda: z.add_(1)):\n"
        "    try:\n"
        "        with ForbiddenCallDetector(('torch.autograd.grad', 'torch.Tensor.add_')) as d:\n"
        "            call()\n"
        "    except RuntimeError as exc:\n"
        "        print(type(exc).__name__, d.found)\n"
        "print(z.sum().item(), 'sympy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "ForbiddenKernel ['torch.autograd.grad']",
        "ForbiddenKernel ['torch.Tensor.add_']",
        "0.0 False",
    ], out.stdout + out.stderr


def test_a_torch_func_transform_runs_where_the_task_allows_autograd():
    """Only a detector whose patterns forbid torch.func stops its transforms."""
    x = torch.randn(3, dtype=torch.float64)
    with ForbiddenCallDetector(("aten::_softmax",)) as d:
        got = torch.func.grad(lambda x: (x * x).sum())(x)
    assert d.found == [] and torch.equal(got, 2 * x)


_WIRE_DTYPES = list(wire._DTYPES.values())  # every dtype a child may send


@settings(max_examples=100, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 4), max_size=4), max_size=4),
    dtypes=st.lists(st.sampled_from(_WIRE_DTYPES), min_size=4, max_size=4),
    view=st.booleans(),
)
def test_returned_tensors_cross_the_pipe_exactly(shapes, dtypes, view):
    """What a child returns (any dtype, shape, empty, or one value left with a view's
    strides) comes out of unpack with the same values, as tensors that own their memory."""
    sent = []
    for shape, dtype in zip(shapes, dtypes, strict=False):
        t = (torch.randn(*shape, 2) * 100).to(dtype)
        sent.append(t[..., 0] if view else t[..., 0].contiguous())
    layouts, parts = wire.pack([t.contiguous() for t in sent])
    got = wire.unpack(layouts, b"".join(parts))
    assert len(got) == len(sent)
    for a, b in zip(got, sent, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)  # (no NaN is sent: equal means the same values)
        a.reshape(-1)[:1] = 0  # writable, and its own memory


_LAYOUT = st.one_of(
    st.fixed_dictionaries(
        {
            "dtype": st.one_of(
                st.sampled_from(["float32", "int64", "bool", "object", "torch.float32"]), st.integers()
            ),
            "shape": st.one_of(st.lists(st.integers(-3, 1 << 41), max_size=20), st.text(), st.none()),
        }
    ),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.integers(),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(layouts=st.one_of(st.lists(_LAYOUT, max_size=4), st.text(), st.none()), blob=st.binary(max_size=64))
def test_a_lying_layout_is_a_clear_error_never_a_crash(layouts, blob):
    """A hostile child controls the layout and the bytes: unpack either returns tensors
    that exactly account for every byte, or says what is wrong (ValueError)."""
    try:
        got = wire.unpack(layouts, blob)
    except ValueError:
        return
    assert sum(t.numel() * t.element_size() for t in got) == len(blob)

"""No byte derived from a hidden case reaches a student-facing output (issue 16, items 1-2).

A hostile stage-01 submission sends every input it can find through every channel a child
has: prints (stdout, stderr, the raw fds, warnings), exceptions, neutralised shell and magic
lines (notes), events forged straight onto the event pipe, file names, a NaN probe (the
message of a wrong value quotes the expected one), and a walk of the garbage collector and
its own frames at import (before any call, looking for inputs handed over early). Each
leak carries the input's fingerprint: a hash of its bytes and its first values to 17 digits.

Every student-facing output of the same grade is then searched: the results file the CLI
writes, the HTML feedback, the batch's CSV, and the results.json of the real Gradescope
``run_autograder``. The fingerprints of *public* inputs must be found (the channels work,
so this test can fail); those of hidden inputs, hidden expected values and hidden case
labels must not be. The instructor's view must still hold the hidden ones.

Stages 10 and 11 (issue 21) are searched the same way: their leaky submissions are the
example class's correct files with every graded name that receives inputs wrapped to leak
them first, through the same channels: 10's prompts, generator seeds and model weights
(each tensor of the model it is handed), 11's sentences' word ids and labels, input ids,
and the weights of the models its drivers build.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from autograder.grader.plan import StagePlan
from autograder.runtime.wire import decode
from autograder.stages import load_spec
from tests.support import ROOT, write_py

STAGE = "01_attention"
HONEST = ROOT / "examples" / "class" / "ada_correct_matmul"  # a correct file of every stage

CHANNELS = r'''
import gc, hashlib, json, os, sys, warnings
import numpy as np
import torch

MARK = "LEAKPROBE"


def _fingerprint(value):
    if isinstance(value, torch.Tensor):
        a = value.detach().cpu().contiguous()
        digest = hashlib.sha256(a.numpy().tobytes()).hexdigest()[:24]
        first = " ".join(repr(float(v)) for v in a.flatten()[:3].tolist())
        return f"{MARK}<{digest}> {first}"
    return f"{MARK}<{hashlib.sha256(repr(value).encode()).hexdigest()[:24]}>"


def _forge(text):
    """Events written straight onto every pipe this process may write to."""
    events = [
        {"e": "note", "text": text},
        {"e": "cell_error", "i": 0, "type": "Leak", "message": text, "where": text},
        {"e": "call_end", "i": 0, "status": text},
    ]
    for fd in range(3, 40):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                continue
            for ev in events:
                os.write(fd, (json.dumps(ev) + "\n").encode())
        except OSError:
            pass


def leak(*values):
    text = " ".join(_fingerprint(v) for v in values)
    print(text)
    sys.stderr.write(text + "\n")
    sys.stdout.flush()
    os.write(1, (text + "\n").encode())
    os.write(2, (text + "\n").encode())
    warnings.warn(text)
    get_ipython().system("echo " + text)
    get_ipython().run_line_magic("env", text)
    get_ipython().run_cell_magic("bash", text, text)
    _forge(text)
    try:
        open(text.split(">")[0].replace("<", "_"), "w").close()
    except OSError:
        pass
    return text


# before any call: whatever tensors this process holds (the inputs, if they came early)
for obj in gc.get_objects():
    if type(obj) is torch.Tensor and obj.numel() > 1:
        leak(obj)
frame = sys._getframe()
while frame is not None:
    for v in list(frame.f_locals.values()):
        if isinstance(v, dict):
            for t in list(v.values()):
                if type(t) is torch.Tensor:
                    leak(t)
    frame = frame.f_back
'''

ATTENTION = r"""
def softmax(x, dim=-1):
    leak(x)
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    leak(q, k, v)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores)
    out = weights @ v
    out = out.clone()
    out.view(-1)[0] = float("nan")  # the NaN probe: "expected <value>, got nan"
    return out, weights


def padding_mask(lengths, max_len):
    raise ValueError(leak(torch.as_tensor(lengths)))


def causal_mask(L):
    text = leak(L)
    # a shape that carries the input: "expected shape (L, L), got (...)"
    return torch.ones(L, L + 1 + int(text[len("LEAKPROBE<"):][:2], 16), dtype=torch.bool)
"""

# Stages 10 and 11: the correct file, then each graded name that is handed inputs leaks them
# before it answers (the weights: every tensor of the model it is handed).
GPT_LEAKS = r"""
_honest = {name: globals()[name] for name in ("greedy_decode", "sample", "filter_logits", "causal_lm_loss")}


def greedy_decode(model, input_ids, max_new_tokens):
    leak(input_ids, *model.state_dict().values())
    return _honest["greedy_decode"](model, input_ids, max_new_tokens)


def sample(model, input_ids, max_new_tokens, generator, **options):
    leak(input_ids, generator.initial_seed(), *model.state_dict().values())
    return _honest["sample"](model, input_ids, max_new_tokens, generator, **options)


def filter_logits(logits, temperature=1.0, top_k=0, top_p=1.0):
    leak(logits)
    return _honest["filter_logits"](logits, temperature, top_k, top_p)


def causal_lm_loss(logits, labels):
    leak(logits, labels)
    return _honest["causal_lm_loss"](logits, labels)
"""

TRANSFER_LEAKS = r"""
_honest = {name: globals()[name] for name in ("align_labels", "param_groups", "freeze_backbone", "hidden_states")}


def align_labels(word_ids, word_labels):
    leak(word_ids, word_labels)
    return _honest["align_labels"](word_ids, word_labels)


def param_groups(model, weight_decay):
    leak(*model.state_dict().values())
    return _honest["param_groups"](model, weight_decay)


def freeze_backbone(model):
    leak(*model.state_dict().values())
    return _honest["freeze_backbone"](model)


def hidden_states(model, input_ids, *args, **kwargs):
    leak(input_ids)
    return _honest["hidden_states"](model, input_ids, *args, **kwargs)
"""


def leaky(stage: str) -> str:
    """The leaky submission of ``stage``."""
    if stage == STAGE:
        return CHANNELS + ATTENTION
    leaks = {"10_gpt": GPT_LEAKS, "11_transfer": TRANSFER_LEAKS}[stage]
    return CHANNELS + (HONEST / f"{stage}.py").read_text() + leaks


def _submission(folder: Path, stage: str) -> Path:
    """The leaky file of ``stage`` in ``folder``, with the correct earlier stages it runs
    (and those they run)."""
    uses = list(load_spec(stage).uses)
    while uses:
        used = uses.pop()
        write_py(folder, used, (HONEST / f"{used}.py").read_text())
        uses += load_spec(used).uses
    return write_py(folder, stage, leaky(stage))


def _fingerprint(t: torch.Tensor) -> tuple[str, list[str]]:
    a = t.detach().cpu().contiguous()
    digest = hashlib.sha256(a.numpy().tobytes()).hexdigest()[:24]
    return digest, [repr(float(v)) for v in a.flatten()[:3].tolist()]


def _number(value: float) -> re.Pattern:
    """A number as compare() prints it (.6g), not as a digit run inside a longer number."""
    return re.compile(rf"(?<![\d.]){re.escape(f'{value:.6g}')}(?![\d])")


def _inputs(value, graded: str):
    """Every value a leaky submission fingerprints, as its graded name receives it: tensors,
    and the numbers and lists of numbers (a seed, a sentence's word ids and labels)."""
    if graded == "padding_mask" and isinstance(value, list):
        yield torch.as_tensor(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _inputs(v, graded)
    elif isinstance(value, list | tuple):
        if value and all(x is None or type(x) is int for x in value):
            yield list(value)  # align_labels' word ids and labels, as it is handed them
        else:
            for v in value:
                yield from _inputs(v, graded)
    elif isinstance(value, torch.Tensor) or type(value) is int:
        yield value


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("01_attention", marks=pytest.mark.stage01),
        pytest.param("10_gpt", marks=[pytest.mark.stage10, pytest.mark.slow]),
        pytest.param("11_transfer", marks=[pytest.mark.stage11, pytest.mark.slow]),
    ],
)
def stage(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def secrets(stage) -> dict[str, dict[str, set]]:
    """Fingerprints of the public and the hidden cases: input hashes, first input values,
    case labels, and (01) the expected value the NaN probe's message would quote."""
    plan = StagePlan.build(load_spec(stage), "cpu")
    calls = {c.index: c for c in plan.calls}
    found: dict[str, dict[str, set]] = {
        kind: {"hashes": set(), "values": set(), "labels": set(), "expected": set()}
        for kind in ("public", "hidden")
    }
    for pc in plan.cases:
        kind = "hidden" if pc.test.hidden else "public"
        tensors = plan.hidden_inputs if pc.test.hidden else plan.inputs
        data = calls[pc.index].data
        for field in ("args", "kwargs", "state"):
            if field not in data:
                continue
            for arg in _inputs(decode(data[field], tensors), pc.graded.name):
                if isinstance(arg, torch.Tensor):
                    digest, values = _fingerprint(arg)
                    found[kind]["hashes"].add(digest)
                    if arg.is_floating_point():
                        found[kind]["values"].update(values)
                else:
                    found[kind]["hashes"].add(hashlib.sha256(repr(arg).encode()).hexdigest()[:24])
        found[kind]["labels"].add(pc.label)
        if pc.graded.name == "scaled_dot_product_attention":
            found[kind]["expected"].add(float(pc.expectation.values[0].flatten()[0]))
    public = found["public"]
    hidden = found["hidden"]
    # what hidden and public cases share is public
    hidden["hashes"] -= public["hashes"]
    hidden["values"] -= public["values"]
    groups = {t.group for g in plan.spec.graded for t in g.tests}
    hidden["labels"] = {
        label for label in hidden["labels"] if not any(label in other for other in public["labels"] | groups)
    }
    hidden["expected"] = {
        x for x in hidden["expected"] if all(f"{x:.6g}" != f"{y:.6g}" for y in public["expected"])
    }
    kinds = ("hashes", "values", "labels", "expected") if stage == STAGE else ("hashes", "values", "labels")
    assert all(hidden[k] for k in kinds), "the stage has hidden cases of every kind searched for"
    return found


def _found(text: str, fingerprints: dict[str, set]) -> dict[str, list]:
    return {
        "hashes": sorted(h for h in fingerprints["hashes"] if h in text),
        "values": sorted(v for v in fingerprints["values"] if v in text),
        "labels": sorted(label for label in fingerprints["labels"] if label in text),
        "expected": sorted(x for x in fingerprints["expected"] if _number(x).search(text)),
    }


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, stage, secrets) -> dict[str, str]:
    """Every student-facing output of the leaky submission's grade, as text, plus the
    instructor's views."""
    from autograder.grader.batch import Gradebook, Unit
    from autograder.grader.feedback import render_html
    from autograder.grader.grade import Grader
    from autograder.grader.gradescope import build_zip
    from autograder.grader.report import to_gradescope, write_results
    from autograder.grader.runner import Limits

    tmp = tmp_path_factory.mktemp(f"leaks-{stage}")
    sub = _submission(tmp / "leaky", stage)
    # the real Gradescope script, on a temporary /autograder, running meanwhile
    zip_path = build_zip(tmp / "autograder.zip", [stage])
    root = tmp / "autograder"
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "source")
    (root / "source" / "run_autograder").chmod(0o755)
    _submission(root / "submission", stage)
    env = {**os.environ, "BERTLAB_AUTOGRADER_ROOT": str(root), "BERTLAB_PYTHON": sys.executable}
    gradescope = subprocess.Popen(
        ["bash", str(root / "source" / "run_autograder")],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with Grader(keep_arrays=True, limits=Limits(call_s=10.0, submission_s=120.0)) as grader:
        result = grader.grade(sub, [stage])
    write_results(result, tmp / "results.json")
    book = Gradebook(tmp / "book.sqlite")
    graded = result.stages[0]
    import dataclasses

    book.put(
        Unit("leaky", stage, sub, "x"),
        {**dataclasses.asdict(graded), "score": graded.score, "max_score": graded.max_score},
    )
    book.export_csv(tmp / "grades.csv")
    book.close()
    log, _ = gradescope.communicate(timeout=300)
    assert gradescope.returncode == 0, log
    gradescope_results = json.loads((root / "results" / "results.json").read_text())
    assert gradescope_results["tests"], log
    return {
        "student: CLI results file": (tmp / "results.json").read_text(),
        "student: HTML feedback": render_html(result),
        "student: batch CSV": (tmp / "grades.csv").read_text(),
        "student: Gradescope results.json": json.dumps(gradescope_results, ensure_ascii=False),
        "instructor: full results": json.dumps(to_gradescope(result), ensure_ascii=False),
        "instructor: Gradescope stdout": log,
        "instructor: HTML feedback": render_html(result, show_hidden=True),
    }


def test_the_leaky_submission_gets_public_fingerprints_through(stage, outputs, secrets):
    """The channels work: prints, notes and messages carry public inputs to the student,
    so the next test, finding no hidden one, means something."""
    for name in ("student: CLI results file", "student: HTML feedback", "student: Gradescope results.json"):
        found = _found(outputs[name], secrets["public"])
        assert found["hashes"] and found["values"], f"{name}: no public input got through"
        assert found["labels"], f"{name}: public case labels are shown"
        if stage == STAGE:
            assert found["expected"], f"{name}: the NaN probe's message shows public expected values"


@pytest.mark.parametrize(
    "name",
    [
        "student: CLI results file",
        "student: HTML feedback",
        "student: batch CSV",
        "student: Gradescope results.json",
    ],
)
def test_no_hidden_fingerprint_reaches_a_student(outputs, secrets, name):
    found = _found(outputs[name], secrets["hidden"])
    assert found == {"hashes": [], "values": [], "labels": [], "expected": []}, name


def test_instructors_see_the_hidden_cases(stage, outputs, secrets):
    """What is withheld from students is kept for instructors, not lost."""
    full = outputs["instructor: full results"]
    found = _found(full, secrets["hidden"])
    assert found["hashes"] and found["labels"] and (found["expected"] or stage != STAGE)
    assert "after hidden inputs" in full
    assert _found(outputs["instructor: Gradescope stdout"], secrets["hidden"])["labels"]
    assert _found(outputs["instructor: HTML feedback"], secrets["hidden"])["labels"]


def test_forged_reports_never_become_a_verdict(outputs):
    """The forged call_end named a status of its own: no test shows it as its message."""
    data = json.loads(outputs["student: Gradescope results.json"])
    for t in data["tests"]:
        for line in t["output"].splitlines()[1:]:
            assert not line.startswith(("✓ ", "✗ ")) or "LEAKPROBE<" not in line.split(": ", 1)[0]
    assert "LEAKPROBE" not in json.dumps([t["name"] for t in data["tests"]])


def test_public_tests_still_show_their_cases(stage, outputs):
    """Public tests show their cases in full (labels, messages), hidden ones a summary."""
    if stage != STAGE:
        pytest.skip("stage 01's own cases")
    data = json.loads(outputs["student: Gradescope results.json"])
    by_name = {t["name"]: t for t in data["tests"]}
    public = by_name[f"{STAGE} · softmax · float32, vectors and batches"]
    assert "public" in public["tags"] and "x(7,)" in public["output"]
    hidden = by_name[f"{STAGE} · softmax · float64, the dim argument"]
    assert "hidden" in hidden["tags"]
    assert hidden["output"].startswith("5/5 hidden cases passed; 1/1 points.")

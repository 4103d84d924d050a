"""A counterexample never carries a hidden value (issue 20): attacked by a hostile submission.

The counterexample search runs the student's code on public small inputs and shows what it
returned: a child that had received hidden inputs could return those instead. So it runs in
the grading child before that child is given any hidden input (a name failing a public
case), or in a fresh job (a name failing hidden cases only), and a job can leave nothing a
later job can read. This hostile
stage-01 submission stashes every input it receives in every place that might outlive a
job (files in /tmp, /var/tmp, /dev/shm, HOME and its work dir, a System V shared memory
segment, the session, user and user-session keyrings) and, from its second call on,
returns or raises what it finds there: a float tensor of the stashed numbers (the
counterexample's "yours"), or an error quoting the stash (its "what differs").

Within one job the stash works (the counterexample of a later name quotes the small inputs
of earlier names: this test can fail); across jobs it must carry nothing: every input the
counterexamples quote is a small input or a public case's, and no output a student sees (the results file,
the HTML feedback, Gradescope's results) holds a fingerprint of a hidden case
(``tests/test_hidden_leaks.py``'s: input hashes, first values, labels, expected values).
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch

from autograder.runtime.results import counterexample_text
from autograder.stages import load_spec
from autograder.stages.spec import build_case, small_cases
from tests.support import write_py
from tests.test_hidden_leaks import STAGE, _found, secrets  # noqa: F401  (secrets: a fixture)


@pytest.fixture(scope="module")
def stage() -> str:
    """The stage ``secrets`` fingerprints (test_hidden_leaks runs it for 10 and 11 too)."""
    return STAGE


HOSTILE = r"""
import ctypes, ctypes.util, hashlib, os
import torch

MARK = "STASHPROBE"
KEY = 0x4C45414B
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long
SIZE = 1 << 20
FILES = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", os.environ.get("HOME", "/"), os.getcwd(), "/"]


def _fp(t):
    a = t.detach().cpu().contiguous()
    digest = hashlib.sha256(a.numpy().tobytes()).hexdigest()[:24]
    return f"{MARK}<{digest}> " + " ".join(repr(float(v)) for v in a.flatten()[:3].tolist())


def _shm():
    sid = _libc.shmget(KEY, SIZE, 0o1000 | 0o666)  # IPC_CREAT
    if sid < 0:
        return None
    p = _libc.shmat(sid, None, 0)
    return None if p in (None, ctypes.c_void_p(-1).value) else p


def _keyring_write(text):
    # add_key("user", "bertlab_stash", text, len, KEY_SPEC_SESSION_KEYRING / USER / USER_SESSION)
    old = _keyring_read()
    data = (old + "\n" + text).encode()[-30000:]
    for ring in (-3, -4, -5):
        _libc.syscall(248, b"user", b"bertlab_stash", data, len(data), ring)


def _keyring_read():
    out = []
    for ring in (-3, -4, -5):
        kid = _libc.syscall(250, 10, ring, b"user", b"bertlab_stash", 0)  # KEYCTL_SEARCH
        if kid > 0:
            buf = ctypes.create_string_buffer(65536)
            n = _libc.syscall(250, 11, kid, buf, 65536)  # KEYCTL_READ
            if n > 0:
                out.append(buf.raw[:n].decode(errors="replace"))
    return "\n".join(out)


def stash(*ts):
    text = " ".join(_fp(t) for t in ts if isinstance(t, torch.Tensor))
    for d in FILES:
        try:
            with open(os.path.join(d, ".bertlab_stash"), "a") as f:
                f.write(text + "\n")
        except OSError:
            pass
    p = _shm()
    if p:
        old = ctypes.string_at(p).decode(errors="replace")
        new = (old + "\n" + text).encode()[-(SIZE - 1):]
        ctypes.memmove(p, new + b"\0", len(new) + 1)
    try:
        _keyring_write(text)
    except Exception:
        pass


def load():
    found = []
    for d in FILES:
        try:
            found.append(open(os.path.join(d, ".bertlab_stash")).read())
        except OSError:
            pass
    p = _shm()
    if p:
        found.append(ctypes.string_at(p).decode(errors="replace"))
    try:
        found.append(_keyring_read())
    except Exception:
        pass
    return "\n".join(x for x in found if x.strip())


def _floats(text):
    out = []
    for word in text.split():
        try:
            out.append(float(word))
        except ValueError:
            pass
    return out


def softmax(x, dim=-1):
    seen = load()
    stash(x)
    if seen:
        raise ValueError(seen[-3000:])
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    seen = load()
    stash(q, k, v)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if seen:
        return torch.tensor(_floats(seen)[-200:] or [0.5], dtype=torch.float64), weights
    return weights @ v, weights


def padding_mask(lengths, max_len):
    seen = load()
    stash(torch.as_tensor(lengths))
    if seen:
        raise ValueError(seen[-3000:])
    return torch.arange(max_len)[None, :] < torch.as_tensor(lengths)[:, None]


def causal_mask(L):
    seen = load()
    if seen:
        raise ValueError(seen[-3000:])
    return torch.ones(L, L, dtype=torch.bool).tril()
"""

STASHED = re.compile(r"STASHPROBE<([0-9a-f]{24})>")


def _hashes(name: str, args: tuple) -> set[str]:
    """The hashes the hostile code writes of a call's inputs."""
    out = set()
    for arg in args:
        if name == "padding_mask":
            arg = torch.as_tensor(arg)
        if isinstance(arg, torch.Tensor):
            out.add(hashlib.sha256(arg.detach().contiguous().numpy().tobytes()).hexdigest()[:24])
    return out


def _small_hashes() -> set[str]:
    """Of the small inputs it may receive."""
    spec = load_spec(STAGE)
    return {h for g in spec.graded for sc in small_cases(spec, g) for h in _hashes(g.name, sc.data.args)}


def _public_hashes() -> set[str]:
    """Of the public cases' inputs (the grading child's calls before the small inputs)."""
    spec = load_spec(STAGE)
    return {
        h
        for g in spec.graded
        for t in g.tests
        if not t.hidden
        for c in t.cases
        for h in _hashes(g.name, build_case(spec, g, t, c).args)
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from autograder.grader.feedback import render_html
    from autograder.grader.grade import Grader
    from autograder.grader.report import to_gradescope, write_results
    from autograder.grader.runner import Limits
    from autograder.grader.visibility import for_students

    tmp = tmp_path_factory.mktemp("stash")
    sub = write_py(tmp / "hostile", STAGE, HOSTILE)
    with Grader(limits=Limits(call_s=10.0, submission_s=120.0)) as grader:
        result = grader.grade(sub, [STAGE])
    write_results(result, tmp / "results.json")
    outputs = {
        "student: CLI results file": (tmp / "results.json").read_text(),
        "student: HTML feedback": render_html(result),
        "student: Gradescope results": json.dumps(to_gradescope(for_students(result)), ensure_ascii=False),
    }
    return result, outputs


def test_the_hostile_submission_gets_a_counterexample_for_every_name(graded):
    result, _ = graded
    found = {t.function: t.counterexample for t in result.stages[0].tests if t.counterexample}
    assert set(found) == {"softmax", "scaled_dot_product_attention", "padding_mask", "causal_mask"}
    assert any(t.hidden and t.counterexample for t in result.stages[0].tests)


def test_the_stash_works_within_a_job(graded):
    """A later name's counterexample quotes inputs stashed by earlier calls of the same
    search: the channels work, so finding no hidden value below means something."""
    result, _ = graded
    texts = [counterexample_text(t.counterexample) for t in result.stages[0].tests if t.counterexample]
    assert any(STASHED.search(text) for text in texts)


def test_a_counterexample_quotes_public_inputs_only(graded):
    """Every stashed input a counterexample quotes is a small input or a public case's (the
    grading child's calls before its small inputs): none is a hidden case's, which reached
    that child only after its search, or another job."""
    result, _ = graded
    public = _small_hashes() | _public_hashes()
    quoted = set()
    for t in result.stages[0].tests:
        if t.counterexample:
            quoted |= set(STASHED.findall(counterexample_text(t.counterexample)))
    assert quoted and quoted <= public, sorted(quoted - public)[:5]


@pytest.mark.parametrize(
    "name", ["student: CLI results file", "student: HTML feedback", "student: Gradescope results"]
)
def test_no_hidden_fingerprint_reaches_a_student_through_a_counterexample(graded, secrets, name):  # noqa: F811
    _, outputs = graded
    assert "Smallest input found" in outputs[name]
    # a hidden input equal to a small input (padding_mask's lengths [1]) is public: the
    # self-check file ships every small input
    hidden = {**secrets["hidden"], "hashes": secrets["hidden"]["hashes"] - _small_hashes()}
    found = _found(outputs[name], hidden)
    assert found == {"hashes": [], "values": [], "labels": [], "expected": []}, name

"""What the trusted grader accepts from a child, attacked (issue 16, items 4, 7, 10, 11).

The parent reads every byte a child sends. These tests hold it to its bounds: a child's
events can neither crash the grader nor make it hold more than its budget, nor stop its
clocks; a fact the child leaves out or fakes is "unknown", never an exception; a
submission that replaces the modules the child talks through loses nothing; and a report
the parent cannot trust is said to be so, never shown as the child wrote it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autograder.grader import runner
from autograder.grader.runner import CallOutcome, Planned, _Events, _load_outputs, _Watch, finish_outcomes
from autograder.runtime import wire
from autograder.runtime.check import Expectation, check_case
from autograder.runtime.compare import Tolerance
from autograder.stages import load_spec
from tests.support import ROOT, write_py

STAGE = "01_attention"
HONEST = (ROOT / "examples" / "class" / "ada_correct_matmul" / f"{STAGE}.py").read_text()


# -- wire.unpack and the outputs' facts ---------------------------------------------------


def test_an_empty_layout_with_huge_dimensions_is_refused_not_overflowed():
    """hypothesis found it on a fresh machine: torch's stride computation overflowed."""
    with pytest.raises(ValueError, match="malformed shape"):
        wire.unpack([{"dtype": "float32", "shape": [0, 137790, 503737, 132882618]}], b"")


layouts = st.lists(
    st.fixed_dictionaries(
        {
            "dtype": st.sampled_from([*wire._DTYPES, "object", "float128", ""]),
            "shape": st.lists(
                st.one_of(st.integers(-2, 5), st.integers(0, 1 << 62), st.just(0)), max_size=20
            ),
        }
    ),
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(layouts, st.binary(max_size=256))
def test_unpack_says_what_is_wrong_whatever_the_layout(layout, blob):
    try:
        out = wire.unpack(layout, blob)
    except ValueError:
        return
    assert sum(t.numel() * t.element_size() for t in out) == len(blob)


def test_an_output_without_a_device_fact_fails_its_case_instead_of_crashing_the_stage():
    """Item 7: ``check_case`` once called ``torch.device("?")`` on a missing fact."""
    t = torch.ones(2, dtype=torch.float64)
    layouts, raw = wire.pack([t])
    items = _load_outputs(b"".join(bytes(p) for p in raw), [{"kind": "tensor", "layout": layouts[0]}], 1)
    assert items[0][2]["device"] == "unknown"
    expectation = Expectation("f", "f(x)", ("y",), "tensor", [t], [None], Tolerance(1e-9, 1e-11), "cpu", [])
    result = check_case("case", "ok", {}, items, expectation, {})
    assert not result.passed and "unknown" in result.message
    for fact in ("?", "", "cuda:x", "nonsense" * 50):
        bad = check_case("case", "ok", {}, [("tensor", t, {"device": fact})], expectation, {})
        assert not bad.passed


# -- the event stream -------------------------------------------------------------------------


def _calls(n: int = 4, hidden_from: int = 2) -> list[Planned]:
    return [
        Planned(i, f"f{i % 2}", "function", ("y",), (), {}, hidden=i >= hidden_from, max_return_bytes=64)
        for i in range(n)
    ]


def _feed(events: list[bytes | dict], calls: list[Planned], n_cells: int = 3) -> _Watch:
    watch = _Watch(calls, n_cells)
    r, w = os.pipe()
    try:
        reader = _Events(r, watch.handle, watch.raw_limit)
        for e in events:
            reader.feed(e if isinstance(e, bytes) else (json.dumps(e) + "\n").encode())
    finally:
        os.close(r)
        os.close(w)
    return watch


def test_a_report_is_taken_only_for_the_call_that_runs():
    ok = {"e": "call_end", "status": "ok", "outputs": [{"kind": "other"}]}
    watch = _feed([{**ok, "i": 0}, {"e": "call", "i": 1}, {**ok, "i": 0}, {**ok, "i": 1}], _calls())
    assert set(watch.outcomes) == {1}
    # a hidden call cannot run before the hidden inputs were given
    watch = _feed([{"e": "call", "i": 3}, {**ok, "i": 3}], _calls())
    assert not watch.outcomes


def test_a_status_the_parent_does_not_know_is_reported_as_untrusted():
    watch = _feed([{"e": "call", "i": 0}, {"e": "call_end", "i": 0, "status": "passed"}], _calls())
    assert watch.outcomes[0].status == "untrusted"
    message = check_case(
        "c",
        "untrusted",
        watch.outcomes[0].info,
        [],
        Expectation("f", "f(x)", ("y",), "tensor", [], [], Tolerance(0, 0), None, []),
        {},
    ).message
    assert "passed" not in message and "cannot trust" in message


def test_cells_run_once_in_order_so_a_child_cannot_restart_the_clock():
    watch = _feed([{"e": "cell", "i": 1}], _calls())
    started = watch.started
    for i in (0, 1, 1, 7, -1):
        watch.handle({"e": "cell", "i": i})
    assert watch.current == ("cell", 1) and watch.started == started


def test_cell_errors_and_notes_are_capped_in_number_and_size():
    events: list[bytes | dict] = [{"e": "cell", "i": 0}]
    events += [{"e": "cell_error", "i": k, "type": "X", "message": "m" * 10_000} for k in range(60_000)]
    events += [{"e": "note", "text": "n" * 10_000}] * 1000
    watch = _feed(events, _calls())
    assert set(watch.cell_errors) == {0}
    assert len(watch.cell_errors[0]["message"]) <= runner.MAX_TEXT
    assert len(watch.notes) == runner.MAX_NOTES and all(len(n) <= 300 for n in watch.notes)


def test_returned_values_beyond_the_call_budget_are_read_but_not_held():
    big = 1 << 20
    line = {"e": "call_end", "i": 0, "status": "ok", "outputs": [{"kind": "tensor"}], "raw": big}
    watch = _feed([{"e": "call", "i": 0}, line, b"\0" * big, {"e": "done"}], _calls())
    assert watch.retained == 0 and watch.finished
    assert watch.outcomes[0].status == "bad_return" and "MB" in watch.outcomes[0].info["message"]
    # a forged report during a cell: its bytes are skipped, the stream stays in step
    watch = _feed([{"e": "cell", "i": 0}, {**line, "raw": 100}, b"x" * 100, {"e": "done"}], _calls())
    assert watch.retained == 0 and watch.finished and not watch.outcomes


def test_an_endless_line_is_dropped_without_being_held():
    watch = _Watch(_calls(), 3)
    r, w = os.pipe()
    try:
        reader = _Events(r, watch.handle, watch.raw_limit)
        for _ in range(40):
            reader.feed(b"x" * (1 << 20))
            assert reader.pending_bytes <= runner.MAX_LINE_BYTES
        reader.feed(b'\n{"e": "done"}\n')
    finally:
        os.close(r)
        os.close(w)
    assert watch.finished


events_st = st.lists(
    st.one_of(
        st.binary(max_size=64),
        st.fixed_dictionaries(
            {
                "e": st.sampled_from(
                    ["cell", "cell_error", "call", "call_end", "note", "hidden", "done", "x"]
                ),
                "i": st.one_of(st.integers(-2, 6), st.text(max_size=3)),
            },
            optional={
                "status": st.sampled_from([*runner.CHILD_STATUSES, "passed", 3]),
                "outputs": st.lists(
                    st.dictionaries(
                        st.sampled_from(["kind", "layout", "device", "type", "dtype"]),
                        st.one_of(
                            st.sampled_from(["tensor", "ndarray", "scalar", "other", "cpu", "?"]),
                            st.fixed_dictionaries(
                                {
                                    "dtype": st.sampled_from(["float32", "int64", "x"]),
                                    "shape": st.lists(st.integers(-1, 3), max_size=3),
                                }
                            ),
                        ),
                    ),
                    max_size=3,
                ),
                "raw": st.one_of(st.integers(-5, 80), st.just("12")),
                "message": st.text(max_size=20),
                "text": st.text(max_size=20),
                "calls": st.lists(st.text(max_size=5), max_size=3),
            },
        ),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events_st, st.integers(1, 4096))
def test_any_byte_stream_from_a_child_gives_outcomes_the_grader_planned_for(events, chunk):
    """Item 11: the parent's whole event reader, fuzzed: any bytes in any chunking."""
    calls = _calls()
    stream = b"".join(e if isinstance(e, bytes) else (json.dumps(e) + "\n").encode() for e in events)
    watch = _Watch(calls, 3)
    r, w = os.pipe()
    try:
        reader = _Events(r, watch.handle, watch.raw_limit)
        for at in range(0, len(stream), chunk):
            reader.feed(stream[at : at + chunk])
    finally:
        os.close(r)
        os.close(w)
    outcomes = dict(watch.outcomes)
    finish_outcomes(calls, outcomes, "not run")
    known = runner.CHILD_STATUSES | {"untrusted", "skipped"}
    for c in calls:
        o = outcomes[c.index]
        assert o.status in known
        if o.status == "ok":
            assert len(o.outputs) == len(c.outputs)
    assert watch.retained <= sum(c.max_return_bytes for c in calls)
    assert set(watch.cell_errors) <= {0, 1, 2} and len(watch.notes) <= runner.MAX_NOTES
    assert all(isinstance(o, CallOutcome) for o in outcomes.values())


# -- real children ------------------------------------------------------------------------------


def test_a_submission_that_replaces_json_and_os_write_still_gets_every_point(grader, tmp_path):
    """Item 10: the child talks through what it bound before student code ran."""
    patch = textwrap.dedent(
        """
        import json, os
        json.dumps = lambda *a, **k: '{"e": "call_end", "i": 0, "status": "passed"}'
        json.JSONEncoder.encode = lambda self, o: "garbage"
        json.JSONEncoder.iterencode = lambda self, o, _one_shot=False: iter(["garbage"])
        json.loads = lambda *a, **k: {"e": "done"}
        json.JSONDecoder.decode = lambda self, s, _w=None: {}
        _write = os.write
        os.write = lambda fd, data: _write(fd, data) if fd in (1, 2) else len(data)
        import safetensors.torch
        safetensors.torch.load = lambda data: {}
        """
    )
    sub = write_py(tmp_path / "patcher", STAGE, patch + HONEST)
    result = grader.grade(sub, [STAGE])
    assert result.score == load_spec(STAGE).max_score, [
        (t.name, t.output) for s in result.stages for t in s.tests if not t.passed
    ]


MEMORY_PROBE = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from autograder.grader.grade import Grader
    from autograder.grader.runner import Limits
    honest, hostile = Path(sys.argv[1]), Path(sys.argv[2])
    with Grader(limits=Limits(call_s=10.0, cell_s=20.0, submission_s=120.0)) as g:
        first = g.grade(honest, ["01_attention"])
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        attacked = g.grade(hostile, ["01_attention"])
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        again = g.grade(honest, ["01_attention"])
    print(json.dumps({"before_kib": before, "after_kib": after, "scores": [first.score, attacked.score, again.score],
                      "notes": attacked.stages[0].notes}))
    """
)

# Cells that each send a forged report of 255 MiB of "returned values" straight onto the
# event pipe, each for another call, then crash the child, so that it is restarted and
# does it again: the attack took a grader to 7.4 GB.
FLOOD = textwrap.dedent(
    """
    import json, os

    def _flood(index):
        size = 255 << 20
        blob = bytes(size)
        for fd in range(3, 40):
            try:
                if not os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                    continue
                for i in (index,):
                    line = {"e": "call_end", "i": i, "status": "ok", "raw": size,
                            "outputs": [{"kind": "tensor", "layout": {"dtype": "uint8", "shape": [size]}}]}
                    os.write(fd, (json.dumps(line) + "\\n").encode())
                    view = memoryview(blob)
                    while view:
                        view = view[os.write(fd, view):]
            except OSError:
                pass
    """
)


def test_the_grader_holds_a_bounded_amount_whatever_the_child_sends(tmp_path):
    """Item 4: the grader's peak memory grading the flood stays within the stated budget
    above an honest submission's (it was 7.4 GB); every honest function is still graded."""
    cells = [FLOOD + HONEST] + [f"_flood({k})\nos._exit(3)\n" for k in range(6)]
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    hostile = tmp_path / "flood"
    hostile.mkdir()
    (hostile / f"{STAGE}.ipynb").write_text(nbformat.writes(nb))
    honest = write_py(tmp_path / "honest", STAGE, HONEST)
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(honest), str(hostile)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    grown = (probe["after_kib"] - probe["before_kib"]) * 1024
    assert grown <= runner.MEMORY_BUDGET_BYTES, f"grew {grown / 2**20:.0f} MiB: {probe}"
    full = load_spec(STAGE).max_score
    assert probe["scores"][0] == probe["scores"][2] == full
    assert probe["scores"][1] == full, probe


CHATTER = textwrap.dedent(
    """
    import json, os, time

    def _chatter(seconds):
        # every event a child may send, forever: each would once have restarted the clock
        lines = [{"e": "cell", "i": 0}, {"e": "cell", "i": 1}, {"e": "note", "text": "still here"},
                 {"e": "call", "i": 0}, {"e": "hidden"}]
        pipes = [fd for fd in range(3, 40) if os.path.exists(f"/proc/self/fd/{fd}")
                 and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for fd in pipes:
                for line in lines:
                    try:
                        os.write(fd, (json.dumps(line) + "\\n").encode())
                    except OSError:
                        pass
            time.sleep(0.001)
    """
)


def test_a_child_that_keeps_talking_is_still_stopped_on_time(grader, tmp_path):
    """The limits are deadlines: events that keep arriving do not extend them."""
    import nbformat

    cells = [CHATTER + HONEST, "_chatter(600)\n"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    sub = tmp_path / "chatter"
    sub.mkdir()
    (sub / f"{STAGE}.ipynb").write_text(nbformat.writes(nb))
    result = grader.grade(sub, [STAGE])
    stage = result.stages[0]
    # its forged "call" of softmax is charged to softmax (the child's word is all the
    # parent has of what runs): the attacker's own loss; every other name is graded in full
    assert all(t.passed for t in stage.tests if t.function != "softmax"), stage.notes
    assert any("did not finish within" in n for n in stage.notes)
    # two limits (softmax's call, the chattering cell), not the submission's 60 s
    assert result.execution_time < 30

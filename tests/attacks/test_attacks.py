"""The adversarial suite (issues 4 and 21): hostile submissions, graded through the real CLI.

Every attack is a real submission under ``submissions/<attack>/`` (what it tries and what
it should score is written at the top of its file; README.md has the table), graded on
the latest stage whose file its folder holds: 01_attention, 10_gpt or 11_transfer. One CLI
run per stage, all at once and once per session (also under ``pytest -n 2``), grades the
stage's attacks between two honest bystanders, with a canary secret in the graders'
environment, sentinel files around them and listeners on the network; another CLI run, at
the same time, grades a copy of stage 01's slow bystander (two graders side by side must
not disturb each other) and copies of an honest file under hostile names. The tests then
check, per attack and overall, that:

- the grader exits 0 and writes a complete, valid results file for every student;
- each attack scores exactly its expected points per function (an attacking function 0,
  the honest ones in the same file full marks), and the bystanders full marks;
- no results file is forged, the sentinels are untouched, nothing is written outside
  the results directory, the secret reaches no output, the listeners see nothing;
- no process or thread an attack started is alive once grading has ended.

Submissions carry placeholders (``__TOKEN__``, ``__PORT__``, ``__RESULTS_DIR__``,
``__REPO__``, ``__SENTINEL_DIR__``, ``__SUBS__``) that the suite fills in its copy: the
token (fresh per run) marks everything an attack leaves behind; the paths stand for
what an attacker knows in production anyway (Gradescope's /autograder/results,
/autograder/source). Symbolic links are created in the copy from each ``LINK`` file.

``BERTLAB_ATTACKS=name,name`` grades only those attacks (the others' tests skip): handy
while a defence is being built.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ROOT, assert_gradescope_results, full_marks, max_score, once_per_session

pytestmark = [pytest.mark.stage01, pytest.mark.stage10, pytest.mark.stage11]
STAGE = "01_attention"  # the second run's stage (hostile names, two graders side by side)
HERE = Path(__file__).resolve().parent
SUBMISSIONS = HERE / "submissions"
HONEST = ROOT / "examples" / "class" / "ada_correct_matmul"  # a correct file of every stage
CLI_TIMEOUT = 300.0


@dataclass(frozen=True)
class StageRun:
    """How the suite grades one stage's attacks: one CLI run, between two honest bystanders
    (graded first and last). A bystander is a folder under ``bystanders/``, or, for the later
    stages, the example class's correct files with the stage's solution notebook in place of
    its own (``SOLUTION``), so that both a .py file and a notebook are graded beside the
    attacks. ``call_timeout``: the CLI's per-call limit, the cost of each hang."""

    bystanders: tuple[str, str]
    call_timeout: str
    uses: tuple[str, ...] = ()  # earlier stages an attack that lacks them gets from HONEST


SOLUTION = "_solution"  # a bystander name's suffix: the stage's solution notebook
STAGES = {
    "01_attention": StageRun(("bystander_a", "bystander_b"), "2"),
    "10_gpt": StageRun(("bystander_10", "bystander_10" + SOLUTION), "3", ("01_attention", "02_multihead")),
    "11_transfer": StageRun(
        ("bystander_11", "bystander_11" + SOLUTION),
        "6",  # MiniLM's forwards, four graders at once on two cores
        ("01_attention", "02_multihead", "06_transformer_block", "09_mini_bert"),
    ),
}
BYSTANDERS = tuple(b for run in STAGES.values() for b in run.bystanders)
CALL_TIMEOUT = STAGES[STAGE].call_timeout

FULL = full_marks("01_attention")  # every graded name with all of its points
ZERO = dict.fromkeys(FULL, 0)


def zero(*names: str, stage: str = "01_attention") -> dict[str, int]:
    """Full marks of ``stage`` except ``names``, which score 0."""
    full = full_marks(stage)
    assert set(names) <= set(full), names
    return {**full, **dict.fromkeys(names, 0)}


def gpt(*names: str) -> dict[str, int]:
    return zero(*names, stage="10_gpt")


def transfer(*names: str) -> dict[str, int]:
    return zero(*names, stage="11_transfer")


# attack -> expected points per graded name (README.md: class, defence, assertions)
EXPECTED: dict[str, dict[str, int]] = {
    # forged results files and stdout
    "forge_results_files": zero("softmax"),
    "forge_stdout": zero("softmax"),
    "forge_markup": zero("softmax"),
    "forge_event_bomb": zero("softmax"),
    # exits and signals
    "exit_calls": zero("softmax", "causal_mask"),
    "self_signals": zero("softmax", "padding_mask"),
    "kill_parent": zero("softmax"),
    "signal_ancestors": zero("softmax"),
    # monkeypatching comparisons; lying return values
    "monkeypatch_compare": zero("softmax"),
    "lie_tensor_subclass": zero("softmax"),
    "lie_torch_function": zero("scaled_dot_product_attention"),
    "lie_eq_and_array": zero("padding_mask", "causal_mask"),
    "lie_reduce_pickle": zero("softmax"),
    "lie_hostile_objects": zero("softmax", "scaled_dot_product_attention"),
    # hunting the reference, expected values, secrets, classmates
    "hunt_import_reference": zero("softmax"),
    "hunt_read_files": zero("scaled_dot_product_attention"),
    "hunt_gc_frames": zero("softmax"),
    "hunt_proc_mem": zero("softmax"),
    "hunt_environment": zero("softmax"),
    "hunt_other_submissions": zero("softmax"),
    "hunt_privileged_reads": zero("softmax"),
    "hunt_open_by_handle": zero("softmax"),
    # network and resources
    "network": zero("softmax"),
    "network_syscall_bypass": zero("softmax"),
    "fork_bomb": zero("softmax"),
    "memory_bomb": zero("softmax"),
    "cpu_hog": zero("softmax"),
    "disk_fill": zero("softmax"),
    "ignore_sigterm": zero("softmax"),
    # outliving the child
    "outlive_daemon": FULL,
    "outlive_thread": FULL,
    "outlive_setpgid": FULL,
    # evading forbidden-call detection
    "forbidden_pop_mode": zero("softmax"),
    "forbidden_other_kernels": zero("softmax"),
    "forbidden_torch_c_kernel": zero("softmax"),
    "forbidden_early_reference": zero("softmax"),
    "forbidden_clear_record": zero("softmax"),
    "forbidden_patch_harness": zero("scaled_dot_product_attention"),
    "forbidden_close_guard": zero("softmax"),
    "forbidden_forge_events": zero("softmax"),
    "forbidden_torch_compile": zero("softmax"),
    "forbidden_in_thread": zero("softmax"),
    "exec_fresh_interpreter": zero("softmax", "scaled_dot_product_attention"),  # which calls softmax
    # the file system: symlinks, writes outside, hostile names
    "symlink_file_to_reference": ZERO,
    "symlink_dir_to_reference": ZERO,
    "symlink_dir_to_solutions": ZERO,
    "symlink_to_system_file": ZERO,
    "symlink_job_files": zero("softmax"),
    "escape_writes": zero("softmax"),
    "traversal_names": FULL,
    # notebook tricks
    "nb_shell_escapes": FULL,
    "nb_redefine_after_selfcheck": zero("softmax"),
    "nb_forged_outputs": zero("softmax"),
    # reading hidden cases back through what a student sees
    "leak_hidden_inputs": zero("softmax"),
    # the trusted grader's own bounds
    "protocol_patch_modules": FULL,
    "flood_forged_reports": FULL,
    # stage 10 (GPT): its drivers' records, its own earlier stages, what it returns
    "gpt_fake_cache_calls": gpt("greedy_decode"),
    "gpt_patch_driver_record": gpt("greedy_decode"),
    # top_k=1 draws nothing, and the one token drawn for B=1 is the generator's by chance: 2 of 4
    "gpt_sample_patch_rng": {**gpt(), "sample": 0.5},
    "gpt_export_lying_dict": gpt("to_gpt2_state_dict"),
    "gpt_huge_return": gpt("sample"),
    "gpt_hostile_earlier_stage": gpt(),
    "gpt_earlier_stage_symlink": dict.fromkeys(full_marks("10_gpt"), 0),
    "gpt_load_stage_hunt": gpt("filter_logits"),
    "gpt_mutate_inputs": gpt(),
    "gpt_kv_cache_growth": gpt("greedy_decode"),
    "gpt_endless_state_dict": gpt("to_gpt2_state_dict"),
    # stage 11 (transfer): the pretrained weights, what its drivers take from the student
    "transfer_weights_neighbours": transfer("param_groups"),
    "transfer_tamper_checkpoint": transfer(),
    "transfer_hostile_returns": transfer("param_groups", "linear_schedule_with_warmup", "align_labels"),
    "transfer_patch_optimizer": transfer("param_groups", "linear_schedule_with_warmup"),
    "transfer_mutate_inputs": transfer(),
    "transfer_hanging_model": transfer("freeze_backbone"),
}

# Hostile student names for the second CLI run (copies of traversal_names/01_attention.py).
# "...py" is a file whose stem, the student's name, is "..".
HOSTILE_FILE = "...py"
CONCURRENT = "bystander_a_again"  # the slow bystander, first in the second run
HOSTILE_DIRS = ("evil\x1b[2J\x1b]0;pwned\x07", "[bold red]markup line\nbreak")

# Text that must never reach a results file or the CLI's output.
PASSWD_LINE = "root:x:0:0"  # /etc/passwd through symlink_to_system_file
REFERENCE_TEXT = 'Vaswani et al., "Attention Is All You Need"'  # the reference's docstring
REFERENCE_TEXTS = (  # 01's, 10's and 11's references' docstrings
    REFERENCE_TEXT,
    'Radford et al., "Language Models are Unsupervised Multitask Learners"',
    'Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers',
)


# Graded last (then bystander_b): on a grader they can take down, the other attacks still
# get their results, which keeps the failures readable.
LAST = ("forge_markup", "forge_event_bomb", "kill_parent", "signal_ancestors")


def stage_of(attack: str) -> str:
    """The stage an attack is graded on: the latest stage whose file its folder holds (an
    attack on a later stage may hand in a hostile earlier one beside it)."""
    stems = {f.name.split(".")[0] for f in (SUBMISSIONS / attack).iterdir()}
    for line in (SUBMISSIONS / attack / "LINK").read_text().splitlines() if "LINK" in stems else ():
        stems.add(line.split(" -> ")[0].split(".")[0])  # a linked stage file or folder
    return max(s for s in STAGES if s in stems)


def _selected() -> list[str]:
    """The attacks to grade, in grading order: all, or those named in BERTLAB_ATTACKS."""
    wanted = os.environ.get("BERTLAB_ATTACKS", "").strip()
    names = [n.strip() for n in wanted.split(",") if n.strip()] if wanted else list(EXPECTED)
    unknown = set(names) - set(EXPECTED)
    assert not unknown, f"BERTLAB_ATTACKS names unknown attacks: {sorted(unknown)}"
    return [n for n in names if n not in LAST] + [n for n in LAST if n in names]


def _fill(text: str, subst: dict[str, str]) -> str:
    for key, value in subst.items():
        text = text.replace(key, value)
    return text


def _materialize(src: Path, dest: Path, subst: dict[str, str], uses: tuple[str, ...] = ()) -> None:
    """Copy a submission with placeholders filled in and its LINK lines made real links.
    A line ``# __HONEST__`` stands for the example class's correct file of the same stage
    (the attack's own definitions, after it, replace the names it attacks); an earlier stage
    in ``uses`` that the submission does not hold is the example class's correct file."""
    dest.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if not f.is_file():
            continue
        if f.name == "LINK":
            for line in f.read_text().splitlines():
                if line and not line.startswith("#") and " -> " in line:
                    link, target = line.split(" -> ", 1)
                    os.symlink(_fill(target.strip(), subst), dest / link.strip())
        else:
            text = f.read_text()
            if "\n# __HONEST__\n" in text:
                text = text.replace("\n# __HONEST__\n", "\n" + (HONEST / f.name).read_text())
            (dest / f.name).write_text(_fill(text, subst))
    for stage in uses:
        if not any(os.path.lexists(dest / f"{stage}{ext}") for ext in (".py", ".ipynb")):
            shutil.copyfile(HONEST / f"{stage}.py", dest / f"{stage}.py")


def _bystander(name: str, stage: str, dest: Path, subst: dict[str, str]) -> None:
    """An honest student: a folder of ``bystanders/``, or the example class's correct files
    of the stage and those it uses (the solution notebook in place of the stage's file for a
    name ending in ``SOLUTION``)."""
    if (HERE / "bystanders" / name).is_dir():
        _materialize(HERE / "bystanders" / name, dest, subst)
        return
    dest.mkdir(parents=True)
    for s in STAGES[stage].uses:
        shutil.copyfile(HONEST / f"{s}.py", dest / f"{s}.py")
    if name.endswith(SOLUTION):
        shutil.copyfile(ROOT / "solutions" / stage / f"{stage}.ipynb", dest / f"{stage}.ipynb")
    else:
        shutil.copyfile(HONEST / f"{stage}.py", dest / f"{stage}.py")


def _digest(path: Path) -> str | None:
    try:
        st = os.lstat(path)
        return (
            f"{st.st_mode:o}:{st.st_size}:{st.st_mtime_ns}:" + hashlib.sha256(path.read_bytes()).hexdigest()
        )
    except OSError:
        return None


class _Listeners:
    """TCP and UDP on one loopback port, an abstract unix socket and a world-writable unix
    socket file in a directory only root may enter: records anything that arrives."""

    def __init__(self, token: str, unix_path: Path) -> None:
        self.hits: list[list[str]] = []
        for _ in range(20):
            self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.tcp.bind(("127.0.0.1", 0))
            self.port = self.tcp.getsockname()[1]
            self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                self.udp.bind(("127.0.0.1", self.port))
                break
            except OSError:
                self.tcp.close()
                self.udp.close()
        self.tcp.listen(16)
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(f"\0bertlab-{token}")
        self.unix.listen(16)
        self.path = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.path.bind(str(unix_path))
        os.chmod(unix_path, 0o777)
        self.path.listen(16)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _record(self, kind: str, sock: socket.socket) -> None:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        conn.settimeout(0.5)
        try:
            data = conn.recv(1024)
        except OSError:
            data = b""
        conn.close()
        self.hits.append([kind, data.decode(errors="replace")])

    def _serve(self) -> None:
        socks = [self.tcp, self.udp, self.unix, self.path]
        while not self._stop.is_set():
            ready, _, _ = select.select(socks, [], [], 0.1)
            for s in ready:
                if s is self.udp:
                    data, _ = s.recvfrom(1024)
                    self.hits.append(["udp", data.decode(errors="replace")])
                else:
                    self._record({self.tcp: "tcp", self.unix: "abstract"}.get(s, "unix"), s)

    def close(self) -> list[list[str]]:
        self._stop.set()
        self._thread.join(5)
        for s in (self.tcp, self.udp, self.unix, self.path):
            s.close()
        return self.hits


def _attack_of(text: str, token: str) -> str:
    """Which attack a marker, file name or forged text belongs to."""
    m = re.search(rf"(?:bertlab-attack-|FORGED-|bertlab_pwned_){token}[-_]([A-Za-z0-9_]+)", text)
    if m:
        tail = m.group(1)
        for name in sorted(EXPECTED, key=len, reverse=True):
            if tail == name or tail.startswith(name + "_"):
                return name
    if f"bl{token}" in text:
        return "outlive_thread"  # the only attack that names a thread
    return "unknown"


def _marked_processes(token: str) -> list[tuple[int, str]]:
    """(pid, description) of every process whose argv, or one of whose threads' names,
    carries the run's token."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            texts = [(p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")]
        except OSError:
            continue
        try:
            texts += [(t / "comm").read_text().strip() for t in (p / "task").iterdir()]
        except OSError:
            pass
        if any(token in t for t in texts):
            found.append((int(p.name), " | ".join(texts)[-300:]))
    return found


def _leftovers(token: str, grace: float = 5.0) -> dict[str, list[str]]:
    """Processes an attack left alive, by attack; they are killed once recorded."""
    deadline = time.monotonic() + grace
    alive = _marked_processes(token)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = _marked_processes(token)
    by_attack: dict[str, list[str]] = {}
    for pid, text in alive:
        by_attack.setdefault(_attack_of(text, token), []).append(text)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return by_attack


FORGED_SPOTS = (
    "/results.json",
    "/tmp/results.json",
    "/var/tmp/results.json",
    "/autograder/results/results.json",
)


def _outside_files(token: str, autograder_existed: dict[str, bool]) -> dict[str, list[str]]:
    """Files the attacks created outside the results directory, by attack; removed once
    recorded (only files that carry this run's token)."""
    found: list[tuple[str, str]] = []
    for d in ("/tmp", "/var/tmp", "/dev/shm", str(ROOT), os.path.expanduser("~")):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            if token in n:
                found.append((os.path.join(d, n), n))
    for spot in (*FORGED_SPOTS, str(ROOT / "results.json")):
        try:
            text = Path(spot).read_text(errors="replace")
        except OSError:
            continue
        if f"FORGED-{token}" in text:
            found.append((spot, text))
    by_attack: dict[str, list[str]] = {}
    for path, evidence in found:
        by_attack.setdefault(_attack_of(evidence, token), []).append(path)
        try:
            os.unlink(path)
        except OSError:
            pass
    for d in ("/autograder/results", "/autograder"):  # made by an attack: take it away again
        if not autograder_existed[d]:
            try:
                os.rmdir(d)
                by_attack.setdefault("forge_results_files", []).append(d)
            except OSError:
                pass
    return by_attack


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {"unreadable": f"{type(exc).__name__}: {exc}"}


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    # A session of its own: whatever an attack does to the grader's process group or
    # session, it cannot reach the test runner.
    return subprocess.Popen(
        [sys.executable, "-m", "autograder", "grade", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, deadline: float) -> dict:
    try:
        stdout, stderr = proc.communicate(timeout=max(deadline - time.monotonic(), 1.0))
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        stdout, stderr = proc.communicate()
        rc = None
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def _run_all(base: Path) -> dict:
    token = secrets.token_hex(4)
    secret = "canary-" + secrets.token_hex(16)
    subs, out, sent = base / "subs", base / "results", base / "sentinels"
    out.mkdir()
    sent.mkdir()
    (out / "sentinel").write_text(f"sentinel {token}\n")
    (sent / "target").write_text(f"target {token}\n")
    sentinels = {str(p): _digest(p) for p in (out / "sentinel", sent / "target")}
    autograder_existed = {d: os.path.lexists(d) for d in ("/autograder/results", "/autograder")}
    sent.chmod(0o700)  # like a host's private socket directory
    listeners = _Listeners(token, sent / "sock")
    subst = {
        "__TOKEN__": token,
        "__PORT__": str(listeners.port),
        "__RESULTS_DIR__": str(out),
        "__REPO__": str(ROOT),
        "__SENTINEL_DIR__": str(sent),
        "__SUBS__": str(subs),
    }
    attacks = _selected()
    # one CLI run per stage, all at once: its bystanders first and last, its attacks between
    order: dict[str, list[str]] = {}
    for stage, spec in STAGES.items():
        mine = [a for a in attacks if stage_of(a) == stage]
        if mine or stage == STAGE:
            order[stage] = [spec.bystanders[0], *mine, spec.bystanders[1]]
            for name in mine:
                _materialize(SUBMISSIONS / name, subs / name, subst, spec.uses)
            for name in spec.bystanders:
                _bystander(name, stage, subs / name, subst)
    students = [s for names in order.values() for s in names]

    # The second run, at the same time: first a copy of the slow bystander (so that each
    # run is grading a student while the other finishes its first ones: two graders must
    # not disturb each other's children), then an honest file under hostile names.
    names_dir = base / "names"
    names_out = names_dir / "results"
    _materialize(HERE / "bystanders" / STAGES[STAGE].bystanders[0], names_dir / CONCURRENT, subst)
    honest = (SUBMISSIONS / "traversal_names" / f"{STAGE}.py").read_text()
    (names_dir / "files").mkdir(parents=True)
    hostile = [names_dir / CONCURRENT, names_dir / "files" / HOSTILE_FILE]
    hostile[1].write_text(_fill(honest, subst))
    for d in HOSTILE_DIRS:
        (names_dir / d).mkdir()
        (names_dir / d / f"{STAGE}.py").write_text(_fill(honest, subst))
        hostile.append(names_dir / d)
    names_before = sorted(os.listdir(names_dir))

    env = {**os.environ, "BERTLAB_TEST_SECRET": secret, "COLUMNS": "200"}
    common = ["--stage", STAGE, "--call-timeout", CALL_TIMEOUT]
    t0 = time.monotonic()
    try:
        batches = {
            stage: _cli(
                [*(str(subs / s) for s in names), "--stage", stage, "--results-dir", str(out)]
                + ["--call-timeout", STAGES[stage].call_timeout],
                env,
            )
            for stage, names in order.items()
        }
        names = _cli([*map(str, hostile), *common, "--results-dir", str(names_out)], env)
        deadline = t0 + CLI_TIMEOUT
        finished = {stage: _finish(proc, deadline) for stage, proc in batches.items()}
        runs = {"batch": finished[STAGE], "batches": finished, "names": _finish(names, deadline)}
        elapsed = time.monotonic() - t0
        time.sleep(1.5)  # anything that outlived its child gets the time to show itself
        results = {
            s: _read_json(out / s / "results.json") for s in students if (out / s / "results.json").exists()
        }
        out_layout = {
            e: sorted(os.listdir(out / e)) if (out / e).is_dir() else None for e in sorted(os.listdir(out))
        }
        names_results = (
            {str(p.relative_to(names_out)): _read_json(p) for p in sorted(names_out.rglob("results.json"))}
            if names_out.is_dir()
            else {}
        )
        names_layout = sorted(os.listdir(names_dir))
        out_text = {
            str(p.relative_to(out)): p.read_text(errors="replace")
            for p in sorted(out.rglob("*"))
            if p.is_file() and not p.is_symlink()
        }
    finally:
        hits = listeners.close()
        leftovers = _leftovers(token)
        outside = _outside_files(token, autograder_existed)
    return {
        "token": token,
        "secret": secret,
        "attacks": attacks,
        "students": students,
        "order": order,
        "elapsed": elapsed,
        **runs,
        "results": results,
        "out_layout": out_layout,
        "out_text": out_text,
        "names_results": names_results,
        "names_layout": names_layout,
        "names_before": names_before,
        "sentinels_changed": [p for p, d in sentinels.items() if _digest(Path(p)) != d],
        "listener_hits": hits,
        "leftovers": leftovers,
        "outside": outside,
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return once_per_session(tmp_path_factory, "attacks", lambda: _run_all(tmp_path_factory.mktemp("attacks")))


def by_function(result: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in result["tests"]:
        fn = next(x.split(":", 1)[1] for x in t["tags"] if x.startswith("function:"))
        out[fn] = out.get(fn, 0) + t["score"]
    return out


def failures(result: dict) -> str:
    """The first failing case of each failed test: why the points went."""
    lines = []
    for t in result["tests"]:
        if t["score"] < t["max_score"]:
            first = next((x for x in t["output"].splitlines() if x.startswith("✗")), t["output"][:200])
            lines.append(f"{t['name']}: {first[:240]}")
    return "\n".join(lines)


def text_of(result: dict) -> str:
    return json.dumps(result, ensure_ascii=False)


def _batch_failure(run: dict, stage: str = STAGE) -> str:
    batch = run["batches"][stage]
    return f"{stage} CLI rc={batch['rc']}; stderr tail: {batch['stderr'][-1500:]}"


# -- per attack ---------------------------------------------------------------------------


def _no_forged_or_injected(run: dict, result: dict) -> None:
    text = text_of(result)
    assert f"FORGED-{run['token']}" not in text, "a forged results file survived"
    assert f"INJECTED-{run['token']}" not in text


def _extra_forge_stdout(run: dict, attack: str) -> None:
    token = run["token"]
    for stream in ("stdout", "stderr"):
        assert f"INJECTED-{token}" not in run["batch"][stream], f"injected into the grader's {stream}"
        assert f"PRINTED-{token}" not in run["batch"][stream], f"student stdout reached the grader's {stream}"
    for student, result in run["results"].items():
        assert f"INJECTED-{token}" not in text_of(result), student
        if student != attack:
            assert f"PRINTED-{token}" not in text_of(result), f"leaked into {student}'s results"


def _extra_clean_console(run: dict, attack: str) -> None:
    assert run["batch"]["rc"] == 0, _batch_failure(run)
    for stream in ("stdout", "stderr"):
        assert "\x1b" not in run["batch"][stream] and "\x07" not in run["batch"][stream], stream


def _extra_no_secret(run: dict, attack: str) -> None:
    assert run["secret"] not in text_of(run["results"][attack])


def _extra_network(run: dict, attack: str) -> None:
    assert run["listener_hits"] == [], f"the listeners were reached: {run['listener_hits']}"


def _flags_absent(*flags: str):
    """The attack printed none of ``flags`` (what it prints once it got past a limit)."""

    def check(run: dict, attack: str) -> None:
        text = text_of(run["results"][attack])
        for flag in flags:
            assert flag not in text, f"{attack} printed {flag}: no limit stopped it"

    return check


def _flags_present(*flags: str):
    """The attack printed each of ``flags``: the probe it stands on worked."""

    def check(run: dict, attack: str) -> None:
        text = text_of(run["results"][attack])
        for flag in flags:
            assert flag in text, f"{attack} never printed {flag}: the probe is broken"

    return check


def _extra_grader_survived(run: dict, attack: str) -> None:
    stage = stage_of(attack)
    assert run["batches"][stage]["rc"] == 0, _batch_failure(run, stage)
    last = STAGES[stage].bystanders[1]
    assert last in run["results"], "the student graded after the attack got no results"


def _extra_sentinels(run: dict, attack: str) -> None:
    assert run["sentinels_changed"] == [], f"sentinel files changed: {run['sentinels_changed']}"


def _extra_no_passwd(run: dict, attack: str) -> None:
    for student, result in run["results"].items():
        assert PASSWD_LINE not in text_of(result), student
    assert PASSWD_LINE not in run["batch"]["stdout"] + run["batch"]["stderr"]


def _extra_no_reference_text(run: dict, attack: str) -> None:
    for student, result in run["results"].items():
        for text in REFERENCE_TEXTS:
            assert text not in text_of(result), student


def _softmax_fingerprints(token: str) -> dict[str, set[str]]:
    """The probe of every softmax input, as leak_hidden_inputs computes it, public and hidden."""
    from autograder.grader.plan import StagePlan
    from autograder.runtime.wire import decode
    from autograder.stages import load_spec

    plan = StagePlan.build(load_spec(STAGE), "cpu")
    calls = {c.index: c for c in plan.calls}
    found: dict[str, set[str]] = {"public": set(), "hidden": set()}
    for pc in plan.cases:
        if pc.graded.name == "softmax":
            inputs = plan.hidden_inputs if pc.test.hidden else plan.inputs
            (x,) = decode(calls[pc.index].data["args"], inputs)[:1]
            digest = hashlib.sha256(x.contiguous().numpy().tobytes()).hexdigest()[:24]
            found["hidden" if pc.test.hidden else "public"].add(f"HIDDEN-PROBE-{token}-{digest}")
    found["hidden"] -= found["public"]
    return found


def _extra_no_hidden_input(run: dict, attack: str) -> None:
    text = text_of(run["results"][attack])
    probes = _softmax_fingerprints(run["token"])
    assert any(p in text for p in probes["public"]), "no public input got through: the probe is broken"
    leaked = sorted(p for p in probes["hidden"] if p in text)
    assert not leaked, f"hidden inputs reached the student's results: {leaked}"
    assert f"HIDDEN-PROBE-{run['token']}" not in json.dumps(
        [t["name"] for t in run["results"][attack]["tests"]]
    )


EXTRA = {
    "forge_stdout": [_extra_forge_stdout],
    "forge_markup": [_extra_clean_console],
    "hunt_environment": [_extra_no_secret],
    "network": [_extra_network],
    "network_syscall_bypass": [_extra_network],
    "memory_bomb": [_flags_absent("MEMORY-BOMB-RESERVED", "MEMORY-BOMB-REACHED-CAP")],
    "disk_fill": [_flags_absent("DISK-FILL-BEYOND-LIMIT", "DISK-FILL-REACHED-CAP")],
    "fork_bomb": [_flags_absent("FORK-BOMB-BEYOND-LIMIT")],
    "kill_parent": [_extra_grader_survived],
    "signal_ancestors": [_extra_grader_survived],
    "exit_calls": [_extra_grader_survived],
    "forge_event_bomb": [_extra_grader_survived],
    "symlink_job_files": [_extra_sentinels],
    "escape_writes": [_extra_sentinels],
    "forge_results_files": [_extra_sentinels],
    "symlink_to_system_file": [_extra_no_passwd],
    "symlink_file_to_reference": [_extra_no_reference_text],
    "symlink_dir_to_reference": [_extra_no_reference_text],
    "leak_hidden_inputs": [_extra_no_hidden_input],
    "flood_forged_reports": [_extra_grader_survived],
    "gpt_huge_return": [_extra_grader_survived],
    "gpt_kv_cache_growth": [_flags_absent("KV-GROWTH-BEYOND-LIMIT")],
    "gpt_endless_state_dict": [_extra_grader_survived],
    "transfer_hanging_model": [_extra_grader_survived],
    "gpt_hostile_earlier_stage": [_extra_no_reference_text, _extra_sentinels],
    "gpt_earlier_stage_symlink": [_extra_no_reference_text],
    "gpt_load_stage_hunt": [_extra_no_reference_text],
    "transfer_weights_neighbours": [_flags_present("MINILM-DIR-READ"), _extra_no_reference_text],
    "transfer_tamper_checkpoint": [_flags_absent("CHECKPOINT-WRITTEN")],
}


# Forbidden-call detection runs in the student's own process, so code that hunts down the
# guard (gc) or impersonates the child's reporting can undo it: an honesty check, not a
# security boundary (README, "Security model"). So do the drivers' records of how a result
# was computed (10's cache and generator outputs): code beside them can rewrite them. These
# stay strict xfails: if the design closes them, the suite says so.
IN_PROCESS_LIMITS = {
    "forbidden_close_guard": "destroys the kernel guard found through gc before calling torch.softmax",
    "gpt_patch_driver_record": "rewrites the greedy driver's record (sys.modules) before greedy_decode runs",
}


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(a, marks=pytest.mark.xfail(strict=True, reason=IN_PROCESS_LIMITS[a]))
        if a in IN_PROCESS_LIMITS
        else a
        for a in sorted(EXPECTED)
    ],
)
def test_attack(run, attack):
    if attack not in run["attacks"]:
        pytest.skip("not selected by BERTLAB_ATTACKS")
    result = run["results"].get(attack)
    stage = stage_of(attack)
    assert result is not None, f"no results file for {attack}: {_batch_failure(run, stage)}"
    assert "unreadable" not in result, result
    assert_gradescope_results(result, stage, stage)
    _no_forged_or_injected(run, result)
    got = by_function(result)
    assert got == EXPECTED[attack], (
        f"{attack} scored {got}, expected {EXPECTED[attack]}\n{failures(result)}\n{result['output'][:1500]}"
    )
    assert result["score"] == sum(EXPECTED[attack].values())
    assert run["leftovers"].get(attack, []) == [], f"processes left alive: {run['leftovers'][attack]}"
    assert run["outside"].get(attack, []) == [], f"files created outside: {run['outside'][attack]}"
    for check in EXTRA.get(attack, []):
        check(run, attack)


# -- the whole run ------------------------------------------------------------------------


def test_the_suite_has_every_attack_documented():
    dirs = sorted(p.name for p in SUBMISSIONS.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert dirs == sorted(EXPECTED)
    assert len(EXPECTED) >= 25
    for name in dirs:
        files = [f for f in (SUBMISSIONS / name).iterdir() if f.is_file()]
        assert files, name
        graded = [f for f in files if f.name.split(".")[0] == stage_of(name)] or files
        assert f"ATTACK {name} (class:" in graded[0].read_text(), f"{name}: intent not documented"
        assert "Expected:" in graded[0].read_text(), f"{name}: expected outcome not documented"


def test_the_grader_exits_normally_with_every_results_file(run):
    for stage, batch in run["batches"].items():
        assert batch["rc"] == 0, _batch_failure(run, stage)
        assert "internal error" not in batch["stdout"] + batch["stderr"], stage
        assert "Traceback" not in batch["stderr"], stage
    assert set(run["results"]) == set(run["students"])
    for stage, students in run["order"].items():
        for student in students:
            assert "unreadable" not in run["results"][student], (student, run["results"][student])
            assert_gradescope_results(run["results"][student], stage, stage)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_bystanders_are_graded_as_usual(run, stage):
    if stage not in run["order"]:
        pytest.skip("no attack on this stage selected by BERTLAB_ATTACKS")
    for student in STAGES[stage].bystanders:
        result = run["results"].get(student)
        assert result is not None, f"no results for {student}: {_batch_failure(run, stage)}"
        assert "unreadable" not in result, result
        assert_gradescope_results(result, stage, stage)
        assert by_function(result) == full_marks(stage), f"{student}:\n{failures(result)}"
        assert "FORGED-" not in text_of(result) and "INJECTED-" not in text_of(result)
        assert "your code printed" not in result["output"], f"someone else's output reached {student}"


def test_the_results_directory_holds_only_results(run):
    expected = {s: ["results.json"] for s in run["students"]}
    assert run["out_layout"] == {**expected, "sentinel": None}


def test_sentinel_files_are_untouched(run):
    assert run["sentinels_changed"] == []


def test_no_process_is_left_running(run):
    assert run["leftovers"] == {}


def test_nothing_is_written_outside_the_results_directory(run):
    assert run["outside"] == {}


def test_the_secret_reaches_no_output(run):
    secret = run["secret"]
    for where, text in run["out_text"].items():
        assert secret not in text, where
    for stream in ("stdout", "stderr"):
        for batch in run["batches"].values():
            assert secret not in batch[stream]
        assert secret not in run["names"][stream]


def test_the_network_is_unreachable(run):
    if "network" not in run["attacks"]:
        pytest.skip("not selected by BERTLAB_ATTACKS")
    assert run["listener_hits"] == []


def test_the_run_is_quick(run):
    # every hang costs the call limit (2 s), not the submission's 120 s
    assert run["elapsed"] < 150, run["elapsed"]


def test_two_graders_side_by_side_do_not_disturb_each_other(run):
    """Both CLI runs grade the slow bystander first, at the same time: neither may lose
    a call to the other (say, to a clean-up that kills processes by a uid both use)."""
    again = run["names_results"].get(f"{CONCURRENT}/results.json")
    assert again is not None, run["names"]["stderr"][-1500:]
    for where, result in (
        (f"second run: {CONCURRENT}", again),
        ("batch: bystander_a", run["results"].get("bystander_a")),
    ):
        assert result is not None, where
        assert by_function(result) == FULL, f"{where}:\n{failures(result)}"


def test_hostile_names_stay_inside_the_results_directory(run):
    names = run["names"]
    assert names["rc"] == 0, names["stderr"][-1500:]
    for stream in ("stdout", "stderr"):
        assert "\x1b" not in names[stream] and "\x07" not in names[stream], (
            f"raw control characters on {stream}"
        )
    new = sorted(set(run["names_layout"]) - set(run["names_before"]))
    assert new == ["results"], f"written beside the results directory: {new}"
    hostile = {k: v for k, v in run["names_results"].items() if not k.startswith(CONCURRENT + "/")}
    assert len(hostile) == 1 + len(HOSTILE_DIRS), sorted(hostile)
    for where, result in hostile.items():
        assert "unreadable" not in result, (where, result)
        assert_gradescope_results(result)
        assert result["score"] == max_score(), f"{where}:\n{failures(result)}"

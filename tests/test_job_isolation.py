"""Jobs isolated by the kernel (issue 25): what one job does reaches no other job, no later
child and nothing of the machine. Each attack is real code in a real confined child, run
the way the grader runs a submission (``runner.run_submission`` on the fork server), and
each succeeded on the grader before job boxes (``autograder/sandbox/jail.py``):

1. a program started by the child (a fresh interpreter, a shell, a binary it wrote)
2. NETLINK_USERSOCK unicast from one job to another running at the same time
3. bits written into files' access times by one job, read back by a later, clean one
4. processes that outlive their job by forking and letting the parent exit, fast
5. memory held in memfds, outside every limit of the process
6. root-only devices: the disk, terminals, the console
9. (the parent) see tests/test_protocol_fuzz.py; 8: tests/test_notebook_duplicate_keys.py

Item 7 (the same without root) runs the CLI as another user: ``test_without_root_*``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import pytest
import safetensors.torch

from autograder.grader.runner import ForkServer, Limits, run_submission
from autograder.sandbox import confine, jail
from tests.support import ROOT, max_score, revealing_python, write_py

BOXED = confine.box_support().mode is not None
needs_box = pytest.mark.skipif(
    not BOXED, reason=f"this machine makes no job box: {confine.box_support().reason}"
)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a root grader")
STAGE = "01_attention"
HONEST = (ROOT / "examples" / "class" / "ada_correct_matmul" / f"{STAGE}.py").read_text()


@pytest.fixture(scope="module")
def server():
    with ForkServer() as s:
        s.wait_ready()
        yield s


def run(server: ForkServer, code: str, seconds: float = 30.0) -> str:
    """Run ``code`` as a submission's only cell in a confined child; what it printed."""
    report = run_submission(
        server,
        [("code cell 1", code)],
        "probe",
        [],
        safetensors.torch.save({}),
        "cpu",
        Limits(call_s=seconds, cell_s=seconds, submission_s=seconds + 10),
    )
    errors = [f"{e['type']}: {e['message']}" for e in report.cell_errors.values()]
    return report.stdout + "".join(f"\nCELL ERROR {e}" for e in errors)


def findings(stdout: str, tag: str) -> list[str]:
    return [line[len(tag) + 1 :] for line in stdout.splitlines() if line.startswith(tag + " ")]


# -- 1. exec ------------------------------------------------------------------------------------

EXEC = """
import os, shutil, subprocess, sys
tries = {
    "a fresh interpreter": [sys.executable, "-c", "import torch; print(torch.softmax(torch.ones(2), 0))"],
    "a shell": ["/bin/sh", "-c", "echo shell"],
}
own = os.path.join(os.getcwd(), "own_true")
try:
    shutil.copy("/bin/true", own)
    os.chmod(own, 0o755)
    tries["a binary written to the work dir"] = [own]
except OSError as exc:
    print("NOCOPY", exc)
for what, argv in tries.items():
    try:
        out = subprocess.run(argv, capture_output=True, timeout=20)
        print("RAN", what, out.returncode, out.stdout[:80])
    except OSError as exc:
        print("REFUSED", what, exc.errno)
try:
    os.execv("/bin/true", ["true"])
except OSError as exc:
    print("REFUSED execv", exc.errno)
"""


@needs_box
def test_a_child_starts_no_program(server):
    out = run(server, EXEC)
    assert findings(out, "RAN") == [], out
    assert len(findings(out, "REFUSED")) == 4, out


# -- 2. netlink between jobs running at the same time ---------------------------------------------

RECEIVER = """
import socket, time
got = []
for proto in (2, 0):  # NETLINK_USERSOCK, NETLINK_ROUTE
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto)
        s.bind(({port} + proto, 0))
        s.settimeout(0.05)
        got.append(s)
        print("BOUND", proto)
    except OSError as exc:
        print("NOSOCKET", proto, exc.errno)
deadline = time.monotonic() + 8
while got and time.monotonic() < deadline:
    for s in got:
        try:
            print("GOT", s.recv(4096)[16:].decode(errors="replace"))
            deadline = 0
        except OSError:
            pass
"""

SENDER = """
import socket, struct, time
payload = b"{secret}"
end = time.monotonic() + 8
socks = []
for proto in (2, 0):
    try:
        socks.append((proto, socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto)))
    except OSError as exc:
        print("NOSOCKET", proto, exc.errno)
while socks and time.monotonic() < end:
    for proto, s in socks:
        header = struct.pack("=IHHII", 16 + len(payload), 0x10, 0, 0, 0)
        try:
            s.sendto(header + payload, ({port} + proto, 0))
        except OSError as exc:
            print("SENDFAIL", proto, exc.errno)
            socks.remove((proto, s))
            break
    time.sleep(0.01)
"""


@needs_box
def test_no_netlink_message_reaches_another_job(server):
    """Two jobs at once (as two stages of one submission, or two classmates, are graded):
    the one holding hidden inputs sends, the other listens. Each job has a network namespace
    of its own, and no netlink socket but NETLINK_ROUTE."""
    secret, port = secrets.token_hex(8), 40000 + secrets.randbelow(20000)
    heard: list[str] = []
    listener = threading.Thread(target=lambda: heard.append(run(server, RECEIVER.format(port=port))))
    listener.start()
    time.sleep(1.0)
    said = run(server, SENDER.format(secret=secret, port=port))
    listener.join()
    assert secret not in heard[0] and not findings(heard[0], "GOT"), heard[0]
    assert "NOSOCKET 2 13" in said and "NOSOCKET 2 13" in heard[0]  # USERSOCK: EACCES


# -- 3. access times: a dirty job writes bits, a later clean one reads them ---------------------------

ATIME_READ = """
for path in {paths!r}:
    with open(path, "rb") as f:
        f.read(1)
print("READ", len({paths!r}))
"""

ATIME_STAT = """
import os
for path in {paths!r}:
    print("ATIME", os.stat(path).st_atime_ns)
"""


def _unread_files(n: int) -> list[str]:
    """``n`` files of the Python installation that nothing imports while grading."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [str(p) for p in sorted((stdlib / "lib2to3" / "fixes").glob("fix_*.py"))[:n]]


@needs_box
@root_only
def test_reading_a_file_writes_no_access_time_a_later_job_can_read(server):
    paths = _unread_files(8)
    assert len(paths) == 8
    old = 978307200 * 10**9  # 2001: older than each file's mtime, so relatime would update it
    for path in paths:
        os.utime(path, ns=(old, os.stat(path).st_mtime_ns))
    dirty = run(server, ATIME_READ.format(paths=paths))
    assert "READ 8" in dirty, dirty
    clean = run(server, ATIME_STAT.format(paths=paths))
    assert findings(clean, "ATIME") == [str(old)] * 8, clean
    assert [os.stat(p).st_atime_ns for p in paths] == [old] * 8  # nor on the host


# -- 4. processes that outlive their job -----------------------------------------------------------

HOPPER = """
import ctypes, os, time
libc = ctypes.CDLL(None)
for chain in range(8):
    if os.fork() == 0:
        end = time.monotonic() + 20
        while time.monotonic() < end:
            libc.prctl(15, b"{marker}", 0, 0, 0)  # PR_SET_NAME: the test looks for it
            if os.fork() != 0:
                os._exit(0)  # the parent exits at once: a sweep by uid finds pids already gone
        os._exit(0)
print("HOPPING")
"""


def _alive(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/comm") as f:
                    if f.read().strip() == marker:
                        found.append(int(entry.name))
            except OSError:
                pass
    return found


@needs_box
def test_no_process_outlives_its_job(server):
    marker = "hop" + secrets.token_hex(5)
    try:
        out = run(server, HOPPER.format(marker=marker))
        assert "HOPPING" in out, out
        server.drain()  # the job's end: its child reaped, its box gone
        survivors = []
        for _ in range(20):  # 2 s: a hopper that escaped keeps hopping
            survivors += _alive(marker)
            time.sleep(0.1)
        assert survivors == []
    finally:
        for _ in range(50):
            pids = _alive(marker)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass


# -- 5. memory outside every limit -------------------------------------------------------------------

MEMFD = """
import os
held = 0
fds = []
for i in range(24):
    try:
        fd = os.memfd_create(f"m{{i}}")
    except OSError as exc:
        print("REFUSED memfd", exc.errno)
        break
    chunk = b"x" * (64 << 20)
    for _ in range(4):
        held += os.write(fd, chunk)
    fds.append(fd)
print("HELD", held)
for path in ("/dev/shm", "/run/shm"):
    try:
        fd = os.open(os.path.join(path, "bertlab-shm"), os.O_CREAT | os.O_RDWR, 0o600)
        print("SHM", path)
    except OSError:
        pass
"""


@needs_box
def test_no_memory_is_held_outside_the_limits(server):
    out = run(server, MEMFD, seconds=60)
    assert findings(out, "HELD") == ["0"], out
    assert "REFUSED memfd 38" in out and not findings(out, "SHM")


CGROUP = """
with open("/proc/self/cgroup") as f:
    print("CGROUP", f.read().replace(chr(10), " "))
"""


@needs_box
@pytest.mark.skipif(not confine.box_support().cgroups, reason="no cgroup controllers for jobs here")
def test_every_job_runs_in_a_cgroup_of_its_own(server):
    out = run(server, CGROUP)
    lines = [line.split(":", 2) for line in findings(out, "CGROUP")[0].split()]
    for h in confine.box_support().hierarchies:
        want = "" if h.version == 2 else h.controllers[0]
        (path,) = [
            p for _id, controllers, p in lines if want in controllers.split(",") or controllers == want
        ]
        assert "/bertlab/job-" in path, lines


@root_only
@pytest.mark.skipif(not confine.box_support().cgroups, reason="no cgroup controllers for jobs here")
def test_a_job_cgroup_bounds_shared_memory_and_processes():
    """The cgroup's limits, on a process that writes shared memory (tmpfs pages, which no
    address-space limit counts) and one that forks: the first is killed at the limit."""
    found = confine.box_support()
    if "memory" not in found.cgroups:
        pytest.skip("no memory controller for jobs here")
    plan = jail.cgroup_plan(list(found.hierarchies), found.v2_kill, 64 << 20, 8)
    cgroup = jail.JobCgroup.make(plan, f"test-{os.getpid()}")
    shm = tempfile.mkdtemp(prefix="bertlab-shm-")
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", shm], check=True)
        script = (
            "import os, sys\n"
            "for procs in sys.argv[1:]:\n"
            "    open(procs, 'w').write('0')\n"
            f"f = open('{shm}/fill', 'wb')\n"
            "for i in range(32):\n"
            "    f.write(b'x' * (8 << 20)); f.flush()\n"
            "print('WROTE ALL')\n"
        )
        proc = subprocess.run([sys.executable, "-c", script, *cgroup.procs], capture_output=True, text=True)
        assert "WROTE ALL" not in proc.stdout and proc.returncode == -9, (proc.returncode, proc.stderr)
    finally:
        subprocess.run(["umount", shm], check=False)
        os.rmdir(shm)
        cgroup.kill()
        cgroup.remove()
    assert all(not os.path.exists(d) for d in cgroup.dirs)


# -- 6. devices ------------------------------------------------------------------------------------------

DEVICES = """
import os
for path in {paths!r}:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        print("OPENED", path)
        os.close(fd)
    except OSError as exc:
        print("REFUSED", path, exc.errno)
print("DEV", " ".join(sorted(os.listdir("/dev"))))
"""


def _root_block_device() -> str | None:
    dev = os.stat("/").st_dev
    for entry in os.scandir("/dev"):
        try:
            st = os.stat(entry.path)
        except OSError:
            continue
        if stat.S_ISBLK(st.st_mode) and st.st_rdev == dev:
            return entry.path
    return None


@needs_box
def test_no_disk_terminal_or_console_opens(server):
    paths = [
        "/dev/console",
        "/dev/tty",
        "/dev/tty0",
        "/dev/tty1",
        "/dev/vcs",
        "/dev/hwrng",
        "/dev/kvm",
        "/dev/fuse",
        "/dev/mem",
        "/dev/kmsg",
        "/dev/ptmx",
        "/dev/pts/0",
        "/dev/pts/1",
        "/dev/shm",
    ]
    disk = _root_block_device()
    paths += [disk] if disk else []
    out = run(server, DEVICES.format(paths=paths))
    assert findings(out, "OPENED") == [], out
    assert findings(out, "DEV") == ["fd full null random stderr stdin stdout urandom zero"], out


# -- 7. without root: the CLI as another user ------------------------------------------------------------

NOBODY = 65534


def _as_nobody(argv: list[str], tmp: Path) -> subprocess.CompletedProcess:
    """``argv`` as uid 65534, in a private mount namespace where that user may pass through
    root's private home to the Python installation (as an image's /usr is readable)."""
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    command = revealing_python(command, tmp / "skel")
    env = {**os.environ, "HOME": str(tmp), "COLUMNS": "250"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


NONROOT_ATTACK = """

import os, socket, time
# a UDP datagram to a listener on the host's loopback, and a daemon in a session of its own
for _ in range(3):
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"{secret}", ("127.0.0.1", {port}))
    except OSError:
        pass
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        import ctypes
        ctypes.CDLL(None).prctl(15, b"{marker}", 0, 0, 0)
        time.sleep(30)
    os._exit(0)
"""


@pytest.mark.slow
@root_only
@pytest.mark.skipif(shutil.which("setpriv") is None or shutil.which("unshare") is None, reason="util-linux")
def test_without_root_a_job_reaches_no_listener_and_leaves_no_daemon():
    import socket

    tmp_path = Path(tempfile.mkdtemp(prefix="bertlab-nonroot-"))  # pytest's are root's alone (0700)
    os.chmod(tmp_path, 0o777)
    secret, marker = secrets.token_hex(8), "nr" + secrets.token_hex(5)
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    sub = write_py(
        tmp_path / "student", STAGE, HONEST + NONROOT_ATTACK.format(secret=secret, port=port, marker=marker)
    )
    os.chmod(sub, 0o755)
    os.chmod(sub / f"{STAGE}.py", 0o644)
    # a student failing public cases: the counterexample search in the grading child, without root
    bob = tmp_path / "bob"
    bob.mkdir(mode=0o755)
    shutil.copy(ROOT / "examples" / "class" / "bob_missing_scale" / f"{STAGE}.ipynb", bob)
    os.chmod(bob / f"{STAGE}.ipynb", 0o644)
    out = tmp_path / "out"
    try:
        proc = _as_nobody(
            [sys.executable, "-m", "autograder", "grade", str(sub), str(bob), "--results-dir", str(out)],
            tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        doctor = _as_nobody([sys.executable, "-m", "autograder", "doctor"], tmp_path)
        assert (
            "│ user namespace " in doctor.stdout
            and "a confined child runs a submission: yes" in doctor.stdout
        )
        score = json.loads((out / "student" / "results.json").read_text())["score"]
        assert score == max_score(STAGE)
        bobs = (out / "bob" / "results.json").read_text()
        assert (
            json.loads(bobs)["score"] == 8.25 and "Smallest input found" in bobs
        )  # examples/class/README.md
        received = []
        try:
            while True:
                received.append(listener.recv(100))
        except OSError:
            pass
        assert received == []
        time.sleep(0.5)
        assert _alive(marker) == []
    finally:
        listener.close()
        for pid in _alive(marker):
            os.kill(pid, 9)
        shutil.rmtree(tmp_path, ignore_errors=True)


# -- spare boxes: made ahead, gone with their grader -----------------------------------------------

ABANDON = """
import os, sys, json
from pathlib import Path
from autograder.grader.grade import Grader
g = Grader()
g.grade(Path(sys.argv[1]), ["01_attention"])  # a job, and the spare the server made after it
print(json.dumps({"server": g.server.proc.pid}), flush=True)
os._exit(0)  # a grader killed: no close, no atexit
"""


def _in_cgroup_of(prefix: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cgroup") as f:
                    if prefix in f.read():
                        found.append(int(entry.name))
            except OSError:
                pass
    return found


@needs_box
@root_only
@pytest.mark.skipif(not confine.box_support().cgroups, reason="no cgroup controllers for jobs here")
def test_a_grader_that_dies_takes_its_spare_boxes_along():
    """The fork server makes the next job's box ahead (its init and worker waiting in the
    job's cgroup); a grader killed outright leaves neither those processes nor, once the
    next grader starts, their cgroups."""
    proc = subprocess.run(
        [sys.executable, "-c", ABANDON, str(ROOT / "examples" / "class" / "ada_correct_matmul")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    server = json.loads(proc.stdout.splitlines()[-1])["server"]
    prefix = f"/bertlab/job-{server}-"
    left = _in_cgroup_of(prefix)
    for _ in range(50):
        if not left:
            break
        time.sleep(0.1)
        left = _in_cgroup_of(prefix)
    for pid in left:
        os.kill(pid, 9)
    assert left == []
    # the next grader removes the cgroups the dead server's spares made
    subprocess.run(
        [sys.executable, "-c", "from autograder.sandbox import confine; confine.box_support()"],
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    for h in confine.box_support().hierarchies:
        assert not [n for n in os.listdir(h.base) if n.startswith(f"job-{server}-")], h.base

"""``make docker-check``: the TAs' Docker path end to end, offline, against the host.

Builds the CPU image as ``make docker`` does (on a Debian base made here with debootstrap
unless ``--base`` names another), then, running the documented ``docker run`` command
word for word as a TA would (a user in the docker group, in a folder holding
``submissions/`` and ``out/``):

- grades examples/class in the container and compares every student x stage score, and
  every test's, with a host run of ``python -m autograder batch`` (item 1 of issue 20 as
  a non-root TA, and as root: the same command without ``--user``);
- no layer of the image holds a solution notebook, ``BEGIN SOLUTION`` outside the two
  files that name the marker, or anything of solutions/ but the data stages read (2);
- the image holds no CUDA package and its size (3); ``out/`` missing (so made by Docker,
  as root) or not mounted stops with what to do (5); ``feedback`` writes its pages into
  out/ with no warning (6); README.md documents the Dockerfile header's command (7).

It needs a Docker engine (and, for its base image, debootstrap and root): without them it
says so and exits 0, SKIPPED. Everything it writes is in build/docker-check/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "docker-check"
CLASS = ROOT / "examples" / "class"
IMAGE = "bertlab"
USER_OPTION = '--user "$(id -u):$(id -g)" '
OUT_MOUNT = '-v "$PWD/out:/out" '
# the only files of the image that may name nbgrader's solution marker: nbgrader itself,
# and the release's check that no bundle holds one
MARKER = b"BEGIN SOLUTION"
MARKER_ALLOWED = ("/site-packages/nbgrader/", "opt/bertlab/autograder/grader/release.py")
MARKER_ALLOWED_PYC = "opt/bertlab/autograder/grader/__pycache__/release."


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.facts: list[str] = []

    def check(self, ok: bool, what: str, detail: str = "") -> bool:
        print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail else ""), flush=True)
        if not ok:
            self.failed.append(what)
        return ok

    def fact(self, text: str) -> None:
        print(f"     {text}", flush=True)
        self.facts.append(text)


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, text=True, capture_output=True, **kw)


def timed(argv: list[str], **kw) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run(argv, text=True, **kw)
    return proc, time.monotonic() - t0


def documented(text: str) -> str:
    """The one ``docker run`` line of a README or of the Dockerfile's header comment."""
    lines = [line.lstrip("# \t") for line in text.splitlines()]
    found = [line.rstrip() for line in lines if line.startswith("docker run ")]
    return found[0] if found else ""


class TA:
    """A TA's shell: a user of the docker group (root's checks run as ``uid:gid``), in a
    folder of their own holding submissions/ (a copy of examples/class)."""

    def __init__(self, home: Path, ids: tuple[int, int] | None) -> None:
        self.home, self.ids = home, ids
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(CLASS, home / "submissions")
        if ids is not None:
            for path in [home, *home.rglob("*")]:
                os.chown(path, *ids, follow_symlinks=False)

    def run(self, command: str, timeout: float = 1800) -> tuple[subprocess.CompletedProcess, float]:
        argv = ["bash", "-c", command]
        if self.ids is not None:
            socket_gid = os.stat("/var/run/docker.sock").st_gid
            uid, gid = self.ids
            argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={socket_gid}", *argv]
        env = {"PATH": os.environ["PATH"], "HOME": str(self.home), "LANG": "C.UTF-8"}
        t0 = time.monotonic()
        proc = subprocess.run(argv, cwd=self.home, env=env, text=True, capture_output=True, timeout=timeout)
        return proc, time.monotonic() - t0

    def mkdir_out(self) -> Path:
        out = self.home / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        if self.ids is not None:
            os.chown(out, *self.ids)
        return out


def gradebook(path: Path) -> dict[tuple[str, str], tuple[float, list[tuple[str, float]], str]]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT student, stage, score, result FROM grades").fetchall()
    out = {}
    for student, stage, score, result in rows:
        tests = [(t["number"], t["score"]) for t in json.loads(result)["tests"]]
        out[(student, stage)] = (score, tests, result)
    return out


def _first_difference(a: object, b: object, where: str = "") -> str:
    """Where two results first differ: "tests[3].output"."""
    if type(a) is not type(b):
        return where or "the whole result"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{where}.{k}" if where else str(k))
    if isinstance(a, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
    return where or "the whole result"


def compare(checks: Checks, what: str, host: dict, other_db: Path) -> None:
    """Every grade equals the host's, whole: scores, named mistakes, counterexamples, messages."""
    if not checks.check(other_db.is_file(), f"{what}: a gradebook in out/", str(other_db)):
        return
    other = gradebook(other_db)
    differ = [
        f"{s} {st}: host {host[s, st][0]:g}, container {other[s, st][0]:g}"
        for s, st in sorted(host)
        if (s, st) in other and host[s, st][:2] != other[s, st][:2]
    ]
    missing = sorted(set(host) ^ set(other))
    checks.check(
        not differ and not missing and bool(host),
        f"{what}: every student x stage score and test score equals the host's",
        f"{len(host)} grades"
        if not (differ or missing)
        else "; ".join(differ[:5] + [str(m) for m in missing[:5]]),
    )
    unlike = [
        f"{s} {st}: {_first_difference(json.loads(host[s, st][2]), json.loads(other[s, st][2]))}"
        for s, st in sorted(host)
        if (s, st) in other and host[s, st][2] != other[s, st][2]
    ]
    checks.check(
        not unlike and bool(host),
        f"{what}: every result equals the host's byte for byte (named mistakes, counterexamples, messages)",
        f"{len(host)} results" if not unlike else "; ".join(unlike[:5]),
    )


def _holds(f, needle: bytes, chunk: int = 16 << 20) -> bool:
    """Does the file ``f`` hold ``needle``? Read a chunk at a time (libtorch is 400 MB)."""
    tail = b""
    while block := f.read(chunk):
        if needle in tail + block:
            return True
        tail = block[-len(needle) + 1 :]
    return False


def check_context(checks: Checks, base: str) -> None:
    """The build context, as the daemon receives it through .dockerignore: listed by a
    throw-away build that copies all of it."""
    listing = f"FROM {base}\nCOPY . /context\nRUN cd /context && find . -type f -printf '%s %p\\n'\n"
    tag = "bertlab-context-check"
    proc = sh(["docker", "build", "--no-cache", "-f", "-", "-t", tag, "."], input=listing, cwd=ROOT)
    sh(["docker", "rmi", "-f", tag])
    files = {}
    for line in proc.stdout.splitlines():
        size, _, path = line.partition(" ./")
        if size.isdigit() and path:
            files[path] = int(size)
    wheels = ("build/wheelhouse-cpu/", "build/wheelhouse-cuda/")
    allowed = (
        "autograder/",
        "reference/",
        "scripts/install.sh",
        "docker/entrypoint.sh",
        "solutions/",
        "requirements",
    )
    allowed += ("pyproject.toml", "README.md", *wheels)
    stray = [
        p
        for p in files
        if not p.startswith(allowed) or (p.startswith("solutions/") and not p.endswith(".txt"))
    ]
    stray += [p for p in files if "__pycache__" in p]
    code = sum(size for p, size in files.items() if not p.startswith(wheels))
    checks.check(
        proc.returncode == 0 and bool(files) and not stray and code < 20e6,
        "the build context is what grading reads and the wheelhouse (.dockerignore)",
        ", ".join(stray[:5])
        or f"{len(files)} files: {code / 1e6:.1f} MB + wheels {(sum(files.values()) - code) / 1e6:.0f} MB",
    )


def scan_layers(checks: Checks, image: str) -> None:
    """Every file of every layer ``docker save`` writes: solutions/ holds only stage data,
    no notebook anywhere in the project, the marker only where allowed."""
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    bad_paths, marked, layers, files = [], [], 0, 0
    with tarfile.open(fileobj=save.stdout, mode="r|") as outer:
        for member in outer:
            if not member.isfile():
                continue
            head = outer.extractfile(member)
            try:
                inner = tarfile.open(fileobj=head, mode="r|")
            except tarfile.TarError:
                continue  # the image's JSON, a manifest
            layers += 1
            with inner:
                for item in inner:
                    name = item.name.lstrip("./")
                    if "solutions/" in name or name.endswith("/solutions"):
                        parts = name.split("/")
                        at = parts.index("solutions")
                        rest = parts[at + 1 :]
                        if not (item.isdir() or (len(rest) == 2 and rest[1].endswith(".txt"))):
                            bad_paths.append(name)
                    if name.startswith("opt/bertlab/") and name.endswith(".ipynb"):
                        bad_paths.append(name)
                    if not item.isfile():
                        continue
                    files += 1
                    allowed = any(a in "/" + name for a in MARKER_ALLOWED) or name.startswith(
                        MARKER_ALLOWED_PYC
                    )
                    if not allowed and _holds(inner.extractfile(item), MARKER):
                        marked.append(name)
    save.wait()
    checks.check(save.returncode == 0 and layers > 0, "docker save", f"{layers} layers, {files} files read")
    checks.check(
        not bad_paths,
        "no layer holds solutions/ beyond solutions/*/*.txt, nor a notebook",
        ", ".join(bad_paths[:5]),
    )
    checks.check(
        not marked, "no layer holds 'BEGIN SOLUTION' (but nbgrader and release.py)", ", ".join(marked[:5])
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--base", default="bertlab-base:bookworm", help="the base image (made here if missing)"
    )
    parser.add_argument("--cold", action="store_true", help="build with --no-cache (a cold build's time)")
    parser.add_argument(
        "--readme", type=Path, default=ROOT / "README.md", help="the README whose command runs"
    )
    parser.add_argument("--as", dest="ids", default="1000:1000", help="uid:gid of the TA when run as root")
    args = parser.parse_args()
    checks = Checks()

    if sh(["docker", "info"]).returncode != 0:
        print("docker-check SKIPPED: no Docker engine answers `docker info` here")
        return 0
    base = subprocess.run(["bash", "docker/base.sh", args.base], cwd=ROOT)
    if base.returncode == 3:
        print(f"docker-check SKIPPED: no base image {args.base}, and it cannot be made here (said above)")
        return 0
    if base.returncode != 0:
        return checks.check(False, f"base image {args.base}") or 1
    WORK.mkdir(parents=True, exist_ok=True)

    # -- build: wheelhouse, image (cold: no cache; else with the cache of earlier builds) ---
    wheels, t = timed(
        ["nice", "bash", "docker/wheelhouse.sh", "cpu", args.base, "build/wheelhouse-cpu"], cwd=ROOT
    )
    if not checks.check(wheels.returncode == 0, "wheelhouse build/wheelhouse-cpu", f"{t:.0f} s"):
        return 1
    build = ["nice", "docker", "build", "-q", "-f", "docker/Dockerfile", "--build-arg", f"BASE={args.base}"]
    built, t_build = timed([*build, *(["--no-cache"] if args.cold else []), "-t", IMAGE, "."], cwd=ROOT)
    if not checks.check(built.returncode == 0, "docker build", f"{t_build:.0f} s"):
        return 1
    checks.fact(
        f"build: {t_build:.0f} s, {'cold (--no-cache)' if args.cold else 'with the cache of earlier builds'}"
    )
    size = int(sh(["docker", "image", "inspect", IMAGE, "--format", "{{.Size}}"]).stdout)
    checks.check(size < 2.5e9, "the CPU image is under 2.5 GB", f"{size / 1e9:.2f} GB")
    checks.fact(f"image {IMAGE}: {size / 1e9:.2f} GB")
    listed = sh(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "/opt/venv/bin/python",
            IMAGE,
            "-m",
            "pip",
            "list",
            "--format",
            "freeze",
        ]
    ).stdout.lower()
    cuda = [line for line in listed.splitlines() if line.startswith(("nvidia", "triton"))]
    torch = [line for line in listed.splitlines() if line.startswith("torch==")]
    checks.check(
        not cuda and torch and "+cpu" in torch[0],
        "the image's torch is the CPU build, no nvidia-*/triton",
        ", ".join(torch + cuda),
    )
    check_context(checks, args.base)
    scan_layers(checks, IMAGE)

    # -- the one documented command ------------------------------------------------------
    command = documented(args.readme.read_text())
    header = documented((ROOT / "docker" / "Dockerfile").read_text())
    checks.check(
        bool(command) and command == header,
        f"{args.readme.name} documents the Dockerfile header's docker run command",
        f"README: {command!r}" if command != header else command,
    )
    command = command if command == header else header  # a README that differs has failed above
    if not checks.check(
        USER_OPTION in command and OUT_MOUNT in command, "the command runs as the TA and mounts out/"
    ):
        return 1

    # -- the host's grades --------------------------------------------------------------
    host_db = WORK / "host.sqlite"
    host_db.unlink(missing_ok=True)
    host_run, t_host = timed(
        [sys.executable, "-m", "autograder", "batch", str(CLASS), "--db", str(host_db)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    checks.check(host_run.returncode == 0, "host: batch examples/class", f"{t_host:.1f} s")
    host = gradebook(host_db)

    # -- the TA's command, then as root -----------------------------------------------------
    root = os.geteuid() == 0
    ids = tuple(int(x) for x in args.ids.split(":")) if root else None
    ta = TA(WORK / "ta", ids)
    ta.mkdir_out()
    proc, t_ta = ta.run(command)
    checks.check(
        proc.returncode == 0,
        "container, the documented command (as a TA)",
        f"{t_ta:.1f} s" + (f"\n{proc.stderr[-2000:]}" if proc.returncode else ""),
    )
    compare(checks, "container (--user)", host, ta.home / "out" / "bertlab-gradebook.sqlite")
    warned = [line for line in (proc.stdout + proc.stderr).splitlines() if "matplotlib" in line.lower()]
    checks.check(not warned, "no matplotlib warning under --user (HOME)", "; ".join(warned[:2]))
    checks.fact(f"grading examples/class: host {t_host:.1f} s, container {t_ta:.1f} s (docker run included)")

    as_root = TA(WORK / "root", None)
    as_root.mkdir_out()
    proc, t_root = as_root.run(command.replace(USER_OPTION, ""))
    detail = f"{t_root:.1f} s" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-1500:]}"
    checks.check(
        proc.returncode == 0, "container as root (no --user): grades, or exits non-zero saying why", detail
    )
    if proc.returncode == 0:
        compare(checks, "container as root", host, as_root.home / "out" / "bertlab-gradebook.sqlite")
    doctor, _ = as_root.run(command.replace(USER_OPTION, "") + " doctor")
    checks.check(
        doctor.returncode == 0 and "degraded: unprivileged uid" in doctor.stdout,
        "doctor as root: the uid layer degraded (no CAP_DAC_READ_SEARCH), a child runs",
        next(
            (line for line in doctor.stdout.splitlines() if "unprivileged uid" in line), doctor.stderr[-500:]
        ),
    )

    # -- out/ missing, out/ not mounted (item 5) -----------------------------------------------
    missing = TA(WORK / "no-out", ids)
    proc, _ = missing.run(command)
    said = proc.stderr.strip().splitlines()[-1:] or [""]
    checks.check(
        proc.returncode == 2 and "is not writable by uid" in said[0] and "mkdir -p out" in said[0],
        "out/ missing (Docker makes it, as root): exit 2, what to do",
        said[0],
    )
    shutil.rmtree(missing.home, ignore_errors=True)
    unmounted = TA(WORK / "unmounted", ids)
    proc, _ = unmounted.run(command.replace(OUT_MOUNT, ""))
    said = proc.stderr.strip().splitlines()[-1:] or [""]
    checks.check(
        proc.returncode == 2 and "nothing is mounted on /out" in said[0],
        "no out/ mount: exit 2, what to do",
        said[0],
    )
    shutil.rmtree(unmounted.home)

    # -- feedback through the entry point (item 6) --------------------------------------------
    ta.mkdir_out()
    students = ["ada_correct_matmul", "carol_scale_by_d"]
    # the second as a pattern, quoted as the README says: expanded in the container
    proc, _ = ta.run(command + " feedback /submissions/ada_correct_matmul '/submissions/carol_*'")
    pages = [ta.home / "out" / "feedback" / s / "feedback.html" for s in students]
    noise = [line for line in proc.stderr.splitlines() if "warn" in line.lower()]
    checks.check(
        proc.returncode == 0 and all(p.is_file() for p in pages) and not noise,
        "feedback from the entry point: out/feedback/<student>/feedback.html, no warning",
        proc.stderr[-800:] if proc.returncode else "; ".join(noise[:2]),
    )

    print()
    print(
        f"docker-check: {len(checks.failed)} failed"
        + (f": {', '.join(checks.failed)}" if checks.failed else "")
    )
    for fact in checks.facts:
        print(f"  {fact}")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())

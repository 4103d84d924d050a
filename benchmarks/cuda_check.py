"""Grading on a GPU gives the grades it gives on the CPU: run on a machine with CUDA.

1. The reference on CUDA equals the reference on the CPU, case by case, within the CUDA
   tolerance (``tests/reference/test_cuda_parity.py``).
2. Every promise of the example class (``examples/expected``) holds when the class is
   graded with ``--device cuda`` (``tests/test_examples.py`` with ``BERTLAB_TEST_DEVICE=cuda``).
3. ``batch`` grades the example class on ``cuda`` and on ``cpu`` (same workers, same
   machine): wall times, and every test's score compared between the two gradebooks.

Run: ``.venv/bin/python benchmarks/cuda_check.py [--workers N] [--json PATH]``. Without
CUDA it says so and exits 2. Figures go to ``build/bench/cuda_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLASS = ROOT / "examples" / "class"


def _run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, float, str]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    return proc.returncode, time.monotonic() - t0, proc.stdout + proc.stderr


def _tests(db: Path) -> dict[tuple[str, str, str], float]:
    """(student, stage, test number) -> score."""
    out = {}
    with sqlite3.connect(db) as conn:
        for student, stage, result in conn.execute("SELECT student, stage, result FROM grades"):
            for t in json.loads(result)["tests"]:
                out[(student, stage, t["number"])] = t["score"]
    return out


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "bench" / "cuda_check.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("cuda_check: torch sees no CUDA device here; run it on a GPU machine")
        return 2
    figures: dict = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "workers": args.workers,
    }
    print(f"cuda_check: {figures['gpu']}, torch {figures['torch']}, {figures['cpus']} CPUs")
    py = sys.executable
    ok = True

    rc, s, out = _run(
        [py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/reference/test_cuda_parity.py"]
    )
    figures["parity"] = {
        "rc": rc,
        "seconds": round(s, 1),
        "lines": [ln for ln in out.splitlines() if "tolerance" in ln],
    }
    print(f"\n[1] reference, CUDA vs CPU: rc={rc} in {s:.0f} s")
    print("\n".join(figures["parity"]["lines"]) or out[-3000:])
    ok &= rc == 0

    rc, s, out = _run(
        [
            py,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            str(args.workers),
            "tests/test_examples.py",
        ],
        env={"BERTLAB_TEST_DEVICE": "cuda"},
    )
    figures["examples"] = {"rc": rc, "seconds": round(s, 1), "tail": out.strip().splitlines()[-1:]}
    print(f"\n[2] example-class promises on CUDA: rc={rc} in {s:.0f} s: {out.strip().splitlines()[-1:]}")
    if rc:
        print(out[-4000:])
    ok &= rc == 0

    with tempfile.TemporaryDirectory() as tmp:
        books = {}
        for device in ("cuda", "cpu"):
            db = Path(tmp) / f"{device}.db"
            rc, s, out = _run(
                [
                    py,
                    "-m",
                    "autograder",
                    "batch",
                    str(CLASS),
                    "--db",
                    str(db),
                    "--workers",
                    str(args.workers),
                    "--device",
                    device,
                ]
            )
            figures[f"batch_{device}"] = {"rc": rc, "seconds": round(s, 1)}
            print(f"\n[3] batch of the example class on {device}: rc={rc}, {s:.1f} s, {args.workers} workers")
            if rc:
                print(out[-3000:])
            ok &= rc == 0
            books[device] = _tests(db) if db.exists() else {}
        cuda, cpu = books["cuda"], books["cpu"]
        differ = sorted(k for k in cpu.keys() | cuda.keys() if cpu.get(k) != cuda.get(k))
        figures["batch_compare"] = {"tests": len(cpu), "differ": [list(k) for k in differ]}
        print(f"    {len(cpu)} test scores on cpu, {len(cuda)} on cuda; {len(differ)} differ")
        for k in differ[:20]:
            print(f"      {'/'.join(k)}: cpu {cpu.get(k)}, cuda {cuda.get(k)}")
        ok &= not differ and len(cpu) > 0
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=1))
    print(f"\ncuda_check: {'PASS' if ok else 'FAIL'}; figures: {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

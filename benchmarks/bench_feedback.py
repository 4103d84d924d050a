"""`feedback` against `grade` for the same students, end to end, in the same run.

    .venv/bin/python benchmarks/bench_feedback.py [STUDENT ...] [--repeat 3]

Each student of examples/class/ (default: one with a few wrong matrices and one with many
wrong tensors over four stages) is run through the real command line, alternately
``grade`` and ``feedback --out TMP``, ``--repeat`` times each; the table shows the median
wall time of each, their ratio and how many pictures the page holds. Both commands start
the same way (torch, the fork server, the expected values), so the difference is what the
page costs: the kept arrays and the pictures.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLASS = ROOT / "examples" / "class"
STUDENTS = ("hana_weights_transposed", "walt_bert_on_broken_heads")


def _run(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "autograder", *args], cwd=ROOT, check=True, capture_output=True, text=True
    )
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("students", nargs="*", default=list(STUDENTS))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'student':34} {'grade s':>8} {'feedback s':>11} {'ratio':>6} {'pictures':>9}")
    for student in args.students:
        sub = str(CLASS / student)
        grade, feedback = [], []
        with tempfile.TemporaryDirectory() as out:
            for _ in range(args.repeat):  # alternated, so a slow moment costs both alike
                grade.append(_run(["grade", sub]))
                feedback.append(_run(["feedback", sub, "--out", out]))
            page = next(Path(out).glob("*/feedback.html")).read_text()
        g, f = statistics.median(grade), statistics.median(feedback)
        pictures = len(re.findall(r'<figure class="picture">', page))
        print(f"{student:34} {g:8.2f} {f:11.2f} {f / g:6.2f} {pictures:9d}")


if __name__ == "__main__":
    main()

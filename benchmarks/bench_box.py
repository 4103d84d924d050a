"""What the job box (issue 25, ``autograder/sandbox/jail.py``) costs an honest grade.

One ``Grader`` (one fork server) grades the same honest submissions of one stage (default:
stage 01, the example class's correct ones) in rounds; within a round each submission is
graded once in each mode, in an order that rotates from round to round, so that load and
warm-up fall on every mode alike:

- ``box``: as the grader runs here (namespaces, the read-only view, the cgroup);
- ``box, no cgroup``: the same box without the job's cgroup (what the cgroup costs);
- ``no box``: the process-level sandbox alone (uid, Landlock, seccomp, rlimits, the uid
  sweep), as the grader ran before job boxes (and still runs with
  BERTLAB_ALLOW_WEAK_SANDBOX=1 where no box can be made).

Each figure is the median wall time of ``Grader.grade(submission, [stage])`` per mode; the
ratios are against ``no box``, measured in the same process. Target (issue 25): a warm
stage-01 grade with every layer within 10% of the grade without them.

    .venv/bin/python benchmarks/bench_box.py [--rounds 15] [--stage 01_attention]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.grader.grade import Grader  # noqa: E402
from autograder.grader.runner import Limits  # noqa: E402
from autograder.sandbox import confine, jail  # noqa: E402

HONEST = ("ada_correct_matmul", "grace_correct_einsum")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--stage", default="01_attention")
    args = parser.parse_args()
    found = confine.box_support()
    if found.mode is None:
        sys.exit(f"no job box on this machine: {found.reason}")
    modes = {
        "box": found,
        "box, no cgroup": dataclasses.replace(found, hierarchies=(), v2_kill=""),
        "no box": jail.Support(None, "benchmark: the process-level sandbox alone"),
    }
    os.environ[jail.WEAK_ENV] = "1"  # only this process, only for the "no box" mode
    subs = [ROOT / "examples" / "class" / name for name in HONEST]
    subs = [s for s in subs if (s / f"{args.stage}.py").exists()]
    times: dict[str, list[float]] = {m: [] for m in modes}
    with Grader(limits=Limits(call_s=30.0)) as g:
        for sub in subs:  # warm: the plan, the first children
            for support in modes.values():
                confine._BOX = support
                g.grade(sub, [args.stage])
        names = list(modes)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for sub in subs:
                for mode in order:
                    confine._BOX = modes[mode]
                    t = time.perf_counter()
                    result = g.grade(sub, [args.stage])
                    times[mode].append(time.perf_counter() - t)
                    assert result.score == result.max_score, (mode, sub.name, result.score)
    confine._BOX = found
    base = statistics.median(times["no box"])
    print(
        f"stage {args.stage}, {len(subs)} honest submissions x {args.rounds} rounds, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"box layers here: {found.mode}; cgroups: {', '.join(found.cgroups) or 'none'}")
    for mode, ts in times.items():
        med = statistics.median(ts)
        print(f"  {mode:16s} median {1000 * med:7.1f} ms   ratio {med / base:5.3f}")
    ratio = statistics.median(times["box"]) / base
    print(f"target: box within 10% of no box: {'met' if ratio <= 1.10 else 'MISSED'} ({ratio:.3f})")


if __name__ == "__main__":
    main()

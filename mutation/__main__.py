"""``python -m mutation [STAGE ...]``: mutation testing of the stages' hidden cases.

Exit status: 0 when every stage run passes the gate (no unexplained survivor, score at
least 97 %, every graded name mutated, the equivalents file up to date), 1 when one does
not, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from autograder.stages import stage_ids
from mutation.generate import generate
from mutation.report import summary_markdown, write_stage, write_summary
from mutation.run import EQUIVALENTS, default_workers, load_equivalents, run, stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutation", description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="*", help="stages to run (default: all)")
    parser.add_argument("--workers", type=int, default=min(2, default_workers()), help="grading threads")
    parser.add_argument("--out", type=Path, default=Path("build/mutation"), help="where the reports go")
    parser.add_argument("--equivalents", type=Path, default=EQUIVALENTS, help="the reviewed equivalents")
    parser.add_argument("--only", action="append", metavar="ID", help="grade only these mutants")
    parser.add_argument("--list", action="store_true", help="list the mutants (id, change); grade nothing")
    parser.add_argument("--show", metavar="ID", help="print one mutant's diff and the names it changes")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="give failing tests their counterexamples and count those that say nothing of why",
    )
    args = parser.parse_args(argv)
    known = stage_ids()
    unknown = [s for s in args.stages if s not in known]
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(known)}")
    stages = args.stages or known

    if args.list or args.show:
        for stage in stages:
            for m in generate(stage).mutants:
                if args.show and m.id == args.show:
                    print(f"{m.stage} {m.id}\nchanges: {', '.join(m.affects)}\n{m.diff}")
                    return 0
                if args.list:
                    print(f"{stage}\t{m.id}\t{m.summary}")
        if args.show:
            print(f"no mutant {args.show} in {', '.join(stages)}", file=sys.stderr)
            return 2
        return 0

    t0 = time.monotonic()
    reports = run(
        stages,
        workers=args.workers,
        equivalents=load_equivalents(args.equivalents),
        only=set(args.only) if args.only else None,
        log=stderr,
        on_stage=lambda report: write_stage(report, args.out),
        explain=args.explain,
    )
    write_summary(reports, args.out)
    if args.only:
        graded = {o.mutant.id for r in reports for o in r.outcomes}
        missing = sorted(set(args.only) - graded)
        if missing:
            print(f"not generated in {', '.join(stages)}: {', '.join(missing)}", file=sys.stderr)
            return 2
    print(summary_markdown(reports))
    print(f"reports in {args.out}/ ({time.monotonic() - t0:.0f} s in all)")
    return 1 if any(r.check() for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())

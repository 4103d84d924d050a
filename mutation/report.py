"""Per-stage reports of a mutation run: markdown for people, JSON for tools."""

from __future__ import annotations

import json
from pathlib import Path

from mutation.run import KILLS, TARGET, StageReport


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def stage_markdown(r: StageReport) -> str:
    g = r.generated
    lines = [
        f"# {g.stage}: mutation testing",
        "",
        f"{len(r.outcomes)} mutants: {r.count(*KILLS)} killed ({r.count('timeout')} timed out, "
        f"{r.count('crashed')} crashed), {r.count('equivalent')} equivalent, "
        f"{r.count('survived')} survived. Score {r.score:.1%} (killed / (mutants - equivalent); "
        f"target {TARGET:.0%}). Graded in {r.seconds:.1f} s with {r.workers} worker(s); "
        f"made in {r.generate_seconds:.1f} s.",
        "",
    ]
    problems = r.check()
    if problems:
        lines += ["**Does not pass:**", ""] + [f"- {p}" for p in problems] + [""]
    lines += [
        _row("graded name", "mutants", "killed here", "killed elsewhere", "equivalent", "survived", "score"),
        _row("---", "---:", "---:", "---:", "---:", "---:", "---:"),
    ]
    for name, row in r.by_name().items():
        graded = row["mutants"] - row["equivalent"]
        killed = row["killed"] + row["killed_elsewhere"]
        score = f"{killed / graded:.1%}" if graded else "-"
        lines.append(
            _row(
                f"`{name}`",
                row["mutants"],
                row["killed"],
                row["killed_elsewhere"],
                row["equivalent"],
                row["survived"],
                score,
            )
        )
    lines += [
        "",
        "A mutant counts under every graded name whose code it changes; *killed elsewhere*: it lost",
        "points only on another of those names.",
    ]
    survivors = [o for o in r.outcomes if o.status == "survived"]
    lines += ["", f"## Survivors ({len(survivors)})", ""]
    if not survivors:
        lines.append("None.")
    for o in survivors:
        m = o.mutant
        elsewhere = f"; lost points only on {', '.join(o.lost)}" if o.lost else ""
        lines += [
            f"### `{m.id}`",
            "",
            f"Line {m.line}, changes {', '.join(f'`{a}`' for a in m.affects)}{elsewhere}.",
            "",
            "```diff",
            m.diff,
            "```",
            "",
        ]
    equivalent = [o for o in r.outcomes if o.status == "equivalent"]
    lines += ["", f"## Equivalent ({len(equivalent)}, from mutation/equivalent.toml)", ""]
    lines += [f"- `{o.mutant.id}` ({o.mutant.summary}): {o.why}" for o in equivalent] or ["None."]
    slow = [o for o in r.outcomes if o.status in ("timeout", "crashed")]
    if slow:
        lines += ["", "## Timed out or crashed (counted as killed)", ""]
        lines += [f"- {o.status}: `{o.mutant.id}` {o.mutant.summary}" for o in slow]
    lines += ["", "## Positions not mutated", ""]
    lines += [f"- {why}: {n}" for why, n in sorted(r.generated.skipped.items())] or ["None."]
    return "\n".join(lines) + "\n"


def summary_markdown(reports: list[StageReport]) -> str:
    lines = [
        "# Mutation testing: summary",
        "",
        _row(
            "stage", "mutants", "killed", "timeout", "crashed", "equivalent", "survived", "score", "time (s)"
        ),
        _row("---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:"),
    ]
    for r in reports:
        lines.append(
            _row(
                r.generated.stage,
                len(r.outcomes),
                r.count(*KILLS),
                r.count("timeout"),
                r.count("crashed"),
                r.count("equivalent"),
                r.count("survived"),
                f"{r.score:.1%}",
                f"{r.seconds:.1f}",
            )
        )
    problems = [p for r in reports for p in r.check()]
    lines += ["", "**Passes.**" if not problems else "**Does not pass:**", ""]
    lines += [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def write_stage(r: StageReport, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix, text in (
        (".md", stage_markdown(r)),
        (".json", json.dumps(r.to_json(), indent=1, ensure_ascii=False) + "\n"),
    ):
        path = out / f"{r.generated.stage}{suffix}"
        path.write_text(text)
        written.append(path)
    return written


def write_summary(reports: list[StageReport], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    summary = {"stages": [{k: v for k, v in r.to_json().items() if k != "outcomes"} for r in reports]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    (out / "summary.md").write_text(summary_markdown(reports))
    return [out / "summary.md", out / "summary.json"]

"""Render example students' feedback pages and photograph them in headless Chromium.

    .venv/bin/python scripts/screenshot_feedback.py [--out DIR] [STUDENT...]

Writes DIR/<student>/feedback.html and DIR/<student>/feedback.png (default DIR:
build/feedback-screenshots; students: bob_missing_scale, hana_weights_transposed from
examples/class/). Needs Debian's `chromium` (apt-get install chromium).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLASS = ROOT / "examples" / "class"
STUDENTS = ("bob_missing_scale", "hana_weights_transposed")


def chromium() -> str | None:
    """The Chromium binary on PATH, if any."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(page: Path, png: Path, size: tuple[int, int] = (1200, 2400), timeout: float = 120.0) -> Path:
    """Photograph ``page`` (a local HTML file) into ``png`` with headless Chromium."""
    binary = chromium()
    if binary is None:
        raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="bertlab-chromium-") as profile:
        subprocess.run(
            [
                binary,
                "--headless",
                "--no-sandbox",  # root in a container has no user namespaces for Chromium's own
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={profile}",
                f"--screenshot={png}",
                f"--window-size={size[0]},{size[1]}",
                page.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no screenshot of {page}")
    return png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("students", nargs="*", default=list(STUDENTS))
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "feedback-screenshots")
    parser.add_argument("--stage", action="append", help="stage id(s); default: those the student holds")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from autograder.grader.feedback import write_html
    from autograder.grader.grade import Grader
    from autograder.runtime.submission import Submission
    from autograder.stages import stage_ids

    with Grader(keep_arrays=True) as grader:
        for student in args.students:
            submission = CLASS / student
            result = grader.grade(submission, Submission(submission).stages(stage_ids(), args.stage))
            page = write_html(result, args.out / student / "feedback.html")
            png = screenshot(page, page.with_suffix(".png"))
            print(f"{student}: {result.score:g}/{result.max_score:g} -> {page} -> {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

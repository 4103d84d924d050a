"""bertlab's grades into nbgrader's own gradebook, through nbgrader's API.

Each stage is an nbgrader assignment with one notebook of the same name; each bertlab
test (a graded name on a group of cases) is a grade cell worth its points. A grade sets
``auto_score`` only, as nbgrader's ``SaveAutoGrades`` does, so manual grades and comments
an instructor entered in formgrader survive a re-export. ``nbgrader export`` and
formgrader then show bertlab's grades per grade cell.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from typing import Any

from autograder.stages.spec import Graded, StageSpec, Test


def grade_cell_name(graded: Graded, test: Test) -> str:
    """The grade cell of one bertlab test: ``softmax: float32, vectors and batches``."""
    return f"{graded.name}: {test.group}"


def _declare(gb: Any, spec: StageSpec) -> None:
    gb.update_or_create_assignment(spec.id)
    gb.update_or_create_notebook(spec.id, spec.id)
    for graded in spec.graded:
        for test in graded.tests:
            gb.update_or_create_grade_cell(
                grade_cell_name(graded, test), spec.id, spec.id, max_score=test.points, cell_type="code"
            )


def export(rows: Iterable[dict[str, Any]], db_url: str) -> int:
    """Write ``rows`` (bertlab gradebook rows: student, stage, result JSON) into the nbgrader
    gradebook at ``db_url`` (e.g. ``sqlite:///gradebook.db``). Returns the grades written."""
    from nbgrader.api import Gradebook

    from autograder.grader.batch import FAILED
    from autograder.stages import load_spec

    # an error row is no grade (the grader failed on it): nbgrader keeps what it had
    rows = [r for r in rows if not str(r.get("fingerprint", "")).startswith(FAILED)]
    written = 0
    # nbgrader creates a new gradebook by running the `alembic` script installed beside
    # this interpreter; find it even when the environment is not activated
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    with Gradebook(db_url) as gb:
        for stage in sorted({r["stage"] for r in rows}):
            _declare(gb, load_spec(stage))
        for row in rows:
            spec = load_spec(row["stage"])
            gb.update_or_create_student(row["student"])
            gb.update_or_create_submission(spec.id, row["student"])
            by_name = {(t["function"], t["group"]): t for t in json.loads(row["result"])["tests"]}
            for graded in spec.graded:
                for test in graded.tests:
                    got = by_name.get((graded.name, test.group))
                    grade = gb.find_grade(grade_cell_name(graded, test), spec.id, spec.id, row["student"])
                    grade.auto_score = got["score"] if got is not None else 0.0
                    written += 1
            gb.db.commit()
    return written

from __future__ import annotations

import pytest

from autograder.grade import Grader
from autograder.runner import Limits
from tests.support import CALL_S, DEVICE


@pytest.fixture(scope="module")
def grader():
    """One grader (one fork server, expected values computed once) per test module."""
    with Grader(device=DEVICE, limits=Limits(call_s=CALL_S, cell_s=5.0, submission_s=60.0)) as g:
        yield g

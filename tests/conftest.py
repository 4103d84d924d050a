from __future__ import annotations

import os

# `make test` runs two workers on two cores: each worker, and every kernel and child a test
# starts, gets one torch thread (as the grader's children and `batch` have). With torch's
# default pool the threads wait for each other's cores: stage 10's notebook (its demo trains
# a model) took 258 s in a kernel beside one busy core, 10 s on one thread. Set before torch
# loads here; the workers and every child inherit it. A value already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, is_hypothesis_test, settings

from tests.support import CALL_S, DEVICE

# Property tests must not make CI flaky. "ci" (the default, what `make test` runs) draws the
# same examples on every run and every machine, and keeps no example database that would
# replay one machine's failures on the next run; no limit or health check depends on timing
# (two shared cores). "explore" (`make explore`) draws new examples each run, EXPLORE_FACTOR
# times as many, and keeps its failures in .hypothesis/ to replay them. HYPOTHESIS_PROFILE
# picks one. The profile is loaded here, before any test module is imported, because
# @settings(...) copies the profile that is current when its module is imported.
EXPLORE_FACTOR = 10
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=100,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    derandomize=False,
    max_examples=100 * EXPLORE_FACTOR,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    """A marker per stage, ``stageNN`` (``pytest -m stage03``), derived from the stage ids:
    a stage that `new-stage` adds has its marker with no list to edit."""
    from autograder.stages import stage_ids  # instant: no spec (and no torch) loads

    for stage in stage_ids():
        config.addinivalue_line("markers", f"stage{stage[:2]}: stage {stage}")


def pytest_collection_modifyitems(items):
    """Under "explore", a test's own @settings(max_examples=N) (its cost relative to the
    others) runs EXPLORE_FACTOR * N examples: otherwise N would override the profile and
    exploring would draw no more examples than CI."""
    if settings.get_current_profile_name() != "explore":
        return
    scaled = set()
    for item in items:
        fn = getattr(item, "obj", None)
        if fn is None or not is_hypothesis_test(fn) or id(fn) in scaled:
            continue  # the parametrized copies of one test share its function
        scaled.add(id(fn))
        # where @given keeps the test's settings (hypothesis has no public setter)
        own = fn._hypothesis_internal_use_settings
        fn._hypothesis_internal_use_settings = settings(own, max_examples=own.max_examples * EXPLORE_FACTOR)


@pytest.fixture(scope="module")
def grader():
    """One grader (one fork server, expected values computed once) per test module."""
    # imported here: a process that loads only the profiles above need not load torch
    from autograder.grader.grade import Grader
    from autograder.grader.runner import Limits

    with Grader(device=DEVICE, limits=Limits(call_s=CALL_S, cell_s=5.0, submission_s=60.0)) as g:
        yield g

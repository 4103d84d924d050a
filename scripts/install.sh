#!/usr/bin/env bash
# The one list of install commands. The Makefile (.venv, with the dev tools), the
# Gradescope autograder's setup.sh and docker/Dockerfile all run this script, so the
# three environments cannot drift apart.
#
# usage (from the project root): scripts/install.sh PYTHON [REQUIREMENTS [--packages-only]]
#   PYTHON        the interpreter to install into (a venv's python)
#   REQUIREMENTS  requirements.txt (the grading runtime: Gradescope, Docker),
#                 requirements-instructor.txt (it, and the instructors' notebook tools) or
#                 requirements-dev.txt (both, and tests, lint and benchmarks: make)
set -euo pipefail
py=$1
req=${2:-requirements.txt}
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet -r "$req"
# each needs nothing beyond requirements.txt; their declared dependencies would pull in
# stacks we never import (see requirements-nodeps.txt)
"$py" -m pip install --quiet --no-deps -r requirements-nodeps.txt
# --packages-only: the pinned packages and nothing of the project (docker/Dockerfile's first
# layer: kept while the pins are the same, whatever the code does)
[ "${3:-}" != --packages-only ] || exit 0
"$py" -m pip install --quiet --no-deps --no-build-isolation -e .
# the notebooks' kernel, where the instructors' tools are installed (a grader has none)
if "$py" -c "import ipykernel" 2>/dev/null; then
    "$py" -m ipykernel install --sys-prefix --name python3 >/dev/null
fi
# What every grading run would otherwise redo at its start (each Gradescope container
# starts from this image): compile the code, and compute every stage's expected values
# into expected/ (autograder/grader/expected.py; beside the code, where no child reads).
# Values shipped there (the Gradescope zip's) are checked against this machine's own
# reference, bit for bit, and replaced where they differ.
"$py" -m compileall -q autograder reference
if built=$("$py" -m autograder.grader.expected build --verify); then
    grep "replaced" <<<"$built" >&2 || true
else
    echo "install.sh: expected values not stored: each grading run computes them" >&2
fi

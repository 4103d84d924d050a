#!/usr/bin/env bash
# The one list of install commands. The Makefile (.venv, with the dev tools), the
# Gradescope autograder's setup.sh and docker/Dockerfile all run this script, so the
# three environments cannot drift apart.
#
# usage (from the project root): scripts/install.sh PYTHON [REQUIREMENTS [--packages-only]]
#   PYTHON        the interpreter to install into (a venv's python)
#   REQUIREMENTS  requirements.txt (the grader's runtime: Gradescope, Docker) or
#                 requirements-dev.txt (which adds tests, lint and benchmarks: make)
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
"$py" -m ipykernel install --sys-prefix --name python3 >/dev/null

"""What ships to students and runs in their kernel, and in the sandboxed child.

This folder is the student bundle's runtime (``python -m autograder release`` ships it
with ``autograder/selfcheck.py`` and ``autograder/parts.py``, which re-export it). It
holds no reference code, no stage spec and no hidden case, and imports nothing outside
itself from bertlab: the release's import guard and tests/test_architecture.py check it.
"""

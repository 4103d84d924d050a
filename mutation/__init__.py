"""Mutation testing of the hidden cases (issue 17): does every plausible mistake lose points?

Each stage's reference is mutated (cosmic-ray's operators and ours, ``operators.py``),
each mutant is graded as a student submission through the real pipeline (one ``Grader``:
fork server, sandboxed child, public then hidden cases), and the survivors are listed
for review. ``python -m mutation [STAGE ...]`` or ``make mutation ARGS=...``; reports go
to ``build/mutation/``. A development tool: the grader never imports it.
"""

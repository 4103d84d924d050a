"""The trusted grader: it holds the reference, the stage specs and the expected values,
starts the fork server, scores what the children return and writes every output.

Nothing here ships to students or runs in the child (tests/test_architecture.py).
"""

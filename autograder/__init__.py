"""bertlab's autograder.

Importing this package does no work and imports neither the reference nor the stage
specs: the child process that runs student code imports ``autograder.child`` (and
through it ``harness``, ``wire``), and the student's self-check imports
``autograder.selfcheck``; neither may see hidden material.
"""

__version__ = "0.1.0"

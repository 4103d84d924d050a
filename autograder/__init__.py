"""bertlab's autograder. Its folders are its trust zones:

- ``runtime/``: what ships to students and runs in their kernel (the self-check, the call
  protocol, the forbidden-call detector, the comparison, the drivers, the results model);
  the sandboxed child runs it too. It is the student bundle's ``autograder`` package.
- ``sandbox/``: the untrusted side and its jail: the fork server, the child that runs a
  submission, and the confinement applied to it. It never imports the grader.
- ``grader/``: the trusted grader: expected values, scoring, the parent side of the
  process boundary, and every output (results files, Gradescope, HTML, the gradebook).
- ``stages/``: the stage specs (hidden cases, variants, points): trusted data.

``autograder.selfcheck`` and ``autograder.parts`` are the two names student notebooks
import; they re-export the runtime. Importing this package does no work, and neither
``runtime`` nor ``sandbox`` ever imports ``reference``, a stage spec or the grader
(tests/test_architecture.py).
"""

__version__ = "0.1.0"

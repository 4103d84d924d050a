"""``from autograder.parts import load_stage``: a student's own earlier stages, under the
name their notebooks import (in Jupyter and in the grading child alike). The code is
``autograder.runtime.parts``."""

from autograder.runtime.parts import load_stage

__all__ = ["load_stage"]

"""``from autograder.selfcheck import check``: the notebook self-check, under the name every
student notebook imports. The code is ``autograder.runtime.selfcheck``."""

from autograder.runtime.selfcheck import Report, check, find_data

__all__ = ["Report", "check", "find_data"]

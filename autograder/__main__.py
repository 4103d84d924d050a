import sys

from autograder.grader.launch import early

early(sys.argv[1:])  # a grading command's fork server imports torch while the CLI loads
from autograder.grader.cli import main  # noqa: E402

main()

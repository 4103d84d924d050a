from autograder.grader.cli import main

main()

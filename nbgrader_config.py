# nbgrader's course layout for bertlab: solutions/ is the source, assignments/ the release.
# `python -m autograder generate` (make generate) drives nbgrader's generate_assignment with
# this file, and so can `nbgrader generate_assignment 01_attention --no-db` by hand.
c = get_config()  # noqa: F821  (nbgrader's config loader provides it)

c.CourseDirectory.root = "."
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "assignments"
c.GenerateAssignment.no_database = True
c.SaveCells.enabled = False  # what --no-db also sets: no gradebook.db, no alembic run
# The stub a student finds in place of each solution region; the grader reports a
# NotImplementedError as "not implemented yet", never as a crash.
c.ClearSolutions.code_stub = {"python": '# YOUR CODE HERE\nraise NotImplementedError("not implemented yet")'}

# ruff: noqa
"""ATTACK gpt_earlier_stage_symlink (class: symlinks in the submission: an earlier stage).

Intent: have the grader run the reference instead of the student's own earlier stage:
beside an honest 10_gpt.py, this submission's 01_attention.py is a symbolic link to the
hidden reference of stage 01 (reference/01_attention.py; made by the suite from LINK).
If the loader followed it, the reference's attention would run inside this GPT and its
text could be printed back.

Expected: 0 for every graded name (the 10_gpt.py loads its 01_attention at import, and a
linked file is refused: load_stage raises, so nothing is defined); the reference's text
in no result.
"""

# __HONEST__

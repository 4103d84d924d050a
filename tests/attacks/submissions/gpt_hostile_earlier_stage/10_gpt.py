# ruff: noqa
"""ATTACK gpt_hostile_earlier_stage (class: a hostile earlier stage, run through load_stage).

Intent: attack from a file the grader does not grade but runs: stage 10 loads the
student's own 01_attention (load_stage), and this submission's 01_attention.py, beside an
honest 10_gpt.py, does at import what a graded file cannot get away with: it forges a
results file for the bystander graded after it and for itself, writes files outside its
work dir (/tmp, /dev/shm, the grader's source directory), starts a daemon that outlives
its child (double fork, setsid) to rewrite results later, and reads the stage's reference
and expected values to print them. Its attention functions are honest.

Expected: full marks (the honest 10_gpt.py and 01_attention.py); no forged result, no
file outside, no daemon left, the reference's text in no result.
"""

# __HONEST__

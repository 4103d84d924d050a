# ruff: noqa
"""ATTACK gpt_load_stage_hunt (class: hunting through load_stage: the reference, the
solutions, a classmate's files).

Intent: load someone else's code as an "earlier stage". load_stage is handed traversal and
absolute names (../../reference/10_gpt, the solutions' notebook, a classmate's folder),
then, with the grading child's list of provided files switched off
(autograder.runtime.parts._provided = None, so that load_stage reads the disk as it does
in a student's kernel), asked for 10_gpt where= the reference, the solutions, the
bystander graded beside it; `import reference` and the expected values are tried too.
filter_logits is taken from the first module found; without one it returns zeros.

Expected: filter_logits 0 (load_stage serves only this submission's own files; Landlock
lets the child read no repository and no classmate), everything else full marks.
"""

import importlib
import sys
import types

# __HONEST__

REPO = "__REPO__"
SUBS = "__SUBS__"
FOUND = []


def _hunt():
    from autograder.runtime import parts

    names = (
        "../../reference/10_gpt",
        f"{REPO}/reference/10_gpt",
        f"{REPO}/solutions/10_gpt/10_gpt",
        f"{SUBS}/bystander_10/10_gpt",
        "../bystander_10/10_gpt",
    )
    for name in names:
        try:
            FOUND.append(parts.load_stage(name))
        except BaseException as exc:
            print(f"load_stage({name!r}): {type(exc).__name__}")
    parts._provided = None
    for where in (f"{REPO}/reference", f"{REPO}/solutions/10_gpt", f"{SUBS}/bystander_10"):
        try:
            FOUND.append(parts.load_stage("10_gpt", where))
        except BaseException as exc:
            print(f"load_stage('10_gpt', {where!r}): {type(exc).__name__}")
    sys.path.insert(0, REPO)
    for module in ("reference.10_gpt", "solutions"):
        try:
            FOUND.append(importlib.import_module(module))
        except BaseException as exc:
            print(f"import {module}: {type(exc).__name__}")


_hunt()
# sample keeps the honest filter_logits (its globals, but that one name)
sample = types.FunctionType(
    sample.__code__, {**globals(), "filter_logits": filter_logits}, "sample", sample.__defaults__
)
_stolen = next((getattr(m, "filter_logits") for m in FOUND if hasattr(m, "filter_logits")), None)


def filter_logits(logits, temperature=1.0, top_k=0, top_p=1.0):
    if _stolen is not None:
        return _stolen(logits, temperature, top_k, top_p)
    return torch.zeros_like(logits)

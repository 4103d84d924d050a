"""Helpers shared by the test modules."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_py(directory: Path, stage: str, code: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stage}.py").write_text(code)
    return directory


def no_process_left(marker: str, timeout: float = 5.0) -> bool:
    """True when no process whose command line contains ``marker`` is alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if marker.encode() in (p / "cmdline").read_bytes():
                        alive.append(int(p.name))
                except OSError:
                    pass
        if not alive:
            return True
        time.sleep(0.1)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return False

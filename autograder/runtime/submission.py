"""Where a student's stage files are: the one place that knows a submission's layout.

A submission is a folder holding ``NN_name.ipynb`` or ``NN_name.py`` per stage, each
either in the folder itself (a flat hand-in, a Gradescope upload) or in its own
``NN_name/`` sub-folder (nbgrader's ``submitted/<student>/<stage>/``, stage folders side
by side), or a single such file. The grader (one student or a class), Gradescope, the
batch's fingerprints and, in a student's kernel, ``load_stage`` all ask this class.

It runs on both sides: the trusted grader reads the files it finds, so a link is refused
(a submission must not make the grader read the reference, a solution or another
student's work); in the student's own kernel ``Submission.beside`` finds their notebooks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from autograder.runtime.load import MAX_FILE_BYTES, LoadError

UPLOAD_DEPTH = 4  # how deep a zipped upload may hide its folder of stage files


SUFFIXES = (".ipynb", ".py")  # what a stage file may be


def _names(stage: str) -> tuple[str, str]:
    return f"{stage}.ipynb", f"{stage}.py"


@dataclass(frozen=True)
class Submission:
    path: Path  # the folder (or the one file) handed in

    @property
    def name(self) -> str:
        """The student's name, as the folder (or file) is called."""
        return self.path.name if self.path.is_dir() else self.path.stem

    @property
    def folder(self) -> Path:
        """Where the stage files are: the folder handed in, or the one file's folder."""
        return self.path if self.path.is_dir() else self.path.parent

    def file(self, stage: str) -> Path | None:
        """``stage``'s file: the submission itself if it is a file, else the stage's file in
        the folder or in its ``stage/`` sub-folder; None when there is none. A stage folder
        that is a link raises ``LoadError`` (a file that is one is refused when read)."""
        if self.path.is_symlink():
            return self.path
        if self.path.is_file():
            # a single file is graded as whichever stage is asked for; one that is neither a
            # notebook nor Python is no stage's file (``nothing_found`` says so, once)
            return self.path if self.path.suffix in SUFFIXES else None
        for where in (self.path, self.path / stage):
            for name in _names(stage):
                candidate = where / name
                if candidate.exists() or candidate.is_symlink():
                    if where != self.path and where.is_symlink():
                        raise LoadError(f"{where.name}/ is a symbolic link; submit the folder itself")
                    return candidate
        return None

    def holds(self, stage: str) -> bool:
        """Whether it holds a file for ``stage`` (one that cannot be read counts: graded,
        the student reads why it cannot be)."""
        try:
            return self.file(stage) is not None
        except LoadError:
            return True

    def nothing_found(self, stages: Sequence[str], holds: Callable[[str], bool] | None = None) -> str | None:
        """What to say, once, when it holds no file of any of ``stages``: what it holds
        instead and which names were expected. None when it holds one. ``holds``: how that
        is known (default ``Submission.holds``; the grader's ``Jobs`` knows already)."""
        if any(map(holds or self.holds, stages)):
            return None
        if len(stages) == 1:
            expected = f"expected {stages[0]}.ipynb or {stages[0]}.py"
        else:
            expected = (
                f"expected one of {', '.join(f'{s}.ipynb' for s in stages)} (or the same names ending in .py)"
            )
        if self.path.is_file():
            return (
                f"no stage file was handed in: {self.path.name} is neither a notebook (.ipynb) nor a "
                f"Python file (.py); {expected}. Every stage scores 0."
            )
        try:
            shown = sorted(p.name + "/" * p.is_dir() for p in self.path.iterdir() if p.name[:1] != ".")
        except OSError:
            shown = []
        holds = ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
        return (
            f"no stage file found in the submission ({f'it holds {holds}' if shown else 'it is empty'}); "
            f"{expected}, in the folder itself or each in its own stage folder "
            f"({stages[0]}/{stages[0]}.ipynb). Every stage scores 0."
        )

    def stages(self, known: Sequence[str], asked: Sequence[str] | None = None) -> list[str]:
        """The stages to grade: those asked for, else those it holds (one holding none is
        graded on all ``known``, so that each says its file is missing)."""
        if asked:
            return list(asked)
        if self.path.is_file() and self.path.stem in known:
            return [self.path.stem]
        if self.path.is_dir():
            return [s for s in known if self.holds(s)] or list(known)
        return list(known)

    def earlier(
        self, stage: str, graded: Path, of: str, find: Callable[[Submission, str], Path | None] | None = None
    ) -> Path | None:
        """The file of ``stage``, an earlier stage that ``of`` runs (its file: ``graded``):
        in this submission, else, when the folder handed in is ``of``'s own stage folder,
        beside it (the student's other stage folders, where ``load_stage`` finds them in
        Jupyter). None when missing, or when it is ``graded`` itself. ``find``: how a
        folder's file of a stage is found (default ``Submission.file``; the grader's
        ``Jobs`` finds each once)."""
        find = find or Submission.file
        found = find(Submission(self.folder), stage)
        if found is None and self.folder.name == of:
            found = find(Submission(self.folder.parent), stage)
        return None if found == graded else found

    def fingerprint(self, stages: Iterable[str]) -> str:
        """A hash of ``stages``' files (a stage and the earlier ones it runs): what a grade
        depends on. A file over the loader's limit counts by its size: it is refused
        whatever it holds, and reading it could exhaust memory."""
        digest = hashlib.sha256()
        for s in stages:
            try:
                path = self.file(s)
            except LoadError:
                path = None
            digest.update(s.encode() + b"\0")
            if path is not None and path.is_file() and not path.is_symlink():
                size = path.stat().st_size
                digest.update(path.read_bytes() if size <= MAX_FILE_BYTES else f"{size} bytes".encode())
            digest.update(b"\0")
        return digest.hexdigest()

    @classmethod
    def upload(cls, folder: Path, stages: Sequence[str]) -> Submission:
        """A Gradescope upload: the folder itself or (breadth first) the folder a student
        zipped that holds one of ``stages``. Links are not followed; macOS' ``__MACOSX``
        and hidden folders are skipped."""
        level = [folder]
        for _ in range(UPLOAD_DEPTH):
            for d in level:
                if any(cls(d).holds(s) for s in stages):
                    return cls(d)
            level = [
                sub
                for d in level
                for sub in sorted(d.iterdir())
                if sub.is_dir() and not sub.is_symlink() and not sub.name.startswith((".", "__MACOSX"))
            ]
        return cls(folder)

    @staticmethod
    def beside(stage: str, where: Path) -> Path:
        """In the student's kernel: their file of ``stage`` beside the notebook in ``where``,
        in ``../stage/`` (stage folders side by side, as released) or in ``stage/``."""
        for folder in (where, where.parent / stage, where / stage):
            for name in _names(stage):
                if (folder / name).is_file():
                    return folder / name
        raise ImportError(
            f"cannot find your {stage} notebook: looked for {stage}.ipynb or {stage}.py in {where} "
            f"and in {where.parent / stage}. Keep the stage folders side by side, as released."
        )

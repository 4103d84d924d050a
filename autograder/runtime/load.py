"""From a submission on disk to the Python source the child runs (trusted, parses only).

A stage's file is ``NN_name.ipynb`` or ``NN_name.py``. A notebook's code cells run in
order, as a kernel would: cells tagged ``skip-grading`` are left out, a line magic or
``!`` line becomes a call to a ``get_ipython()`` stand-in that does nothing (the rest of
the cell still runs), and a cell magic that is not Python (``%%bash``, ``%%writefile``...)
skips its cell. Stored outputs and metadata are ignored; nbformat 3 is upgraded.

All of this runs in the grader itself, before any time limit applies, on bytes a student
chose. So every step is linear in its input, and the input has limits that no notebook
Jupyter saves comes near (a stage's solution runs 2-8 KB of code, in a 20-35 KB file):

- the file is read a chunk at a time and only the code cells' source, type and tags are
  kept: outputs (images, printed tensors, tables), attachments and metadata cost the time
  to read past them and no memory, up to ``MAX_FILE_BYTES``;
- at most ``MAX_CODE_CHARS`` of code is run, in at most ``MAX_CELLS`` cells, with at most
  ``MAX_IPYTHON_LINES`` magic, ``!`` or ``?`` lines;
- JSON is read in bulk (regular expressions over whole runs of bytes); what must be looked
  at one value at a time (keys, cells, deeply nested outputs) is limited to
  ``MAX_JSON_STEPS`` values, and nesting to ``MAX_JSON_DEPTH``, as Python's own json;
- an object read key by key (the notebook, a worksheet, a cell, a cell's metadata) that
  repeats a key is refused: Jupyter keeps the key's last value, and what is graded must be
  what Jupyter shows.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

# Reading past outputs costs up to ~50 ns a byte (a file of nothing but tiny JSON values): the
# file's size is what bounds the time. nbgrader itself ignores files over 100 MB.
MAX_FILE_BYTES = 128 << 20
MAX_CODE_CHARS = 1 << 20  # over 100 times the largest solution's
MAX_CELLS = 10_000
MAX_IPYTHON_LINES = 10_000
MAX_JSON_STEPS = 200_000  # a notebook of 10,000 cells needs about half
MAX_JSON_DEPTH = 1000
SKIP_TAG = "skip-grading"
# Cell magics whose body is Python: the body runs once, the magic is dropped.
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun"}


class LoadError(Exception):
    """The file cannot be graded at all; the message is for the student."""


@dataclass
class Source:
    path: Path
    cells: list[tuple[str, str]]  # (label shown to the student, Python source)
    module_name: str
    notes: list[str] = field(default_factory=list)
    heads: list[str] = field(default_factory=list)  # each cell's first line, as the student wrote it

    @staticmethod
    def definition_pattern(name: str) -> str:
        """A ``re.MULTILINE`` pattern for a line that starts ``def name`` or ``class name``.

        Its whitespace never crosses a line: ``^\\s*`` would scan every blank line that
        follows each line start, quadratic in the blank lines of a cell."""
        return rf"^[^\S\n]*+(?:def|class)[^\S\n]++{re.escape(name)}\b"


def defines(source: str, name: str) -> bool:
    """Whether a line of ``source`` starts the definition of ``name``; linear in ``source``."""
    return re.search(Source.definition_pattern(name), source, re.MULTILINE) is not None


def _mb(n: int) -> str:
    return f"{n >> 20} MB"


def _first_code_line(src: str) -> str:
    lines = [line.strip() for line in src.split("\n") if line.strip()]
    return next((line for line in lines if not line.startswith("#")), lines[0] if lines else "")


def _open(path: Path, max_bytes: int, too_large: LoadError) -> BinaryIO:
    """The file, opened without following a link and without blocking on a FIFO, so that
    what is checked is what is read."""
    if path.is_symlink():
        raise LoadError(f"{path.name} is a symbolic link; submit the file itself")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise LoadError(f"{path.name} cannot be read ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise LoadError(f"{path.name} is not a regular file")
    if info.st_size > max_bytes:
        os.close(fd)
        raise too_large
    return os.fdopen(fd, "rb")


def _not_text(name: str, suffix: str, reason: str, at: int) -> LoadError:
    what = "a Jupyter notebook" if suffix == ".ipynb" else "a Python file"
    return LoadError(
        f"{name} is not {what}: it is not text ({reason} at byte {at}). Submit the file that Jupyter saved."
    )


def _too_much_code(name: str) -> LoadError:
    return LoadError(
        f"{name} has more than {_mb(MAX_CODE_CHARS)} of code to run (the grader's limit): remove pasted "
        f"data or printed output from code cells, or tag such cells {SKIP_TAG}"
    )


def _read_py(path: Path) -> str:
    # a character is at most 4 bytes: a larger file holds more code than the limit
    with _open(path, 4 * MAX_CODE_CHARS, _too_much_code(path.name)) as f:
        data = f.read(4 * MAX_CODE_CHARS + 1)
    if len(data) > 4 * MAX_CODE_CHARS:
        raise _too_much_code(path.name)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_text(path.name, path.suffix, exc.reason, exc.start) from None
    if len(text) > MAX_CODE_CHARS:
        raise _too_much_code(path.name)
    return text


# -- the notebook's JSON, read a chunk at a time ----------------------------------------------

_CHUNK = 1 << 20
_WS = re.compile(rb"[ \t\n\r]*+")
_STRING = rb'"(?:[^"\\]++|\\[\s\S])*+"'
_STRING_RE = re.compile(_STRING)
_STRING_BODY = re.compile(rb'(?:[^"\\]++|\\[\s\S])*+')
_PLAIN_STRING = re.compile(rb'"[^"\\\x00-\x1f]*+"')  # no escape, no raw control character
_SCALAR = re.compile(
    rb"-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][-+]?[0-9]++)?+|true|false|null|NaN|Infinity|-Infinity"
)
_SCALAR_WINDOW = 1 << 10  # a number the reader must parse (nbformat's) fits in this
# The keys the grader reads: each is spelled in at most 60 bytes, every character escaped, so
# a key spelled in more than _KEY_BYTES is none of them, read past and not compared. An
# object's repeated key is found by holding its keys; past _KEYS_HELD of them (an object
# Jupyter saves has a dozen), only these are held, so memory stays bounded whatever the file.
_READ_KEYS = frozenset("cells worksheets nbformat cell_type metadata source input tags".split())
_KEY_BYTES = 64
_KEYS_HELD = 1000


def _nested(levels: int) -> bytes:
    """Any JSON text whose arrays and objects nest at most ``levels`` deep, to be matched in
    one call: outputs' lists of lines and objects cost no Python step per item."""
    item = rb'[^"\[\]{}]++|' + _STRING
    for _ in range(levels):
        item = rb'[^"\[\]{}]++|' + _STRING + rb"|[\[{](?:" + item + rb")*+[\]}]"
    return item


_NESTING = 4
_CONTENT = re.compile(rb"(?:" + _nested(_NESTING) + rb")*+")
_CONTAINER = re.compile(rb"[\[{](?:" + _nested(_NESTING - 1) + rb")*+[\]}]")
_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))
_QUOTE, _COLON, _COMMA = ord('"'), ord(":"), ord(",")
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = ord("{"), ord("}"), ord("["), ord("]")
_OPENERS = {_LBRACE, _LBRACKET}
_PAIR = {_RBRACE: _LBRACE, _RBRACKET: _LBRACKET}
_NUMBER_START = frozenset(b"-0123456789NI")


def _chars(data: bytes, start: int, end: int) -> int:
    """Characters in ``data[start:end]``, valid UTF-8: its bytes that start one."""
    part = data[start:end]
    return len(part) if part.isascii() else len(part.translate(None, _CONTINUATION_BYTES))


class _Reader:
    """JSON values from a stream of bytes, read ``chunk`` bytes at a time.

    ``buf[pos:]`` is what is not read yet; what is read is dropped at the next chunk, so
    memory holds one chunk and the few values the caller keeps. Values are read with
    ``members`` and ``items`` (the caller reads or ``skip``s each value) or ``string``;
    everything skipped is only checked for what delimits it (strings and brackets).
    """

    def __init__(self, stream: BinaryIO, name: str, chunk: int = _CHUNK) -> None:
        self.stream, self.name, self.chunk = stream, name, chunk
        self.buf = b""
        self.pos = 0
        self.eof = False
        self.read = 0  # bytes read from the stream
        self.lines = 0  # newlines in the bytes dropped from buf
        self.column = 0  # characters after the last of them
        self.steps = 0
        self.depth = 0
        self.utf8 = codecs.getincrementaldecoder("utf-8")()

    # -- bytes -------------------------------------------------------------------------------

    def fill(self) -> bool:
        """Append the next chunk to the unread bytes; False at the end of the stream."""
        if self.eof:
            return False
        data = self.stream.read(self.chunk)
        if self.read + len(data) > MAX_FILE_BYTES:
            raise LoadError(f"{self.name} is larger than {_mb(MAX_FILE_BYTES)}")
        pending = len(self.utf8.getstate()[0])
        try:
            self.utf8.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise _not_text(self.name, ".ipynb", exc.reason, self.read - pending + exc.start) from None
        self.read += len(data)
        if not data:
            self.eof = True
            return False
        if self.pos:
            newlines = self.buf.count(b"\n", 0, self.pos)
            if newlines:
                self.lines += newlines
                self.column = _chars(self.buf, self.buf.rfind(b"\n", 0, self.pos) + 1, self.pos)
            else:
                self.column += _chars(self.buf, 0, self.pos)
            self.buf = self.buf[self.pos :]
            self.pos = 0
        self.buf += data
        return True

    def ensure(self, n: int) -> None:
        while len(self.buf) - self.pos < n and self.fill():
            pass

    def where(self, at: int | None = None) -> tuple[int, int]:
        """(line, column) of ``buf[at]``, counted as Python's json does."""
        at = self.pos if at is None else at
        last = self.buf.rfind(b"\n", 0, at)
        line = self.lines + self.buf.count(b"\n", 0, at) + 1
        column = _chars(self.buf, last + 1, at) if last >= 0 else self.column + _chars(self.buf, 0, at)
        return line, column + 1

    def error(self, reason: str, where: tuple[int, int] | None = None) -> LoadError:
        line, column = where or self.where()
        return LoadError(
            f"{self.name} is not a valid notebook: invalid JSON at line {line} column {column} "
            f"({reason}). Was it saved completely?"
        )

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_JSON_STEPS:
            raise LoadError(
                f"{self.name} has more JSON structure than a notebook Jupyter saves (over {MAX_JSON_STEPS:,} "
                "cells, fields, tags and nested values): clear its outputs and save it again"
            )

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_JSON_DEPTH:
            raise LoadError(f"{self.name} is not a Jupyter notebook: its JSON is nested too deeply")

    def peek(self) -> int:
        """The next byte that is not whitespace (not consumed), or -1 at the end."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return -1

    def end(self) -> None:
        if self.peek() != -1:
            raise self.error("Extra data")

    # -- values ------------------------------------------------------------------------------

    def string(self, keep: int = 0) -> str | None:
        """The string at ``pos``: its value if the file spells it in at most ``keep`` bytes,
        else None (read past, never held)."""
        start = self.pos
        whole = _STRING_RE.match(self.buf, start)
        if whole:
            self.pos = whole.end()
            size = self.pos - start - 2
            if size > keep:
                return None
            if _PLAIN_STRING.fullmatch(self.buf, start, self.pos):  # what json.loads would return
                return self.buf[start + 1 : self.pos - 1].decode()
            return self._decode(self.buf[start : self.pos], start)
        # it ends beyond the bytes read so far (an image, a long output): memchr-fast where it
        # has no escapes
        where = self.where(start)
        pieces: list[bytes] | None = [b'"'] if keep else None
        size, p = 0, start + 1
        while True:
            e = self.buf.find(b'"', p)
            if self.buf.find(b"\\", p, len(self.buf) if e < 0 else e) >= 0:
                e = _STRING_BODY.match(self.buf, p).end()
            elif e < 0:
                e = len(self.buf)
            if pieces is not None:
                size += e - p
                if size <= keep:
                    pieces.append(self.buf[p:e])
                else:
                    pieces = None
            if e < len(self.buf) and self.buf[e] == _QUOTE:
                self.pos = e + 1
                return None if pieces is None else self._decode(b"".join(pieces) + b'"', where)
            self.pos = e  # at the end, or at a backslash that the next chunk completes
            if not self.fill():
                raise self.error("Unterminated string", where)
            p = self.pos

    def _decode(self, token: bytes, at: tuple[int, int] | int) -> str:
        try:
            return json.loads(token)
        except ValueError as err:  # a raw control character, an invalid escape
            where = self.where(at) if isinstance(at, int) else at
            raise self.error(getattr(err, "msg", "invalid string"), where) from None

    def scalar(self) -> bytes:
        self.ensure(_SCALAR_WINDOW)
        m = _SCALAR.match(self.buf, self.pos)
        if not m:
            raise self.error("Expecting value" if self.pos < len(self.buf) else "unexpected end of the file")
        if m.end() == len(self.buf) and not self.eof:
            raise self.error(f"a number of more than {_SCALAR_WINDOW} characters")
        self.pos = m.end()
        return m.group()

    def skip(self) -> None:
        """Read past the value at ``pos`` (after ``peek``)."""
        c = self.peek()
        if c == _QUOTE:
            self.string()
        elif c in _OPENERS:
            self._skip_container()
        elif c == -1:
            raise self.error("unexpected end of the file")
        else:
            self.scalar()

    def _skip_container(self) -> None:
        self.step()
        whole = _CONTAINER.match(self.buf, self.pos)
        if whole:
            self.pos = whole.end()
            return
        # deeper than _NESTING, or not all read yet: one level at a time
        stack = bytearray()
        while True:
            c = self.buf[self.pos]
            if c == _QUOTE:
                self.string()
            elif c in _OPENERS:
                if self.depth + len(stack) >= MAX_JSON_DEPTH:
                    raise LoadError(f"{self.name} is not a Jupyter notebook: its JSON is nested too deeply")
                stack.append(c)
                self.pos += 1
            else:
                if stack.pop() != _PAIR[c]:
                    raise self.error("a bracket closed by the wrong kind")
                self.pos += 1
                if not stack:
                    return
            while True:
                self.pos = _CONTENT.match(self.buf, self.pos).end()
                if self.pos < len(self.buf):
                    break
                if not self.fill():
                    raise self.error("unexpected end of the file")
            self.step()

    def members(self, where: str, n: int = 0) -> Iterator[str | None]:
        """The keys of the object at ``pos`` (None for a key too long to be one the grader
        reads); after each, the caller reads or skips its value.

        A key the object repeats, compared as json.loads decodes keys, is refused once the
        object is read (so a limit that reading it breaks is said first): Jupyter keeps the
        last value, and a reader that kept another would grade code Jupyter does not show.
        ``where`` names the object in the message, ``{n}`` in it replaced by ``n``."""
        self.enter()
        self.pos += 1
        if self.peek() == _RBRACE:
            self.pos += 1
            self.depth -= 1
            return
        seen: set[str] = set()
        repeated: str | None = None
        while True:
            self.step()
            if self.peek() != _QUOTE:
                raise self.error("Expecting property name enclosed in double quotes")
            key = self.string(_KEY_BYTES)
            if key in seen:
                repeated = key if repeated is None else repeated
            elif key is not None and (len(seen) < _KEYS_HELD or key in _READ_KEYS):
                seen.add(key)
            if self.peek() != _COLON:
                raise self.error("Expecting ':' delimiter")
            self.pos += 1
            yield key
            c = self.peek()
            if c == _RBRACE:
                self.pos += 1
                self.depth -= 1
                if repeated is not None:
                    raise self.repeated(repeated, where.format(n=n))
                return
            if c != _COMMA:
                raise self.error("Expecting ',' delimiter")
            self.pos += 1

    def repeated(self, key: str, where: str) -> LoadError:
        return LoadError(
            f"{self.name}: {where} has the key {json.dumps(key)} twice. Jupyter shows only the last one, "
            "so the file is not graded (the code graded must be the code Jupyter shows): save the notebook "
            "again from Jupyter (or fix the file) so that each key appears once"
        )

    def items(self) -> Iterator[None]:
        """Once per item of the array at ``pos``; the caller reads or skips each."""
        self.enter()
        self.pos += 1
        if self.peek() == _RBRACKET:
            self.pos += 1
            self.depth -= 1
            return
        while True:
            self.step()
            yield None
            c = self.peek()
            if c == _RBRACKET:
                self.pos += 1
                self.depth -= 1
                return
            if c != _COMMA:
                raise self.error("Expecting ',' delimiter")
            self.pos += 1


# -- what the grader takes from a notebook: code cells' source and tags -----------------------

# A character the file spells in at most 12 bytes (a surrogate pair of \u escapes).
_KEEP_BYTES = 12 * MAX_CODE_CHARS


@dataclass
class _Cell:
    source: str | None = ""  # nbformat 4; None: more than MAX_CODE_CHARS
    input: str | None = ""  # nbformat 3
    skip: bool = False


def _text(r: _Reader) -> str | None:
    """A cell's source as text, whatever a damaged notebook holds there (a string, a list
    whose strings are joined, anything else: no text); None if longer than the limit."""
    c = r.peek()
    if c == _QUOTE:
        s = r.string(_KEEP_BYTES)
        return None if s is None or len(s) > MAX_CODE_CHARS else s
    if c != _LBRACKET:
        r.skip()
        return ""
    parts: list[str] = []
    size = 0
    for _ in r.items():
        if r.peek() == _QUOTE and size <= MAX_CODE_CHARS:
            s = r.string(12 * (MAX_CODE_CHARS - size + 1))
            size += MAX_CODE_CHARS + 1 if s is None else len(s)
            parts.append(s or "")
        else:
            r.skip()
    return None if size > MAX_CODE_CHARS else "".join(parts)


_CELL = "cell {n} (counting markdown cells too)"


def _tagged(r: _Reader, n: int) -> bool:
    """Whether the metadata of cell ``n``, at ``pos``, holds the ``skip-grading`` tag."""
    if r.peek() != _LBRACE:
        r.skip()
        return False
    tagged = False
    for key in r.members("the metadata of " + _CELL, n):
        if key != "tags":
            r.skip()
            continue
        tagged = False
        if r.peek() != _LBRACKET:
            r.skip()
            continue
        for _ in r.items():
            if r.peek() == _QUOTE:
                tagged |= r.string(64) == SKIP_TAG
            else:
                r.skip()
    return tagged


def _cell(r: _Reader, n: int) -> _Cell | None:
    """Cell ``n`` (counted from 1), at ``pos``, if it is a code cell. A source is kept only
    while the cell may be code: a markdown cell's embedded images are read past."""
    kind: str | None = None
    cell = _Cell()
    for key in r.members(_CELL, n):
        if key == "cell_type":
            kind = r.string(64) if r.peek() == _QUOTE else r.skip()
        elif key == "metadata":
            cell.skip = _tagged(r, n)
        elif key in ("source", "input") and kind in (None, "code"):
            setattr(cell, key, _text(r))
        else:
            r.skip()
    return cell if kind == "code" else None


class _Cells:
    """Code cells of one notebook, as read; the code they hold is counted as it comes so that
    a notebook of too much code is refused before it is held."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self.code = {"source": 0, "input": 0}

    def read(self, r: _Reader) -> list[_Cell] | None:
        """The code cells of the list of cells at ``pos``; None if it is not a list."""
        if r.peek() != _LBRACKET:
            r.skip()
            return None
        found = []
        for _ in r.items():
            self.count += 1
            if self.count > MAX_CELLS:
                raise LoadError(f"{self.name} has more than {MAX_CELLS:,} cells (the grader's limit)")
            cell = _cell(r, self.count) if r.peek() == _LBRACE else r.skip()
            if cell is None:
                continue
            found.append(cell)
            if not cell.skip:
                for key in self.code:
                    text = getattr(cell, key)
                    self.code[key] += MAX_CODE_CHARS + 1 if text is None else len(text)
                # whichever nbformat the file turns out to be, its code is too much
                if min(self.code.values()) > MAX_CODE_CHARS:
                    raise _too_much_code(self.name)
        return found


def _notebook(stream: BinaryIO, name: str, chunk: int = _CHUNK) -> list[tuple[str, bool]]:
    """(source, skip) of each code cell of the notebook in ``stream``.

    Only what grading needs is read: a damaged but readable notebook still gives its code,
    and nbformat 3 (worksheets of cells whose code is ``input``) is read as its upgrade to
    4 would be, code cells only (nothing else of it survives: headings, outputs)."""
    r = _Reader(stream, name, chunk)
    r.ensure(3)
    if r.buf.startswith(b"\xef\xbb\xbf"):
        r.pos = 3
    if r.peek() != _LBRACE:
        r.skip()
        r.end()
        raise LoadError(f"{name} is not a Jupyter notebook: it has no list of cells")
    cells = _Cells(name)
    v4: list[_Cell] | None = None
    v3: list[_Cell] | None = None
    version: object = None
    for key in r.members("the notebook's top level"):
        if key == "cells":
            v4 = cells.read(r)
        elif key == "worksheets":
            v3 = _worksheets(r, cells)
        elif key == "nbformat" and r.peek() in _NUMBER_START:
            try:
                version = json.loads(r.scalar())
            except ValueError as err:  # more digits than Python converts
                raise r.error(str(err)[:200]) from None
        else:
            r.skip()
    r.end()
    if version == 3:
        if v3 is None:
            raise LoadError(f"{name} is an nbformat 3 notebook without a list of worksheets")
        kept = [(c.input, c.skip) for c in v3]
    else:
        if v4 is None:
            raise LoadError(f"{name} is not a Jupyter notebook: it has no list of cells")
        kept = [(c.source, c.skip) for c in v4]
    if sum(MAX_CODE_CHARS + 1 if t is None else len(t) for t, skip in kept if not skip) > MAX_CODE_CHARS:
        raise _too_much_code(name)
    return [(t or "", skip) for t, skip in kept]


def _worksheets(r: _Reader, cells: _Cells) -> list[_Cell] | None:
    if r.peek() != _LBRACKET:
        r.skip()
        return None
    found: list[_Cell] = []
    for n, _ in enumerate(r.items(), start=1):
        if r.peek() != _LBRACE:
            r.skip()
            continue
        sheet: list[_Cell] | None = None
        for key in r.members("worksheet {n}", n):
            if key == "cells":
                sheet = cells.read(r)
            else:
                r.skip()
        found += sheet or []
    return found


# -- IPython's syntax, found in one pass ------------------------------------------------------
# IPython's TransformerManager tokenizes a whole cell once per magic it converts (quadratic in
# the magics) with Python's pure-Python tokenizer (quadratic in a line such as ``'\'\'\'...``),
# and its prompt stripper is quadratic in the triple quotes of a line. So the lines that hold
# IPython syntax are found here, by where Python's tokenizer would put strings, comments,
# brackets and logical lines, and IPython's own transformations convert each of those lines.

_ESCAPES = frozenset("!?%,;/")  # IPython's ESCAPE_SINGLES: a logical line starting with one
_OPERATORS = ("!=", "%=", "/=", "//")  # ...unless the tokenizer reads an operator there
_EVENT = re.compile(
    # a newline, and the lines after it that hold none of the other events, no bracket and
    # no IPython syntax (so a cell of plain lines costs one step)
    r"""(?P<nl>\n(?:[ \t\f]*+(?![,;/])[^\n'"\#\\?()\[\]{}%!]*+(?:\#[^\n]*+)?\n)*+)
      | (?P<quote>'''|\"\"\"|['"])
      | (?P<comment>\#[^\n]*+)
      | (?P<cont>\\\r?\n)
      | (?P<help>\?[ \t\f\r]*+(?=\n|\Z))
      | (?P<eq>(?<![=<>!+\-*/%&|^@:~])=(?!=))""",
    re.VERBOSE,
)
_INDENT = re.compile(r"[ \t\f]*+")
_ASSIGNED = re.compile(r"[ \t\f]*+(%[ \t\f]*+[^\W\d]|!(?!=))")  # `= %magic` or `= !command`
_SINGLE_BODY = {q: re.compile(rf"(?:[^{q}\\\n]++|\\\r\n|\\[\s\S])*+") for q in "'\""}
_TRIPLE = {q * 3: re.compile(rf"(?:[^{q}\\]++|\\[\s\S]|{q}(?!{q}{q}))*+{q}{q}{q}") for q in "'\""}
HELP_MAX = 64  # IPython's `name?` pattern is quadratic in the line: a longer line is not help
PROMPT_LINE_MAX = 2000  # the doctest-prompt stripper is quadratic in a line's triple quotes


def _brackets(text: str, start: int, end: int) -> int:
    if start == end:
        return 0
    return (
        text.count("(", start, end)
        + text.count("[", start, end)
        + text.count("{", start, end)
        - text.count(")", start, end)
        - text.count("]", start, end)
        - text.count("}", start, end)
    )


def _string_end(text: str, start: int, quote: str, failed: dict[str, int]) -> int:
    """Where the string opened at ``start`` ends, as Python's tokenizer reads it: a triple
    quote left open runs to the end; a single one left open is one bad character. ``failed``
    remembers how far a single-quoted string was looked for in vain: one that opens before
    there fails the same way, so no line is scanned twice."""
    if len(quote) == 3:
        m = _TRIPLE[quote].match(text, start + 3)
        return m.end() if m else len(text)
    if start < failed[quote]:
        return start + 1
    end = _SINGLE_BODY[quote].match(text, start + 1).end()
    if end < len(text) and text[end] == quote:
        return end + 1
    failed[quote] = end
    return start + 1


def _line_end(text: str, at: int) -> int:
    """The end (after its newline) of the line holding ``at`` and the lines that a final
    backslash continues, as IPython takes them."""
    while True:
        e = text.find("\n", at)
        if e < 0:
            return len(text)
        if text[e - 1] != "\\":
            return e + 1
        at = e + 1


def _help_at(text: str, start: int, end: int) -> int:
    """Where ``text[start:end]`` ends with a help ``?`` as a token (not in a string or
    comment, outside brackets); -1 if it does not."""
    depth, pos = 0, start
    failed = {"'": -1, '"': -1}
    while pos < end:
        m = _EVENT.search(text, pos, end)
        if m is None:
            return -1
        depth += _brackets(text, pos, m.start())
        pos = m.end()
        if m.lastgroup == "quote":
            pos = _string_end(text, m.start(), m.group(), failed)
        elif m.lastgroup == "help" and depth <= 0:
            return m.start()
    return -1


def _special_lines(text: str) -> list[tuple[int, int, str, int, int, int]]:
    """The logical lines of a cell that IPython would convert, in one linear pass:
    (start, end, kind, where its syntax starts, where a help ``?`` is or -1, where the
    line's first token is). Brackets are counted as Python's tokenizer counts them."""
    found = []
    n = len(text)
    depth = 0
    pos = 0
    line_start = line_depth = 0
    assigned = False  # the line's first `=` was seen (IPython looks at that one only)
    failed = {"'": -1, '"': -1}
    at_start = True
    while pos < n:
        if at_start:
            at_start = False
            line_start, line_depth, assigned = pos, depth, False
            first = _INDENT.match(text, pos).end()
            if first < n and text[first] in _ESCAPES and not text.startswith(_OPERATORS, first):
                end = _line_end(text, first)
                found.append((pos, end, "escape", first, _help_at(text, first + 1, end), first))
                pos, at_start = end, True
                continue
        m = _EVENT.search(text, pos)
        if m is None:
            break
        depth += _brackets(text, pos, m.start())
        pos = m.end()
        kind = m.lastgroup
        if kind == "nl":
            at_start = depth <= 0
        elif kind == "quote":
            pos = _string_end(text, m.start(), m.group(), failed)
        elif kind == "help" and depth <= 0:
            end = min(pos + 1, n)
            first = _INDENT.match(text, line_start).end()
            found.append((line_start, end, "help", first, m.start(), first))
            pos, at_start = end, True
        elif kind == "eq" and not assigned and depth <= line_depth:
            assigned = True
            rhs = _ASSIGNED.match(text, pos)
            if rhs:
                end = _line_end(text, rhs.start(1))
                first = _INDENT.match(text, line_start).end()
                at = rhs.start(1)
                found.append((line_start, end, "assign", at, _help_at(text, at, end), first))
                pos, at_start = end, True
    return found


def _convert(region: str, kind: str, at: int, q: int, first: int) -> str:
    """One logical line converted by IPython's own transformer for it (offsets are into
    ``region``), with IPython's priorities: ``name?`` help first."""
    it = _ipython_transformer()

    lines = region.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def loc(offset: int) -> tuple[int, int]:  # IPython's (1-based line, column)
        i = next(i for i in range(len(lines)) if starts[i + 1] > offset)
        return i + 1, offset - starts[i]

    transformers = []
    if q >= 0 and len(region) <= HELP_MAX:
        transformers.append(it.HelpEnd(loc(first), loc(q)))
    if kind == "escape":
        transformers.append(it.EscapedCommand(loc(at)))
    elif kind == "assign":
        if region[at] == "%":
            transformers.append(it.MagicAssign(loc(at)))
        elif not lines[loc(at)[0] - 1].strip().startswith("="):
            transformers.append(it.SystemAssign(loc(at)))
    for t in transformers:
        try:
            return "".join(t.transform(lines))
        except SyntaxError:  # not that syntax after all (`f(x)?`): the next, or as it is
            continue
    return region


_PLAIN_START = re.compile(r"[^\s%>.I\[]")  # a first line that no clean-up step changes
_LINE_BREAKS = re.compile(r"[\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")  # str.splitlines' others
_INDENTED_BLANK = re.compile(r"^[ \t]+$", re.MULTILINE)  # textwrap.dedent empties such lines


def _needs_cleanup(src: str) -> bool:
    """Whether IPython's clean-up (leading blank lines, common indentation, ``>>>`` and
    ``In [1]:`` prompts, a cell magic) may change ``src``; a plain cell needs no line list."""
    head = src[:200].split("\n", 2)
    return (
        not _PLAIN_START.match(src)
        # a prompt on the second line strips the cell's prompts; an empty line is no prompt
        or any(line and _PLAIN_START.match(line) is None for line in head[1:2])
        or ">>>" in src
        or _LINE_BREAKS.search(src) is not None
        or _INDENTED_BLANK.search(src) is not None
    )


class _Budget:
    """How many more IPython lines a submission's cells may have converted."""

    def __init__(self, name: str) -> None:
        self.name, self.left = name, MAX_IPYTHON_LINES

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise LoadError(
                f"{self.name} has more than {MAX_IPYTHON_LINES:,} lines of IPython syntax (%magic, "
                "!command, ?help): the grader converts at most that many"
            )


_IPYTHON_IMPORT = threading.Lock()


def _ipython_transformer():
    """IPython's input transformer module, imported once even when threads (the stages of a
    submission graded side by side, batch's workers) load notebooks at the same time: two
    threads importing IPython together may find it partly initialised and fail."""
    with _IPYTHON_IMPORT:
        from IPython.core import inputtransformer2

    return inputtransformer2


def _to_python(src: str, budget: _Budget) -> str:
    """IPython's input transformation of one cell: magics, ``!`` and ``?`` lines become
    ``get_ipython()`` calls, as ``TransformerManager.transform_cell`` makes them. A plain
    cell needs no IPython at all: a notebook without its syntax never imports it (a tenth of a
    second or more of a cold grade)."""
    if not src.endswith("\n"):
        src += "\n"
    text = src
    if _needs_cleanup(src):  # else IPython's clean-up leaves the cell as it is, and costs lists
        it = _ipython_transformer()
        lines = it.leading_indent(it.leading_empty_lines(src.splitlines(keepends=True)))
        if ">>>" in src and max(map(len, lines), default=0) <= PROMPT_LINE_MAX:
            lines = it.classic_prompt(lines)
        lines = it.ipython_prompt(lines)
        if lines and lines[0].startswith("%%"):
            whole = it.cell_magic(lines)
            if whole is not lines:  # else `%%name?`: help, an escaped line like any other
                return "".join(whole)
        text = "".join(lines)
    special = _special_lines(text)
    budget.take(len(special))
    out, done = [], 0
    for start, end, kind, at, q, first in special:
        out.append(text[done:start])
        region = text[start:end]
        out.append(_convert(region, kind, at - start, q - start if q >= 0 else -1, first - start))
        done = end
    out.append(text[done:])
    return "".join(out)


def _notebook_code(path: Path) -> list[tuple[str, bool]]:
    """(source, skip) of each code cell of the notebook at ``path``, as written."""
    name = path.name
    if path.suffix != ".ipynb":
        raise LoadError(f"{name} is neither a notebook (.ipynb) nor a Python file (.py)")
    too_large = LoadError(f"{name} is larger than {_mb(MAX_FILE_BYTES)}: clear its outputs and save it again")
    with _open(path, MAX_FILE_BYTES, too_large) as f:
        return _notebook(f, name)


def graded_code(path: Path) -> list[str]:
    """The code of the cells of ``path`` not tagged ``skip-grading``, as written (IPython
    syntax not converted): enough to see what it imports, without IPython's transformer."""
    if path.suffix == ".py":
        return [_read_py(path)]
    return [src for src, skip in _notebook_code(path) if not skip]


def load_source(path: Path, stage: str) -> Source:
    name = path.name
    if path.suffix == ".py":
        return Source(path, [(name, _read_py(path))], module_name=stage)
    code = _notebook_code(path)
    cells, notes, heads = [], [], []
    budget = _Budget(name)
    for n, (src, skip) in enumerate(code, start=1):
        if skip:
            continue
        first = src.lstrip().split("\n", 1)[0]
        if first.startswith("%%"):
            magic = first[2:].split(maxsplit=1)[0] if first[2:].strip() else ""
            if magic not in PYTHON_CELL_MAGICS:
                notes.append(f"code cell {n} starts with %%{magic}: not Python, skipped when grading")
                continue
            src = src.lstrip().split("\n", 1)[1] if "\n" in src.lstrip() else ""
        cells.append((f"code cell {n}", _to_python(src, budget)))
        heads.append(_first_code_line(src))
    if not cells:
        notes.append(f"{name} has no code cells to run")
    return Source(path, cells, module_name="__main__", notes=notes, heads=heads)

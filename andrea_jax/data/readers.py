"""Reading documents from a source's local files: JSON Lines, plain text and Parquet.

The three built-in file formats (``data.files.<source>.format``; :mod:`andrea_jax.data.formats`
holds them by name), each a frozen dataclass whose fields are its config fields and whose
``units(path)`` and ``read(unit)`` cut a file into pieces and read a piece's documents:

* ``"jsonl"`` (:class:`Jsonl`): one JSON object per line; the document is the string under
  ``text_field``. Blank lines are skipped.
* ``"text"`` (:class:`Text`): UTF-8 text. A line that is exactly ``separator`` (default ``<|endoftext|>``; LF or
  CRLF line ends) separates two documents; the line end before it belongs to the separator. A file without a
  separator line is one document. Blank lines inside a document are kept, so documents may hold
  paragraphs.
* ``"parquet"`` (:class:`Parquet`): the string column ``text_field``, one document per row (read
  with pyarrow).

Empty documents are dropped in every format. Large files are cut into work units (byte ranges that
end on a line break for JSONL and just after a separator line for text, row groups for Parquet) so
that a process pool can read and tokenize them in parallel while the order of documents stays the
order of the files. :class:`SourceSpec` is a file source in one tuple (format, fields, held-out
share and cap), as :func:`andrea_jax.data.prepare_lib.prepare` also takes it.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Sequence
from typing import NamedTuple

from andrea_jax import checks
from andrea_jax.data.errors import DataError

FORMATS = ("jsonl", "text", "parquet")
DEFAULT_SEPARATOR = "<|endoftext|>"
CHUNK_BYTES = 16 << 20  # bytes of JSONL or text per work unit (about; cuts move to a boundary)


class SourceSpec(NamedTuple):
  """Where one source's documents live and how to read them.

  Attributes:
    paths: glob patterns (``**`` allowed), expanded and sorted pattern by pattern.
    format: ``"jsonl"``, ``"text"`` or ``"parquet"``.
    text_field: the JSON key (``jsonl``) or the column (``parquet``) holding the text.
    separator: ``text`` only: the line that separates documents.
    eval_fraction: share of documents held out for evaluation, in [0, 0.5]: one of the first two
      documents, then one in every block of ``round(1 / eval_fraction)`` consecutive documents (at a
      pseudo-random place in each block); 0 holds out nothing.
    max_tokens: a cap of whole documents: the longest prefix of the source's documents whose
      tokens add up to at most this (held-out ones included); 0 reads everything.
  """
  paths: tuple[str, ...]
  format: str = "jsonl"
  text_field: str = "text"
  separator: str = DEFAULT_SEPARATOR
  eval_fraction: float = 0.01
  max_tokens: int = 0


class WorkUnit(NamedTuple):
  """A piece of one input file: bytes ``[start, stop)`` (JSONL, text) or row group ``start``
  (Parquet)."""
  path: str
  format: str
  text_field: str
  separator: str
  start: int
  stop: int

  def where(self, k: int) -> str:
    """Document ``k`` of the unit, for errors: ``"<path> (bytes 0.., document 1 there)"``."""
    at = f"row group {self.start}" if self.format == "parquet" else f"bytes {self.start}.."
    return f"{self.path} ({at}, document {k + 1} there)"


def patterns(paths: str | Sequence[str]) -> tuple[str, ...]:
  """The glob patterns of a ``paths`` field: a comma-separated string (as the config writes them)
  or a sequence of patterns, blanks dropped.

  Example: ``patterns("a/*.jsonl, b/*.jsonl") == ("a/*.jsonl", "b/*.jsonl")``.
  """
  parts = paths.split(",") if isinstance(paths, str) else list(paths)
  return tuple(p.strip() for p in parts if isinstance(p, str) and p.strip())


def _text_field(value: str) -> None:
  checks.text("text_field", value, empty=False)


@dataclasses.dataclass(frozen=True)
class Jsonl:
  """JSON Lines: one object per line, the document the string under ``text_field``."""
  paths: str = ""           # comma-separated glob patterns of the source's files ("" = none)
  text_field: str = "text"  # the key of the document's text

  def __post_init__(self):
    _text_field(self.text_field)

  def units(self, path: str, chunk_bytes: int = CHUNK_BYTES) -> list[WorkUnit]:
    """Byte ranges of about ``chunk_bytes`` that end on a line break."""
    return _byte_units(path, "jsonl", self.text_field, DEFAULT_SEPARATOR, chunk_bytes)

  def read(self, unit: WorkUnit) -> list[str]:
    return _read_jsonl(unit)

  def record(self) -> dict:
    return {"text_field": self.text_field, "separator": None}


@dataclasses.dataclass(frozen=True)
class Text:
  """UTF-8 text; a line exactly equal to ``separator`` separates two documents."""
  paths: str = ""           # comma-separated glob patterns of the source's files ("" = none)
  separator: str = DEFAULT_SEPARATOR  # the line that separates documents

  def __post_init__(self):
    if not isinstance(self.separator, str) or not self.separator or "\n" in self.separator:
      raise ValueError(f"separator must be a non-empty single line, got {self.separator!r}")

  def units(self, path: str, chunk_bytes: int = CHUNK_BYTES) -> list[WorkUnit]:
    """Byte ranges of about ``chunk_bytes`` that end just after a separator line."""
    return _byte_units(path, "text", "text", self.separator, chunk_bytes)

  def read(self, unit: WorkUnit) -> list[str]:
    return _read_text(unit)

  def record(self) -> dict:
    return {"text_field": "text", "separator": self.separator}


@dataclasses.dataclass(frozen=True)
class Parquet:
  """Parquet: the string column ``text_field``, one document per row."""
  paths: str = ""           # comma-separated glob patterns of the source's files ("" = none)
  text_field: str = "text"  # the column holding the text

  def __post_init__(self):
    _text_field(self.text_field)

  def units(self, path: str, chunk_bytes: int = CHUNK_BYTES) -> list[WorkUnit]:
    """One unit per row group."""
    del chunk_bytes
    import pyarrow.parquet as pq
    try:
      groups = pq.ParquetFile(path).num_row_groups
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ...
      raise DataError(f"{path}: not a readable Parquet file ({e})") from e
    return [WorkUnit(path, "parquet", self.text_field, DEFAULT_SEPARATOR, g, g + 1)
            for g in range(groups)]

  def read(self, unit: WorkUnit) -> list[str]:
    return _read_parquet(unit)

  def record(self) -> dict:
    return {"text_field": self.text_field, "separator": None}


def reader_of(spec: SourceSpec) -> Jsonl | Text | Parquet:
  """The built-in reader of a :class:`SourceSpec` (its format's fields taken from it)."""
  if spec.format == "text":
    return Text(spec.paths, spec.separator)
  return {"jsonl": Jsonl, "parquet": Parquet}[spec.format](spec.paths, spec.text_field)


def check_spec(source: str, spec: SourceSpec) -> None:
  """Raises ``ValueError`` naming the source and the field for an invalid :class:`SourceSpec`."""
  if isinstance(spec.paths, str) or not spec.paths:
    raise ValueError(f"source {source!r}: paths must be a non-empty list of globs, "
                     f"got {spec.paths!r}")
  if spec.format not in FORMATS:
    raise ValueError(f"source {source!r}: format must be one of {FORMATS}, got {spec.format!r}")
  if not 0.0 <= float(spec.eval_fraction) <= 0.5:
    raise ValueError(f"source {source!r}: eval_fraction must lie in [0, 0.5], "
                     f"got {spec.eval_fraction!r}")
  try:
    reader_of(spec)
    checks.integer("max_tokens", spec.max_tokens, minimum=0, int32=False)
  except (TypeError, ValueError) as e:
    raise ValueError(f"source {source!r}: {e}") from None


def resolve_files(source: str, spec: SourceSpec) -> list[str]:
  """The input files of a source: each glob expanded and sorted, in pattern order, no repeats."""
  return expand_patterns(source, spec.paths)


def expand_patterns(source: str, patterns: tuple[str, ...] | list[str]) -> list[str]:
  """Each glob of ``patterns`` expanded (``~`` and ``**`` too) and sorted, in pattern order, no
  repeats; a pattern that matches no file is a :class:`DataError` naming it and the source."""
  files: dict[str, None] = {}
  for pattern in patterns:
    matches = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True)
                     if os.path.isfile(p))
    if not matches:
      raise DataError(f"source {source!r}: no file matches {pattern!r}")
    files.update(dict.fromkeys(matches))
  return list(files)


def _next_boundary(f, fmt: str, separator: str) -> None:
  """Moves ``f`` to the start of the next document: after the next line break (JSONL) or after
  the next separator line (text)."""
  f.readline()  # the rest of the current line
  if fmt == "text":
    line_of = separator.encode("utf-8")
    while line := f.readline():
      if line.rstrip(b"\r\n") == line_of and line.endswith(b"\n"):
        return


def work_units(path: str, spec: SourceSpec, chunk_bytes: int = CHUNK_BYTES) -> list[WorkUnit]:
  """Cuts one input file into work units (see :class:`WorkUnit`), in document order.

  A cut never falls inside a document, so reading the units one after the other yields exactly
  the documents of the whole file.
  """
  return reader_of(spec).units(path, chunk_bytes)


def _byte_units(path: str, fmt: str, text_field: str, separator: str,
                chunk_bytes: int) -> list[WorkUnit]:
  unit = lambda a, b: WorkUnit(path, fmt, text_field, separator, a, b)
  size = os.path.getsize(path)
  if size <= chunk_bytes:
    return [unit(0, size)]
  bounds = [0]
  with open(path, "rb") as f:
    while bounds[-1] + chunk_bytes < size:
      # Seek one byte early: a chunk that ends exactly on a boundary keeps that boundary.
      f.seek(bounds[-1] + chunk_bytes - 1)
      _next_boundary(f, fmt, separator)
      bounds.append(min(f.tell(), size))
  if bounds[-1] < size:
    bounds.append(size)
  return [unit(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def read_unit(unit: WorkUnit) -> list[str]:
  """The non-empty documents of a work unit, in order; ``DataError`` naming file and position."""
  if unit.format == "jsonl":
    return _read_jsonl(unit)
  if unit.format == "text":
    return _read_text(unit)
  return _read_parquet(unit)


def _read_jsonl(unit: WorkUnit) -> list[str]:
  with open(unit.path, "rb") as f:
    f.seek(unit.start)
    data = f.read(unit.stop - unit.start)
  docs = []
  offset = unit.start
  for line in data.split(b"\n"):
    where = f"{unit.path}, byte {offset}"
    offset += len(line) + 1
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except (ValueError, RecursionError) as e:   # bad JSON or UTF-8, too deep, a huge integer
      raise DataError(f"{where}: invalid JSON line ({type(e).__name__}: {e})") from e
    if not isinstance(record, dict) or unit.text_field not in record:
      raise DataError(f"{where}: no field {unit.text_field!r} in the JSON record")
    text = record[unit.text_field]
    if not isinstance(text, str):
      raise DataError(f"{where}: field {unit.text_field!r} is {type(text).__name__}, not a string")
    if b"\\u" in line:   # only a \u escape can make a lone surrogate, which UTF-8 cannot hold
      try:
        text.encode("utf-8")
      except UnicodeEncodeError as e:
        raise DataError(f"{where}: field {unit.text_field!r} holds a lone surrogate "
                        f"({text[e.start]!r} at character {e.start}), not text") from e
    if text:
      docs.append(text)
  return docs


def _read_text(unit: WorkUnit) -> list[str]:
  with open(unit.path, "rb") as f:
    f.seek(unit.start)
    data = f.read(unit.stop - unit.start)
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{unit.path}, byte {unit.start + e.start}: invalid UTF-8") from e
  docs, current = [], []
  for line in text.split("\n"):
    if line.rstrip("\r") == unit.separator:   # a Windows (CRLF) file's separator line too
      if line.endswith("\r") and current and current[-1].endswith("\r"):
        current[-1] = current[-1][:-1]   # the whole CRLF before the separator belongs to it
      docs.append("\n".join(current))
      current = []
    else:
      current.append(line)
  docs.append("\n".join(current))
  return [d for d in docs if d]


def _read_parquet(unit: WorkUnit) -> list[str]:
  import pyarrow as pa
  import pyarrow.parquet as pq

  try:
    pf = pq.ParquetFile(unit.path)
    names = pf.schema_arrow.names
    if unit.text_field not in names:
      raise DataError(f"{unit.path}: no column {unit.text_field!r} (columns: {names})")
    column = pf.read_row_group(unit.start, columns=[unit.text_field]).column(0)
  except (OSError, pa.ArrowException) as e:   # a corrupt page: bad compression, bad encoding
    raise DataError(f"{unit.path}, row group {unit.start}: unreadable ({e})") from e
  if pa.types.is_dictionary(column.type):   # e.g. pandas categories: text all the same
    column = column.cast(column.type.value_type)
  if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
    raise DataError(f"{unit.path}: column {unit.text_field!r} has type {column.type}, not string")
  try:
    return [t for t in column.to_pylist() if t]
  except UnicodeDecodeError as e:
    raise DataError(f"{unit.path}, row group {unit.start}: column {unit.text_field!r} is not valid "
                    f"UTF-8 ({e})") from e

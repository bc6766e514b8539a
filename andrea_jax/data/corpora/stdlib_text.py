"""Documents of five kinds cut from the Python standard library's files, as pure functions of bytes.

:mod:`andrea_jax.data.corpora.stdlib` makes a corpus of them; this module only reads and cuts.

* **code** -- each module's source cut at its top-level ``def`` and ``class`` statements (with their
  decorators and the comments just above them): the module's header (imports, constants) is one
  document, every top-level definition another, and each parses on its own with :mod:`ast`. The
  docstrings and the long license comments are taken out of the code (a body left empty gets a
  ``pass``), so that the code, the docstrings and the licenses share no text and one source's
  held-out documents do not sit in another source's training text.
* **docstrings** -- :func:`ast.get_docstring` (cleaned) of the module, and of every function and
  class nested in each top-level statement, one document per top-level statement, its docstrings
  in source order separated by blank lines.
* **reference** -- the topics of ``pydoc_data/topics.py`` (the language and library reference
  pages ``help()`` prints), read as a literal with :func:`ast.literal_eval`, cut at their headings.
* **notes** -- the plain-text files the library tree ships beside the code (``README*``, ``*.rst``,
  ``*.txt``: IDLE's README, NEWS and HISTORY, the e-mail package's design notes, ...), cut at their
  headings; the root ``LICENSE.txt`` and grammar files are not notes.
* **licenses** -- the root ``LICENSE.txt`` cut at its headings (the history of Python and each of
  its licenses), and every block of full-line comments of a module that reads as a license notice
  (:data:`LICENSE_RE`, at least :data:`MIN_LICENSE_CHARS` characters): near-duplicates of each other
  (the three ``logging`` modules, ``profile`` and ``pstats``, ...).

Which files: the ``*.py`` files, ``LICENSE.txt`` and the notes of the library directory, walked in
sorted order of their relative paths, without the test suites (``test``, ``tests``, ``idle_test``:
distributions and container images often drop them), ``site-packages``, compiled and build files
(``__pycache__``, ``lib-dynload``, ``config-*``, ``_sysconfigdata*.py``, which hold the machine's
build paths) and the character-map codecs ``encodings/*.py`` made by ``gencodec.py`` (tables, not
code).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings
from collections.abc import Sequence

from andrea_jax.data.errors import DataError

KINDS = ("code", "docstrings", "reference", "notes", "licenses")
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                       "__pycache__", "lib-dynload"})
REFERENCE_FILE = "pydoc_data/topics.py"
ROOT_LICENSE = "LICENSE.txt"
# A comment block is a license notice when it says one of these (case-insensitive) ...
LICENSE_RE = re.compile(r"copyright|all rights reserved|licensed to|permission (?:to use|is "
                        r"hereby granted)|redistribution and use|without warranty", re.IGNORECASE)
MIN_LICENSE_CHARS = 200   # ... and is this long: a one-line "Copyright 2007 X" stays in the code
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_NOTE_NAME = re.compile(r"(?i)^(readme.*|.*\.rst|.*\.txt)$")
_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=]")   # PEP 263
# A heading's underline: one punctuation character repeated, alone on its line.
_UNDERLINE = re.compile(r"^([=\-*~^\"#+])\1{2,}[ \t]*$")


def kind_of(relpath: str) -> str | None:
  """Which reader takes a file of the library (a ``/``-separated path relative to its root):
  ``"python"`` (code, docstrings and license comments), ``"reference"``, ``"root-license"``,
  ``"notes"``, or ``None`` (not read).

  Example:
    >>> kind_of("json/decoder.py"), kind_of("idlelib/NEWS.txt"), kind_of("test/test_ast.py")
    ('python', 'notes', None)
  """
  parts = relpath.split("/")
  if any(p in SKIP_DIRS or p.startswith("config-") for p in parts[:-1]):
    return None
  name = parts[-1]
  if relpath == REFERENCE_FILE:
    return "reference"
  if relpath == ROOT_LICENSE:
    return "root-license"
  if name.endswith(".py"):
    return None if name.startswith("_sysconfigdata") else "python"
  if _NOTE_NAME.match(name) and not name.upper().startswith("LICENSE") and "Grammar" not in name:
    return "notes"
  return None


def split_sections(text: str) -> list[str]:
  """``text`` cut before each heading: a paragraph whose last line is underlined by one character
  of ``= - * ~ ^ " # +`` repeated (reST and the reference's plain-text style). A section holding
  only headings joins the next one. Sections are stripped; empty ones dropped.

  Example:
    >>> split_sections("Intro\\n\\nA\\n===\\nbody a\\n\\nB\\n---\\nbody b\\n")
    ['Intro', 'A\\n===\\nbody a', 'B\\n---\\nbody b']
  """
  lines = text.replace("\r\n", "\n").split("\n")
  starts = [0]
  for i in range(1, len(lines)):
    if _UNDERLINE.match(lines[i]) and lines[i - 1].strip() and not _UNDERLINE.match(lines[i - 1]):
      j = i - 1
      while j > 0 and lines[j - 1].strip():   # the heading starts its paragraph
        j -= 1
      if j > starts[-1]:
        starts.append(j)
  ends = starts[1:] + [len(lines)]
  out, start = [], None
  for a, b in zip(starts, ends):
    start = a if start is None else start
    body = [l for l in lines[a:b] if l.strip() and not _UNDERLINE.match(l)]
    underlined = sum(1 for l in lines[a:b] if _UNDERLINE.match(l))
    if underlined and len(body) <= underlined and b < len(lines):
      continue   # headings only: the section runs on into the next one
    piece = "\n".join(lines[start:b]).strip()
    if piece:
      out.append(piece)
    start = None
  return out


def _docstring_expr(node: ast.AST) -> ast.Expr | None:
  body = getattr(node, "body", None)
  if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
      isinstance(body[0].value.value, str):
    return body[0]
  return None


def _defs(stmts: Sequence[ast.stmt]) -> list[ast.AST]:
  """Every function and class among ``stmts`` and inside them, in source order."""
  out = []
  stack = list(reversed(stmts))
  while stack:
    s = stack.pop()
    if isinstance(s, _DEFS):
      out.append(s)
      children = s.body
    elif not hasattr(s, "body") and not hasattr(s, "cases"):
      continue   # a simple statement
    else:   # if / for / while / try / with / match bodies hold definitions too
      children = [*getattr(s, "body", ()), *getattr(s, "orelse", ()),
                  *(x for h in getattr(s, "handlers", ()) for x in h.body),
                  *getattr(s, "finalbody", ()),
                  *(x for c in getattr(s, "cases", ()) for x in c.body)]
    stack.extend(reversed(children))
  return out


def _comment_blocks(lines: Sequence[bytes], free: Sequence[bool]) -> list[tuple[int, int, bytes]]:
  """Runs of consecutive full-line comments among the ``free`` lines (those outside every
  top-level statement, so never inside a string): ``(first_line, last_line, text)``, 0-based, the
  text without each line's ``#`` and the one space after it."""
  blocks: list[tuple[int, int, list[bytes]]] = []
  for i, line in enumerate(lines):
    body = line.strip()
    if not free[i] or not body.startswith(b"#"):
      continue
    body = body[1:]
    body = body[1:] if body.startswith(b" ") else body
    if blocks and blocks[-1][1] == i - 1:
      blocks[-1] = (blocks[-1][0], i, blocks[-1][2] + [body])
    else:
      blocks.append((i, i, [body]))
  return [(a, b, b"\n".join(t).strip()) for a, b, t in blocks]


def python_documents(data: bytes) -> dict[str, list[str]]:
  """The code, docstring and license documents of one module's source bytes (see the module
  docstring); ``{"code": [...], "docstrings": [...], "licenses": [...]}``.

  Raises ``SyntaxError`` (or ``ValueError``: a null byte) when the source does not parse.

  Example:
    >>> python_documents(b"'Doc.'\\nimport os\\n\\ndef f():\\n  'F.'\\n  return 1\\n")
    {'code': ['import os', 'def f():\\n  return 1'], 'docstrings': ['Doc.', 'F.'], 'licenses': []}
  """
  encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
  with warnings.catch_warnings():   # the library's own warnings (escapes, ...) are not ours
    warnings.simplefilter("ignore", SyntaxWarning)
    tree = ast.parse(data)
  # ast's column offsets count UTF-8 bytes: the cutting works on byte lines.
  lines = data.splitlines(keepends=True)
  keep = [True] * len(lines)
  replace: dict[int, bytes] = {}

  def strip_docstring(node: ast.AST) -> None:
    e = _docstring_expr(node)
    if e is None:
      return
    first, last = lines[e.lineno - 1], lines[e.end_lineno - 1]
    if first[:e.col_offset].strip() or last[e.end_col_offset:].strip():
      return   # shares its line with other code (``def f(): "doc"``): left in place
    for i in range(e.lineno - 1, e.end_lineno):
      keep[i] = False
    if len(node.body) == 1 and not isinstance(node, ast.Module):
      replace[e.lineno - 1] = first[:e.col_offset] + b"pass\n"

  docstrings = []
  module_doc = ast.get_docstring(tree, clean=True)
  if module_doc and module_doc.strip():
    docstrings.append(module_doc.strip())
  strip_docstring(tree)
  for stmt in tree.body:
    parts = []
    for node in _defs([stmt]):
      doc = ast.get_docstring(node, clean=True)
      if doc and doc.strip():
        parts.append(doc.strip())
      strip_docstring(node)
    if parts:
      docstrings.append("\n\n".join(parts))

  licenses = _take_licenses(tree, lines, keep, encoding)
  code = _code_pieces(tree, lines, keep, replace, encoding)
  return {"code": code, "docstrings": docstrings, "licenses": licenses}


def _take_licenses(tree: ast.Module, lines: list[bytes], keep: list[bool],
                   encoding: str) -> list[str]:
  """The license notices among the comment blocks between top-level statements (mostly above the
  first one); their lines are marked not to ``keep`` in the code."""
  free = [True] * len(lines)
  for i in range(min(2, len(lines))):   # a shebang or an encoding line is no part of a notice
    if lines[i].startswith(b"#!") or _CODING.match(lines[i]):
      free[i] = False
  for stmt in tree.body:
    for i in range(stmt.lineno - 1, stmt.end_lineno):
      free[i] = False
  licenses = []
  for first, last, block in _comment_blocks(lines, free):
    text = block.decode(encoding)
    if len(text) >= MIN_LICENSE_CHARS and LICENSE_RE.search(text):
      licenses.append(text)
      for i in range(first, last + 1):
        keep[i] = False
  return licenses


def _code_pieces(tree: ast.Module, lines: list[bytes], keep: list[bool],
                 replace: dict[int, bytes], encoding: str) -> list[str]:
  """The kept code cut before each top-level definition, the cut moved up over its decorators and
  the comment lines just above it (never above the end of the statement before it)."""
  cuts = [0]
  prev_end = 0
  for stmt in tree.body:
    if isinstance(stmt, _DEFS):
      start = min([stmt.lineno] + [d.lineno for d in stmt.decorator_list]) - 1
      while start > prev_end and lines[start - 1].lstrip().startswith(b"#"):
        start -= 1
      if start > cuts[-1]:
        cuts.append(start)
    prev_end = stmt.end_lineno
  code = []
  for a, b in zip(cuts, cuts[1:] + [len(lines)]):
    piece = b"".join(replace.get(i, lines[i]) for i in range(a, b)
                     if keep[i] or i in replace).decode(encoding).strip()
    if piece:
      code.append(piece)
  return code


def reference_documents(data: bytes) -> list[str]:
  """The sections of the topics of ``pydoc_data/topics.py`` (the assignment ``topics = {...}``),
  topics in sorted order, each cut with :func:`split_sections`.

  Example:
    >>> reference_documents(b"topics = {'b': 'B\\\\n=\\\\nx', 'a': 'A'}")
    ['A', 'B\\n=\\nx']
  """
  for node in ast.parse(data).body:
    targets = node.targets if isinstance(node, ast.Assign) else (
        [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
    if any(isinstance(t, ast.Name) and t.id == "topics" for t in targets):
      topics = ast.literal_eval(node.value)
      return [s for key in sorted(topics) for s in split_sections(topics[key])]
  raise DataError(f"{REFERENCE_FILE}: no 'topics = {{...}}' assignment")


def text_documents(data: bytes) -> list[str]:
  """A UTF-8 text file (invalid bytes replaced) cut with :func:`split_sections`."""
  return split_sections(data.decode("utf-8", errors="replace"))


def library_documents(inputs: Sequence[tuple[str, bytes]]) -> dict[str, list[str]]:
  """Documents of each kind of :data:`KINDS` from ``(relative path, bytes)`` pairs of library files,
  in the order given (files :func:`kind_of` does not take are ignored). Not deduplicated.

  Example:
    >>> docs = library_documents([("LICENSE.txt", b"PSF LICENSE\\n===\\nPermission ...")])
    >>> docs["licenses"]
    ['PSF LICENSE\\n===\\nPermission ...']
  """
  out: dict[str, list[str]] = {k: [] for k in KINDS}
  for relpath, data in inputs:
    kind = kind_of(relpath)
    if kind == "python":
      if b"gencodec.py" in data[:1000]:   # a generated character-map table
        continue
      try:
        docs = python_documents(data)
      except (SyntaxError, ValueError) as e:   # ValueError: null bytes, an unknown encoding
        raise DataError(f"{relpath}: not Python this interpreter parses ({e})") from e
      for k, v in docs.items():
        out[k].extend(v)
    elif kind == "reference":
      out["reference"].extend(reference_documents(data))
    elif kind == "root-license":
      out["licenses"].extend(text_documents(data))
    elif kind == "notes":
      out["notes"].extend(text_documents(data))
  return out


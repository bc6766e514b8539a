"""Writes that fail for want of room or permission: a full disk, a quota, a read-only directory.

Every write of a run (a checkpoint, a log record, a prepared shard or manifest, a cached corpus, the
workdir's lock) that fails this way raises :class:`WriteError`: one message that names the file and
says what is intact and what to do, which the command line prints as one ``error:`` line. Each
write site makes sure that what it leaves behind is never taken for a finished file (the previous
checkpoint, manifest or log stays what it was; a partial file is removed or never renamed into
place), so that the same command, run again once there is room, resumes as if nothing happened.

Two forms of the same failure are recognised, anywhere in an exception's chain:

* an ``OSError`` whose ``errno`` is one of :data:`ERRNOS` (Python's own writes);
* tensorstore's report of one (orbax writes checkpoint arrays through tensorstore, whose C++ writer
  raises a ``ValueError`` such as ``RESOURCE_EXHAUSTED: ... Failed writing: "<file>": ... No space
  left on device [os_error_code='28']``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Callable, Iterator

# What makes a write fail for want of room or permission (not a damaged disk: EIO is left alone).
ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                    errno.EFBIG})
_TENSORSTORE_CODE = re.compile(r"os_error_code='?(\d+)'?")
_TENSORSTORE_FILE = re.compile(r'Failed writing: "([^"]+)"')


class WriteError(OSError):
  """A write of the run failed for want of room or permission (see the module docstring).

  ``errno`` and ``filename`` are those of the failed write; ``str()`` is the whole message.
  """

  def __init__(self, code: int, path: str, message: str):
    super().__init__(code, os.strerror(code), path)
    self.message = message

  def __str__(self) -> str:
    return self.message


def failed_write(exc: BaseException) -> tuple[int, str | None] | None:
  """``(errno, file or None)`` when ``exc`` or an exception in its chain (``__cause__``,
  ``__context__``) is a write that failed for want of room or permission; ``None`` otherwise.

  Example:
    >>> failed_write(OSError(errno.ENOSPC, "No space left on device", "/run/metrics.jsonl"))
    (28, '/run/metrics.jsonl')
    >>> failed_write(ValueError("bad value")) is None
    True
  """
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if isinstance(exc, OSError) and exc.errno in ERRNOS:
      return exc.errno, None if exc.filename is None else os.fspath(exc.filename)
    if not isinstance(exc, OSError):
      text = str(exc)
      code = _TENSORSTORE_CODE.search(text)
      if code and int(code.group(1)) in ERRNOS:
        where = _TENSORSTORE_FILE.search(text)
        return int(code.group(1)), where.group(1) if where else None
    exc = exc.__cause__ or exc.__context__
  return None


def write_error(exc: BaseException, path: str, consequence: str) -> WriteError | None:
  """The :class:`WriteError` for ``exc`` when it is a failed write (see :func:`failed_write`),
  else ``None``: ``"cannot write <path>: <strerror> (<ERRNO>[, writing <file>]). <consequence>"``,
  where ``<file>`` is the file the system call named when it is not ``path`` itself."""
  found = failed_write(exc)
  if found is None:
    return None
  code, where = found
  detail = errno.errorcode.get(code, str(code))
  if where and os.path.abspath(where) != os.path.abspath(path):
    detail += f", writing {where}"
  return WriteError(code, path, f"cannot write {path}: {os.strerror(code)} ({detail}). "
                                f"{consequence}")


@contextlib.contextmanager
def writing(path: str, consequence: str | Callable[[], str],
            cleanup: Callable[[], None] | None = None) -> Iterator[None]:
  """Turns a failed write inside the block into a :class:`WriteError` about ``path``.

  ``consequence`` (or its result, computed only on failure) ends the message: what is intact and
  what to do. ``cleanup`` runs first on any exception (remove a partial file); its own errors are
  ignored. A :class:`WriteError` raised inside (a more precise one) passes through unchanged, and
  so does every other exception.

  Example:
    >>> with writing("/run/metrics.jsonl", "the records before are kept"):
    ...   f.write(line)
  """
  try:
    yield
  except BaseException as e:
    if cleanup is not None:
      with contextlib.suppress(Exception):
        cleanup()
    if isinstance(e, WriteError) or failed_write(e) is None:
      raise
    raise write_error(e, path, consequence if isinstance(consequence, str)
                      else consequence()) from e


class AtomicFile:
  """A file written whole or not at all: writes go to a temporary file beside ``path``;
  :meth:`commit` syncs it and renames it into place, :meth:`discard` removes it. Until the commit
  (or after a failure, or a kill) ``path`` is what it was. A write that fails for want of room or
  permission is a :class:`WriteError` naming ``path`` and ending with ``consequence``, and leaves
  no temporary file.

  Example (a stream too large for memory; a small one is :func:`atomic_write`):
    >>> out = AtomicFile("shard.bin", "the shard is not listed")
    >>> out.write(chunk); out.write(chunk)
    >>> out.commit()
  """

  def __init__(self, path: str, consequence: str | Callable[[], str], mode: str = "wb",
               tmp: str | None = None):
    self.path, self._consequence = os.fspath(path), consequence
    self.tmp = tmp if tmp is not None else f"{self.path}.tmp{os.getpid()}"   # same directory
    with self._writing():
      self.file = open(self.tmp, mode, **({} if "b" in mode else
                                            {"encoding": "utf-8", "newline": "\n"}))

  def _writing(self):
    return writing(self.path, self._consequence, cleanup=self.discard)

  def write(self, data) -> None:
    with self._writing():
      self.file.write(data)

  def commit(self) -> None:
    """Syncs the temporary file and renames it to ``path``."""
    with self._writing():
      self.file.flush()
      os.fsync(self.file.fileno())
      self.file.close()
      os.replace(self.tmp, self.path)

  def discard(self) -> None:
    """Drops what was written; ``path`` stays as it was."""
    with contextlib.suppress(OSError):
      self.file.close()
    remove_quietly(self.tmp)


def atomic_write(path: str, content: bytes | str, consequence: str | Callable[[], str]) -> None:
  """Writes ``content`` to ``path`` through a temporary file, synced, then renamed into place: a
  failure (or a kill) leaves the previous ``path`` whole, and no temporary file after a failure
  (:class:`WriteError` ending with ``consequence``). Text is written as UTF-8."""
  out = AtomicFile(path, consequence, "w" if isinstance(content, str) else "wb")
  out.write(content)
  out.commit()


def remove_quietly(path: str) -> None:
  """Removes the file ``path`` if it is there (a partial file after a failed write)."""
  with contextlib.suppress(OSError):
    os.remove(path)


@contextlib.contextmanager
def staged_directory(path: str, consequence: str, *, replace: bool = False) -> Iterator[str]:
  """A directory written whole or not at all: yields a temporary sibling of ``path`` to fill; when
  the block ends without an error it becomes ``path`` (a rename), and on any error, a kill
  included, ``path`` is what it was and the temporary directory is removed (a kill leaves it as
  ``<path>.tmp<pid>``, never as ``path``).

  ``path`` may be absent or an empty directory; with ``replace`` a directory holding files is
  replaced (moved aside, the new one renamed into place, the old one removed), else a
  ``FileExistsError`` names it before anything is written. A failed write is a
  :class:`WriteError` ending with ``consequence``.

  Example:
    >>> with staged_directory("out/tiny-hf", "nothing was exported") as tmp:
    ...   write_files(tmp)
  """
  path = os.path.abspath(path)
  if os.path.exists(path) and not os.path.isdir(path):
    raise FileExistsError(f"{path} is a file, not a directory")
  if os.path.isdir(path) and os.listdir(path) and not replace:
    raise FileExistsError(f"{path} is not empty")
  tmp = f"{path}.tmp{os.getpid()}"
  cleanup = lambda: shutil.rmtree(tmp, ignore_errors=True)
  cleanup()
  with writing(path, consequence, cleanup=cleanup):
    os.makedirs(tmp)
    yield tmp
    aside = f"{path}.old{os.getpid()}" if os.path.isdir(path) and os.listdir(path) else None
    if aside is not None:
      os.rename(path, aside)
    elif os.path.isdir(path):
      os.rmdir(path)
    try:
      os.rename(tmp, path)
    except BaseException:
      if aside is not None:
        os.rename(aside, path)
      raise
    if aside is not None:
      shutil.rmtree(aside, ignore_errors=True)

"""Changing a prepared directory safely: one process at a time, each source all or nothing.

:func:`andrea_jax.data.prepare_lib.prepare` changes an output folder only through these:

* :func:`locked` -- an exclusive ``flock`` on ``<out>/.lock`` for the whole preparation (the
  kernel drops it when its holder dies, so a killed preparation never leaves it held).
* :func:`staging` -- a fresh folder where one source's shards are written while it is read:
  beside the output folder (``.<name>.staging-<pid>`` in its parent), so that even a killed
  preparation leaves the output folder as it was; inside it (``.staging-<pid>``) when the parent
  is another file system (a rename cannot cross one) or cannot be written. It is removed whatever
  happens (a bad row, ``KeyboardInterrupt``); one left behind by a killed process is removed by
  the next preparation of the same folder.
* :func:`commit` -- swaps a finished source in: its old entry unlisted from the manifest, its old
  files deleted, the staged ones renamed into place, the new entry listed. ``SIGINT`` and
  ``SIGTERM`` wait until it is done, so nothing but a kill in those milliseconds interrupts it,
  and that leaves the source unlisted: the next run prepares it again, alone.

Until its commit, a source being prepared (again) keeps its old shards and manifest entry.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Sequence

from andrea_jax import storage
from andrea_jax.data import manifest as mf

LOCK = ".lock"


def source_files(out_dir: str, source: str) -> list[str]:
  """The names of ``source``'s files in ``out_dir``: its token and mask shards
  (``<source>.<split>.*``) and temporary files (``.<source>.*.tmp*``).

  Example:
    >>> source_files("/tmp/prepared", "chat")
    ['chat.eval.00000.bin', 'chat.train.00000.bin', 'chat.train.00000.mask.bin']
  """
  names = []
  for name in os.listdir(out_dir):
    is_shard = name.startswith(f"{source}.") and name.endswith(".bin") and (
        name[len(source) + 1:].split(".")[0] in mf.SPLITS)
    is_tmp = name.startswith(f".{source}.") and ".tmp" in name
    if is_shard or is_tmp:
      names.append(name)
  return sorted(names)


def remove_source_files(out_dir: str, source: str) -> None:
  """Deletes the files :func:`source_files` names."""
  for name in source_files(out_dir, source):
    os.remove(os.path.join(out_dir, name))


def _open_lock(out_dir: str, path: str):
  os.makedirs(out_dir, exist_ok=True)
  with storage.writing(path, f"Nothing was prepared in {out_dir}: free some space (or give a "
                       "directory this user can write to) and run again"):
    return open(path, "a")


@contextlib.contextmanager
def locked(out_dir: str) -> Iterator[bool]:
  """Holds an exclusive lock on ``out_dir`` (created if needed) so that processes preparing it
  at once take turns (the later ones then find the sources finished; one that waits says so).
  Yields whether this call created the lock file. POSIX only; elsewhere, and on a file system
  without locks (some network ones), a no-op.

  A holder that fails may remove the lock file (:func:`undo_creation`); a process that was
  waiting for it then finds its lock on a file no longer there and locks the new one.

  Example:
    >>> with locked("/tmp/prepared") as created:
    ...   pass   # only this process changes /tmp/prepared here
  """
  path = os.path.join(out_dir, LOCK)
  try:
    import fcntl
  except ImportError:
    created = not os.path.exists(path)
    _open_lock(out_dir, path).close()
    yield created
    return
  while True:
    created = not os.path.exists(path)
    f = _open_lock(out_dir, path)
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      print(f"waiting for another process preparing {out_dir} (it holds {path})",
            file=sys.stderr, flush=True)
      fcntl.flock(f, fcntl.LOCK_EX)
    except OSError as e:   # ENOLCK, EOPNOTSUPP: this file system keeps no locks
      print(f"warning: {path} cannot be locked ({e.strerror}); preparing without the lock",
            file=sys.stderr)
      with f:
        yield created
      return
    try:
      same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
      same = False
    if same:
      break
    f.close()   # the holder before us removed the file it locked: lock the one there now
  with f:
    try:
      yield created
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def undo_creation(out_dir: str, created_dir: bool, created_lock: bool) -> None:
  """After a failed preparation that committed nothing: removes the lock file and the folder
  when this preparation created them (call it while still holding the lock)."""
  if created_lock:
    storage.remove_quietly(os.path.join(out_dir, LOCK))
  if created_dir:
    with contextlib.suppress(OSError):   # not empty: something else is in it, keep it
      os.rmdir(out_dir)


def _staging_places(out_dir: str) -> tuple[str, str]:
  """``(parent, prefix)`` of the staging folders of ``out_dir`` beside it, and inside it."""
  out_dir = os.path.abspath(out_dir)
  return os.path.dirname(out_dir), f".{os.path.basename(out_dir)}.staging-"


def remove_stale_staging(out_dir: str) -> None:
  """Removes the staging folders a killed preparation of ``out_dir`` left (under the lock, none
  is in use)."""
  parent, prefix = _staging_places(out_dir)
  for path in (glob.glob(os.path.join(glob.escape(parent), glob.escape(prefix) + "*"))
               + glob.glob(os.path.join(glob.escape(out_dir), ".staging-*"))):
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def staging(out_dir: str) -> Iterator[str]:
  """A fresh, empty folder on the output folder's file system, removed on leaving (see the
  module docstring for where it is).

  Example:
    >>> with staging("/tmp/prepared") as staged:
    ...   staged                                  # doctest: +SKIP
    '/tmp/.prepared.staging-4242'
  """
  parent, prefix = _staging_places(out_dir)
  path = os.path.join(parent, f"{prefix}{os.getpid()}")
  try:
    if os.stat(parent).st_dev != os.stat(out_dir).st_dev:
      raise OSError("another file system")
    os.mkdir(path)
  except OSError:
    path = os.path.join(out_dir, f".staging-{os.getpid()}")
    with storage.writing(path, f"{out_dir} is as it was before: free some space and run again"):
      os.mkdir(path)
  try:
    yield path
  finally:
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
  """``SIGINT`` and ``SIGTERM`` held back until the block ends (then delivered: a
  ``KeyboardInterrupt`` is raised after it); a no-op where signals cannot be masked."""
  mask = getattr(signal, "pthread_sigmask", None)
  if mask is None:
    yield
    return
  old = mask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
  try:
    yield
  finally:
    mask(signal.SIG_SETMASK, old)


def commit(out_dir: str, staged: str, source: str, write_listing: Callable[[bool], None],
           also_remove: Sequence[str] = ()) -> None:
  """Moves the staged files of ``source`` into ``out_dir``.

  ``write_listing(listed)`` writes the manifest with ``source``'s old entry unlisted
  (``listed=False``) or its new one listed (``True``). Files of the sources in ``also_remove``
  (prepared with another tokenizer, now unlisted) are deleted at the same time.

  Example:
    >>> with staging(out) as staged:
    ...   entry = write_shards(staged)            # chat.train.00000.bin, ...
    ...   commit(out, staged, "chat", lambda listed: write_manifest(listed and entry))
  """
  with signals_deferred():
    write_listing(False)   # from here the old shards are referenced by nothing
    for name in (*also_remove, source):
      remove_source_files(out_dir, name)
    for name in sorted(os.listdir(staged)):
      os.replace(os.path.join(staged, name), os.path.join(out_dir, name))
    write_listing(True)

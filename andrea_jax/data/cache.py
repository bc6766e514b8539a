"""A directory built once and cached: written aside, marked complete, renamed into place.

The built-in corpora are generated into the cache on first use. A build interrupted halfway (a
kill, a full disk) must never be taken for a finished one, and two processes building the same
directory at once (the hosts of one run on a shared file system) must both end with a complete
copy. :func:`build_once` does that for any directory a function can write.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping

from andrea_jax import storage

COMPLETE = "COMPLETE"
CACHE_ENV = "ANDREA_JAX_CACHE"


def default_cache_dir() -> str:
  """``$ANDREA_JAX_CACHE``, else ``$XDG_CACHE_HOME/andrea_jax``, else ``~/.cache/andrea_jax``."""
  if os.environ.get(CACHE_ENV):
    return os.environ[CACHE_ENV]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "andrea_jax")


def prepared_folder(root: str, tokenizer, caps: Mapping[str, int] | None = None) -> str:
  """Where a built-in corpus under ``root`` is prepared for ``tokenizer``:
  ``<root>/prepared-<fingerprint[:16]>``, or ``...-cap-<digest>`` when ``caps`` gives some source a
  cap (``max_tokens`` > 0), the digest of the caps: each set of caps has a folder of its own
  (every source in it, the uncapped ones as in the other), so runs with other caps never
  rewrite each other's shards, and the uncapped folder stays as it is."""
  name = f"prepared-{tokenizer.fingerprint[:16]}"
  given = sorted((s, int(n)) for s, n in (caps or {}).items() if n)
  if not given:
    return os.path.join(root, name)
  digest = hashlib.sha256(json.dumps(given).encode()).hexdigest()[:8]
  return os.path.join(root, f"{name}-cap-{digest}")


def is_complete(path: str) -> bool:
  """Whether ``path`` is a directory :func:`build_once` finished."""
  return os.path.isfile(os.path.join(path, COMPLETE))


def build_once(path: str, write: Callable[[str], None], note: str) -> str:
  """``path``, built by ``write(tmp)`` unless a complete one exists; returns ``path``.

  ``write`` fills a temporary sibling directory; a ``COMPLETE`` marker holding ``note`` is added
  once it returns, then the directory is renamed to ``path``. An incomplete ``path`` (an
  interrupted earlier attempt) is replaced; a complete one written meanwhile by another process is
  kept and the temporary copy dropped.

  Example:
    >>> raw = build_once("~/.cache/andrea_jax/x/raw", lambda d: generate(d), "generator v1")
  """
  if is_complete(path):
    return path
  tmp = f"{path}.tmp{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  # A failure (a full disk: WriteError) removes the partial copy: nothing half-written is left to
  # be mistaken for the finished directory, or to take room.
  with storage.writing(tmp, f"The partial copy was removed and {path} was not made: free some "
                       "space and run again", cleanup=lambda: shutil.rmtree(tmp)):
    write(tmp)
    with open(os.path.join(tmp, COMPLETE), "w") as f:
      f.write(note + "\n")
  if os.path.isdir(path):   # an interrupted earlier attempt, or another process finished first
    if is_complete(path):
      shutil.rmtree(tmp)
      return path
    shutil.rmtree(path)
  try:
    os.rename(tmp, path)
  except OSError:   # another process renamed its identical copy in between
    shutil.rmtree(tmp, ignore_errors=True)
  return path

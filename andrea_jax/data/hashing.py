"""Counter-based hashing (splitmix64) and file digests, shared by the sampler and ``prepare``.

Everything random in the pipeline that must be reproducible without state -- window positions
keyed by ``(seed, step, source, row)``, the held-out documents keyed by ``(source, block)`` -- is a
pure function of integers through :func:`splitmix64`, so it is the same on every platform, in every
process and after every resume.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def splitmix64(x_N: np.ndarray | int) -> np.ndarray:
  """The splitmix64 mixer: a bijection of 64-bit integers whose outputs look independent, uniform.

  ``z = x + 0x9E3779B97F4A7C15; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) *
  0x94D049BB133111EB; return z ^ z>>31`` (all mod 2**64).

  Args:
    x_N: integers of any shape (Python ints are taken mod 2**64).

  Returns:
    ``uint64`` array of the same shape (at least 1-D).

  Example:
    >>> int(splitmix64(0)[0])   # the first output of splitmix64 seeded with 0
    16294208416658607535
  """
  if isinstance(x_N, (int, np.integer)):
    x_N = np.array([int(x_N) & _MASK64], np.uint64)
  z = np.atleast_1d(np.asarray(x_N)).astype(np.uint64)
  with np.errstate(over="ignore"):
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
  return z ^ (z >> np.uint64(31))


def hash_key(*parts: int) -> int:
  """Folds integers into one 64-bit key: ``h = splitmix64(h ^ part)`` for each part, from ``h = 0``.

  Example:
    >>> hash_key(0, 7) != hash_key(7, 0)
    True
  """
  h = 0
  for p in parts:
    h = int(splitmix64(h ^ (int(p) & _MASK64))[0])
  return h


def name_key(name: str) -> int:
  """A 64-bit integer for a string (first 8 SHA-256 bytes; no hash randomisation)."""
  return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def sha256_file(path: str | os.PathLike, chunk_bytes: int = 1 << 22) -> str:
  """Hex SHA-256 of a file's bytes, read in chunks of ``chunk_bytes``."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(chunk_bytes):
      h.update(block)
  return h.hexdigest()

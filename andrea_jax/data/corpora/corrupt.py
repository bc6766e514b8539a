"""Character-level corruption: the low-quality near-duplicate that real corpora contain.

Scraped and OCR'd text holds copies of good documents with typos, dropped and doubled characters.
:func:`corrupt_text` makes such a copy of a text, deterministically: every random choice is a pure
function of ``(key, character position)`` through :func:`andrea_jax.data.hashing.splitmix64`
(integer arithmetic only), so the copy is the same on every machine, with every numpy version and
under any hash randomisation.
"""

from __future__ import annotations

import string

import numpy as np

from andrea_jax.data import hashing

ALPHABET = string.ascii_letters + string.digits + string.punctuation + " "
_ALPHABET_A = np.array([ord(c) for c in ALPHABET], np.uint32)
_RATE_BITS = 32


def corrupt_text(text: str, rate: float, key: int) -> str:
  """``text`` with about ``rate`` of its characters hit by one edit each.

  Character ``i`` (a code point) draws ``z_i = splitmix64(key + i)``. It is hit when the top 32
  bits of ``z_i`` fall below ``rate * 2**32``; a hit character is, with probability 1/3 each (from
  ``(z_i mod 2**16) mod 3``), replaced by a character of :data:`ALPHABET`, deleted, or preceded by
  an inserted one (the character drawn from the middle bits of ``z_i``). So the edit (Levenshtein)
  distance to ``text`` is about ``rate * len(text)``: each hit is one edit, except a replacement by
  the same character (1 in 95) and neighbouring edits that merge (a deletion beside an insertion
  is one replacement).

  Args:
    text: any string.
    rate: the share of characters hit, in [0, 1].
    key: any integer (taken mod 2**64): the same key gives the same copy.

  Returns:
    The corrupted copy.

  Example:
    >>> corrupt_text("The quick brown fox jumps over the lazy dog.", 0.2, key=7)
    'The/quick borow3n fox jumps Iver thelazy d~o%g.'
    >>> corrupt_text("abc", 0.0, key=7)
    'abc'
  """
  rate = float(rate)
  if not 0.0 <= rate <= 1.0:
    raise ValueError(f"corruption rate must lie in [0, 1], got {rate}")
  cp_N = np.frombuffer(text.encode("utf-32-le"), np.uint32)
  n = cp_N.size
  if n == 0:
    return text
  with np.errstate(over="ignore"):
    z_N = hashing.splitmix64(np.uint64(int(key) & ((1 << 64) - 1)) + np.arange(n, dtype=np.uint64))
  hit_N = (z_N >> np.uint64(64 - _RATE_BITS)) < np.uint64(round(rate * (1 << _RATE_BITS)))
  op_N = (z_N & np.uint64(0xFFFF)) % np.uint64(3)
  new_N = _ALPHABET_A[((z_N >> np.uint64(16)) & np.uint64(0xFFFF)) % np.uint64(len(ALPHABET))]
  replace_N, delete_N, insert_N = (hit_N & (op_N == k) for k in (0, 1, 2))
  out_N = np.where(replace_N, new_N, cp_N)
  # Each position emits [inserted character, own character]; keep what each one really has.
  pairs_Nx2 = np.stack([new_N, out_N], axis=1)
  keep_Nx2 = np.stack([insert_N, ~delete_N], axis=1)
  return pairs_Nx2[keep_Nx2].astype("<u4").tobytes().decode("utf-32-le")

"""Character-level corruption: deterministic, at the rate asked for."""

import numpy as np
import pytest

from andrea_jax.data.corpora.corrupt import ALPHABET, corrupt_text


def edit_distance(a: str, b: str) -> int:
  """Levenshtein distance, the textbook dynamic programme, one row (of ``b``) at a time:
  ``D[i][j] = min(D[i-1][j-1] + [a_i != b_j], D[i-1][j] + 1, D[i][j-1] + 1)``."""
  b_M = np.array([ord(c) for c in b], np.int64)
  j_M1 = np.arange(len(b) + 1)
  prev = j_M1.copy()
  for i, ca in enumerate(a, 1):
    best = np.empty_like(prev)
    best[0] = i
    best[1:] = np.minimum(prev[:-1] + (b_M != ord(ca)), prev[1:] + 1)
    # The insertions chain along the row: D[i][j] = min_k (best[k] + j - k).
    prev = np.minimum.accumulate(best - j_M1) + j_M1
  return int(prev[-1])


_TEXT = ("Return a new list containing all items from the iterable in ascending order. "
         "A custom key function can be supplied to customize the sort order. ") * 12


def test_edit_distance_reference_by_hand():
  assert edit_distance("kitten", "sitting") == 3   # k->s, e->i, +g
  assert edit_distance("flaw", "lawn") == 2 and edit_distance("ab", "ba") == 2
  assert edit_distance("", "abc") == 3 and edit_distance("abc", "") == 3
  assert edit_distance("same", "same") == 0


def test_rate_zero_and_empty_text_change_nothing():
  assert corrupt_text(_TEXT, 0.0, key=3) == _TEXT
  assert corrupt_text("", 0.5, key=3) == ""


def test_same_key_same_copy_other_key_other_copy():
  a = corrupt_text(_TEXT, 0.1, key=11)
  assert a == corrupt_text(_TEXT, 0.1, key=11)
  assert a != corrupt_text(_TEXT, 0.1, key=12) and a != _TEXT


@pytest.mark.parametrize("rate", [0.02, 0.1, 0.3])
def test_edit_distance_is_about_the_rate(rate):
  # ~1800 characters: the number of hits has a standard deviation of sqrt(n r (1 - r)).
  n = len(_TEXT)
  dist = np.mean([edit_distance(_TEXT, corrupt_text(_TEXT, rate, key=k)) for k in range(4)])
  sd = np.sqrt(n * rate * (1 - rate) / 4)
  # Each hit is one edit; at high rates neighbouring edits merge a little (a deletion next to an
  # insertion is one replacement), so the distance may fall below the hits, never above.
  assert n * rate - 4 * sd - 0.1 * n * rate ** 2 <= dist <= n * rate + 4 * sd, (dist, n * rate)


def test_every_character_hit_at_rate_one():
  text = "x" * 3000
  out = corrupt_text(text, 1.0, key=5)
  # A third deleted, a third replaced, a third doubled by an insertion: about 3000 characters, and
  # almost none of the replacements and insertions is an 'x'.
  assert 2700 < len(out) < 3300
  assert out.count("x") < 0.36 * 3000 + 100
  assert set(out) - {"x"} <= set(ALPHABET)


def test_non_ascii_text_survives():
  text = "naïve café — ☃ " * 50
  out = corrupt_text(text, 0.2, key=1)
  assert isinstance(out, str) and "é" in out and out != text


def test_bad_rate_is_refused():
  with pytest.raises(ValueError, match="rate must lie in"):
    corrupt_text("abc", 1.5, key=0)

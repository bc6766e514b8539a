"""Character-level corruption: deterministic, at the rate asked for."""

import numpy as np
import pytest

from andrea_jax.data.corrupt import ALPHABET, corrupt_text
from tests.test_data_stdlib_corpus import _edit_distance

_TEXT = ("Return a new list containing all items from the iterable in ascending order. "
         "A custom key function can be supplied to customize the sort order. ") * 12


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
  dist = np.mean([_edit_distance(_TEXT, corrupt_text(_TEXT, rate, key=k)) for k in range(4)])
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

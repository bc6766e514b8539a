"""Repetition metrics against hand-computed values and a brute-force reference."""

import numpy as np
import pytest

from andrea_jax import repetition

PROSE = (
    'The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a small tin '
    'of oil and a rag. From the gallery he could see the fishing boats returning to the harbour, '
    'their lanterns bobbing like fireflies over the dark water. In winter the storms came without'
    ' warning, and he would stay awake through the night, trimming the wick and listening to the '
    'waves break against the rocks below. His daughter, who lived in the village, wrote to him '
    'twice a month; he kept her letters in a biscuit box beside the logbook and read them again '
    'whenever the fog rolled in and there was nothing to do but wait for morning.'
)


def _reference_repeated_share(seq, n):
  """Brute force: walk the n-grams, count those seen before."""
  grams = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
  seen, repeats = set(), 0
  for g in grams:
    repeats += g in seen
    seen.add(g)
  return repeats / len(grams) if grams else 0.0


def test_hand_computed_values_on_words_and_ids():
  for x in ("a b a b a", [1, 2, 1, 2, 1], np.array([7, 3, 7, 3, 7], np.int32)):
    # bigrams ab ba ab ba: the last two repeat; {ab, ba} are distinct.
    assert repetition.repeated_ngram_share(x, 2) == 2 / 4
    assert repetition.distinct_n(x, 2) == 2 / 4
    # unigrams a b a b a: 3 of 5 repeat; trigrams aba bab aba: 1 of 3 repeats.
    assert repetition.repeated_ngram_share(x, 1) == 3 / 5
    assert repetition.repeated_ngram_share(x, 3) == 1 / 3
    assert repetition.distinct_n(x, 3) == 2 / 3
    assert repetition.repeated_ngram_share(x, 5) == 0.0 and repetition.distinct_n(x, 5) == 1.0
    # Shorter than n: no n-grams, nothing repeated.
    assert repetition.repeated_ngram_share(x, 6) == 0.0 and repetition.distinct_n(x, 6) == 1.0


def test_words_ignore_case_and_punctuation():
  assert repetition.repeated_ngram_share("Region, region. REGION!", 1) == 2 / 3
  assert repetition.repeated_ngram_share("", 1) == 0.0
  assert repetition.distinct_n([], 2) == 1.0


def test_against_brute_force_on_random_sequences():
  rng = np.random.default_rng(0)
  for _ in range(30):
    seq = rng.integers(0, rng.integers(2, 6), size=rng.integers(0, 40))
    for n in (1, 2, 3, 4):
      expected = _reference_repeated_share(list(seq), n)
      assert repetition.repeated_ngram_share(seq, n) == pytest.approx(expected)
      total = max(len(seq) - n + 1, 0)
      assert repetition.distinct_n(seq, n) == pytest.approx(1 - expected if total else 1.0)


def test_collapse_is_detected_and_prose_is_not():
  loop = "region " * 50
  # One word 50 times: (T - n) / (T - n + 1) of the n-grams repeat, for n = 2, 3, 4.
  assert repetition.repetition_score(loop) == pytest.approx((48 / 49 + 47 / 48 + 46 / 47) / 3)
  assert repetition.is_collapsed(loop)
  assert repetition.is_collapsed("I am a helpful model. " * 12)
  assert repetition.repetition_score(PROSE) < 0.05
  assert not repetition.is_collapsed(PROSE)
  assert repetition.collapse_rate([loop, PROSE, PROSE, [5, 6] * 30]) == 0.5


def test_score_weights_and_validation():
  x = "a b a b a"
  # Weighted mean of 2/4 (n=2) and 1/3 (n=3) with weights 1 and 3.
  assert repetition.repetition_score(x, ns=(2, 3), weights=(1, 3)) == pytest.approx((0.5 + 1.0) / 4)
  with pytest.raises(ValueError, match="n must be"):
    repetition.distinct_n(x, 0)
  with pytest.raises(ValueError, match="1-D"):
    repetition.repeated_ngram_share(np.zeros((2, 3), np.int32), 2)
  with pytest.raises(TypeError, match="integer"):
    repetition.repeated_ngram_share(np.array([0.5, 1.5]), 1)
  with pytest.raises(ValueError, match="weights"):
    repetition.repetition_score(x, ns=(2, 3), weights=(1, -1))
  with pytest.raises(ValueError, match="weights must be 2 finite"):
    repetition.repetition_score(x, ns=(2, 3), weights=(float("inf"), 1))
  with pytest.raises(ValueError, match="threshold"):
    repetition.is_collapsed(x, threshold=0.0)
  with pytest.raises(ValueError, match="samples"):
    repetition.collapse_rate([])


def test_collapse_rate_refuses_a_single_string():
  text = "region " * 20
  assert repetition.collapse_rate([text]) == 1.0
  with pytest.raises(TypeError, match="single string"):
    repetition.collapse_rate(text)

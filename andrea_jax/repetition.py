"""Repetition metrics of generated text: did the model collapse into "region region region"?

v1 of ANDREA-120M, stuck in a bad basin, generated "region region region ...". These host-side numpy
functions score generated samples at evaluation time, either as token-id arrays or as strings. A
string is split into words: lower-cased runs of letters, digits and underscores
(``re.findall(r"\\w+")``), so punctuation and case do not hide a repetition.

For one ``n``, every n-gram position is either the first occurrence of its n-gram or a repeat, so
``repeated_ngram_share(x, n) == 1 - distinct_n(x, n)`` exactly. The two names exist because the
literature uses both (distinct-n: Li et al. 2016; repeated n-grams: Welleck et al. 2020). The
collapse score averages the repeated share over several ``n``: short n-grams repeat in any long text
(Zipf), long ones only in loops.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from andrea_jax import checks

TextOrTokens = str | Sequence[int] | np.ndarray

_WORD = re.compile(r"\w+")


def _ids(x: TextOrTokens) -> np.ndarray:
  """``[T]`` int64 ids: words of a string mapped to ids by first appearance, or the tokens as
  given."""
  if isinstance(x, str):
    vocab: dict[str, int] = {}
    return np.asarray([vocab.setdefault(w, len(vocab)) for w in _WORD.findall(x.lower())],
                      dtype=np.int64)
  arr = np.asarray(x)
  if arr.ndim != 1:
    raise ValueError(f"tokens must be 1-D (one sample), got shape {arr.shape}")
  if arr.size and not np.issubdtype(arr.dtype, np.integer):
    raise TypeError(f"tokens must be integer ids or a string, got dtype {arr.dtype}")
  return arr.astype(np.int64)


def _check_n(n: int) -> None:
  checks.integer("n", n, minimum=1)


def _counts(x: TextOrTokens, n: int) -> tuple[int, int]:
  """``(total, distinct)`` n-grams of one sequence."""
  _check_n(n)
  ids_T = _ids(x)
  total = max(ids_T.size - n + 1, 0)
  if total == 0:
    return 0, 0
  grams_Gxn = np.lib.stride_tricks.sliding_window_view(ids_T, n)
  return total, int(np.unique(grams_Gxn, axis=0).shape[0])


def repeated_ngram_share(tokens: TextOrTokens, n: int) -> float:
  """Fraction of the n-grams of a sequence that already occurred earlier in it.

  ``#{i : gram_i in {gram_0 .. gram_{i-1}}} / #grams`` with ``gram_i = x[i : i + n]``; 0.0 when the
  sequence is shorter than ``n`` (no n-grams, nothing repeated).

  Args:
    tokens: ``[T]`` token ids, or a string (split into words).
    n: n-gram length.

  Example:
    >>> repeated_ngram_share("a b a b a", 2)  # ab ba ab ba: the last two repeat
    0.5
  """
  total, distinct = _counts(tokens, n)
  return 0.0 if total == 0 else (total - distinct) / total


def distinct_n(tokens: TextOrTokens, n: int) -> float:
  """Distinct-n: number of unique n-grams divided by the number of n-grams.

  1.0 when the sequence is shorter than ``n`` (nothing repeated).

  Example:
    >>> distinct_n("a b a b a", 2)  # {ab, ba} of 4 bigrams
    0.5
  """
  total, distinct = _counts(tokens, n)
  return 1.0 if total == 0 else distinct / total


def repetition_score(tokens: TextOrTokens, ns: Sequence[int] = (2, 3, 4),
                     weights: Sequence[float] | None = None) -> float:
  """One number in [0, 1]: the weighted mean over ``n`` in ``ns`` of :func:`repeated_ngram_share`.

  ``score = sum_n w_n * repeated_ngram_share(x, n) / sum_n w_n`` (equal weights by default), i.e.
  the mean of ``1 - distinct_n``. One word repeated ``T`` times scores the mean of ``(T - n) / (T -
  n + 1)``, which tends to 1 with ``T``; a paragraph of prose scores near 0. Unigrams are left out
  by default: function words repeat in any text.

  Example:
    >>> repetition_score("region " * 50)  # mean of 48/49, 47/48, 46/47
    0.9791...
  """
  ns = tuple(ns)
  if not ns:
    raise ValueError("ns is empty")
  w = np.ones(len(ns)) if weights is None else np.asarray(weights, dtype=np.float64)
  if (w.shape != (len(ns),) or not np.all(np.isfinite(w)) or np.any(w < 0)
      or not np.sum(w) > 0):
    raise ValueError(f"weights must be {len(ns)} finite non-negative numbers with a positive sum, "
                     f"got {weights!r}")
  shares = np.asarray([repeated_ngram_share(tokens, n) for n in ns])
  return float(np.sum(w * shares) / np.sum(w))


def is_collapsed(tokens: TextOrTokens, threshold: float = 0.5,
                 ns: Sequence[int] = (2, 3, 4)) -> bool:
  """Whether :func:`repetition_score` of a sample reaches ``threshold``.

  Example:
    >>> is_collapsed("region region region region region region region region")
    True
  """
  if not 0 < threshold <= 1:
    raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
  return repetition_score(tokens, ns) >= threshold


def collapse_rate(samples: Sequence[TextOrTokens], threshold: float = 0.5,
                  ns: Sequence[int] = (2, 3, 4)) -> float:
  """Fraction of ``samples`` (strings or token-id sequences) that :func:`is_collapsed` flags.

  Example:
    >>> collapse_rate(["region " * 20, "The cat sat on the mat."])
    0.5
  """
  if isinstance(samples, (str, bytes)):   # one string would be read as a list of characters
    raise TypeError("samples must be a sequence of samples, got a single string: pass [text]")
  samples = list(samples)
  if not samples:
    raise ValueError("samples is empty")
  return sum(is_collapsed(s, threshold, ns) for s in samples) / len(samples)

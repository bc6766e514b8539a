"""The share of a text's words that are words of a corpus: does a model's sample read as its data?

A **word** is a maximal run of word characters (Python's ``\\w``: Unicode letters, digits and the
underscore) that does not begin with a digit (:data:`WORD_RE`, ``\\b[^\\W\\d]\\w*``) and is at least
:data:`MIN_WORD_CHARS` (3) characters long. ``the``, ``__init__``, ``naïve`` and ``thøzhß`` are
words; ``42``, ``3rd``, ``x2`` and ``of`` are not. Shorter runs are left out because random
characters make them by chance and a corpus of code holds nearly every one- and two-letter
identifier, so they would count babble as words. Words are compared exactly, case included.

A corpus's **vocabulary** is the set of words of its (training) documents; the **word share** of
samples is

    share = (number of word occurrences in the samples that are in the vocabulary)
            / (number of word occurrences in the samples),

pooled over all samples (a long sample weighs more), 0 when the samples hold no word at all. A
model that babbles invented syllables scores near 0; one that writes the corpus's English and
identifiers scores near 1, in whatever order it puts them: the measure is blind to grammar and to
repetition (``the the the`` scores 1; :mod:`andrea_jax.repetition` measures that).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

WORD_RE = re.compile(r"\b[^\W\d]\w*")
MIN_WORD_CHARS = 3


def words(text: str, min_chars: int = MIN_WORD_CHARS) -> list[str]:
  """The words of ``text`` in order: runs of :data:`WORD_RE` at least ``min_chars`` long.

  Example:
    >>> words("def __init__(self, x2): return 42 + 3rd.naïve")
    ['def', '__init__', 'self', 'return', 'naïve']
    >>> words("x2 of a", min_chars=1)
    ['x2', 'of', 'a']
  """
  return [w for w in WORD_RE.findall(text) if len(w) >= min_chars]


def vocabulary(texts: Iterable[str], min_chars: int = MIN_WORD_CHARS) -> frozenset[str]:
  """The set of words of ``texts``.

  Example:
    >>> sorted(vocabulary(["the cat", "the mat on"]))
    ['cat', 'mat', 'the']
  """
  vocab: set[str] = set()
  for text in texts:
    vocab.update(words(text, min_chars))
  return frozenset(vocab)


def word_share(texts: Iterable[str] | str, vocab: frozenset[str] | set[str],
               min_chars: int = MIN_WORD_CHARS) -> float:
  """The share of the words of ``texts`` (one string or several, pooled) found in ``vocab``.

  ``share = sum_t |{w in words(t) : w in vocab}| / sum_t |words(t)|``, counting repeats; 0.0 when
  the texts hold no word.

  Example:
    >>> word_share(["the dog sat", "on 42 mats"], vocabulary(["the cat sat on the mat"]))
    0.5
  """
  if isinstance(texts, str):
    texts = [texts]
  hits = total = 0
  for text in texts:
    found = words(text, min_chars)
    total += len(found)
    hits += sum(1 for w in found if w in vocab)
  return hits / total if total else 0.0

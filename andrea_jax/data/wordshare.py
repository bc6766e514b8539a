"""The share of a text's words that are words of a corpus: does a model's sample read as its data?

A **word** is a maximal run of word characters (Python's ``\\w``: Unicode letters, digits and the
underscore) that does not begin with a digit, found with :data:`WORD_RE` (``\\b[^\\W\\d]\\w*``):
``the``, ``x2``, ``__init__``, ``naïve`` and ``thøzhß`` are one word each; ``42`` is none and
``3rd`` holds none. Words are compared exactly, case included. A corpus's **vocabulary** is the set
of words of its (training) documents; the **word share** of samples is

    share = (number of word occurrences in the samples that are in the vocabulary)
            / (number of word occurrences in the samples),

pooled over all samples (a long sample weighs more), 0 when the samples hold no word at all. A
model that babbles invented syllables scores near 0; one that writes the corpus's English and
identifiers scores near 1, in whatever order it puts them (the measure says nothing of grammar).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

WORD_RE = re.compile(r"\b[^\W\d]\w*")


def words(text: str) -> list[str]:
  """The words of ``text`` in order (see the module docstring).

  Example:
    >>> words("def __init__(self, x2): return 42 + 3rd.naïve")
    ['def', '__init__', 'self', 'x2', 'return', 'naïve']
  """
  return WORD_RE.findall(text)


def vocabulary(texts: Iterable[str]) -> frozenset[str]:
  """The set of words of ``texts``.

  Example:
    >>> sorted(vocabulary(["the cat", "the mat"]))
    ['cat', 'mat', 'the']
  """
  vocab: set[str] = set()
  for text in texts:
    vocab.update(WORD_RE.findall(text))
  return frozenset(vocab)


def word_share(texts: Iterable[str] | str, vocab: frozenset[str] | set[str]) -> float:
  """The share of the words of ``texts`` (one string or several, pooled) found in ``vocab``.

  ``share = sum_t |{w in words(t) : w in vocab}| / sum_t |words(t)|``, counting repeats; 0.0 when
  the texts hold no word.

  Example:
    >>> word_share(["the dog sat", "on 42 mats"], vocabulary(["the cat sat on the mat"]))
    0.6
  """
  if isinstance(texts, str):
    texts = [texts]
  hits = total = 0
  for text in texts:
    found = WORD_RE.findall(text)
    total += len(found)
    hits += sum(1 for w in found if w in vocab)
  return hits / total if total else 0.0

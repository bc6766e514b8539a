"""Deterministic text generation for the built-in corpus: random streams, pseudo-words, Markov text.

Reproducibility across machines: every random number comes from the raw 64-bit output of numpy's
``PCG64`` seeded through ``SeedSequence`` (both specified bit for bit), turned into choices with
integer arithmetic only (``raw % n``, integer cumulative weights and ``searchsorted``); no floating
point, no ``Generator`` methods (whose algorithms numpy may change), no iteration over sets, no
``hash()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class Stream:
  """Reproducible random integers from a key: ``Stream(7, 3)`` is the same stream on every machine.

  Example:
    >>> s = Stream(0, 1)
    >>> s.below(10, 3).tolist() == Stream(0, 1).below(10, 3).tolist()
    True
  """

  def __init__(self, *key: int):
    self._bits = np.random.PCG64(np.random.SeedSequence([int(k) for k in key]))
    self._buffer: list[int] = []  # raw values for scalar draws, drawn 4096 at a time (speed)

  def raw(self, shape: int | tuple[int, ...]) -> np.ndarray:
    """uint64 array of raw PCG64 outputs."""
    n = int(np.prod(shape))
    return np.asarray(self._bits.random_raw(n), np.uint64).reshape(shape)

  def below(self, n: int | np.ndarray, shape: int | tuple[int, ...]) -> np.ndarray:
    """int64 integers in ``[0, n)`` (``raw % n``; the bias, below ``n / 2**64``, is irrelevant)."""
    return (self.raw(shape) % np.asarray(n, np.uint64)).astype(np.int64)

  def _scalar(self, n: int) -> int:
    if not self._buffer:
      self._buffer = self._bits.random_raw(4096).tolist()[::-1]
    return self._buffer.pop() % n

  def int(self, low: int, high: int) -> int:
    """One integer in ``[low, high]``."""
    return low + self._scalar(high - low + 1)

  def pick(self, items: Sequence):
    """One element of ``items``."""
    return items[self._scalar(len(items))]

  def chance(self, numerator: int, denominator: int) -> bool:
    """True with probability ``numerator / denominator``."""
    return self._scalar(denominator) < numerator

  def weighted(self, cum_W: np.ndarray, shape: int | tuple[int, ...]) -> np.ndarray:
    """Indices ``i`` drawn with probability ``weight_i / total``, from ``cum_W = cumsum(weights)``
    (integers)."""
    r = self.below(int(cum_W[-1]), shape)
    return np.searchsorted(cum_W, r, side="right")


def zipf_cum(n: int, scale: int = 1 << 20) -> np.ndarray:
  """Integer cumulative Zipf weights ``floor(scale / (rank + 1))`` of ranks ``0 .. n-1``."""
  return np.cumsum(scale // np.arange(1, n + 1, dtype=np.int64))


def make_words(stream: Stream, n: int, onsets: Sequence[str], nuclei: Sequence[str],
               codas: Sequence[str], max_syllables: int = 3,
               exclude: Sequence[str] = ()) -> list[str]:
  """``n`` distinct pseudo-words of 1..``max_syllables`` syllables ``onset + nucleus + coda``."""
  seen = dict.fromkeys(exclude)
  words: list[str] = []
  while len(words) < n:
    m = 2 * (n - len(words)) + 16
    syl_M = 1 + stream.below(max_syllables, m)
    parts_Mx3xS = stream.raw((m, 3, max_syllables))
    for i in range(m):
      w = "".join(onsets[int(parts_Mx3xS[i, 0, j] % len(onsets))]
                  + nuclei[int(parts_Mx3xS[i, 1, j] % len(nuclei))]
                  + codas[int(parts_Mx3xS[i, 2, j] % len(codas))] for j in range(syl_M[i]))
      if len(w) > 1 and w not in seen:
        seen[w] = None
        words.append(w)
        if len(words) == n:
          break
  return words


class Chain(NamedTuple):
  """A first-order Markov chain over words: each word has ``K`` successor slots."""
  words_V: np.ndarray   # [V] object (str)
  succ_VxK: np.ndarray  # [V, K] successor word ids, drawn Zipf over the vocabulary
  slot_cum_K: np.ndarray  # [K] cumulative integer weights of the slots (slot 0 most likely)
  start_cum_V: np.ndarray  # [V] cumulative integer weights of sentence-initial words


def make_chain(stream: Stream, words: Sequence[str], branching: int) -> Chain:
  """A chain whose word frequencies are Zipfian in the order of ``words`` (function words first).

  Small ``branching`` makes predictable text (few successors per word), large makes harder text.
  """
  v = len(words)
  cum_V = zipf_cum(v)
  succ_VxK = stream.weighted(cum_V, (v, branching))
  slot_cum_K = np.cumsum((branching - np.arange(branching, dtype=np.int64)) ** 2)
  return Chain(np.array(words, dtype=object), succ_VxK, slot_cum_K, cum_V)


def walk(stream: Stream, chain: Chain, n: int, length: int) -> np.ndarray:
  """``[n, length]`` word ids: ``n`` independent walks of the chain (vectorised across walks)."""
  ids_NxL = np.empty((n, length), np.int64)
  ids_NxL[:, 0] = stream.weighted(chain.start_cum_V, n)
  slots_NxL = stream.weighted(chain.slot_cum_K, (n, length))
  for t in range(1, length):
    ids_NxL[:, t] = chain.succ_VxK[ids_NxL[:, t - 1], slots_NxL[:, t]]
  return ids_NxL


class SentencePool:
  """Sentences of a chain, generated in vectorised blocks and handed out in order by :meth:`take`.

  Each sentence has ``lo..hi`` words, a capital, commas after a word with probability ``comma`` (in
  1/1000), and ends with one of ``endings`` (weighted by ``ending_weights``).
  """

  def __init__(self, stream: Stream, chain: Chain, lo: int, hi: int, comma: int = 0,
               endings: str = ".", ending_weights: Sequence[int] = (1,), capital: bool = True,
               block: int = 2048):
    self._stream, self._chain = stream, chain
    self._lo, self._hi, self._comma, self._capital, self._block = lo, hi, comma, capital, block
    self._endings, self._end_cum = endings, np.cumsum(np.asarray(ending_weights, np.int64))
    self._ready: list[str] = []

  def _refill(self) -> None:
    n, hi = self._block, self._hi
    ids_NxL = walk(self._stream, self._chain, n, hi)
    len_N = self._lo + self._stream.below(hi - self._lo + 1, n)
    toks_NxL = self._chain.words_V[ids_NxL]
    if self._comma:
      comma_NxL = (self._stream.below(1000, (n, hi)) < self._comma) & (
          np.arange(hi) < (len_N[:, None] - 1))
      toks_NxL[comma_NxL] = toks_NxL[comma_NxL] + ","
    end_N = self._stream.weighted(self._end_cum, n)
    out = []
    for i in range(n):
      s = " ".join(toks_NxL[i, :len_N[i]]) + self._endings[end_N[i]]
      out.append(s[0].upper() + s[1:] if self._capital else s)
    self._ready = out[::-1]

  def take(self, k: int) -> list[str]:
    """The next ``k`` sentences."""
    out = []
    for _ in range(k):
      if not self._ready:
        self._refill()
      out.append(self._ready.pop())
    return out

  def paragraph(self, lo: int, hi: int) -> str:
    """``lo..hi`` sentences joined by spaces."""
    return " ".join(self.take(self._stream.int(lo, hi)))


def roman(n: int) -> str:
  """Roman numeral of ``1 <= n < 4000``, e.g. ``roman(14) == 'XIV'``."""
  out = []
  for value, digits in ((1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                        (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
    count, n = divmod(n, value)
    out.append(digits * count)
  return "".join(out)


def fill(target_chars: int, make_document) -> list[str]:
  """Calls ``make_document()`` until the documents hold at least ``target_chars`` characters."""
  docs, total = [], 0
  while total < target_chars:
    doc = make_document()
    docs.append(doc)
    total += len(doc)
  return docs

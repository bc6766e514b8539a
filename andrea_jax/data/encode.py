"""Documents to token arrays, as the preparation stores them: ``[eod] + ids`` per document.

:func:`tokenize_docs` encodes documents (and refuses a tokenizer that writes the end-of-document id
inside text, or ids outside its vocabulary); :func:`tokenize_unit` reads and encodes one work unit
of a local file, in a worker process or in this one; :func:`tokenize_masked` encodes conversations
with their loss masks (:mod:`andrea_jax.data.hub.masks`); :func:`ordered_results` runs the units
through a process pool, in order; :func:`capped` cuts a source's tokens to its cap of whole
documents.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from andrea_jax.data import formats, readers
from andrea_jax.data import manifest as mf
from andrea_jax.data.errors import DataError
from andrea_jax.data.tokenizers import Tokenizer, load_tokenizer


@functools.lru_cache(maxsize=4)
def _cached_tokenizer(spec: str, fingerprint: str) -> Tokenizer:
  tok = load_tokenizer(spec)
  if tok.fingerprint != fingerprint:
    raise DataError(f"tokenizer {spec!r} changed on disk while preparing")
  return tok


def tokenize_unit(tokenizer: Tokenizer | tuple[str, str], dtype: str,
                  item: tuple[str, tuple, Any]) -> tuple[np.ndarray, np.ndarray]:
  """Reads and tokenizes one work unit of a file source, ``item = (format, arguments, unit)``
  (the reader is rebuilt from its format's name and arguments): ``(tokens [N] dtype,
  doc_lengths [D] int64)``, each document as ``[eod] + ids``. Workers get ``(spec, fingerprint)``
  and load the tokenizer once.

  Example:
    >>> source = formats.as_source(SourceSpec(("docs.jsonl",)))
    >>> unit = source.reader.units("docs.jsonl")[0]
    >>> tokenize_unit(load_tokenizer("bytes"), "<u2", (*source[:2], unit))[1]   # doctest: +SKIP
    array([12, 30])
  """
  tok = _cached_tokenizer(*tokenizer) if isinstance(tokenizer, tuple) else tokenizer
  fmt, arguments, unit = item
  docs = formats.make_reader(fmt, arguments).read(unit)
  where = (unit.where if isinstance(unit, readers.WorkUnit)
           else lambda k: f"format {fmt!r}, unit {unit!r} (document {k + 1} there)")
  return tokenize_docs(tok, dtype, docs, where)


def tokenize_docs(tok: Tokenizer, dtype: str, docs: list[str], where: Callable[[int], str],
                  encoded: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """``(tokens [N] dtype, doc_lengths [D] int64)`` of documents, each as ``[eod] + ids``;
  ``where(k)`` names document ``k`` in errors; ``encoded``: the documents' ids, when known.

  Example:
    >>> tokenize_docs(load_tokenizer("bytes"), "<u2", ["hi", "é"], str)
    (array([256, 104, 105, 256, 195, 169], dtype=uint16), array([3, 3]))
  """
  if encoded is None:
    encoded = tok.encode_batch(docs) if docs else []
  eod_1 = np.array([tok.eod_id], np.int64)
  lengths_D = np.array([len(ids) + 1 for ids in encoded], np.int64)
  if not encoded:
    return np.zeros(0, dtype), lengths_D
  for k, ids in enumerate(encoded):
    if (ids == tok.eod_id).any():   # it would split the document: a boundary the text never had
      raise DataError(f"{where(k)}: tokenizer {tok.name} encoded text as the end-of-document "
                      f"id {tok.eod_id}")
  tokens_N = np.concatenate([part for ids in encoded for part in (eod_1, ids)])
  if tokens_N.min() < 0 or tokens_N.max() >= tok.vocab_size:
    k = int(np.searchsorted(np.cumsum(lengths_D), np.argmax(
        (tokens_N < 0) | (tokens_N >= tok.vocab_size)), side="right"))
    raise DataError(f"{where(k)}: tokenizer {tok.name} produced id {tokens_N.max()} outside "
                    f"[0, {tok.vocab_size})")
  return tokens_N.astype(dtype), lengths_D


def capped(batches, max_tokens: int):
  """``batches`` (``(tokens, doc_lengths[, mask])`` in document order) cut to the longest prefix
  of whole documents whose tokens add up to at most ``max_tokens`` (0: all of them); ``batches``
  is closed once the cap is reached (a reader stops there).

  Example:
    >>> parts = [(np.arange(5), np.array([2, 3])), (np.arange(4), np.array([4]))]
    >>> [p[1].tolist() for p in capped(iter(parts), 8)]
    [[2, 3], []]
  """
  used = 0
  try:
    for parts in batches:
      lengths_D = parts[1]
      if max_tokens:
        # Whole documents only: the longest prefix that fits in what is left of the cap.
        take = int(np.searchsorted(np.cumsum(lengths_D), max_tokens - used, side="right"))
        if take < lengths_D.size:
          n = int(lengths_D[:take].sum())
          yield tuple(p[:take] if i == 1 else p[:n] for i, p in enumerate(parts))
          return
        used += int(lengths_D.sum())
      yield parts
  finally:
    if hasattr(batches, "close"):
      batches.close()


def worker_init() -> None:
  # Each worker is one of many processes: the tokenizers library must not add a thread per core.
  os.environ["TOKENIZERS_PARALLELISM"] = "false"


def ordered_results(call, units: list[readers.WorkUnit],
                    pool: concurrent.futures.Executor | None, window: int):
  """``call(unit)`` for each unit, in order; at most ``window`` units in flight in the pool
  (``None``: in this process).

  Example:
    >>> list(ordered_results(len, ["ab", "c"], None, 4))
    [2, 1]
  """
  if pool is None:
    yield from map(call, units)
    return
  todo = iter(units)
  pending = collections.deque(pool.submit(call, u) for _, u in zip(range(window), todo))
  while pending:
    result = pending.popleft().result()
    nxt = next(todo, None)
    if nxt is not None:
      pending.append(pool.submit(call, nxt))
    yield result


def tokenize_masked(tok: Tokenizer, dtype: str, docs: list[tuple[str, list]],
                    where: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(tokens [N] dtype, doc_lengths [D] int64, mask [N] uint8)`` of documents given with their
  loss spans: the tokens of :func:`tokenize_docs` (the same ids), and 1 for each token the loss
  counts (never the leading end-of-document id).

  Example:
    >>> tokenize_masked(load_tokenizer("bytes"), "<u2", [("ab", [(1, 2)])], str)[2]
    array([0, 0, 1], dtype=uint8)
  """
  from andrea_jax.data.hub import masks   # only for a masked source (a conversation)
  encoded = masks.encode_masked(tok, docs)
  tokens_N, lengths_D = tokenize_docs(tok, dtype, [text for text, _ in docs], where,
                                      encoded=[ids for ids, _ in encoded])
  zero_1 = np.zeros(1, mf.MASK_DTYPE)
  mask_N = np.concatenate([part for _, m in encoded for part in (zero_1, m.astype(mf.MASK_DTYPE))]
                          ) if encoded else np.zeros(0, mf.MASK_DTYPE)
  return tokens_N, lengths_D, mask_N

"""Bits per byte: a loss in nats per token restated per byte of text, comparable across tokenizers.

A model that spends ``L`` nats on each token of a text of ``N`` tokens and ``B`` UTF-8 bytes spends
``L N / ln 2`` bits on it, so

    bits/byte = L * (N / B) / ln 2.

``N / B`` is the tokenizer's **tokens per byte** on that text: exactly 1 for the byte tokenizer
(then bits/byte = ``L / ln 2``), about 0.25 for a BPE of English. The end-of-document id is not
text: it counts in neither ``N`` nor ``B``, the usual character-level convention. (The held-out
loss of :mod:`andrea_jax.evaluate` averages over every target, end-of-document targets included:
a small share of them, one per document.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from andrea_jax.data.shards import PreparedData
from andrea_jax.data.tokenizers import Tokenizer


def bits_per_byte(loss_nats_per_token: float, tokens_per_byte: float) -> float:
  """``loss_nats_per_token * tokens_per_byte / ln 2``.

  Example:
    >>> bits_per_byte(math.log(2), 1.0)          # byte tokenizer: 1 nat = 1.4427 bits per byte
    1.0
    >>> round(bits_per_byte(2.0, 0.25), 4)       # a BPE at 4 bytes per token
    0.7213
  """
  if not tokens_per_byte > 0:
    raise ValueError(f"tokens_per_byte must be > 0, got {tokens_per_byte!r}")
  return float(loss_nats_per_token) * float(tokens_per_byte) / math.log(2.0)


def tokens_per_byte(texts: Iterable[str], tokenizer: Tokenizer) -> float:
  """``sum(len(tokenizer.encode(t))) / sum(len(t.encode("utf-8")))`` over ``texts``.

  Example:
    >>> tokens_per_byte(["héllo"], load_tokenizer("bytes"))   # 6 tokens, 6 bytes
    1.0
  """
  tokens = num_bytes = 0
  for text in texts:
    tokens += len(tokenizer.encode(text))
    num_bytes += len(text.encode("utf-8"))
  if num_bytes == 0:
    raise ValueError("tokens_per_byte needs text: the texts hold no byte")
  return tokens / num_bytes


def heldout_tokens_per_byte(data: PreparedData, source: str, tokenizer: Tokenizer, *,
                            max_tokens: int = 1 << 20) -> float:
  """Tokens per byte of ``source``'s held-out split of ``data``: its tokens other than the
  end-of-document id, over the UTF-8 bytes of its documents decoded with ``tokenizer``; read from
  the split's first documents, whole, until ``max_tokens`` tokens (a ratio, not a sum: a large
  split need not be read through).

  Example:
    >>> heldout_tokens_per_byte(data, "reference", load_tokenizer("bytes"))
    1.0
  """
  if tokenizer.fingerprint != data.fingerprint:
    raise ValueError(f"tokenizer {tokenizer.name!r} is not the one {data.path} was prepared with "
                     f"({data.tokenizer_name!r})")
  tokens = num_bytes = 0
  for shard_N in data.shards(source, "eval"):
    ids_N = np.asarray(shard_N[:max(0, max_tokens - tokens) + 1], np.int64)
    cuts = np.flatnonzero(ids_N == data.eod_id)
    whole = ids_N if ids_N.size == shard_N.size else ids_N[:cuts[-1]] if cuts.size else ids_N
    for doc_N in np.split(whole, np.flatnonzero(whole == data.eod_id)):
      doc_N = doc_N[doc_N != data.eod_id]
      tokens += doc_N.size
      num_bytes += len(tokenizer.decode(doc_N).encode("utf-8")) if doc_N.size else 0
    if tokens >= max_tokens:
      break
  if num_bytes == 0:
    raise ValueError(f"source {source!r} of {data.path} has no held-out text")
  return tokens / num_bytes

"""Bits per byte: a loss in nats per token restated per byte of text, comparable across tokenizers.

A model that spends ``L`` nats on each token of a text of ``N`` tokens and ``B`` UTF-8 bytes spends
``L N / ln 2`` bits on it, so

    bits/byte = L * (N / B) / ln 2.

``N / B`` is the tokenizer's **tokens per byte** on that text: exactly 1 for the byte tokenizer
(then bits/byte = ``L / ln 2``), about 0.25 for a BPE of English. The end-of-document id is not
text: it counts in neither ``N`` nor ``B``, the usual character-level convention. (The held-out
loss of :mod:`andrea_jax.evaluate` averages over every target, end-of-document targets included:
a small share of them, one per document.) For a source whose loss counts only some tokens (a chat
source's ``loss_on``), ``N`` and ``B`` are those of the counted tokens alone: the bits per byte of
the assistant's text.
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
                            max_tokens: int = 1 << 20, counted: bool = False) -> float:
  """Tokens per byte of ``source``'s held-out split of ``data``: its tokens other than the
  end-of-document id, over the UTF-8 bytes of its documents decoded with ``tokenizer``; read from
  the split's first documents, whole, until ``max_tokens`` tokens (a ratio, not a sum: a large
  split need not be read through). ``counted``: only the tokens its loss mask counts, over the
  bytes of each run of consecutive counted tokens, decoded.

  Example:
    >>> heldout_tokens_per_byte(data, "reference", load_tokenizer("bytes"))
    1.0
  """
  if tokenizer.fingerprint != data.fingerprint:
    raise ValueError(f"tokenizer {tokenizer.name!r} is not the one {data.path} was prepared with "
                     f"({data.tokenizer_name!r})")
  masks = data.masks(source, "eval") if counted else ()
  tokens = num_bytes = 0
  for k, shard_N in enumerate(data.shards(source, "eval")):
    ids_N = np.asarray(shard_N[:max(0, max_tokens - tokens) + 1], np.int64)
    cuts = np.flatnonzero(ids_N == data.eod_id)
    whole = ids_N if ids_N.size == shard_N.size else ids_N[:cuts[-1]] if cuts.size else ids_N
    keep_N = (np.asarray(masks[k][:whole.size]) > 0 if counted
              else np.ones(whole.size, bool)) & (whole != data.eod_id)
    # Runs of kept tokens inside one document, each decoded whole (a piece of a word or of a
    # multi-byte character decodes only with its neighbours).
    breaks = np.flatnonzero(np.diff(keep_N.astype(np.int8)) != 0) + 1
    for run_N, kept in zip(np.split(whole, breaks), np.split(keep_N, breaks)):
      if kept.size and kept[0]:
        tokens += run_N.size
        num_bytes += len(tokenizer.decode(run_N).encode("utf-8"))
    if tokens >= max_tokens:
      break
  if num_bytes == 0:
    raise ValueError(f"source {source!r} of {data.path} has no held-out text")
  return tokens / num_bytes

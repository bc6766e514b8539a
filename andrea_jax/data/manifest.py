"""The on-disk format of prepared data: token shards and ``manifest.json``.

A prepared directory holds, for each source, raw little-endian token files
``<source>.<split>.<k:05d>.bin`` (``split`` is ``train`` or ``eval``; ``uint16`` when the vocabulary
has at most 65536 ids, else ``uint32``) and one ``manifest.json``::

  {"format_version": 1,
   "tokenizer": {"name": "bytes", "fingerprint": "<sha256>", "vocab_size": 257, "eod_id": 256},
   "dtype": "uint16",
   "sources": {"chat": {"source": "chat", "dtype": "uint16",
                        "tokenizer": {"name": ..., "fingerprint": ...},
                        "documents": {"train": 812, "eval": 8},
                        "tokens": {"train": 1048576, "eval": 9000},
                        "inputs": {... files read (sizes, SHA-256) and options ...},
                        "shards": {"train": [{"file": "chat.train.00000.bin", "tokens": 1048576,
                                              "sha256": "<hex>"}], "eval": [...]}}}}

A conversation source prepared with a loss mask (``loss_on`` other than ``"all"``,
:mod:`andrea_jax.data.chat_masks`) also has, beside each token shard, a mask shard
``<source>.<split>.<k:05d>.mask.bin`` of one byte per token (1: the loss counts the token as a
target), listed in its entry with its checksum, and the entry says which tokens count::

  "loss_on": "assistant", "loss_tokens": {"train": 402113, "eval": 3871},
  "masks": {"train": [{"file": "chat.train.00000.mask.bin", "tokens": 1048576, "sha256": ...}],
            "eval": [...]}

A source without a mask has none of these keys and no mask file.

Every document starts with the end-of-document id. Every file is written to a temporary name and
renamed into place, so a crash never leaves a half-written shard or manifest under its final name.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from andrea_jax import storage
from andrea_jax.data.errors import DataError

FORMAT_VERSION = 1
# How files are read and tokenized into documents: part of a source's cache key, so a prepared
# source is redone when it changes (and a prepared_dir made by an older one is warned about).
# Raise it with every change to the readers or to tokenizing (2: CRLF text files separate into
# documents; a tokenizer's saved truncation and padding are ignored).
READER_VERSION = 2
MANIFEST = "manifest.json"
SPLITS = ("train", "eval")


def token_dtype(vocab_size: int) -> np.dtype:
  """``<u2`` when every id fits in 16 bits (``vocab_size <= 65536``), else ``<u4``."""
  return np.dtype("<u2") if vocab_size <= (1 << 16) else np.dtype("<u4")


MASK_DTYPE = np.dtype("u1")


def shard_name(source: str, split: str, index: int, suffix: str = "") -> str:
  """File name of shard ``index`` of a source's split, e.g. ``chat.train.00000.bin`` (with
  ``suffix=".mask"``: ``chat.train.00000.mask.bin``, its loss mask)."""
  return f"{source}.{split}.{index:05d}{suffix}.bin"


def atomic_write_bytes(path: str, content: bytes) -> None:
  """Writes ``content`` to ``path`` through a temporary file and a rename; a failed write (a full
  disk) raises :class:`andrea_jax.storage.WriteError` and leaves the previous file whole."""
  storage.atomic_write(path, content, f"{path} is as it was before: {_AGAIN}")


# After a failed write of prepared data: what the manifest lists is whole, the rest is redone.
_AGAIN = "free some space, then run again (it prepares the sources not listed in it)"


def write_manifest(out_dir: str, manifest: dict[str, Any]) -> None:
  """Writes ``manifest.json`` atomically, with a fixed key order and layout (same bytes)."""
  text = json.dumps(manifest, indent=1, ensure_ascii=True) + "\n"
  atomic_write_bytes(os.path.join(out_dir, MANIFEST), text.encode("utf-8"))


def read_manifest(path: str) -> dict[str, Any]:
  """The manifest of a prepared directory; ``DataError`` if it is absent, unreadable or of another
  format version."""
  file = os.path.join(path, MANIFEST)
  if not os.path.isfile(file):
    raise DataError(f"{file} does not exist: {path!r} holds no prepared data "
                    "(run python -m andrea_jax.data.prepare first)")
  try:
    with open(file, "rb") as f:
      manifest = json.loads(f.read())
  except (ValueError, RecursionError) as e:   # JSONDecodeError, UnicodeDecodeError; too deep
    raise DataError(f"{file} is not valid JSON ({e})") from e
  version = manifest.get("format_version") if isinstance(manifest, dict) else None
  if version != FORMAT_VERSION:
    raise DataError(f"{file}: format_version {version!r}, this version reads {FORMAT_VERSION}")
  for key in ("tokenizer", "dtype", "sources"):
    if key not in manifest:
      raise DataError(f"{file}: missing key {key!r}")
  return manifest


class ShardWriter:
  """Streams one source split into shards of at most ``shard_tokens`` tokens.

  Documents may straddle two shards; every shard but the last holds exactly ``shard_tokens`` tokens.
  ``close()`` returns the manifest entries ``[{"file", "tokens", "sha256"}]`` of the shards written.
  A shard is written under a temporary name and renamed once whole; a failed write (a full disk)
  removes the temporary file and raises :class:`andrea_jax.storage.WriteError`.
  """

  def __init__(self, out_dir: str, source: str, split: str, dtype: np.dtype, shard_tokens: int,
               suffix: str = ""):
    self._out_dir, self._source, self._split, self._suffix = out_dir, source, split, suffix
    self._dtype, self._cap = np.dtype(dtype), int(shard_tokens)
    self._entries: list[dict[str, Any]] = []
    self._file = None
    self._tmp = self._name = ""
    self._count = 0
    self._sha = hashlib.sha256()

  def write(self, tokens_N: np.ndarray) -> None:
    """Appends tokens (any integer dtype, values already checked to fit ``dtype``)."""
    tokens_N = np.asarray(tokens_N).astype(self._dtype, copy=False)
    while tokens_N.size:
      with self._writing():
        if self._file is None:
          self._open()
        take = min(self._cap - self._count, tokens_N.size)
        block = tokens_N[:take].tobytes()
        self._file.write(block)
        self._sha.update(block)
        self._count += take
        tokens_N = tokens_N[take:]
        if self._count == self._cap:
          self._finish()

  def close(self) -> list[dict[str, Any]]:
    if self._file is not None:
      with self._writing():
        self._finish()
    return self._entries

  def abandon(self) -> None:
    """Closes the shard being written without renaming it into place (the caller discards it)."""
    if self._file is not None:
      f, self._file = self._file, None
      f.close()

  def _writing(self):
    """A failed write removes the shard being written (its temporary file)."""
    def discard():
      if self._file is not None:
        f, self._file = self._file, None
        try:
          f.close()
        finally:
          os.remove(self._tmp)
    name = shard_name(self._source, self._split, len(self._entries), self._suffix)
    return storage.writing(
        os.path.join(self._out_dir, name),
        f"Nothing of source {self._source!r} changed in the prepared folder: free some space, "
        "then run again (it prepares this source again)",
        cleanup=discard)

  def _open(self) -> None:
    self._name = shard_name(self._source, self._split, len(self._entries), self._suffix)
    self._tmp = os.path.join(self._out_dir, f".{self._name}.tmp{os.getpid()}")
    self._file = open(self._tmp, "wb")
    self._count = 0
    self._sha = hashlib.sha256()

  def _finish(self) -> None:
    self._file.flush()
    os.fsync(self._file.fileno())
    self._file.close()
    self._file = None
    os.replace(self._tmp, os.path.join(self._out_dir, self._name))
    self._entries.append({"file": self._name, "tokens": self._count,
                          "sha256": self._sha.hexdigest()})

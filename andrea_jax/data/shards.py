"""Opening prepared data: memory-mapped token shards, checked before training starts.

:meth:`PreparedData.open` reads ``manifest.json``, memory-maps every shard read-only and raises one
:class:`DataError` naming the source, the file and the position for any of: a missing or empty
required source, a source the run does not know, a missing or truncated shard, a shard whose SHA-256
differs from the manifest, a token id at or above the vocabulary size, a tokenizer other than the
one the data was prepared with. A source prepared with a loss mask (``loss_on``: the manifest's
``masks``) has its mask shards mapped and checked the same way (their sizes, checksums, values 0
or 1), and a required one whose training tokens the loss never counts is refused.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from andrea_jax import checks
from andrea_jax.data import manifest as mf
from andrea_jax.data.errors import DataError
from andrea_jax.data.tokenizers import Tokenizer
from andrea_jax.sources import SOURCES, check_sources

_CHECK_CHUNK = 1 << 24  # tokens per block when hashing a shard and scanning its maximum


def _check_shard(file: str, source: str, tokens_N: np.ndarray, sha256: str,
                 vocab_size: int) -> None:  # vocab_size 2 for a mask: values 0 and 1
  """SHA-256 of the shard's bytes and its largest id, block by block (one pass over the file)."""
  h = hashlib.sha256()
  bad = None
  for start in range(0, tokens_N.size, _CHECK_CHUNK):
    block_N = np.asarray(tokens_N[start:start + _CHECK_CHUNK])
    h.update(block_N.tobytes())
    if bad is None and block_N.max() >= vocab_size:
      offset = int(np.argmax(block_N >= vocab_size))
      bad = (start + offset, int(block_N[offset]))
  if h.hexdigest() != sha256:
    raise DataError(f"shard {file} of source {source!r}: SHA-256 {h.hexdigest()} does not match "
                    f"the manifest's {sha256}; the file was modified or corrupted: delete it and "
                    "run the preparation again (a source with a missing shard is prepared anew; "
                    "for the built-in corpus, run the training command again)")
  if bad is not None:
    raise DataError(f"shard {file} of source {source!r}: token id {bad[1]} at position {bad[0]} is "
                    f">= the vocabulary size {vocab_size}")


def _manifest_integer(where: str, value, **bounds) -> int:
  """``checks.integer`` of a manifest's field, refused as a :class:`DataError` (the data is wrong,
  not the run: the callers report a DataError as such)."""
  try:
    return checks.integer(where, value, **bounds)
  except (TypeError, ValueError) as e:
    raise DataError(str(e)) from None


class PreparedData:
  """Token shards of a prepared directory, memory-mapped, with their manifest.

  Attributes:
    path: the prepared directory.
    manifest: the parsed ``manifest.json``.
    sources: the run's sources, in weight-vector order.
    required: the sources the run samples from (present with training tokens).
    vocab_size, eod_id: of the tokenizer the data was prepared with.
    tokenizer_name, fingerprint: the same tokenizer's name and SHA-256.
    dtype: ``uint16`` or ``uint32``.
    masked_sources: the run's sources that have loss masks (``loss_on`` other than ``"all"``).
  """

  def __init__(self, path: str, manifest: dict[str, Any], sources: tuple[str, ...],
               required: tuple[str, ...], vocab_size: int,
               shards: dict[tuple[str, str], tuple[np.ndarray, ...]],
               masks: dict[tuple[str, str], tuple[np.ndarray, ...]] | None = None):
    self.path, self.manifest = path, manifest
    self.sources, self.required = sources, required
    self.vocab_size = int(vocab_size)
    self.eod_id = int(manifest["tokenizer"]["eod_id"])
    self.tokenizer_name = manifest["tokenizer"]["name"]
    self.fingerprint = manifest["tokenizer"]["fingerprint"]
    self.dtype = np.dtype(manifest["dtype"])
    self._shards = shards
    self._masks = masks or {}
    self.masked_sources = tuple(s for s in sources if (s, "train") in self._masks)

  @classmethod
  def open(cls, path: str | os.PathLike, *, tokenizer: Tokenizer | None = None,
           sources: Sequence[str] = SOURCES, required: Sequence[str] | None = None,
           verify: bool = True) -> PreparedData:
    """Opens and checks a prepared directory.

    Args:
      path: directory holding ``manifest.json`` and the shards.
      tokenizer: the run's tokenizer; its fingerprint must equal the manifest's. ``None`` trusts the
        manifest's vocabulary size.
      sources: the run's sources (every weight vector is in this order); the manifest's other
        sources, if any, are not opened.
      required: the sources the run samples from; each must be present with training tokens.
        Default: all of ``sources``. The others may be absent.
      verify: also hash every shard and scan its largest token id (one read of the data). Sizes,
        presence and the tokenizer are always checked.

    Returns:
      The opened data.

    Example:
      >>> data = PreparedData.open("/tmp/prepared", tokenizer=load_tokenizer("bytes"))
      >>> data.num_tokens("chat"), data.shards("chat")[0].dtype
      (1048576, dtype('uint16'))
    """
    path = os.fspath(path)
    sources = check_sources(sources)
    required = sources if required is None else check_sources(required, "required")
    unknown_required = [s for s in required if s not in sources]
    if unknown_required:
      raise DataError(f"required sources {unknown_required} are not among the run's sources")
    manifest = mf.read_manifest(path)
    where = os.path.join(path, mf.MANIFEST)
    try:
      return cls._open_manifest(path, manifest, where, tokenizer, sources, required, verify)
    except (KeyError, TypeError, AttributeError, IndexError) as e:
      # A hand-edited or foreign manifest: a key missing, a list where a mapping should be, ...
      raise DataError(f"{where}: malformed manifest ({type(e).__name__}: {e}); prepare the data "
                      "again") from e

  @classmethod
  def _open_manifest(cls, path, manifest, where, tokenizer, sources, required, verify):
    tok_info = manifest["tokenizer"]
    if tokenizer is not None and tokenizer.fingerprint != tok_info["fingerprint"]:
      raise DataError(
          f"{where}: the data was prepared with tokenizer {tok_info['name']!r} (fingerprint "
          f"{tok_info['fingerprint'][:16]}...), the run uses {tokenizer.name!r} (fingerprint "
          f"{tokenizer.fingerprint[:16]}...); prepare the data again with the run's tokenizer")
    vocab_size = tokenizer.vocab_size if tokenizer is not None else int(tok_info["vocab_size"])
    eod_id = tok_info["eod_id"]
    if tokenizer is not None and (tok_info["vocab_size"], eod_id) != (tokenizer.vocab_size,
                                                                     tokenizer.eod_id):
      raise DataError(f"{where}: vocab_size {tok_info['vocab_size']!r} and eod_id {eod_id!r}, the "
                      f"run's tokenizer has {tokenizer.vocab_size} and {tokenizer.eod_id}; "
                      "prepare the data again")
    _manifest_integer(f"{where}: eod_id", eod_id, minimum=0, maximum=vocab_size - 1,
                      hint=f"a token id below the vocabulary size {vocab_size}")
    stale = [s for s in required if isinstance(manifest["sources"].get(s), dict)
             and isinstance(manifest["sources"][s].get("inputs"), dict)
             and manifest["sources"][s]["inputs"].get("reader_version", 1) != mf.READER_VERSION]
    if stale:
      warnings.warn(f"{where}: sources {stale} were prepared by another version of the readers "
                    f"(this one is {mf.READER_VERSION}); prepare them again "
                    "(python -m andrea_jax.data.prepare) to read their files as it does",
                    stacklevel=3)
    for s in required:
      entry = manifest["sources"].get(s)
      if entry is None:
        raise DataError(f"{where}: required source {s!r} is missing; prepare it or leave it out of "
                        "the sources the run samples from")
      if entry.get("tokens", {}).get("train", 0) == 0:
        raise DataError(f"{where}: required source {s!r} has 0 training tokens"
                        + _why_no_training_tokens(entry))
      if "masks" in entry and entry.get("loss_tokens", {}).get("train", 0) == 0:
        raise DataError(f"{where}: required source {s!r} was prepared with loss_on "
                        f"{entry.get('loss_on')!r}, and none of its training tokens counts (no "
                        "assistant turn, or none outside the held-out documents): prepare it "
                        "with loss_on 'all', or leave it out of the sources the run samples")
    if manifest["dtype"] not in ("uint16", "uint32"):   # unsigned: no negative token id
      raise DataError(f"{where}: dtype {manifest['dtype']!r}, token shards are 'uint16' or "
                      "'uint32'")
    # Only the run's sources are opened: a corpus may hold more (a run over some of its sources).
    shards = {(s, split): maps for s, entry in manifest["sources"].items() if s in sources
              for split, maps in _map_shards(path, manifest, where, s, entry, vocab_size,
                                             verify).items()}
    masks = {(s, split): maps for s, entry in manifest["sources"].items()
             if s in sources and "masks" in entry
             for split, maps in _map_shards(path, manifest, where, s, entry, 2, verify,
                                            key="masks").items()}
    return cls(path, manifest, sources, tuple(required), vocab_size, shards, masks)

  def has(self, source: str) -> bool:
    """Whether ``source`` is present with training tokens."""
    return bool(self._shards.get((source, "train")))

  def shards(self, source: str, split: str = "train") -> tuple[np.ndarray, ...]:
    """The read-only ``[n_k]`` token memmaps of a source's split (empty tuple when absent)."""
    if split not in mf.SPLITS:
      raise ValueError(f"split must be one of {mf.SPLITS}, got {split!r}")
    return self._shards.get((source, split), ())

  def masks(self, source: str, split: str = "train") -> tuple[np.ndarray, ...]:
    """The read-only ``[n_k]`` uint8 loss masks of a source's split, one per shard of
    :meth:`shards` (1: the loss counts the token as a target); an empty tuple for a source without
    masks (every token counts)."""
    if split not in mf.SPLITS:
      raise ValueError(f"split must be one of {mf.SPLITS}, got {split!r}")
    return self._masks.get((source, split), ())

  def num_tokens(self, source: str, split: str = "train") -> int:
    """Tokens in a source's split (0 when absent)."""
    return int(sum(m.size for m in self.shards(source, split)))

  def __repr__(self) -> str:
    present = [s for s in self.sources if self.has(s)]
    return (f"PreparedData({self.path!r}, tokenizer={self.tokenizer_name!r}, "
            f"{len(present)}/{len(self.sources)} sources, "
            f"{sum(self.num_tokens(s) for s in present)} train tokens)")


def _map_shards(path: str, manifest: dict, where: str, source: str, entry: dict, vocab_size: int,
                verify: bool, key: str = "shards") -> dict[str, tuple[np.ndarray, ...]]:
  """``split -> memory-mapped shards`` of one source, each shard's name, size and (``verify``)
  hash and token ids checked; ``key="masks"``: its loss masks (one byte per token, each as long
  as its token shard, values below ``vocab_size = 2``)."""
  missing = [k for k in ("dtype", "tokenizer", "tokens", "shards") if k not in entry]
  if missing:
    raise DataError(f"{where}: the entry of source {source!r} lacks {missing}")
  if entry.get("dtype") != manifest["dtype"]:
    raise DataError(f"{where}: source {source!r} has dtype {entry.get('dtype')!r}, the manifest "
                    f"{manifest['dtype']!r}")
  if entry.get("tokenizer", {}).get("fingerprint") != manifest["tokenizer"]["fingerprint"]:
    raise DataError(f"{where}: source {source!r} was prepared with another tokenizer than the "
                    "manifest's")
  dtype = np.dtype(manifest["dtype"]).newbyteorder("<") if key == "shards" else mf.MASK_DTYPE
  out = {}
  for split in mf.SPLITS:
    maps = []
    if key == "masks" and [m["tokens"] for m in entry["masks"][split]] != [
        m["tokens"] for m in entry["shards"][split]]:
      raise DataError(f"{where}: the {split} masks of source {source!r} do not match its shards "
                      "one for one; prepare it again")
    for shard in entry[key][split]:
      name = shard["file"]
      if (not isinstance(name, str) or os.path.isabs(name)
          or os.path.normpath(name).split(os.sep)[0] == os.pardir):
        raise DataError(f"{where}: shard {name!r} of source {source!r} is not a path inside "
                        f"{path}")
      count = _manifest_integer(f"{where}: shard {name!r} of source {source!r}: tokens",
                                shard["tokens"], minimum=0, int32=False, hint="a count")
      file = os.path.join(path, name)
      if not os.path.isfile(file):
        raise DataError(f"shard {file} of source {source!r} is missing")
      expected = count * dtype.itemsize
      size = os.path.getsize(file)
      if size != expected:
        raise DataError(f"shard {file} of source {source!r} is truncated or padded: {size} bytes, "
                        f"expected {expected} ({count} tokens of {dtype.itemsize} bytes)")
      if count == 0:  # mmap refuses empty files
        maps.append(np.zeros(0, dtype))
        continue
      tokens_N = np.memmap(file, dtype=dtype, mode="r", shape=(count,))
      if verify:
        _check_shard(file, source, tokens_N, shard["sha256"], vocab_size)
      maps.append(tokens_N)
    out[split] = tuple(maps)
  return out


def _why_no_training_tokens(entry: dict) -> str:
  """The likely reason a prepared source has no training tokens, for the error message."""
  docs, tokens = entry.get("documents", {}), entry.get("tokens", {})
  held, inputs = docs.get("eval", 0), entry.get("inputs", {})
  if docs.get("train", 0) or tokens.get("eval", 0) <= held:   # each document adds one marker
    return " (its input files hold no text)"
  why = (f" (its {held} document{'s' if held > 1 else ''} went to the held-out split: a source "
         "needs 2 documents or more, one of its first two is held out")
  if inputs.get("format") == "text":
    why += (f"; in a text file a line that is exactly {inputs.get('separator')!r} separates "
            "documents, and a file without one is a single document")
  return why + ")"

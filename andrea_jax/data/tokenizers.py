"""Tokenizers behind one interface: UTF-8 bytes, Hugging Face ``tokenizers`` JSON, SentencePiece.

A tokenizer is named by a string (:func:`load_tokenizer`): ``"bytes"``, a local file, or
``"hf:<repo>[@revision]"`` for a tokenizer on the Hugging Face Hub (``tokenizer.json``, else
``tokenizer.model``), downloaded once into the Hugging Face cache and read from there afterwards;
where the Hub cannot be reached the load fails at once (see :mod:`andrea_jax.data.hub.files`).

Every tokenizer has ``name``, ``spec`` (the string :func:`load_tokenizer` rebuilds it from),
``vocab_size``, ``eod_id`` (the end-of-document id that ``prepare`` puts at the start of every
document), ``fingerprint`` (SHA-256 of its defining content, recorded with the prepared data and
checked when training starts), ``encode(str) -> int32 ids``, ``encode_batch(list[str])`` and
``decode(ids) -> str``. ``encode`` never emits ``eod_id``: text that happens to spell a special
token is encoded as ordinary text. The tokenizers here also have ``encode_batch_offsets``: the same
ids with the ``[start, end)`` characters of the text each one covers, from which the loss masks of
conversations are made (:mod:`andrea_jax.data.hub.masks`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from andrea_jax import storage
from andrea_jax.data.errors import DataError

BYTE_VOCAB_SIZE = 257
BYTE_EOD_ID = 256
_BYTE_SPEC = (b"andrea_jax byte tokenizer v1: ids 0..255 are the UTF-8 bytes of the text, "
              b"256 is the end-of-document id, vocab_size 257")

EOD_TOKEN = "<|endoftext|>"
"""End-of-document token of tokenizers trained by :func:`train_bpe` (id 0)."""

# Looked up in this order in a tokenizers JSON file; the first present is the end-of-document id.
_EOD_CANDIDATES = (EOD_TOKEN, "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]")


def _char_of_byte(text: str) -> np.ndarray:
  """``[len(text.encode()) + 1]`` int64: the index of the character each UTF-8 byte of ``text``
  belongs to (and ``len(text)`` one past the end)."""
  code_C = np.frombuffer(text.encode("utf-32-le"), np.uint32)
  width_C = 1 + (code_C >= 0x80) + (code_C >= 0x800) + (code_C >= 0x10000)
  return np.append(np.repeat(np.arange(code_C.size), width_C), code_C.size)


@runtime_checkable
class Tokenizer(Protocol):
  """What the data pipeline needs from a tokenizer."""
  name: str
  spec: str
  vocab_size: int
  eod_id: int
  fingerprint: str

  def encode(self, text: str) -> np.ndarray: ...

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]: ...

  def decode(self, ids: Iterable[int] | np.ndarray) -> str: ...


class ByteTokenizer:
  """UTF-8 bytes: ids 0..255 are the bytes, 256 is the end-of-document id; no files needed.

  Example:
    >>> tok = ByteTokenizer()
    >>> tok.encode("hé").tolist()
    [104, 195, 169]
    >>> tok.decode([256, 104, 195, 169])
    'hé'
  """
  name = "bytes"
  spec = "bytes"
  vocab_size = BYTE_VOCAB_SIZE
  eod_id = BYTE_EOD_ID
  fingerprint = hashlib.sha256(_BYTE_SPEC).hexdigest()

  def encode(self, text: str) -> np.ndarray:
    """``[n]`` int32 UTF-8 bytes of ``text``."""
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """:meth:`encode` of each text."""
    return [self.encode(t) for t in texts]

  def encode_batch_offsets(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(ids [n] int32, offsets [n, 2] int64)`` of each text: a byte's id and the character it
    belongs to, ``[c, c + 1)``.

    Example:
      >>> ByteTokenizer().encode_batch_offsets(["hé"])[0][1].tolist()
      [[0, 1], [1, 2], [1, 2]]
    """
    out = []
    for text in texts:
      char_N = _char_of_byte(text)[:-1]
      out.append((self.encode(text), np.stack([char_N, char_N + 1], axis=1)))
    return out

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    """Text of ``ids``; end-of-document ids are dropped, invalid UTF-8 becomes U+FFFD."""
    ids_N = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, np.int64).reshape(-1)
    if ids_N.size and (ids_N.min() < 0 or ids_N.max() >= self.vocab_size):
      raise ValueError(f"byte tokenizer ids must lie in [0, {self.vocab_size}), got "
                       f"min {ids_N.min()} max {ids_N.max()}")
    return ids_N[ids_N < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class HFTokenizer:
  """A Hugging Face ``tokenizers`` JSON file (for instance one trained by :func:`train_bpe`).

  The end-of-document id is the first of ``<|endoftext|>``, ``<|end_of_text|>``, ``</s>``,
  ``<eos>``, ``<|eos|>``, ``[EOS]`` present in the vocabulary. Special tokens spelled inside a text
  are encoded as ordinary text (``encode_special_tokens``), so a document never smuggles in a
  boundary.
  """

  def __init__(self, path: str | os.PathLike, name: str | None = None):
    import tokenizers  # the library; this module is andrea_jax.data.tokenizers

    self.spec = os.fspath(path)
    with open(self.spec, "rb") as f:
      content = f.read()
    self.fingerprint = hashlib.sha256(content).hexdigest()
    self.name = name or f"hf:{os.path.basename(self.spec)}"
    try:
      self._tok = tokenizers.Tokenizer.from_str(content.decode("utf-8"))
    except Exception as e:  # the library raises plain Exception subclasses of its own
      raise DataError(f"{self.spec}: not a Hugging Face tokenizers JSON file ({e})") from e
    self._tok.encode_special_tokens = True
    # A saved truncation or padding would cut documents or fill them with pad ids (an end-of-
    # document id among them): this module encodes whole documents, one id per piece of text.
    self._tok.no_truncation()
    self._tok.no_padding()
    self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
    for candidate in _EOD_CANDIDATES:
      tid = self._tok.token_to_id(candidate)
      if tid is not None:
        self.eod_id = int(tid)
        break
    else:
      raise DataError(f"{self.spec}: no end-of-document token; add one of {list(_EOD_CANDIDATES)} "
                      "to the tokenizer's special tokens")
    added = self._tok.get_added_tokens_decoder().get(self.eod_id)
    if added is None or not added.special:
      # Only special tokens are kept out of encode (encode_special_tokens): an ordinary one would
      # turn text that spells it into a document boundary.
      raise DataError(f"{self.spec}: the end-of-document token {candidate!r} (id {self.eod_id}) is "
                      "not a special token, so text spelling it would be encoded as a document "
                      "boundary; mark it special (tokenizer.add_special_tokens) and save the file "
                      "again")
    # The model's unknown token: unk_token (BPE, WordPiece, WordLevel) or unk_id (Unigram), as
    # the file stores them (the library exposes neither for Unigram).
    model = json.loads(content.decode("utf-8")).get("model") or {}
    unk_id = model.get("unk_id")
    if unk_id is None and isinstance(model.get("unk_token"), str):
      unk_id = self._tok.token_to_id(model["unk_token"])
    if isinstance(unk_id, int) and unk_id == self.eod_id:
      raise DataError(f"{self.spec}: the unknown token is the end-of-document token {candidate!r} "
                      f"(id {self.eod_id}), so every character the vocabulary lacks would end a "
                      "document; give the model another unk_token")

  @property
  def eod_token(self) -> str:
    """The text of the end-of-document token, e.g. ``<|endoftext|>``."""
    return self._tok.id_to_token(self.eod_id)

  def encode(self, text: str) -> np.ndarray:
    """``[n]`` int32 ids of ``text`` (no special tokens added)."""
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """:meth:`encode` of each text, in parallel inside the library."""
    encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)  # no offsets: faster
    encs = encode(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, np.int32) for e in encs]

  def encode_batch_offsets(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(ids [n] int32, offsets [n, 2] int64)`` of each text: :meth:`encode_batch`'s ids and the
    ``[start, end)`` characters each covers (the library's offsets, as ``transformers`` reads them
    for ``return_assistant_tokens_mask``)."""
    encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
    return [(np.asarray(e.ids, np.int32), np.asarray(e.offsets, np.int64).reshape(-1, 2))
            for e in encs]

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    """Text of ``ids``, special tokens (the end-of-document id among them) dropped."""
    return self._tok.decode([int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=True)


class SentencePieceTokenizer:
  """A SentencePiece ``.model`` file; its ``eos`` piece is the end-of-document id."""

  def __init__(self, path: str | os.PathLike, name: str | None = None):
    import sentencepiece as spm

    self.spec = os.fspath(path)
    with open(self.spec, "rb") as f:
      content = f.read()
    self.fingerprint = hashlib.sha256(content).hexdigest()
    self.name = name or f"sentencepiece:{os.path.basename(self.spec)}"
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=content)
    except Exception as e:  # RuntimeError or OSError depending on the version
      raise DataError(f"{self.spec}: not a SentencePiece model ({e})") from e
    self.vocab_size = int(self._sp.get_piece_size())
    self.eod_id = int(self._sp.eos_id())
    if self.eod_id < 0:
      raise DataError(f"{self.spec}: the SentencePiece model has no eos piece (trained with "
                      "eos_id=-1); retrain it with an eos_id to mark document ends")

  @property
  def eod_token(self) -> str:
    """The text of the eos piece, e.g. ``</s>``."""
    return self._sp.id_to_piece(self.eod_id)

  def encode(self, text: str) -> np.ndarray:
    """``[n]`` int32 ids of ``text``."""
    return np.asarray(self._sp.encode(text), np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """:meth:`encode` of each text."""
    return [np.asarray(ids, np.int32) for ids in self._sp.encode(list(texts))]

  def encode_batch_offsets(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(ids [n] int32, offsets [n, 2] int64)`` of each text: the pieces' ids and the
    ``[start, end)`` characters each covers (SentencePiece gives bytes; mapped to characters)."""
    try:
      protos = self._sp.encode(list(texts), return_type="proto")
    except TypeError:   # sentencepiece < 0.2.1 names it out_type="immutable_proto"
      protos = self._sp.encode(list(texts), out_type="immutable_proto")
    out = []
    for text, proto in zip(texts, protos):
      char_B = _char_of_byte(text)
      ids_N = np.array([p.id for p in proto.pieces], np.int32)
      bytes_Nx2 = np.array([(p.begin, p.end) for p in proto.pieces], np.int64).reshape(-1, 2)
      out.append((ids_N, char_B[np.minimum(bytes_Nx2, char_B.size - 1)]))
    return out

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    """Text of ``ids`` (control pieces such as eos decode to nothing)."""
    return self._sp.decode([int(i) for i in np.asarray(ids).reshape(-1)])


HUB_PREFIX = "hf:"


def load_hub_tokenizer(name: str) -> Tokenizer:
  """The tokenizer of a Hub repository, ``name = "hf:<repo>[@revision]"``: its ``tokenizer.json``
  (else its SentencePiece ``tokenizer.model``), from the local Hugging Face cache when there, else
  downloaded once. The tokenizer's ``spec`` is the cached file (worker processes read it without
  the network); its ``name`` is ``name``.

  Raises:
    DataError: at once (no retries) when the file is neither cached nor reachable, naming the
      tokenizer and how to use a local file instead.

  Example:
    >>> load_hub_tokenizer("hf:gpt2").vocab_size   # doctest: +SKIP
    50257
  """
  from andrea_jax.data.hub import files as hfhub

  repo, revision = hfhub.split_name(name[len(HUB_PREFIX):])
  if not repo:
    raise DataError(f"tokenizer {name!r}: no repository after {HUB_PREFIX!r}")
  what = f"tokenizer {name!r}"
  hint = ("To use a local file instead, set the tokenizer to the path of a tokenizer.json "
          f"(fetched on a machine with network: hf download {repo} tokenizer.json) or of a "
          "SentencePiece .model.")
  try:
    return HFTokenizer(hfhub.hub_file(repo, "tokenizer.json", revision=revision, what=what,
                                      local_hint=hint), name=name)
  except hfhub.NotOnHub:
    pass
  try:
    return SentencePieceTokenizer(hfhub.hub_file(repo, "tokenizer.model", revision=revision,
                                                 what=what, local_hint=hint), name=name)
  except hfhub.NotOnHub as e:
    raise DataError(f"{what}: {repo} has neither tokenizer.json nor tokenizer.model") from e


def load_tokenizer(spec: str | os.PathLike | Tokenizer) -> Tokenizer:
  """The tokenizer named by ``spec``: ``"bytes"``, tokenizers ``.json``, SentencePiece ``.model``,
  or ``"hf:<repo>[@revision]"`` on the Hugging Face Hub (:func:`load_hub_tokenizer`); a tokenizer
  already loaded (a run's ``run.data.tokenizer``) is returned as it is.

  A file with another extension is recognised by its content (JSON starts with ``{``).

  Example:
    >>> load_tokenizer("bytes").vocab_size
    257
  """
  if not isinstance(spec, (str, os.PathLike)) and isinstance(spec, Tokenizer):
    return spec
  spec = os.fspath(spec)
  if spec.startswith(HUB_PREFIX):
    return load_hub_tokenizer(spec)
  if spec != "bytes":
    spec = os.path.expanduser(spec)   # as data.tokenizer's validation reads it
  if spec == "bytes":
    return ByteTokenizer()
  if not os.path.isfile(spec):
    raise DataError(f"tokenizer {spec!r} is neither 'bytes' nor an existing file (a tokenizer on "
                    "the Hugging Face Hub is named 'hf:<repo>')")
  if spec.endswith(".json"):
    return HFTokenizer(spec)
  if spec.endswith(".model"):
    return SentencePieceTokenizer(spec)
  with open(spec, "rb") as f:
    head = f.read(64).lstrip()
  return HFTokenizer(spec) if head.startswith(b"{") else SentencePieceTokenizer(spec)


def train_bpe(texts_iter: Iterable[str], vocab_size: int, path: str | os.PathLike) -> HFTokenizer:
  """Trains a byte-level BPE tokenizer with the ``tokenizers`` library, saved as JSON at ``path``.

  The vocabulary holds ``<|endoftext|>`` (id 0, the end-of-document id), the 256 byte symbols, then
  up to ``vocab_size - 257`` merges learned from ``texts_iter``; any UTF-8 text round-trips exactly.

  Example:
    >>> tok = train_bpe(["low lower lowest"] * 100, 300, "/tmp/bpe.json")
    >>> tok.decode(tok.encode("lowest")) == "lowest"
    True
  """
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers

  if int(vocab_size) < BYTE_VOCAB_SIZE:
    raise ValueError(f"vocab_size must be >= {BYTE_VOCAB_SIZE} (256 bytes + end of document), "
                     f"got {vocab_size}")
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=int(vocab_size), special_tokens=[EOD_TOKEN],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(texts_iter, trainer)
  path = os.fspath(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  storage.atomic_write(path, tok.to_str(pretty=True), "no tokenizer was written")
  return HFTokenizer(path)

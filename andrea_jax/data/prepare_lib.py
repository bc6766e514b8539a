"""Tokenize each source into token shards and a manifest (see :mod:`manifest`).

A source is local files (:class:`~andrea_jax.data.readers.SourceSpec`) or a Hugging Face dataset
(:class:`~andrea_jax.data.hub.HubSpec`, read through the ``datasets`` library in this process).

The command line is :mod:`andrea_jax.data.prepare`. What :func:`prepare` guarantees:

* every document becomes ``[eod_id] + encode(document)``, so with a document mask each target is
  predictable from its own segment (the last token of a document predicts the next one's leading
  ``eod_id``);
* one document in every block of ``round(1 / eval_fraction)`` consecutive documents of a source (and
  one of its first two) is held out for evaluation, at a place in the block given by
  ``splitmix64(source, block)``: whole documents, the same ones on every run;
* the output is a pure function of the input files, the options and the tokenizer (same input, same
  bytes), whatever the number of workers;
* a source whose manifest entry matches its inputs (sizes and SHA-256 of every file, options,
  tokenizer; for a dataset also its name, revision and fingerprint) and its shards (present, with
  the recorded sizes) is finished and is not redone; an interrupted source is not listed in the
  manifest, so it is redone alone on the next run. Shard
  contents are checked against their SHA-256 when the data is opened
  (:class:`andrea_jax.data.shards.PreparedData`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import multiprocessing
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import tqdm

from andrea_jax import storage
from andrea_jax.data import chat_templates, hashing, hub, readers
from andrea_jax.data import manifest as mf
from andrea_jax.data.errors import DataError
from andrea_jax.data.tokenizers import Tokenizer, load_tokenizer
from andrea_jax.sources import SOURCES, source_index

DEFAULT_SHARD_TOKENS = 1 << 28  # 512 MiB of uint16 tokens per shard
READER_VERSION = mf.READER_VERSION


class PrepareResult(NamedTuple):
  """What :func:`prepare` did: the manifest, the sources tokenized and those found finished."""
  manifest: dict[str, Any]
  prepared: tuple[str, ...]
  skipped: tuple[str, ...]


def eval_mask(source: str, first_doc: int, num_docs: int, eval_fraction: float) -> np.ndarray:
  """``[num_docs]`` bool: which of documents ``first_doc ..`` of ``source`` are held out.

  Documents ``0, 1`` form block 0 (so that any source of two documents or more has a held-out one),
  then blocks of ``k = max(2, round(1 / eval_fraction))`` follow: block ``b >= 1`` is documents
  ``2 + (b-1) k .. 1 + b k``. Exactly one document per full block is held out, the one at offset
  ``splitmix64(name_key(source) ^ b) % size(b)`` in its block.

  Example:
    >>> int(eval_mask("chat", 0, 1002, 0.01).sum())   # block 0 and ten blocks of 100
    11
  """
  if eval_fraction <= 0 or num_docs == 0:
    return np.zeros(num_docs, bool)
  k = max(2, int(round(1.0 / eval_fraction)))
  i_N = np.arange(first_doc, first_doc + num_docs, dtype=np.int64)
  block_N = np.where(i_N < 2, 0, 1 + (i_N - 2) // k)
  start_N = np.where(block_N == 0, 0, 2 + (block_N - 1) * k)
  size_N = np.where(block_N == 0, 2, k).astype(np.uint64)
  key_N = hashing.splitmix64(block_N.astype(np.uint64) ^ np.uint64(hashing.name_key(source)))
  return (i_N - start_N).astype(np.uint64) == key_N % size_N


@functools.lru_cache(maxsize=4)
def _cached_tokenizer(spec: str, fingerprint: str) -> Tokenizer:
  tok = load_tokenizer(spec)
  if tok.fingerprint != fingerprint:
    raise DataError(f"tokenizer {spec!r} changed on disk while preparing")
  return tok


def _tokenize_unit(tokenizer: Tokenizer | tuple[str, str], dtype: str,
                   unit: readers.WorkUnit) -> tuple[np.ndarray, np.ndarray]:
  """Reads and tokenizes one work unit: ``(tokens [N] dtype, doc_lengths [D] int64)``, each
  document as ``[eod] + ids``. Workers get ``(spec, fingerprint)`` and load the tokenizer once."""
  tok = _cached_tokenizer(*tokenizer) if isinstance(tokenizer, tuple) else tokenizer
  at = f"row group {unit.start}" if unit.format == "parquet" else f"bytes {unit.start}.."
  return _tokenize_docs(tok, dtype, readers.read_unit(unit),
                        lambda k: f"{unit.path} ({at}, document {k + 1} there)")


def _tokenize_docs(tok: Tokenizer, dtype: str, docs: list[str],
                   where: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray]:
  """``(tokens [N] dtype, doc_lengths [D] int64)`` of documents, each as ``[eod] + ids``;
  ``where(k)`` names document ``k`` in errors."""
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


def _unit_weights(units: list[readers.WorkUnit]) -> list[int]:
  """Input bytes each unit stands for (Parquet row groups share their file's size), for progress."""
  weights = []
  for u in units:
    if u.format == "parquet":
      n = sum(1 for v in units if v.path == u.path)
      weights.append(os.path.getsize(u.path) // n)
    else:
      weights.append(u.stop - u.start)
  return weights


def _input_record(spec: readers.SourceSpec, files: list[str], shard_tokens: int,
                  hasher: concurrent.futures.Executor) -> dict[str, Any]:
  digests = list(hasher.map(hashing.sha256_file, files))
  return {"reader_version": READER_VERSION, "format": spec.format, "text_field": spec.text_field,
          "separator": spec.separator if spec.format == "text" else None,
          "eval_fraction": float(spec.eval_fraction), "shard_tokens": int(shard_tokens),
          "files": [{"path": f, "bytes": os.path.getsize(f), "sha256": d}
                    for f, d in zip(files, digests)]}


def _content(inputs: dict[str, Any]) -> dict[str, Any]:
  """The part of an input record that decides the output (file paths may move; ``read`` holds
  how a dataset was read, which does not change the documents)."""
  return {**{k: v for k, v in inputs.items() if k != "read"},
          "files": [(f["bytes"], f["sha256"]) for f in inputs["files"]]}


def _is_finished(out_dir: str, entry: dict[str, Any] | None, inputs: dict[str, Any],
                 fingerprint: str, itemsize: int) -> bool:
  try:
    return _finished(out_dir, entry, inputs, fingerprint, itemsize)
  except (KeyError, TypeError, AttributeError, IndexError):   # a malformed earlier entry: redo it
    return False


def _finished(out_dir: str, entry: dict[str, Any] | None, inputs: dict[str, Any],
              fingerprint: str, itemsize: int) -> bool:
  if not entry or entry.get("tokenizer", {}).get("fingerprint") != fingerprint:
    return False
  if _content(entry.get("inputs", {"files": []})) != _content(inputs):
    return False
  for split in mf.SPLITS:
    for shard in entry["shards"][split]:
      file = os.path.join(out_dir, shard["file"])
      if not os.path.isfile(file) or os.path.getsize(file) != shard["tokens"] * itemsize:
        return False
  return True


def _remove_source_files(out_dir: str, source: str) -> None:
  """Deletes the shard and temporary files of ``source``."""
  for name in os.listdir(out_dir):
    is_shard = name.startswith(f"{source}.") and name.endswith(".bin") and (
        name[len(source) + 1:].split(".")[0] in mf.SPLITS)
    is_tmp = name.startswith(f".{source}.") and ".tmp" in name
    if is_shard or is_tmp:
      os.remove(os.path.join(out_dir, name))


@contextlib.contextmanager
def _locked(out_dir: str):
  """Holds an exclusive lock on ``out_dir`` so that processes preparing it at once take turns (the
  later ones then find the sources finished; one that waits says so). An ``flock``, which the
  kernel drops when its holder dies: a killed preparation never leaves it held. POSIX only;
  elsewhere, and on a file system without locks (some network ones), a no-op."""
  try:
    import fcntl
  except ImportError:
    yield
    return
  path = os.path.join(out_dir, ".lock")
  with storage.writing(path, f"Nothing was prepared in {out_dir}: free some space (or give a "
                       "directory this user can write to) and run again"):
    f = open(path, "a")
  with f:
    locked = True
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      print(f"waiting for another process preparing {out_dir} (it holds {path})",
            file=sys.stderr, flush=True)
      fcntl.flock(f, fcntl.LOCK_EX)
    except OSError as e:   # ENOLCK, EOPNOTSUPP: this file system keeps no locks
      print(f"warning: {path} cannot be locked ({e.strerror}); preparing without the lock",
            file=sys.stderr)
      locked = False
    try:
      yield
    finally:
      if locked:
        fcntl.flock(f, fcntl.LOCK_UN)


def _worker_init() -> None:
  # Each worker is one of many processes: the tokenizers library must not add a thread per core.
  os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _results(call, units: list[readers.WorkUnit], pool: concurrent.futures.Executor | None,
             window: int):
  """``call(unit)`` for each unit, in order; at most ``window`` units in flight in the pool."""
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


class _Todo(NamedTuple):
  """A source to tokenize: its spec, input record and work units (in document order; none for a
  dataset, which is read in this process), and a dataset's chat template."""
  name: str
  spec: readers.SourceSpec | hub.HubSpec
  inputs: dict[str, Any]
  units: list[readers.WorkUnit]
  template: chat_templates.ChatTemplate | None = None


def _file_batches(todo: _Todo, results, progress: bool):
  """The tokenized units of one file source, taken from ``results`` in order, with a bar."""
  weights = _unit_weights(todo.units)
  with tqdm.tqdm(total=sum(weights), unit="B", unit_scale=True, desc=f"prepare {todo.name}",
                 disable=not progress, leave=False) as bar:
    for weight in weights:
      yield next(results)
      bar.update(weight)


def _hub_batches(todo: _Todo, tok: Tokenizer, dtype: np.dtype, progress: bool):
  """The tokenized documents of a dataset source, cut to its token budget (``max_tokens``)."""
  spec = todo.spec
  budget = int(spec.max_tokens) or None
  used = first = 0
  docs = hub.documents(todo.name, spec, todo.template, progress=progress,
                       revision=todo.inputs["dataset"]["revision"])
  try:
    for batch in docs:
      where = lambda k, at=first: (f"source {todo.name!r}: dataset {spec.dataset!r}, split "
                                   f"{spec.split!r}, document {at + k} (documents, not rows)")
      tokens_N, lengths_D = _tokenize_docs(tok, dtype.str, batch, where)
      first += len(batch)
      if budget is not None:
        # Whole documents only: the longest prefix that fits in what is left of the budget.
        take = int(np.searchsorted(np.cumsum(lengths_D), budget - used, side="right"))
        if take < lengths_D.size:
          yield tokens_N[:int(lengths_D[:take].sum())], lengths_D[:take]
          return
        used += int(lengths_D.sum())
      yield tokens_N, lengths_D
  finally:
    docs.close()


def _write_source(todo: _Todo, batches, tok: Tokenizer, out_dir: str, dtype: np.dtype,
                  shard_tokens: int) -> dict[str, Any]:
  """Writes one source's tokenized ``batches`` (``(tokens, doc_lengths)`` in document order) into
  its shards; returns its manifest entry."""
  writers = {s: mf.ShardWriter(out_dir, todo.name, s, dtype, shard_tokens) for s in mf.SPLITS}
  docs = {s: 0 for s in mf.SPLITS}
  first_doc = 0
  try:
    for tokens_N, lengths_D in batches:
      held_D = eval_mask(todo.name, first_doc, lengths_D.size, todo.spec.eval_fraction)
      first_doc += lengths_D.size
      held_N = np.repeat(held_D, lengths_D)
      writers["train"].write(tokens_N[~held_N])
      writers["eval"].write(tokens_N[held_N])
      docs["eval"] += int(held_D.sum())
      docs["train"] += int(lengths_D.size - held_D.sum())
    shards = {s: writers[s].close() for s in mf.SPLITS}
  except storage.WriteError:
    # Unlisted in the manifest, its shards would never be used; on a full disk they take room.
    for w in writers.values():
      with contextlib.suppress(Exception):
        w.close()
    with contextlib.suppress(OSError):
      _remove_source_files(out_dir, todo.name)
    raise
  return {"source": todo.name, "dtype": dtype.name,
          "tokenizer": {"name": tok.name, "fingerprint": tok.fingerprint},
          "documents": docs,
          "tokens": {s: sum(x["tokens"] for x in shards[s]) for s in mf.SPLITS},
          "inputs": todo.inputs, "shards": shards}


def prepare(sources: Mapping[str, readers.SourceSpec | hub.HubSpec], tokenizer: Tokenizer,
            out_dir: str, *,
            shard_tokens: int = DEFAULT_SHARD_TOKENS, workers: int = 1, progress: bool = True,
            known_sources: Sequence[str] = SOURCES) -> PrepareResult:
  """Tokenizes every source of ``sources`` into ``out_dir``; finished sources are skipped.

  Args:
    sources: source name -> :class:`SourceSpec` (local files) or :class:`HubSpec` (a dataset
      read with ``datasets``), names from ``known_sources``.
    tokenizer: the tokenizer; worker processes rebuild it from ``tokenizer.spec``.
    out_dir: the prepared directory (created if needed).
    shard_tokens: the most tokens per shard file.
    workers: processes reading and tokenizing local files in parallel; 1 works in this process,
      0 = all CPUs. Datasets are read and tokenized in this process (a ``tokenizers`` BPE
      tokenizer encodes each batch on all cores by itself).
    progress: show a tqdm bar per source.
    known_sources: the valid source names, in manifest order.

  Returns:
    :class:`PrepareResult`.

  Example:
    >>> spec = SourceSpec(paths=("corpus/chat/*.jsonl",), format="jsonl", text_field="text")
    >>> prepare({"chat": spec}, load_tokenizer("bytes"), "/tmp/prepared").prepared
    ('chat',)
  """
  order = {s: source_index(s, known_sources) for s in sources}
  for name, spec in sources.items():
    if isinstance(spec, hub.HubSpec):
      hub.check_hub_spec(name, spec)
    else:
      readers.check_spec(name, spec)
  if int(shard_tokens) < 1:
    raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
  if int(workers) < 0:
    raise ValueError(f"workers must be >= 0, got {workers}")
  workers = int(workers) or (os.cpu_count() or 1)
  os.makedirs(out_dir, exist_ok=True)
  with _locked(out_dir):
    return _prepare_locked(sources, order, tokenizer, out_dir, int(shard_tokens), workers,
                           progress, known_sources)


def _prepare_locked(sources: Mapping[str, readers.SourceSpec | hub.HubSpec],
                    order: dict[str, int],
                    tokenizer: Tokenizer, out_dir: str, shard_tokens: int, workers: int,
                    progress: bool, known_sources: Sequence[str]) -> PrepareResult:
  dtype = mf.token_dtype(tokenizer.vocab_size)
  header = {"format_version": mf.FORMAT_VERSION,
            "tokenizer": {"name": tokenizer.name, "fingerprint": tokenizer.fingerprint,
                          "vocab_size": int(tokenizer.vocab_size), "eod_id": int(tokenizer.eod_id)},
            "dtype": dtype.name}
  try:
    old = mf.read_manifest(out_dir)
  except DataError:
    old = None
  entries: dict[str, Any] = {}
  if old is not None and all(old.get(k) == v for k, v in header.items()):
    entries = {k: v for k, v in old["sources"].items() if k in known_sources}
  elif old is not None:  # another tokenizer or format: none of the old shards can be reused
    for name in old.get("sources", {}):
      _remove_source_files(out_dir, name)

  def write(entries):
    ordered = dict(sorted(entries.items(), key=lambda kv: source_index(kv[0], known_sources)))
    mf.write_manifest(out_dir, {**header, "sources": ordered})

  todo: list[_Todo] = []
  skipped = []
  # hashlib releases the GIL on large blocks: threads hash the input files in parallel.
  with concurrent.futures.ThreadPoolExecutor(workers) as hasher:
    for name in sorted(sources, key=order.__getitem__):
      spec = sources[name]
      template = None
      if isinstance(spec, hub.HubSpec):
        hub.require_datasets()
        if spec.layout != "text":
          template = chat_templates.load_chat_template(spec.template)
          chat_templates.check_chat_tokens(tokenizer, template)
        inputs = hub.input_record(name, spec, template, shard_tokens, READER_VERSION)
      else:
        files = readers.resolve_files(name, spec)
        inputs = _input_record(spec, files, shard_tokens, hasher)
      if _is_finished(out_dir, entries.get(name), inputs, tokenizer.fingerprint, dtype.itemsize):
        skipped.append(name)
      elif isinstance(spec, hub.HubSpec):
        todo.append(_Todo(name, spec, inputs, [], template))
      else:
        todo.append(_Todo(name, spec, inputs, [u for f in files
                                               for u in readers.work_units(f, spec)]))
  pool = None
  if workers > 1 and sum(len(t.units) for t in todo) > 1:
    pool = concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init)
  try:
    for t in todo:  # their shards are about to be rewritten: unlist them first
      entries.pop(t.name, None)
      _remove_source_files(out_dir, t.name)
    write(entries)
    # One ordered stream of units over all sources keeps every worker busy, also when each source
    # is a single small file; the shards are still written in document order.
    call = functools.partial(
        _tokenize_unit, tokenizer if pool is None else (tokenizer.spec, tokenizer.fingerprint),
        dtype.str)
    results = _results(call, [u for t in todo for u in t.units], pool, 2 * workers)
    for t in todo:
      batches = (_hub_batches(t, tokenizer, dtype, progress) if isinstance(t.spec, hub.HubSpec)
                 else _file_batches(t, results, progress))
      entries[t.name] = _write_source(t, batches, tokenizer, out_dir, dtype, shard_tokens)
      write(entries)
  finally:
    if pool is not None:
      pool.shutdown(cancel_futures=True)
  prepared = [t.name for t in todo]
  return PrepareResult(mf.read_manifest(out_dir), tuple(prepared), tuple(skipped))

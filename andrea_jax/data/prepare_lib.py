"""Tokenize each source into token shards and a manifest (see :mod:`manifest`).

A source is a :class:`~andrea_jax.data.formats.Source` (a format by name and its fields: local
files read by a pool of processes, or a dataset read in this process), local files in one tuple
(:class:`~andrea_jax.data.readers.SourceSpec`) or a Hugging Face dataset
(:class:`~andrea_jax.data.hub.datasets.HubSpec`, read through the ``datasets`` library in this process).

The command line is :mod:`andrea_jax.data.prepare`. What :func:`prepare` guarantees:

* every document becomes ``[eod_id] + encode(document)``, so with a document mask each target is
  predictable from its own segment (the last token of a document predicts the next one's leading
  ``eod_id``);
* one document in every block of ``round(1 / eval_fraction)`` consecutive documents of a source (and
  one of its first two) is held out for evaluation, at a place in the block given by
  ``splitmix64(source, block)``: whole documents, the same ones on every run;
* a source with a cap (``max_tokens`` > 0) keeps the longest prefix of its documents, in reading
  order, whose tokens (each document's leading ``eod_id`` included) add up to at most the cap;
  the held-out documents are then those of that prefix that the uncapped source holds out (the
  cap counts them), so a cap never moves a document between the splits;
* the output is a pure function of the input files, the options and the tokenizer (same input, same
  bytes), whatever the number of workers;
* a source whose manifest entry matches its inputs (sizes and SHA-256 of every file, options and
  cap, tokenizer; for a dataset also its name, revision, fingerprint and ``loss_on``) and its shards
  (present, with the recorded sizes) is finished and is not redone. Shard contents are checked
  against their SHA-256 when the data is opened (:class:`andrea_jax.data.shards.PreparedData`);
* each source is all or nothing (:mod:`andrea_jax.data.commit`): its shards are written in a
  staging folder and swapped in once whole, so an error (a bad row, a full disk, a
  ``KeyboardInterrupt``) or a kill leaves the output folder as it was (a source prepared again
  keeps its old shards until then), and the next run redoes that source alone;
* a conversation source with ``loss_on`` other than ``"all"`` gets a mask shard beside each token
  shard, one byte per token (:mod:`andrea_jax.data.hub.masks`); the token shards are the same
  whatever ``loss_on`` is.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import multiprocessing
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import tqdm

from andrea_jax import checks
from andrea_jax.data import commit, encode, formats, hashing, readers
from andrea_jax.data import manifest as mf
from andrea_jax.data.hub.spec import HubSpec
from andrea_jax.data.errors import DataError
from andrea_jax.data.tokenizers import Tokenizer
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


def _input_record(source: formats.Source, reader, files: list[str], shard_tokens: int,
                  hasher: concurrent.futures.Executor | None) -> dict[str, Any]:
  """What a prepared source depends on, for its manifest entry: the format, what its reader says
  decides the documents (default: its arguments), the held-out share, the cap when there is one,
  and the size and SHA-256 of every file read."""
  digests = list(hasher.map(hashing.sha256_file, files)) if files else []
  own = reader.record() if hasattr(reader, "record") else {"arguments": dict(source.arguments)}
  record = {"reader_version": READER_VERSION, "format": source.format,
            **json.loads(json.dumps(own)),
            "eval_fraction": float(source.eval_fraction), "shard_tokens": int(shard_tokens)}
  if source.max_tokens:   # only then: an uncapped source keeps the record it had before caps
    record["max_tokens"] = int(source.max_tokens)
  record["files"] = [{"path": f, "bytes": os.path.getsize(f), "sha256": d}
                     for f, d in zip(files, digests)]
  return record


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
    for key, size in (("shards", itemsize), ("masks", mf.MASK_DTYPE.itemsize)):
      for shard in entry.get(key, {}).get(split, []) if key == "masks" else entry[key][split]:
        file = os.path.join(out_dir, shard["file"])
        if not os.path.isfile(file) or os.path.getsize(file) != shard["tokens"] * size:
          return False
  return True


class _Todo(NamedTuple):
  """A source to tokenize: its spec (a :class:`HubSpec`, or a :class:`formats.Source`), input
  record and, for files, its work units (``(format, arguments, unit)``, in document order, with
  the input bytes each stands for), and a dataset's chat template."""
  name: str
  spec: formats.Source | HubSpec
  inputs: dict[str, Any]
  units: list[tuple[str, tuple, Any]]
  weights: list[int]
  template: Any = None          # the source's ChatTemplate (andrea_jax.data.hub.templates)


def _file_batches(todo: _Todo, results, progress: bool):
  """The tokenized units of one file source, taken from ``results`` in order, with a bar."""
  with tqdm.tqdm(total=sum(todo.weights), unit="B", unit_scale=True, desc=f"prepare {todo.name}",
                 disable=not progress, leave=False) as bar:
    for weight in todo.weights:
      yield next(results)
      bar.update(weight)


def _hub_batches(todo: _Todo, tok: Tokenizer, dtype: np.dtype, progress: bool):
  """The tokenized documents of a dataset source (a Hugging Face dataset, or a format whose reader
  yields documents), read in this process: ``(tokens, doc_lengths)``, and the loss mask after them
  when the source has one."""
  spec = todo.spec
  first = 0
  if isinstance(spec, HubSpec):
    docs = _hub().documents(todo.name, spec, todo.template, progress=progress,
                            revision=todo.inputs["dataset"]["revision"])
    label = f"dataset {spec.dataset!r}, split {spec.split!r}"
  else:
    docs = iter(spec.reader.documents(todo.name, progress))
    label = f"format {spec.format!r}"
  masked = getattr(spec, "loss_on", "all") != "all"
  try:
    for batch in docs:
      where = lambda k, at=first: (f"source {todo.name!r}: {label}, document {at + k} "
                                   "(documents, not rows)")
      yield (encode.tokenize_masked(tok, dtype.str, batch, where) if masked
             else encode.tokenize_docs(tok, dtype.str, list(batch), where))
      first += len(batch)
  finally:
    if hasattr(docs, "close"):
      docs.close()


def _write_source(todo: _Todo, batches, tok: Tokenizer, out_dir: str, dtype: np.dtype,
                  shard_tokens: int) -> dict[str, Any]:
  """Writes one source's tokenized ``batches`` (``(tokens, doc_lengths[, mask])`` in document
  order) into its shards in ``out_dir`` (a staging folder); returns its manifest entry."""
  writers = {s: mf.ShardWriter(out_dir, todo.name, s, dtype, shard_tokens) for s in mf.SPLITS}
  masked = getattr(todo.spec, "loss_on", "all") != "all"
  masks = {s: mf.ShardWriter(out_dir, todo.name, s, mf.MASK_DTYPE, shard_tokens, ".mask")
           for s in mf.SPLITS} if masked else {}
  docs = {s: 0 for s in mf.SPLITS}
  counted = {s: 0 for s in mf.SPLITS}
  first_doc = 0
  try:
    for tokens_N, lengths_D, *mask in batches:
      held_D = eval_mask(todo.name, first_doc, lengths_D.size, todo.spec.eval_fraction)
      first_doc += lengths_D.size
      held_N = np.repeat(held_D, lengths_D)
      for split, pick_N in (("train", ~held_N), ("eval", held_N)):
        writers[split].write(tokens_N[pick_N])
        if masked:
          masks[split].write(mask[0][pick_N])
          counted[split] += int(mask[0][pick_N].sum())
      docs["eval"] += int(held_D.sum())
      docs["train"] += int(lengths_D.size - held_D.sum())
  except BaseException:
    for w in (*writers.values(), *masks.values()):
      w.abandon()   # the staging folder goes with its files
    raise
  shards = {s: writers[s].close() for s in mf.SPLITS}
  entry = {"source": todo.name, "dtype": dtype.name,
           "tokenizer": {"name": tok.name, "fingerprint": tok.fingerprint},
           "documents": docs,
           "tokens": {s: sum(x["tokens"] for x in shards[s]) for s in mf.SPLITS},
           "inputs": todo.inputs, "shards": shards}
  if masked:
    entry.update(loss_on=todo.spec.loss_on, loss_tokens=counted,
                 masks={s: masks[s].close() for s in mf.SPLITS})
  return entry


def prepare(sources: Mapping[str, formats.Source | readers.SourceSpec | HubSpec],
            tokenizer: Tokenizer, out_dir: str, *,
            shard_tokens: int = DEFAULT_SHARD_TOKENS, workers: int = 1, progress: bool = True,
            known_sources: Sequence[str] = SOURCES) -> PrepareResult:
  """Tokenizes every source of ``sources`` into ``out_dir``; finished sources are skipped.

  Args:
    sources: source name -> :class:`~andrea_jax.data.formats.Source` (a format and its fields),
      :class:`SourceSpec` (local files) or :class:`HubSpec` (a dataset read with ``datasets``),
      names from ``known_sources``.
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
  sources = {name: _checked(name, spec) for name, spec in sources.items()}
  if int(shard_tokens) < 1:
    raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
  if int(workers) < 0:
    raise ValueError(f"workers must be >= 0, got {workers}")
  workers = int(workers) or (os.cpu_count() or 1)
  created_dir = not os.path.isdir(out_dir)
  with commit.locked(out_dir) as created_lock:
    commit.remove_stale_staging(out_dir)
    try:
      return _prepare_locked(sources, order, tokenizer, out_dir, int(shard_tokens), workers,
                             progress, known_sources)
    except BaseException:
      if not os.path.exists(os.path.join(out_dir, mf.MANIFEST)):   # nothing was committed
        commit.undo_creation(out_dir, created_dir, created_lock)
      raise


def _checked(name: str, spec: formats.Source | readers.SourceSpec | HubSpec
             ) -> formats.Source | HubSpec:
  """A source's spec checked, as a :class:`HubSpec` (a Hugging Face dataset, its held-out share
  and cap in it) or a :class:`formats.Source` whose reader reads files or yields documents."""
  if isinstance(spec, readers.SourceSpec):
    readers.check_spec(name, spec)
    spec = formats.as_source(spec)
  if isinstance(spec, formats.Source) and isinstance(spec.reader, HubSpec):
    spec = spec.reader._replace(eval_fraction=spec.eval_fraction, max_tokens=spec.max_tokens)
  if isinstance(spec, HubSpec):
    _hub().check_hub_spec(name, spec)
    return spec
  if not isinstance(spec, formats.Source):
    raise TypeError(f"source {name!r}: a Source, SourceSpec or HubSpec, got {spec!r}")
  try:
    checks.number("eval_fraction", spec.eval_fraction, low=0, high=0.5)
    checks.integer("max_tokens", spec.max_tokens, minimum=0, int32=False)
    reader = spec.reader
  except (TypeError, ValueError) as e:
    raise type(e)(f"source {name!r}: {e}") from None
  if hasattr(reader, "units") and not readers.patterns(reader.paths):
    raise ValueError(f"source {name!r}: paths must name the files of format {spec.format!r}, "
                     f"got {reader.paths!r}")
  if not hasattr(reader, "units") and not hasattr(reader, "documents"):
    raise TypeError(f"source {name!r}: format {spec.format!r} made a "
                    f"{type(reader).__name__}, which has neither units() and read() (files) nor "
                    "documents() (a dataset)")
  return spec


def _hub():
  """The Hub plug-in (:mod:`andrea_jax.data.hub.datasets`), imported when a source is a dataset."""
  from andrea_jax.data.hub import datasets
  return datasets


def _plan(sources: Mapping[str, formats.Source | HubSpec], order: dict[str, int],
          tokenizer: Tokenizer, out_dir: str, entries: dict[str, Any], shard_tokens: int,
          workers: int) -> tuple[list[_Todo], list[str]]:
  """``(todo, skipped)``: the sources to prepare, every one of their templates and masks checked
  before any is read, and those already finished."""
  dtype = mf.token_dtype(tokenizer.vocab_size)
  todo: list[_Todo] = []
  skipped = []
  # hashlib releases the GIL on large blocks: threads hash the input files in parallel.
  with concurrent.futures.ThreadPoolExecutor(workers) as hasher:
    for name in sorted(sources, key=order.__getitem__):
      spec = sources[name]
      template, files = None, []
      if isinstance(spec, HubSpec):
        inputs, template = _hub().plan_source(name, spec, tokenizer, shard_tokens,
                                              READER_VERSION)
      else:
        if hasattr(spec.reader, "units"):
          files = readers.expand_patterns(name, readers.patterns(spec.reader.paths))
        inputs = _input_record(spec, spec.reader, files, shard_tokens, hasher)
      if _is_finished(out_dir, entries.get(name), inputs, tokenizer.fingerprint, dtype.itemsize):
        skipped.append(name)
        continue
      units, weights = [], []
      for f in files:
        pieces = spec.reader.units(f)
        units += [(spec.format, spec.arguments, u) for u in pieces]
        weights += [os.path.getsize(f) // max(1, len(pieces))] * len(pieces)
      todo.append(_Todo(name, spec, inputs, units, weights, template))
  return todo, skipped


def _prepare_locked(sources: Mapping[str, formats.Source | HubSpec], order: dict[str, int],
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
  # Sources of another tokenizer or format: none of their shards can be reused; they go at the
  # first commit (until then the folder stays as it was).
  stale: list[str] = []
  if old is not None and all(old.get(k) == v for k, v in header.items()):
    entries = {k: v for k, v in old["sources"].items() if k in known_sources}
  elif old is not None:
    stale = list(old.get("sources", {}))

  def write(entries):
    ordered = dict(sorted(entries.items(), key=lambda kv: source_index(kv[0], known_sources)))
    mf.write_manifest(out_dir, {**header, "sources": ordered})

  todo, skipped = _plan(sources, order, tokenizer, out_dir, entries, shard_tokens, workers)
  if not todo:
    write(entries)
  pool = None
  if workers > 1 and sum(len(t.units) for t in todo) > 1:
    pool = concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=encode.worker_init)
  try:
    # One ordered stream of units over all uncapped sources keeps every worker busy, also when
    # each source is a single small file; the shards are still written in document order. A
    # capped source has a stream of its own, closed once its cap is reached.
    call = functools.partial(encode.tokenize_unit, tokenizer if pool is None
                             else (tokenizer.spec, tokenizer.fingerprint), dtype.str)
    shared = encode.ordered_results(call, [u for t in todo if not t.spec.max_tokens
                                           for u in t.units], pool, 2 * workers)
    for t in todo:
      if isinstance(t.spec, HubSpec) or not hasattr(t.spec.reader, "units"):
        batches = _hub_batches(t, tokenizer, dtype, progress)
      elif t.spec.max_tokens:
        batches = _file_batches(t, encode.ordered_results(call, t.units, pool, 2 * workers),
                                progress)
      else:
        batches = _file_batches(t, shared, progress)
      with commit.staging(out_dir) as staged:
        entry = _write_source(t, encode.capped(batches, t.spec.max_tokens), tokenizer, staged, dtype,
                              shard_tokens)

        def listing(listed, name=t.name, entry=entry):
          if listed:
            entries[name] = entry
          else:
            entries.pop(name, None)
          write(entries)

        commit.commit(out_dir, staged, t.name, listing, also_remove=stale)
      stale = []
  finally:
    if pool is not None:
      pool.shutdown(cancel_futures=True)
  prepared = [t.name for t in todo]
  return PrepareResult(mf.read_manifest(out_dir), tuple(prepared), tuple(skipped))

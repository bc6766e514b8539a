"""Hugging Face datasets as a source: a Hub name, a ``save_to_disk`` directory, or local data files.

A :class:`~andrea_jax.data.hub.spec.HubSpec` names a dataset and the options that select a source's documents from it; it
is prepared by :func:`andrea_jax.data.prepare_lib.prepare` into the same per-source shards and
manifest as local files. The dataset is read through the ``datasets`` library (the optional extra
``pip install 'andrea_jax[hub]'``):

* ``dataset``: a Hub name (``"HuggingFaceTB/smoltalk"``, read with ``load_dataset(name, subset,
  split=split, revision=...)``, pinned to the commit the revision resolves to when the Hub is
  reachable); a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
  (``load_from_disk``; ``split`` picks a split of a ``DatasetDict``, a lone ``Dataset`` is read
  whole); or, with ``data_files``, a builder of ``datasets`` (``"json"``, ``"parquet"``, ``"csv"``,
  ``"text"``, ``"arrow"``; ``""`` infers it from the first file's extension) reading those files.
* ``layout``: ``"text"`` (the document is the string ``text_field``), ``"messages"`` (a list of
  messages in ``messages_field``, with an optional system prompt in ``system_field`` and the row's
  tool schemas in ``tools_field`` when the dataset has that column, rendered with ``template``;
  see :mod:`andrea_jax.data.hub.templates`), or ``"tree"`` (one row per message of
  OpenAssistant-style trees: every root-to-leaf thread is a document; the split is read whole
  before its first thread, and a thread is kept when all its messages pass the filter).
* ``loss_on``: which tokens of a conversation the loss counts: ``"all"``, ``"assistant"`` or
  ``"generation"`` (:mod:`andrea_jax.data.hub.masks`); anything but ``"all"`` yields each document
  with the character spans that count, from which the preparation makes a token mask.
* ``filter_field`` / ``filter_value``: keep the rows whose field equals the value (or one of a
  tuple of values), so that one dataset can feed several sources.
* ``streaming``: read without downloading the whole dataset first (``load_dataset(...,
  streaming=True)``, or ``to_iterable_dataset()`` for a directory). The rows, and so the shards,
  are the same either way; ``streaming`` is recorded but not part of the cache key.
* ``max_tokens``: the source's cap, as every source has one
  (:mod:`andrea_jax.data.prepare_lib`): the longest prefix of its documents (in dataset order)
  whose tokens, each document's leading end-of-document id included, add up to at most
  ``max_tokens``; 0 reads everything. The dataset is read no further.

The manifest records the dataset (name, subset, split, the resolved revision of a Hub dataset, the
``_fingerprint`` of a saved one), the SHA-256 of every local file read, and the options; a source
is prepared again when any of them changes. Rows are numbered in the split (filtered rows
counted), and every error about a row names the dataset, the split and that number.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import tqdm

from andrea_jax import checks
from andrea_jax.data import hashing, readers
from andrea_jax.data.errors import DataError
from andrea_jax.data.hub import files as hfhub
from andrea_jax.data.hub import masks as chat_masks
from andrea_jax.data.hub import rows as hub_rows
from andrea_jax.data.hub.spec import (BUILDERS, LAYOUTS, HubSpec,  # noqa: F401 (re-exported)
                                      check_fields, saved_dir)
from andrea_jax.data.hub.templates import ChatTemplate

_EXTENSIONS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv",
               ".tsv": "csv", ".txt": "text", ".arrow": "arrow"}
_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")
BATCH_ROWS = 1000   # rows read from the dataset at a time
# Raise with every change to how rows become documents (part of the cache key). 2: a message's
# other fields and a row's tools reach a Jinja template.
HUB_VERSION = 2


def require_datasets():
  """The ``datasets`` module, or an ``ImportError`` saying how to install it."""
  try:
    import datasets
  except ImportError as e:
    raise ImportError("reading Hugging Face datasets needs the `datasets` library: "
                      "pip install 'andrea_jax[hub]'") from e
  return datasets


def plan_source(name: str, spec: HubSpec, tokenizer, shard_tokens: int, reader_version: int
                ) -> tuple[dict, ChatTemplate | None]:
  """``(inputs record, chat template or None)`` of a Hub source about to be prepared, every check
  made first: the ``datasets`` library, the template and its special tokens, ``loss_on`` against
  the template and the tokenizer (a mask needs character offsets)."""
  from andrea_jax.data.hub import template_files
  from andrea_jax.data.hub.templates import check_chat_tokens
  require_datasets()
  template = None
  if spec.layout != "text":
    template = template_files.load_chat_template(spec.template)
    check_chat_tokens(tokenizer, template)
  chat_masks.check_loss_on(spec.loss_on, template, f"source {name!r}")
  if spec.loss_on != "all" and not hasattr(tokenizer, "encode_batch_offsets"):
    raise DataError(f"source {name!r}: loss_on {spec.loss_on!r} needs a tokenizer that "
                    f"gives character offsets; {tokenizer.name} gives none")
  return input_record(name, spec, template, shard_tokens, reader_version), template


def _kind(spec: HubSpec) -> str:
  """``"files"`` (data_files), ``"disk"`` (a save_to_disk directory) or ``"hub"``."""
  if spec.data_files:
    return "files"
  path = os.path.expanduser(spec.dataset)
  if os.path.isdir(path):
    return "disk"
  return "hub"


def check_hub_spec(source: str, spec: HubSpec) -> None:
  """Raises ``ValueError`` naming the source and the field for an invalid :class:`HubSpec`."""
  try:
    check_fields(spec)
    if spec.format != "hf":
      raise ValueError(f"format must be 'hf', got {spec.format!r}")
    checks.integer("max_tokens", spec.max_tokens, minimum=0, int32=False, hint="0: no budget")
    checks.number("eval_fraction", spec.eval_fraction, low=0, high=0.5)
  except (TypeError, ValueError) as e:   # one ValueError naming the source
    raise ValueError(f"source {source!r}: {e}") from None


def _files(source: str, spec: HubSpec) -> list[str]:
  """The local files a source reads, sorted: its data files, or a saved directory's files (for a
  DatasetDict, those of the split)."""
  if _kind(spec) == "files":
    return readers.expand_patterns(source, spec.data_files)
  if _kind(spec) == "disk":
    root = os.path.expanduser(spec.dataset)
    if os.path.isfile(os.path.join(root, "dataset_dict.json")):
      root = os.path.join(root, spec.split)
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                  if not f.startswith("."))
  return []


def _label(spec: HubSpec) -> str:
  if spec.data_files:
    return f"{spec.dataset or 'data files'} {list(spec.data_files)}"
  return repr(spec.dataset) + (f" (subset {spec.subset!r})" if spec.subset else "")


def _builder(source: str, spec: HubSpec, files: Sequence[str]) -> str:
  if spec.dataset:
    return spec.dataset
  name = files[0]
  for c in _COMPRESSIONS:
    name = name.removesuffix(c)
  ext = os.path.splitext(name)[1].lower()
  if ext not in _EXTENSIONS:
    raise DataError(f"source {source!r}: cannot tell the format of {files[0]!r} from its "
                    f"extension; set dataset to one of {BUILDERS}")
  return _EXTENSIONS[ext]


def input_record(source: str, spec: HubSpec, template: ChatTemplate | None,
                 shard_tokens: int, reader_version: int) -> dict[str, Any]:
  """What a prepared source depends on, for the manifest (``read`` holds what it does not)."""
  files = _files(source, spec)
  kind = _kind(spec)
  revision = fingerprint = None
  name = spec.dataset
  if kind == "hub":
    try:
      revision = hfhub.dataset_revision(spec.dataset, spec.revision)
    except DataError as e:
      raise DataError(f"source {source!r}: {e}") from e
    if revision is None:   # offline: the cached copy is what will be read; name it
      revision = spec.revision
      if not spec.streaming:
        fingerprint = _open(source, spec, None)[0]._fingerprint
  elif kind == "disk":
    name = None   # the directory may move; its files' digests identify it
    state = [f for f in files if os.path.basename(f) == "state.json"]
    if state:
      with open(state[0], encoding="utf-8") as f:
        fingerprint = json.load(f).get("_fingerprint")
  else:
    name = _builder(source, spec, files)
  options: dict[str, Any] = {"layout": spec.layout}
  if spec.layout in ("text", "tree"):
    options["text_field"] = spec.text_field
  if spec.layout == "messages":
    options.update(messages_field=spec.messages_field, system_field=spec.system_field,
                   tools_field=spec.tools_field)
  if spec.loss_on != "all":   # only then: a source without a mask keeps its cache key
    options["loss_on"] = spec.loss_on
  filt = None
  if spec.filter_field:
    value = spec.filter_value
    filt = {"field": spec.filter_field,
            "value": list(value) if isinstance(value, (list, tuple)) else value}
  return {"reader_version": reader_version, "hub_version": HUB_VERSION, "format": "hf",
          "dataset": {"kind": kind, "name": name, "subset": spec.subset, "split": spec.split,
                      "revision": revision, "fingerprint": fingerprint},
          "options": options,
          "template": (None if template is None else {"kind": template.name.split(":")[0],
                                                       "sha256": template.fingerprint}),
          "filter": filt, "max_tokens": int(spec.max_tokens),
          "eval_fraction": float(spec.eval_fraction), "shard_tokens": int(shard_tokens),
          "files": [{"path": f, "bytes": os.path.getsize(f), "sha256": hashing.sha256_file(f)}
                    for f in files],
          "read": {"dataset": spec.dataset, "streaming": spec.streaming,
                   "template": None if template is None else template.name}}


def _open(source: str, spec: HubSpec, revision: str | None):
  """``(dataset, number of rows or None)``: a ``Dataset``, or an ``IterableDataset`` when
  streaming."""
  datasets = require_datasets()
  kind = _kind(spec)
  if kind == "disk":
    ds = datasets.load_from_disk(os.path.expanduser(spec.dataset))
    if isinstance(ds, datasets.DatasetDict):
      if spec.split not in ds:
        raise DataError(f"source {source!r}: dataset {spec.dataset!r} has no split "
                        f"{spec.split!r} (splits: {sorted(ds)})")
      ds = ds[spec.split]
    return (ds.to_iterable_dataset() if spec.streaming else ds), len(ds)
  try:
    if kind == "files":
      files = _files(source, spec)
      ds = datasets.load_dataset(_builder(source, spec, files), data_files={spec.split: files},
                                 split=spec.split, streaming=spec.streaming)
    else:
      ds = datasets.load_dataset(spec.dataset, spec.subset, split=spec.split,
                                 revision=revision or spec.revision, streaming=spec.streaming)
  except (ValueError, OSError, ConnectionError) as e:  # unknown split/subset, unreadable files
    raise DataError(f"source {source!r}: cannot load dataset {_label(spec)}, split "
                    f"{spec.split!r}: {type(e).__name__}: {e}") from e
  rows = None if spec.streaming else len(ds)
  if rows is None and ds.info.splits and spec.split in ds.info.splits:
    rows = ds.info.splits[spec.split].num_examples or None
  return ds, rows


def _columns(spec: HubSpec) -> list[str]:
  """The fields a source reads and the dataset must have (the tools column is optional)."""
  if spec.layout == "text":
    cols = [spec.text_field]
  elif spec.layout == "messages":
    cols = [spec.messages_field] + ([spec.system_field] if spec.system_field else [])
  else:
    cols = [*hub_rows.TREE_FIELDS, spec.text_field]
  return list(dict.fromkeys(cols + ([spec.filter_field] if spec.filter_field else [])))


def documents(source: str, spec: HubSpec, template: ChatTemplate | None, *,
              revision: str | None = None, progress: bool = True
              ) -> Iterator[list[hub_rows.Document]]:
  """The documents of a source, in dataset order, in lists of at most :data:`BATCH_ROWS`: texts,
  or ``(text, spans)`` when ``spec.loss_on`` is not ``"all"`` (the character spans the loss
  counts: :func:`andrea_jax.data.hub.masks.loss_spans`).

  Empty texts are dropped; every other problem with a row raises ``DataError`` naming the dataset,
  the split and the row. Close the generator to stop reading early (a token budget).
  """
  datasets = require_datasets()
  ds, rows = _open(source, spec, revision)
  names = ds.column_names
  if names is not None:
    missing = [c for c in _columns(spec) if c not in names]
    if missing:
      raise DataError(f"source {source!r}: dataset {_label(spec)}, split {spec.split!r} has no "
                      f"field {missing[0]!r} (fields: {names})")
    tools = [spec.tools_field] if spec.layout == "messages" and spec.tools_field in names else []
    ds = ds.select_columns(_columns(spec) + tools)
  render = hub_rows.renderer(template, spec.loss_on)
  where = lambda row: f"source {source!r}: dataset {_label(spec)}, split {spec.split!r}, row {row}"
  quiet = not progress and not datasets.utils.are_progress_bars_disabled()
  if quiet:
    datasets.utils.disable_progress_bars()
  try:
    with tqdm.tqdm(total=rows, unit="row", desc=f"prepare {source}", disable=not progress,
                   leave=False) as bar:
      batches = _batches(ds, bar)
      if spec.layout == "tree":
        yield from hub_rows.tree_documents(batches, spec, render, where, BATCH_ROWS)
        return
      for first, batch in batches:
        yield hub_rows.batch_documents(first, batch, spec, render, where)
  finally:
    if quiet:
      datasets.utils.enable_progress_bars()


def _batches(ds, bar) -> Iterator[tuple[int, dict[str, list]]]:
  """``(index of the first row, columns)`` of each batch of rows."""
  first = 0
  for batch in ds.iter(batch_size=BATCH_ROWS):
    n = len(next(iter(batch.values()))) if batch else 0
    yield first, batch
    first += n
    bar.update(n)

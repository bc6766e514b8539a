"""From a checked ``data`` section to data a run can sample: prepared if needed, opened, checked.

:func:`open_training_data` is the trainer's one way into the data. It takes the
:class:`~andrea_jax.data.config.DataSpec` that :func:`~andrea_jax.data.config.data_spec` (or
``runconfig.build``, as ``run.data``) checked once, and picks where the data comes from:

1. ``prepared_dir``: that directory, opened as is;
2. a built-in corpus: generated and prepared once in the cache (its capped sources, if any, in a
   folder of their own beside it, so that the uncapped corpus stays as it is);
3. ``corpus = "files"``: each source's format read and tokenized into
   ``<cache_dir>/prepared/files-<digest>`` (:func:`files_prepared_dir`), finished sources kept.

:func:`prepare_from_config` prepares the same into a folder of one's choosing (the command line
``python -m andrea_jax.data.prepare``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

from andrea_jax.data import formats
from andrea_jax.data import sampler as sampler_lib
from andrea_jax.data.config import BUILTIN_CORPORA, DataSpec
from andrea_jax.data.errors import DataError
from andrea_jax.data.prepare_lib import PrepareResult, prepare
from andrea_jax.data.shards import PreparedData
from andrea_jax.data.tokenizers import Tokenizer


def files_prepared_dir(spec: DataSpec, tokenizer: Tokenizer | None = None) -> str:
  """``<cache_dir>/prepared/files-<digest>``: the digest covers the sources' formats and fields,
  ``shard_tokens`` and the tokenizer (``spec.tokenizer`` unless given)."""
  tokenizer = spec.tokenizer if tokenizer is None else tokenizer
  key = json.dumps({"specs": {k: formats.folder_key(v) for k, v in spec.files.items()},
                    "shard_tokens": spec.shard_tokens, "tokenizer": tokenizer.fingerprint},
                   sort_keys=True)
  digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
  return os.path.join(os.path.expanduser(spec.cache_dir), "prepared", f"files-{digest}")


def prepare_from_config(spec: DataSpec, out_dir: str, *, tokenizer: Tokenizer | None = None,
                        progress: bool = True) -> PrepareResult:
  """Prepares the data of ``spec`` (a built-in corpus's sources, caps applied, or the files') into
  ``out_dir``."""
  tokenizer = spec.tokenizer if tokenizer is None else tokenizer
  if spec.corpus in BUILTIN_CORPORA:
    sources = {s: v for s, v in BUILTIN_CORPORA[spec.corpus]().raw(spec).items()
               if s in spec.sources}
  else:
    sources = dict(spec.files)
  return prepare(sources, tokenizer, out_dir, shard_tokens=spec.shard_tokens,
                 workers=spec.workers, progress=progress, known_sources=spec.sources)


def open_training_data(spec: DataSpec, tokenizer: Tokenizer | None = None, *,
                       required: Sequence[str] | None = None,
                       progress: bool = True) -> PreparedData:
  """Prepares the data if needed and opens it with every check (see :class:`PreparedData`).

  Args:
    spec: the checked ``data`` section (``run.data``, or :func:`~andrea_jax.data.config.data_spec`
      of a ``data`` section); its ``sources`` are the order of every weight vector.
    tokenizer: the run's tokenizer (default: ``spec.tokenizer``).
    required: the sources the run samples from (default: all of ``spec.sources``); the others may
      be absent.
    progress: tqdm bars while preparing.

  On several hosts sharing a file system, let process 0 call this first and the others after a
  barrier: the result is the same, but preparing it once is cheaper.

  Example:
    >>> spec = data_spec(data_config())
    >>> data = open_training_data(spec)
    >>> sampler = MixtureSampler(data, seq_len=spec.seq_len,
    ...                          global_batch_size=spec.global_batch_size, seed=0)
  """
  tokenizer = spec.tokenizer if tokenizer is None else tokenizer
  if spec.prepared_dir:
    path = os.path.expanduser(spec.prepared_dir)
  elif spec.corpus in BUILTIN_CORPORA:
    # Byte tokenization is faster than starting worker processes.
    workers = 1 if tokenizer.name == "bytes" else spec.workers
    path = BUILTIN_CORPORA[spec.corpus]().prepared(spec, tokenizer, workers, progress)
  else:
    path = files_prepared_dir(spec, tokenizer)
    prepare(dict(spec.files), tokenizer, path, shard_tokens=spec.shard_tokens,
            workers=spec.workers, progress=progress, known_sources=spec.sources)
  data = PreparedData.open(path, tokenizer=tokenizer, sources=spec.sources, required=required,
                           verify=spec.verify)
  check_windows(data, spec.seq_len)
  return data


def corpus_vocabulary(spec: DataSpec) -> frozenset[str] | None:
  """The words of the built-in corpus's training documents (``eval/word_share`` is measured
  against them), or ``None`` for a corpus that records none (the synthetic one, files)."""
  if spec.corpus != "stdlib" or spec.prepared_dir:
    return None
  from andrea_jax.data.corpora import stdlib
  return stdlib.read_vocabulary(stdlib.ensure_stdlib_raw(spec.cache_dir,
                                                         packages=spec.stdlib_packages))


def check_windows(data: PreparedData, seq_len: int, split: str = "train") -> None:
  """``DataError`` unless every required source has a shard of ``split`` with at least
  ``seq_len + 1`` tokens (a row is a window of ``seq_len + 1`` tokens inside one shard).

  :func:`open_training_data` checks the training split, so that a run stops before it compiles
  anything rather than when the sampler first meets the source.
  """
  for source in data.required:
    if not any(m.size >= seq_len + 1 for m in data.shards(source, split)):
      files = [os.path.join(data.path, s["file"])
               for s in data.manifest["sources"][source]["shards"][split]]
      raise DataError(f"{sampler_lib.too_short(data, source, split, seq_len + 1)} (shards {files})")

"""The ``data`` section of a run config, its validation, and the trainer's one call to get data.

Three ways to data, chosen in this order by :func:`open_training_data`:

1. ``prepared_dir`` set: open that directory (prepared by ``python -m andrea_jax.data.prepare``);
2. ``corpus = "builtin"``: generate and prepare the synthetic built-in corpus once in ``cache_dir``;
3. ``corpus = "files"``: prepare ``files.<source>`` (JSON Lines, text or Parquet) in ``cache_dir``
   (finished sources are not redone), then open it.

Example override on the command line: ``--config.data.files.chat.paths=/data/chat/*.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import ml_collections
from ml_collections import config_dict

from andrea_jax.data import readers
from andrea_jax.data import sampler as sampler_lib
from andrea_jax.data.corpus import builtin_specs, ensure_builtin, ensure_builtin_raw
from andrea_jax.data.errors import DataError
from andrea_jax.data.prepare_lib import DEFAULT_SHARD_TOKENS, PrepareResult, prepare
from andrea_jax.data.shards import PreparedData
from andrea_jax.data.tokenizers import Tokenizer
from andrea_jax.sources import SOURCES

CACHE_ENV = "ANDREA_JAX_CACHE"
CORPORA = ("builtin", "files")


def _key(source: str) -> str:
  """The config key of a source: ``"repo-docs" -> "repo_docs"`` (``-`` does not survive flags)."""
  return source.replace("-", "_")


def default_cache_dir() -> str:
  """``$ANDREA_JAX_CACHE``, else ``$XDG_CACHE_HOME/andrea_jax``, else ``~/.cache/andrea_jax``."""
  if os.environ.get(CACHE_ENV):
    return os.environ[CACHE_ENV]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "andrea_jax")


def _source_files() -> ml_collections.ConfigDict:
  f = ml_collections.ConfigDict()
  f.paths = ""              # comma-separated glob patterns of the source's files; "" = no files
  f.format = "jsonl"        # "jsonl" (one JSON object per line), "text" or "parquet"
  f.text_field = "text"     # jsonl: key of the document text; parquet: column of the text
  f.separator = readers.DEFAULT_SEPARATOR  # text: a line exactly equal to this separates documents
  f.eval_fraction = config_dict.placeholder(float)  # held-out share for this source; None = global
  return f


def data_config() -> ml_collections.ConfigDict:
  """Every knob of the data pipeline, one commented field each (the ``data`` section of a run)."""
  c = ml_collections.ConfigDict()
  c.tokenizer = "bytes"     # "bytes" (257 ids, no file), tokenizers .json or SentencePiece .model
  c.corpus = "builtin"      # "builtin" (synthetic, generated locally) or "files" (see `files`)
  c.builtin_scale = 1.0     # size of the built-in corpus: ~1 MB of text per source per unit
  # corpus = "files": the inputs of each source (sources without paths are absent), keyed by the
  # source name with "-" written "_" so that flags can reach them: --config.data.files.repo_docs.paths
  c.files = ml_collections.ConfigDict({_key(s): _source_files() for s in SOURCES})
  # Where built-in and prepared data are cached (default from env ANDREA_JAX_CACHE).
  c.cache_dir = default_cache_dir()
  c.prepared_dir = ""       # directory prepared earlier; when set it is opened as is ("" = unused)
  c.eval_fraction = 0.01    # share of each source's documents held out for evaluation, in [0, 0.5]
  c.seq_len = 256           # tokens per training row (the model's context length)
  c.global_batch_size = 32  # rows per step over all processes
  c.prefetch = 2            # batches prepared ahead by the background thread
  c.shard_tokens = DEFAULT_SHARD_TOKENS  # most tokens per shard file (2**28 = 512 MiB of uint16)
  c.workers = 0             # processes tokenizing in parallel when preparing; 0 = all CPUs
  c.verify = True           # hash every shard and scan its token ids when opening (one read)
  return c


def _positive_int(cfg: ml_collections.ConfigDict, field: str, low: int = 1) -> None:
  value = cfg[field]
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise ValueError(f"data.{field} must be an integer >= {low}, got {value!r}")


def _number(cfg: ml_collections.ConfigDict, field: str) -> float:
  value = cfg[field]
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise TypeError(f"data.{field} must be a number, got {value!r}")
  return float(value)


def validate_data_config(cfg: ml_collections.ConfigDict) -> None:
  """Raises ``ValueError`` naming the field (``data.<field>``) and the offending value."""
  if not isinstance(cfg.tokenizer, str) or not cfg.tokenizer:
    raise ValueError(f"data.tokenizer must be 'bytes' or a file path, got {cfg.tokenizer!r}")
  if cfg.tokenizer != "bytes" and not os.path.isfile(os.path.expanduser(cfg.tokenizer)):
    raise ValueError(f"data.tokenizer: no file {cfg.tokenizer!r} (and not 'bytes')")
  if cfg.corpus not in CORPORA:
    raise ValueError(f"data.corpus must be one of {CORPORA}, got {cfg.corpus!r}")
  if not 0.0 < _number(cfg, "builtin_scale") <= 1000.0:
    raise ValueError(f"data.builtin_scale must lie in (0, 1000], got {cfg.builtin_scale!r}")
  if not cfg.cache_dir:
    raise ValueError("data.cache_dir is empty")
  cache = os.path.expanduser(cfg.cache_dir)
  if os.path.exists(cache) and not os.path.isdir(cache):
    raise ValueError(f"data.cache_dir = {cfg.cache_dir!r} is a file, not a directory")
  if cfg.prepared_dir and not os.path.isdir(os.path.expanduser(cfg.prepared_dir)):
    raise ValueError(f"data.prepared_dir: no directory {cfg.prepared_dir!r}")
  if not 0.0 <= _number(cfg, "eval_fraction") <= 0.5:
    raise ValueError(f"data.eval_fraction must lie in [0, 0.5], got {cfg.eval_fraction!r}")
  for field in ("seq_len", "global_batch_size", "prefetch", "shard_tokens"):
    _positive_int(cfg, field)
  _positive_int(cfg, "workers", low=0)
  if not isinstance(cfg.verify, bool):
    raise TypeError(f"data.verify must be True or False, got {cfg.verify!r}")
  unknown = sorted(set(cfg.files.keys()) - {_key(s) for s in SOURCES})
  if unknown:
    raise ValueError(f"data.files has unknown sources {unknown}; the sources are "
                     f"{[_key(s) for s in SOURCES]}")
  specs = source_specs(cfg)
  for name, spec in specs.items():
    try:
      readers.check_spec(name, spec)
    except ValueError as e:
      raise ValueError(f"data.files.{name}: {e}") from None
  if cfg.corpus == "files" and not cfg.prepared_dir and not specs:
    raise ValueError("data.corpus is 'files' but no data.files.<source>.paths is set")
  if cfg.prepared_dir and specs:
    # The prepared directory is opened as is: these files would be silently ignored.
    given = ", ".join(f"data.files.{_key(n)}.paths" for n in specs)
    raise ValueError(f"data.prepared_dir = {cfg.prepared_dir!r} is opened as is, so {given} "
                     "would be ignored: set one or the other (prepare the files with "
                     "python -m andrea_jax.data.prepare, or leave prepared_dir empty)")


def source_specs(cfg: ml_collections.ConfigDict) -> dict[str, readers.SourceSpec]:
  """``SourceSpec`` of every source of ``cfg.files`` with paths set."""
  specs = {}
  for name in SOURCES:
    f = cfg.files.get(_key(name))
    if f is None or not f.paths:
      continue
    eval_fraction = cfg.eval_fraction if f.eval_fraction is None else f.eval_fraction
    specs[name] = readers.SourceSpec(
        paths=tuple(p.strip() for p in f.paths.split(",") if p.strip()), format=f.format,
        text_field=f.text_field, separator=f.separator, eval_fraction=float(eval_fraction))
  return specs


def files_prepared_dir(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer) -> str:
  """``<cache_dir>/prepared/files-<digest>``: the digest covers the specs, options and tokenizer."""
  key = json.dumps({"specs": {k: v._asdict() for k, v in source_specs(cfg).items()},
                    "shard_tokens": cfg.shard_tokens, "tokenizer": tokenizer.fingerprint},
                   sort_keys=True)
  digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
  return os.path.join(os.path.expanduser(cfg.cache_dir), "prepared", f"files-{digest}")


def prepare_from_config(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer, out_dir: str, *,
                        progress: bool = True) -> PrepareResult:
  """Prepares the config's corpus (built-in or files) into ``out_dir``."""
  specs = (builtin_specs(ensure_builtin_raw(cfg.cache_dir, cfg.builtin_scale))
           if cfg.corpus == "builtin" else source_specs(cfg))
  return prepare(specs, tokenizer, out_dir, shard_tokens=cfg.shard_tokens, workers=cfg.workers,
                 progress=progress)


def open_training_data(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer, *,
                       required: Sequence[str] | None = None,
                       progress: bool = True) -> PreparedData:
  """Prepares the data if needed and opens it with every check (see :class:`PreparedData`).

  Args:
    cfg: the ``data`` section.
    tokenizer: the run's tokenizer (``load_tokenizer(cfg.tokenizer)``).
    required: the sources the run samples from (default: all sixteen); the others may be absent.
    progress: tqdm bars while preparing.

  On several hosts sharing a file system, let process 0 call this first and the others after a
  barrier: the result is the same, but preparing it once is cheaper.

  Example:
    >>> cfg = data_config()
    >>> data = open_training_data(cfg, load_tokenizer(cfg.tokenizer))
    >>> sampler = MixtureSampler(data, seq_len=cfg.seq_len,
    ...                          global_batch_size=cfg.global_batch_size, seed=0)
  """
  validate_data_config(cfg)
  if cfg.prepared_dir:
    path = os.path.expanduser(cfg.prepared_dir)
  elif cfg.corpus == "builtin":
    # Byte tokenization is faster than starting worker processes.
    workers = 1 if tokenizer.name == "bytes" else cfg.workers
    path = ensure_builtin(cfg.cache_dir, tokenizer, cfg.builtin_scale, workers=workers,
                          progress=progress)
  else:
    path = files_prepared_dir(cfg, tokenizer)
    prepare(source_specs(cfg), tokenizer, path, shard_tokens=cfg.shard_tokens,
            workers=cfg.workers, progress=progress)
  data = PreparedData.open(path, tokenizer=tokenizer, required=required, verify=cfg.verify)
  check_windows(data, cfg.seq_len)
  return data


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

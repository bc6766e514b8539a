"""The ``data`` section of a run config, its validation, and the trainer's one call to get data.

A run's sources (``config.sources``) get their data one of three ways, chosen in this order by
:func:`open_training_data`:

1. ``prepared_dir`` set: open that directory (prepared by ``python -m andrea_jax.data.prepare``);
2. ``corpus`` names a built-in corpus (:data:`BUILTIN_CORPORA`): ``"stdlib"``, real text cut from
   the Python standard library, or ``"synthetic"``, sixteen invented languages under ANDREA's
   source names; generated and prepared once in ``cache_dir``; the run's sources must be sources
   of that corpus (any subset, in any order);
3. ``corpus = "files"``: each source's ``files.<source>``: local files (JSON Lines, text or
   Parquet) or a Hugging Face dataset (``format = "hf"``: a Hub name, a ``save_to_disk``
   directory, or local files read by ``datasets``), prepared in ``cache_dir`` (finished sources
   are not redone), then opened.

Example overrides on the command line: ``--config.data.files.chat.paths=/data/chat/*.jsonl``,
``--config.data.files.smoltalk.format=hf --config.data.files.smoltalk.dataset=HuggingFaceTB/smoltalk``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Callable, NamedTuple

import ml_collections
from ml_collections import config_dict

from andrea_jax.data import hub
from andrea_jax.data import readers
from andrea_jax.data.cache import CACHE_ENV, default_cache_dir  # noqa: F401 (re-exported)
from andrea_jax.data import sampler as sampler_lib
from andrea_jax.data.corpus import builtin_specs, ensure_builtin, ensure_builtin_raw
from andrea_jax.data.errors import DataError
from andrea_jax.data.prepare_lib import DEFAULT_SHARD_TOKENS, PrepareResult, prepare
from andrea_jax.data.shards import PreparedData
from andrea_jax.data.tokenizers import HUB_PREFIX, Tokenizer
from andrea_jax.sources import SOURCES, check_sources, source_key

class BuiltinCorpus(NamedTuple):
  """A corpus generated on this machine: its sources and how to build it from the ``data``
  section (``raw``: the JSONL specs; ``prepared``: the prepared directory)."""
  sources: tuple[str, ...]
  raw: Callable[[ml_collections.ConfigDict], dict[str, readers.SourceSpec]]
  prepared: Callable[[ml_collections.ConfigDict, Tokenizer, int, bool], str]


def _stdlib() -> BuiltinCorpus:
  # Imported when asked for: python -m andrea_jax.data.stdlib_corpus must not find it imported.
  from andrea_jax.data import stdlib_corpus as sc
  return BuiltinCorpus(
      sc.STDLIB_SOURCES,
      raw=lambda c: sc.stdlib_specs(sc.ensure_stdlib_raw(c.cache_dir, packages=c.stdlib_packages)),
      prepared=lambda c, tok, workers, progress: sc.ensure_stdlib(
          c.cache_dir, tok, packages=c.stdlib_packages, workers=workers, progress=progress))


def _synthetic() -> BuiltinCorpus:
  return BuiltinCorpus(
      SOURCES, raw=lambda c: builtin_specs(ensure_builtin_raw(c.cache_dir, c.builtin_scale)),
      prepared=lambda c, tok, workers, progress: ensure_builtin(
          c.cache_dir, tok, c.builtin_scale, workers=workers, progress=progress))


BUILTIN_CORPORA: dict[str, Callable[[], BuiltinCorpus]] = {"stdlib": _stdlib,
                                                           "synthetic": _synthetic}
"""The built-in corpora by name (``data.corpus``): ``name -> () -> BuiltinCorpus``."""
CORPORA = (*BUILTIN_CORPORA, "files")
_ALIASES = {"builtin": "synthetic"}   # the synthetic corpus's name before there were two


def corpus_name(cfg: ml_collections.ConfigDict) -> str:
  """``data.corpus``, its old spelling ``"builtin"`` read as ``"synthetic"``."""
  return _ALIASES.get(cfg.corpus, cfg.corpus) if isinstance(cfg.corpus, str) else cfg.corpus


def source_files() -> ml_collections.ConfigDict:
  """Where one source's data comes from under ``corpus = "files"`` (``data.files.<source>``)."""
  f = ml_collections.ConfigDict()
  f.paths = ""              # comma-separated glob patterns of the source's files; "" = no files
  # "jsonl" (one JSON object per line), "text", "parquet", or "hf": a Hugging Face dataset read
  # with `datasets` (pip install 'andrea_jax[hub]'), named by `dataset` (with `paths`: its files)
  f.format = "jsonl"
  f.text_field = "text"     # jsonl, hf (layout "text"): key of the document text; parquet: column
  f.separator = readers.DEFAULT_SEPARATOR  # text: a line exactly equal to this separates documents
  f.eval_fraction = config_dict.placeholder(float)  # held-out share for this source; None = global
  # format "hf" only:
  f.dataset = ""            # Hub name, save_to_disk directory, or a builder ("json", ...) of paths
  f.subset = ""             # the dataset's configuration (subset); "" = its default
  f.split = "train"         # the split read
  f.revision = ""           # a Hub revision (commit, tag, branch); "" = the newest
  f.layout = "text"         # "text" (a text field), "messages" (a conversation), "tree" (OASST)
  f.messages_field = "messages"  # layout "messages": the list of messages
  f.system_field = ""       # layout "messages": a field holding a system prompt ("" = none)
  # "chatml", "plain", a tokenizer folder (or its tokenizer_config.json), a .jinja or .json
  # template file, or "hf:<repo>" (see andrea_jax.data.chat_files); "path::name": a named template
  f.template = "chatml"
  # Which tokens of a conversation the loss counts: "all", "assistant" (the assistant's turns, end-
  # of-turn marker included) or "generation" (a Jinja template's {% generation %} blocks)
  f.loss_on = "all"
  f.tools_field = "tools"   # layout "messages": a row's tool schemas, passed to the template if present
  f.filter_field = ""       # keep only rows whose field equals filter_value ("" = every row)
  f.filter_value = ""       # comma-separated values of filter_field to keep
  f.streaming = False       # stream the dataset instead of downloading it whole
  f.max_tokens = 0          # token budget of the source (whole documents); 0 = no budget
  return f


def data_config(sources: Sequence[str] = SOURCES, corpus: str = "synthetic"
                ) -> ml_collections.ConfigDict:
  """Every knob of the data pipeline, one commented field each (the ``data`` section of a run),
  with a ``files`` entry for each of ``sources``."""
  c = ml_collections.ConfigDict()
  # "bytes" (257 ids, no file), a tokenizers .json or SentencePiece .model file, or "hf:<repo>"
  c.tokenizer = "bytes"
  c.corpus = corpus         # "stdlib", "synthetic" (built-in corpora) or "files" (see `files`)
  c.builtin_scale = 1.0     # corpus "synthetic": ~1 MB of text per source per unit
  c.stdlib_packages = False  # corpus "stdlib": the installed packages' README and license texts too
  # corpus = "files": where each source's data comes from (a source with neither paths nor a
  # dataset has none), keyed by the source name with "-" written "_" so that flags can reach them:
  # --config.data.files.repo_docs.paths
  c.files = ml_collections.ConfigDict({source_key(s): source_files() for s in sources})
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


def _check_tokenizer(spec) -> None:
  if not isinstance(spec, str) or not spec:
    raise ValueError(f"data.tokenizer must be 'bytes', a file path or 'hf:<repo>', got {spec!r}")
  if spec.startswith(HUB_PREFIX):
    if not spec[len(HUB_PREFIX):].strip("@"):
      raise ValueError(f"data.tokenizer = {spec!r} names no repository ('hf:gpt2')")
  elif spec != "bytes" and not os.path.isfile(os.path.expanduser(spec)):
    raise ValueError(f"data.tokenizer: no file {spec!r} (and not 'bytes' nor 'hf:<repo>')")


def validate_data_config(cfg: ml_collections.ConfigDict, sources: Sequence[str] = SOURCES
                         ) -> None:
  """Raises ``ValueError`` naming the field (``data.<field>``) and the offending value; ``sources``
  are the run's."""
  sources = check_sources(sources)
  _check_tokenizer(cfg.tokenizer)
  corpus = corpus_name(cfg)
  if not isinstance(corpus, str) or corpus not in CORPORA:
    raise ValueError(f"data.corpus must be one of {CORPORA}, got {cfg.corpus!r}")
  if not 0.0 < _number(cfg, "builtin_scale") <= 1000.0:
    raise ValueError(f"data.builtin_scale must lie in (0, 1000], got {cfg.builtin_scale!r}")
  if not isinstance(cfg.stdlib_packages, bool):
    raise TypeError(f"data.stdlib_packages must be True or False, got {cfg.stdlib_packages!r}")
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
  keys = [source_key(s) for s in sources]
  unknown = sorted(set(cfg.files.keys()) - set(keys))
  if unknown:
    raise ValueError(f"data.files has unknown sources {unknown}; the run's sources are {keys} "
                     "(config.sources)")
  specs = source_specs(cfg, sources)
  _check_origin(cfg, corpus, sources, specs)


def _check_origin(cfg: ml_collections.ConfigDict, corpus: str, sources: tuple[str, ...],
                  specs: dict) -> None:
  """The corpus and the files agree: a built-in corpus holds the run's sources and no file is
  given beside it; a prepared directory is given alone."""
  given = ", ".join(f"data.files.{source_key(n)}" for n in specs)
  if cfg.prepared_dir and specs:
    # The prepared directory is opened as is: these files would be silently ignored.
    raise ValueError(f"data.prepared_dir = {cfg.prepared_dir!r} is opened as is, so {given} "
                     "would be ignored: set one or the other (prepare the files with "
                     "python -m andrea_jax.data.prepare, or leave prepared_dir empty)")
  if cfg.prepared_dir:
    return
  if corpus in BUILTIN_CORPORA:
    if specs:
      raise ValueError(f"data.corpus = {cfg.corpus!r} is a built-in corpus, so {given} would be "
                       "ignored: set data.corpus = 'files' to read them")
    have = BUILTIN_CORPORA[corpus]().sources
    missing = [s for s in sources if s not in have]
    if missing:
      raise ValueError(f"sources {missing} are not sources of the built-in corpus {corpus!r} "
                       f"(it has {list(have)}); read them from files with data.corpus = 'files'")
  elif not specs:
    raise ValueError("data.corpus is 'files' but no source has data: set "
                     "data.files.<source>.paths, or .format='hf' with .dataset")
  for name, spec in specs.items():
    try:
      (hub.check_hub_spec if isinstance(spec, hub.HubSpec) else readers.check_spec)(name, spec)
    except ValueError as e:
      raise ValueError(f"data.files.{source_key(name)}: {e}") from None


def _spec(cfg: ml_collections.ConfigDict, f: ml_collections.ConfigDict
          ) -> readers.SourceSpec | hub.HubSpec:
  eval_fraction = float(cfg.eval_fraction if f.eval_fraction is None else f.eval_fraction)
  paths = tuple(p.strip() for p in f.paths.split(",") if p.strip())
  if f.format != "hf" and f.get("loss_on", "all") != "all":
    # Checked here: a SourceSpec has no turns to mask, so the choice would be silently dropped.
    raise ValueError(f"loss_on = {f.loss_on!r} needs conversations (format 'hf' with layout "
                     f"'messages' or 'tree'), got format {f.format!r}")
  if f.format != "hf":
    return readers.SourceSpec(paths=paths, format=f.format, text_field=f.text_field,
                              separator=f.separator, eval_fraction=eval_fraction)
  values = [v.strip() for v in str(f.filter_value).split(",") if v.strip()]
  return hub.HubSpec(
      dataset=f.dataset, split=f.split, subset=f.subset or None, data_files=paths,
      revision=f.revision or None, layout=f.layout, text_field=f.text_field,
      messages_field=f.messages_field, system_field=f.system_field, template=f.template,
      filter_field=f.filter_field, filter_value=(values[0] if len(values) == 1 else values or None),
      streaming=f.streaming, max_tokens=f.max_tokens, eval_fraction=eval_fraction,
      loss_on=f.get("loss_on", "all"), tools_field=f.get("tools_field", "tools"))


def source_specs(cfg: ml_collections.ConfigDict, sources: Sequence[str] = SOURCES
                 ) -> dict[str, readers.SourceSpec | hub.HubSpec]:
  """The spec of every source of ``sources`` whose ``data.files`` entry names data (paths, or a
  dataset under ``format = "hf"``), in the order of ``sources``."""
  specs = {}
  for name in sources:
    f = cfg.files.get(source_key(name))
    if f is not None and (f.paths or (f.format == "hf" and f.dataset)):
      try:
        specs[name] = _spec(cfg, f)
      except ValueError as e:
        raise ValueError(f"data.files.{source_key(name)}.{e}") from None
  return specs


def without_data(cfg: ml_collections.ConfigDict, sources: Sequence[str],
                 used: Sequence[str]) -> list[str]:
  """The ``used`` sources no data is configured for (``corpus = "files"`` without
  ``prepared_dir``: neither paths nor a dataset); ``[]`` otherwise."""
  if corpus_name(cfg) != "files" or cfg.prepared_dir:
    return []
  specs = source_specs(cfg, sources)
  return [s for s in used if s not in specs]


def _digest_fields(spec: readers.SourceSpec | hub.HubSpec) -> dict:
  """A spec's fields for the prepared folder's digest; the fields added since it was defined
  (``loss_on``, ``tools_field``) only where they differ from their defaults, so that a config
  that does not set them keeps its folder."""
  fields = spec._asdict()
  for name in ("loss_on", "tools_field"):
    if name in fields and fields[name] == hub.HubSpec._field_defaults[name]:
      del fields[name]
  return fields


def files_prepared_dir(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
                       sources: Sequence[str] = SOURCES) -> str:
  """``<cache_dir>/prepared/files-<digest>``: the digest covers the specs, options and tokenizer."""
  key = json.dumps({"specs": {k: _digest_fields(v) for k, v in source_specs(cfg, sources).items()},
                    "shard_tokens": cfg.shard_tokens, "tokenizer": tokenizer.fingerprint},
                   sort_keys=True)
  digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
  return os.path.join(os.path.expanduser(cfg.cache_dir), "prepared", f"files-{digest}")


def prepare_from_config(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer, out_dir: str, *,
                        sources: Sequence[str] = SOURCES, progress: bool = True) -> PrepareResult:
  """Prepares the config's data for ``sources`` (a built-in corpus's or the files') into
  ``out_dir``."""
  corpus = corpus_name(cfg)
  if corpus in BUILTIN_CORPORA:
    specs = {s: spec for s, spec in BUILTIN_CORPORA[corpus]().raw(cfg).items() if s in sources}
  else:
    specs = source_specs(cfg, sources)
  return prepare(specs, tokenizer, out_dir, shard_tokens=cfg.shard_tokens, workers=cfg.workers,
                 progress=progress, known_sources=sources)


def open_training_data(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer, *,
                       sources: Sequence[str] = SOURCES, required: Sequence[str] | None = None,
                       progress: bool = True) -> PreparedData:
  """Prepares the data if needed and opens it with every check (see :class:`PreparedData`).

  Args:
    cfg: the ``data`` section.
    tokenizer: the run's tokenizer (``load_tokenizer(cfg.tokenizer)``).
    sources: the run's sources (``config.sources``), the order of every weight vector.
    required: the sources the run samples from (default: all of ``sources``); the others may be
      absent.
    progress: tqdm bars while preparing.

  On several hosts sharing a file system, let process 0 call this first and the others after a
  barrier: the result is the same, but preparing it once is cheaper.

  Example:
    >>> cfg = data_config()
    >>> data = open_training_data(cfg, load_tokenizer(cfg.tokenizer))
    >>> sampler = MixtureSampler(data, seq_len=cfg.seq_len,
    ...                          global_batch_size=cfg.global_batch_size, seed=0)
  """
  validate_data_config(cfg, sources)
  corpus = corpus_name(cfg)
  if cfg.prepared_dir:
    path = os.path.expanduser(cfg.prepared_dir)
  elif corpus in BUILTIN_CORPORA:
    # Byte tokenization is faster than starting worker processes.
    workers = 1 if tokenizer.name == "bytes" else cfg.workers
    path = BUILTIN_CORPORA[corpus]().prepared(cfg, tokenizer, workers, progress)
  else:
    path = files_prepared_dir(cfg, tokenizer, sources)
    prepare(source_specs(cfg, sources), tokenizer, path, shard_tokens=cfg.shard_tokens,
            workers=cfg.workers, progress=progress, known_sources=sources)
  data = PreparedData.open(path, tokenizer=tokenizer, sources=sources, required=required,
                           verify=cfg.verify)
  check_windows(data, cfg.seq_len)
  return data


def corpus_vocabulary(cfg: ml_collections.ConfigDict) -> frozenset[str] | None:
  """The words of the built-in corpus's training documents (``eval/word_share`` is measured
  against them), or ``None`` for a corpus that records none (the synthetic one, files)."""
  if corpus_name(cfg) != "stdlib" or cfg.prepared_dir:
    return None
  from andrea_jax.data import stdlib_corpus
  return stdlib_corpus.read_vocabulary(
      stdlib_corpus.ensure_stdlib_raw(cfg.cache_dir, packages=cfg.stdlib_packages))


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

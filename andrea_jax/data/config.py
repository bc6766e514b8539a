"""The ``data`` section of a run config, checked once into a typed :class:`DataSpec`.

A run's sources (``config.sources``) get their data one of three ways, chosen in this order by
:func:`andrea_jax.data.pipeline.open_training_data`:

1. ``prepared_dir`` set: open that directory (prepared by ``python -m andrea_jax.data.prepare``);
2. ``corpus`` names a built-in corpus (:data:`BUILTIN_CORPORA`): ``"stdlib"``, real text cut from
   the Python standard library, or ``"synthetic"``, sixteen invented languages under ANDREA's
   source names; generated and prepared once in ``cache_dir``; the run's sources must be sources
   of that corpus (any subset, in any order), and ``files.<source>.max_tokens`` may cap them;
3. ``corpus = "files"``: each source's ``files.<source>``, a section of its format
   (:mod:`andrea_jax.data.formats`: JSON Lines, text, Parquet, a Hugging Face dataset, or a
   format of your own), prepared in ``cache_dir`` (finished sources are not redone), then opened.

Example overrides on the command line: ``--config.data.files.chat.paths=/data/chat/*.jsonl``,
``--config.data.files.smoltalk.format=hf --config.data.files.smoltalk.dataset=HuggingFaceTB/smoltalk``.
In Python: ``set_source(config, "docs", "text", paths="corpus/docs/*.txt")``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Callable, NamedTuple

import ml_collections

from andrea_jax import checks
from andrea_jax.data import formats
from andrea_jax.data import readers
from andrea_jax.data.cache import CACHE_ENV, default_cache_dir  # noqa: F401 (re-exported)
from andrea_jax.data.prepare_lib import DEFAULT_SHARD_TOKENS
from andrea_jax.data.tokenizers import HUB_PREFIX, Tokenizer, load_tokenizer
from andrea_jax.sources import SOURCES, check_sources, source_key


class BuiltinCorpus(NamedTuple):
  """A corpus generated on this machine: its sources and how to build it from the checked
  ``data`` section (``raw``: the JSONL specs; ``prepared``: the prepared directory)."""
  sources: tuple[str, ...]
  raw: Callable[["DataSpec"], dict[str, readers.SourceSpec]]
  prepared: Callable[["DataSpec", Tokenizer, int, bool], str]


def _stdlib() -> BuiltinCorpus:
  # Imported when asked for: python -m andrea_jax.data.corpora.stdlib must not find it imported.
  from andrea_jax.data.corpora import stdlib as sc
  return BuiltinCorpus(
      sc.STDLIB_SOURCES,
      raw=lambda d: sc.stdlib_specs(sc.ensure_stdlib_raw(d.cache_dir, packages=d.stdlib_packages),
                                    caps=d.caps),
      prepared=lambda d, tok, workers, progress: sc.ensure_stdlib(
          d.cache_dir, tok, packages=d.stdlib_packages, workers=workers, progress=progress,
          caps=d.caps))


def _synthetic() -> BuiltinCorpus:
  from andrea_jax.data.corpora.synthetic import builtin_specs, ensure_builtin, ensure_builtin_raw
  return BuiltinCorpus(
      SOURCES, raw=lambda d: builtin_specs(ensure_builtin_raw(d.cache_dir, d.builtin_scale),
                                           caps=d.caps),
      prepared=lambda d, tok, workers, progress: ensure_builtin(
          d.cache_dir, tok, d.builtin_scale, workers=workers, progress=progress, caps=d.caps))


BUILTIN_CORPORA: dict[str, Callable[[], BuiltinCorpus]] = {"stdlib": _stdlib,
                                                           "synthetic": _synthetic}
"""The built-in corpora by name (``data.corpus``): ``name -> () -> BuiltinCorpus``."""
CORPORA = (*BUILTIN_CORPORA, "files")
_ALIASES = {"builtin": "synthetic"}   # the synthetic corpus's name before there were two


def corpus_name(cfg: ml_collections.ConfigDict) -> str:
  """``data.corpus``, its old spelling ``"builtin"`` read as ``"synthetic"``."""
  return _ALIASES.get(cfg.corpus, cfg.corpus) if isinstance(cfg.corpus, str) else cfg.corpus


def source_files(format: str = formats.DEFAULT, **fields) -> ml_collections.ConfigDict:
  """The ``data.files.<source>`` section of ``format`` (:func:`andrea_jax.data.formats.source_section`):
  its fields at their defaults, ``fields`` replacing some. The default, a JSON Lines section with
  no ``paths``, is a source with no data.

  Example: ``source_files("hf", dataset="HuggingFaceTB/smoltalk", layout="messages")``.
  """
  return formats.source_section(format, **fields)


def set_source(config: ml_collections.ConfigDict, source: str, format: str = formats.DEFAULT,
               **fields) -> None:
  """Points ``source`` of a run ``config`` (in place, locked or not) at its data:
  ``data.files.<source>`` made anew for ``format`` with ``fields``.

  Example: ``set_source(config, "docs", "text", paths="corpus/docs/*.txt")``;
  ``set_source(config, "smoltalk", "hf", dataset="HuggingFaceTB/smoltalk", max_tokens=10**8)``.
  """
  key = source_key(source)
  if key not in config.data.files:
    raise ValueError(f"{source!r} is not a source of the config (its sources: "
                     f"{list(config.sources)}); change them with andrea_jax.config.with_sources")
  with config.unlocked():
    config.data.files[key] = source_files(format, **fields)


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
  # Each source's data, keyed by the source name with "-" written "_" so that flags reach them
  # (--config.data.files.repo_docs.paths): a section of its format (andrea_jax.data.formats:
  # "jsonl", "text", "parquet", "hf" or "package.module:factory"), its fields and eval_fraction
  # and max_tokens. The default, format "jsonl" with no paths, has no data. A built-in corpus reads
  # only max_tokens here.
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


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """The ``data`` section, checked (:func:`data_spec`): what the data pipeline
  (:func:`andrea_jax.data.pipeline.open_training_data`) and the trainer read, never the section.
  """
  tokenizer: Tokenizer                # data.tokenizer, loaded
  sources: tuple[str, ...]            # the run's sources, the order of every weight vector
  corpus: str                         # "stdlib", "synthetic" or "files"
  files: Mapping[str, formats.Source]  # corpus "files": each source with data, in source order
  caps: Mapping[str, int]             # a built-in corpus: max_tokens of each source given one
  builtin_scale: float
  stdlib_packages: bool
  cache_dir: str
  prepared_dir: str                   # "" = unused
  eval_fraction: float
  seq_len: int
  global_batch_size: int
  micro_batch_size: int               # global_batch_size / optim.grad_accum_steps (runconfig's)
  prefetch: int
  shard_tokens: int
  workers: int
  verify: bool


def _check_tokenizer(spec) -> None:
  if not isinstance(spec, str) or not spec:
    raise ValueError(f"data.tokenizer must be 'bytes', a file path or 'hf:<repo>', got {spec!r}")
  if spec.startswith(HUB_PREFIX):
    if not spec[len(HUB_PREFIX):].strip("@"):
      raise ValueError(f"data.tokenizer = {spec!r} names no repository ('hf:gpt2')")
  elif spec != "bytes" and not os.path.isfile(os.path.expanduser(spec)):
    raise ValueError(f"data.tokenizer: no file {spec!r} (and not 'bytes' nor 'hf:<repo>')")


def data_spec(cfg: ml_collections.ConfigDict, sources: Sequence[str] = SOURCES, *,
              tokenizer: Tokenizer | None = None) -> DataSpec:
  """The ``data`` section ``cfg`` checked into a :class:`DataSpec`, for the run's ``sources``;
  the tokenizer loaded (``tokenizer``: one loaded already). Raises ``ValueError``/``TypeError``
  naming the field (``data.<field>``, ``data.files.<source>.<field>``) and the value.

  Example:
    >>> spec = data_spec(data_config())
    >>> spec.corpus, spec.tokenizer.vocab_size, spec.files
    ('synthetic', 257, {})
  """
  sources = check_sources(sources)
  _check_tokenizer(cfg.tokenizer)
  corpus = corpus_name(cfg)
  if not isinstance(corpus, str) or corpus not in CORPORA:
    raise ValueError(f"data.corpus must be one of {CORPORA}, got {cfg.corpus!r}")
  scale = checks.number("data.builtin_scale", cfg.builtin_scale, low=0, low_open=True, high=1000)
  packages = checks.flag("data.stdlib_packages", cfg.stdlib_packages)
  checks.text("data.cache_dir", cfg.cache_dir, empty=False)
  cache = os.path.expanduser(cfg.cache_dir)
  if os.path.exists(cache) and not os.path.isdir(cache):
    raise ValueError(f"data.cache_dir = {cfg.cache_dir!r} is a file, not a directory")
  if cfg.prepared_dir and not os.path.isdir(os.path.expanduser(cfg.prepared_dir)):
    raise ValueError(f"data.prepared_dir: no directory {cfg.prepared_dir!r}")
  eval_fraction = checks.number("data.eval_fraction", cfg.eval_fraction, low=0, high=0.5)
  sizes = {f: checks.integer(f"data.{f}", cfg[f], minimum=1, int32=f != "shard_tokens")
           for f in ("seq_len", "global_batch_size", "prefetch", "shard_tokens")}
  workers = checks.integer("data.workers", cfg.workers, minimum=0)
  verify = checks.flag("data.verify", cfg.verify)
  files, caps = _sources(cfg, sources, corpus, eval_fraction)
  if tokenizer is None:
    tokenizer = load_tokenizer(cfg.tokenizer)
  return DataSpec(tokenizer=tokenizer, sources=sources, corpus=corpus, files=files, caps=caps,
                  builtin_scale=scale, stdlib_packages=packages, cache_dir=cfg.cache_dir,
                  prepared_dir=cfg.prepared_dir, eval_fraction=eval_fraction,
                  micro_batch_size=sizes["global_batch_size"], workers=workers, verify=verify,
                  **sizes)


def validate_data_config(cfg: ml_collections.ConfigDict, sources: Sequence[str] = SOURCES
                         ) -> None:
  """Raises ``ValueError``/``TypeError`` naming the field (``data.<field>``) and the offending
  value; ``sources`` are the run's (:func:`data_spec`, its result dropped)."""
  data_spec(cfg, sources)


def _sections(cfg: ml_collections.ConfigDict, sources: tuple[str, ...]
              ) -> dict[str, ml_collections.ConfigDict]:
  """``data.files`` entry of each source that has one, in source order; unknown keys refused."""
  keys = [source_key(s) for s in sources]
  unknown = sorted(set(cfg.files.keys()) - set(keys))
  if unknown:
    raise ValueError(f"data.files has unknown sources {unknown}; the run's sources are {keys} "
                     "(config.sources)")
  return {s: cfg.files[source_key(s)] for s in sources if source_key(s) in cfg.files}


def _sources(cfg: ml_collections.ConfigDict, sources: tuple[str, ...], corpus: str,
             eval_fraction: float) -> tuple[dict[str, formats.Source], dict[str, int]]:
  """``(files, caps)``: the source of every section with data (built by its format) and, for a
  built-in corpus, the caps of its sources; the corpus and the sections checked to agree."""
  files, caps, held = {}, {}, []
  for name, section in _sections(cfg, sources).items():
    where = f"data.files.{source_key(name)}"
    checked = formats.check(where, section, eval_fraction)
    if formats.has_data(section, where):
      files[name] = formats.build(where, section, eval_fraction)
    elif corpus in BUILTIN_CORPORA:   # a file corpus's source without data: nothing is read
      if checked.max_tokens:
        caps[name] = checked.max_tokens
      if section.get("eval_fraction") is not None:
        held.append(f"{where}.eval_fraction")
  _check_origin(cfg, corpus, sources, files, caps)
  if held and not cfg.prepared_dir:
    raise ValueError(f"{held[0]} is set, but the built-in corpus {corpus!r} holds out its own "
                     "share of every source: leave it None (only max_tokens applies to a "
                     "built-in corpus's sources)")
  return files, caps


def _check_origin(cfg: ml_collections.ConfigDict, corpus: str, sources: tuple[str, ...],
                  files: dict, caps: dict) -> None:
  """The corpus and the files agree: a built-in corpus holds the run's sources and no file is
  given beside it; a prepared directory is given alone."""
  given = ", ".join(f"data.files.{source_key(n)}" for n in files)
  if cfg.prepared_dir and (files or caps):
    # The prepared directory is opened as is: these files would be silently ignored.
    given = given or ", ".join(f"data.files.{source_key(n)}.max_tokens" for n in caps)
    raise ValueError(f"data.prepared_dir = {cfg.prepared_dir!r} is opened as is, so {given} "
                     "would be ignored: set one or the other (prepare the files with "
                     "python -m andrea_jax.data.prepare, or leave prepared_dir empty)")
  if cfg.prepared_dir:
    return
  if corpus in BUILTIN_CORPORA:
    if files:
      raise ValueError(f"data.corpus = {cfg.corpus!r} is a built-in corpus, so {given} would be "
                       "ignored: set data.corpus = 'files' to read them")
    have = BUILTIN_CORPORA[corpus]().sources
    missing = [s for s in sources if s not in have]
    if missing:
      raise ValueError(f"sources {missing} are not sources of the built-in corpus {corpus!r} "
                       f"(it has {list(have)}); read them from files with data.corpus = 'files'")
  elif not files:
    raise ValueError("data.corpus is 'files' but no source has data: set "
                     "data.files.<source>.paths, or .format='hf' with .dataset")


def source_specs(cfg: ml_collections.ConfigDict, sources: Sequence[str] = SOURCES
                 ) -> dict[str, formats.Source]:
  """The :class:`~andrea_jax.data.formats.Source` of every source of ``sources`` whose
  ``data.files`` entry names data (paths, or a dataset under ``format = "hf"``), in the order of
  ``sources``, each checked (:func:`data_spec` checks the whole section)."""
  eval_fraction = checks.number("data.eval_fraction", cfg.eval_fraction, low=0, high=0.5)
  return {name: formats.build(f"data.files.{source_key(name)}", section, eval_fraction)
          for name, section in _sections(cfg, check_sources(sources)).items()
          if formats.has_data(section, f"data.files.{source_key(name)}")}


def without_data(spec: DataSpec, used: Sequence[str]) -> list[str]:
  """The ``used`` sources no data is configured for (``corpus = "files"`` without
  ``prepared_dir``: neither paths nor a dataset); ``[]`` otherwise."""
  if spec.corpus != "files" or spec.prepared_dir:
    return []
  return [s for s in used if s not in spec.files]

"""Data formats by name: a source's ``data.files.<source>`` section, made from its format's fields.

A format is a factory with typed keyword arguments and defaults (a function, or a frozen dataclass
whose fields are its arguments) that returns a *reader*, as a mixer factory returns a mixer
(:mod:`andrea_jax.curriculum.registry`). The section of a source is the format's name, one field
per argument, and the fields every source has (:data:`COMMON`)::

  data.files.docs.format = "text"             # a built-in name, or "package.module:factory"
  data.files.docs.paths = "corpus/docs/*.txt"  # ... the format's own fields
  data.files.docs.separator = "<|endoftext|>"
  data.files.docs.eval_fraction = None        # ... and every source's (None: data.eval_fraction)
  data.files.docs.max_tokens = 0              # a cap of whole documents (0: none)

A reader is one of two kinds, the same for the built-ins (:data:`BUILTIN`) and a user's own:

* a **file reader** (``jsonl``, ``text``, ``parquet``: :mod:`andrea_jax.data.readers`):
  ``paths`` (comma-separated glob patterns), ``units(path) -> list`` (picklable pieces of one file,
  in document order) and ``read(unit) -> list[str]`` (the non-empty documents of one piece, in
  order). The pieces are read and tokenized by a pool of processes, which rebuild the reader from
  the format's name and arguments;
* a **dataset reader**: ``documents(source, progress) -> Iterable[list[str]]``, the documents in
  lists, read in this process. ``hf`` (:func:`andrea_jax.data.hub.spec.hf`) is the built-in one,
  read by the Hugging Face plug-in with its chat templates and loss masks.

Either may have ``record() -> dict``: JSON values that, with the bytes of the files it reads, decide
its documents (default: the format's arguments). A prepared source is redone when they change.

:func:`source_section` makes a section, :func:`build` checks one into a :class:`Source` (every
error naming ``data.files.<source>.<field>`` and the value), and :func:`switch_formats` makes
``--config.data.files.<source>.format=<format>`` remake the section for the new format on the
command line (:func:`switch_on_parse`: before the other overrides are read, so that they may name
the new format's fields).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import ml_collections
from ml_collections import config_dict

from andrea_jax import checks
from andrea_jax import plugins
from andrea_jax.data import readers
from andrea_jax.data.hub import spec as hub_spec

BUILTIN: dict[str, Callable[..., Any]] = {
    "jsonl": readers.Jsonl,
    "text": readers.Text,
    "parquet": readers.Parquet,
    "hf": hub_spec.hf,
}
"""The built-in formats' names and factories."""
DEFAULT = "jsonl"
COMMON = ("eval_fraction", "max_tokens")
"""The fields every source has, whatever its format: its held-out share (``None``: the ``data``
section's) and its cap of whole documents (0: none)."""
# A source whose format takes some of these and has all of them empty has no data.
_DATA_FIELDS = ("paths", "dataset")
_SCALARS = (bool, int, float, str)


class FileReader(Protocol):
  """A format of local files (see the module docstring)."""
  paths: str

  def units(self, path: str) -> Sequence[Any]: ...

  def read(self, unit: Any) -> list[str]: ...


class DatasetReader(Protocol):
  """A format read as a stream of documents in this process (see the module docstring)."""

  def documents(self, source: str, progress: bool) -> Iterable[list[str]]: ...


class Source(NamedTuple):
  """One source's data, checked: what ``data.files.<source>`` says, and what the pipeline takes
  (:func:`andrea_jax.data.prepare_lib.prepare`).

  Attributes:
    format: a built-in format's name or ``"package.module:factory"``.
    arguments: ``(name, value)`` of each of the format's arguments, in its signature's order.
    eval_fraction: the share of documents held out, in [0, 0.5].
    max_tokens: a cap of whole documents: the longest prefix of the source's documents whose tokens
      (each document's leading end-of-document id included, held-out documents too) add up to at
      most this; 0 reads everything.
  """
  format: str
  arguments: tuple[tuple[str, Any], ...] = ()
  eval_fraction: float = 0.01
  max_tokens: int = 0

  @property
  def reader(self) -> Any:
    """The reader the format makes of the arguments (made once per format and arguments)."""
    return make_reader(self.format, self.arguments)


def factory(name: str, where: str = "data.files.<source>.format") -> Callable[..., Any]:
  """The factory ``name`` names: a built-in, or ``"package.module:factory"`` imported
  (:func:`andrea_jax.plugins.resolve`). A ``ValueError`` names ``where`` and the built-ins when
  it names nothing usable."""
  found = plugins.resolve(f"{where} = {name!r}", name, BUILTIN, "format")
  if not callable(found):
    raise ValueError(f"{where} = {name!r}: {name.partition(':')[2]!r} is not callable")
  return found


@functools.lru_cache(maxsize=None)
def arguments(make: Callable) -> tuple[tuple[str, type, Any], ...]:
  """``(name, type, default)`` of each argument of the format factory ``make``
  (:func:`andrea_jax.plugins.arguments`): scalars only, none named as a field every source has."""
  where = f"format factory {getattr(make, '__qualname__', make)!r}"
  out = plugins.arguments(make)
  for name, kind, _ in out:
    if name in COMMON or name == "format":
      raise TypeError(f"{where}: argument {name!r} is a field every source has; leave it out")
    if kind not in _SCALARS:
      raise TypeError(f"{where}, {name!r}: a format's arguments must be bool, int, float or "
                      f"str, got {kind!r}")
  return out


def source_section(format: str = DEFAULT, **values) -> ml_collections.ConfigDict:
  """The ``data.files.<source>`` section of format ``format``: its name, the factory's arguments
  at their defaults and the common fields (``values`` replace some).

  Example:
    >>> s = source_section("text", paths="corpus/docs/*.txt")
    >>> sorted(s.keys())
    ['eval_fraction', 'format', 'max_tokens', 'paths', 'separator']
  """
  args = arguments(factory(format, "format"))
  known = {n for n, _, _ in args} | set(COMMON)
  unknown = sorted(set(values) - known)
  if unknown:
    raise ValueError(f"format {format!r} takes no field {unknown}; its fields are "
                     f"{sorted(known)}")
  section = ml_collections.ConfigDict()
  section.format = format
  for name, kind, default in args:
    value = values.get(name, default)
    section[name] = float(value) if kind is float and type(value) is int else value
  section.eval_fraction = config_dict.placeholder(float)
  if values.get("eval_fraction") is not None:
    section.eval_fraction = float(values["eval_fraction"])
  section.max_tokens = values.get("max_tokens", 0)
  return section


def has_data(section: ml_collections.ConfigDict, where: str = "data.files.<source>") -> bool:
  """Whether a section names data: a format that takes ``paths`` or ``dataset`` needs one of
  them set; any other format always reads something."""
  make = factory(section.get("format", DEFAULT), f"{where}.format")
  takes = [f for f in _DATA_FIELDS if f in {n for n, _, _ in arguments(make)}]
  return not takes or any(section.get(f) for f in takes)


_value = plugins.value


def check(where: str, section: ml_collections.ConfigDict, eval_fraction: float) -> Source:
  """The :class:`Source` a section describes (``where``: its name, ``data.files.<source>``), every
  field checked against the format's signature (not yet by the factory: :func:`build`); errors
  name ``<where>.<field>`` and the value. ``eval_fraction``: the default held-out share."""
  if not isinstance(section, (ml_collections.ConfigDict, dict)) or "format" not in section:
    raise ValueError(f"{where} must be a section with a format (make it with "
                     f"data.source_files(format, ...)), got {section!r}")
  name = section["format"]
  args = arguments(factory(name, f"{where}.format"))
  known = {n for n, _, _ in args}
  given = {k: v for k, v in dict(section).items() if k not in COMMON and k != "format"}
  unknown = sorted(set(given) - known)
  if unknown:
    raise ValueError(f"{where} has fields {unknown} that format {name!r} does not take (its "
                     f"fields are {sorted(known)}){_hint(where, name, unknown)}")
  kwargs = {n: _value(f"{where}.{n}", kind, given[n]) if n in given else default
            for n, kind, default in args}
  held = section.get("eval_fraction")
  held = eval_fraction if held is None else checks.number(f"{where}.eval_fraction", held, low=0,
                                                          high=0.5)
  cap = checks.integer(f"{where}.max_tokens", section.get("max_tokens", 0), minimum=0,
                       int32=False)
  return Source(name, tuple(kwargs.items()), float(held), cap)


def _hint(where: str, name: str, fields: list[str]) -> str:
  """How to make the section of format ``name`` (or of the built-in format that takes
  ``fields``, if one does)."""
  source = where.rpartition(".")[2]
  other = next((f for f, make in BUILTIN.items()
                if set(fields) <= {n for n, _, _ in arguments(make)}), None)
  return (f": make the section for {name!r} with data.set_source(config, {source!r}, {name!r}, "
          f"...) (on the command line, --config.{where}.format={name} does)"
          + (f", or set format {other!r}, which takes them" if other else ""))


def build(where: str, section: ml_collections.ConfigDict, eval_fraction: float) -> Source:
  """:func:`check`, then the format's factory called on the arguments (its own checks), its
  errors named as :func:`check`'s."""
  source = check(where, section, eval_fraction)
  try:
    source.reader   # noqa: B018 (made now, and kept for the pipeline)
  except (TypeError, ValueError) as e:   # rebuilt as the base class: a subclass may take more
    base = TypeError if isinstance(e, TypeError) else ValueError
    first = re.split(r"[\s\[.:]", str(e), maxsplit=1)[0]
    known = {n for n, _ in source.arguments}
    raise base(f"{where}.{e}" if first in known
               else f"{where} (format {source.format!r}): {e}") from None
  return source


@functools.lru_cache(maxsize=64)
def make_reader(format: str, arguments: tuple[tuple[str, Any], ...]) -> Any:
  """``factory(format)(**arguments)``, made once per format and arguments (worker processes
  rebuild a reader this way)."""
  return factory(format)(**dict(arguments))


def as_source(spec: readers.SourceSpec) -> Source:
  """A :class:`~andrea_jax.data.readers.SourceSpec` (a built-in file format in one tuple) as the
  :class:`Source` of its format."""
  own = {"jsonl": ("text_field",), "text": ("separator",), "parquet": ("text_field",)}
  if spec.format not in own:
    raise ValueError(f"format must be one of {tuple(own)}, got {spec.format!r}")
  return Source(spec.format, (("paths", tuple(spec.paths)),)
                + tuple((f, getattr(spec, f)) for f in own[spec.format]),
                float(spec.eval_fraction), int(spec.max_tokens))


def folder_key(source: Source) -> dict:
  """What of a source names the prepared folder of a file corpus
  (:func:`andrea_jax.data.pipeline.files_prepared_dir`): its format and fields, spelled for the
  built-ins as their specs were before formats had names, so that their folders stay where they
  were; a cap names the folder too (a Hub source's always did), so runs with other caps never
  rewrite each other's shards."""
  args, reader = dict(source.arguments), source.reader
  if isinstance(reader, hub_spec.HubSpec):
    fields = reader._replace(eval_fraction=source.eval_fraction,
                             max_tokens=source.max_tokens)._asdict()
    for name in ("loss_on", "tools_field"):   # added later: only where set, as before
      if fields[name] == hub_spec.HubSpec._field_defaults[name]:
        del fields[name]
    return fields
  cap = {"max_tokens": source.max_tokens} if source.max_tokens else {}
  if isinstance(reader, (readers.Jsonl, readers.Text, readers.Parquet)):
    return {"paths": list(readers.patterns(reader.paths)), "format": source.format,
            "text_field": args.get("text_field", "text"),
            "separator": args.get("separator", readers.DEFAULT_SEPARATOR),
            "eval_fraction": source.eval_fraction, **cap}
  return {"format": source.format, "arguments": args, "eval_fraction": source.eval_fraction, **cap}


def switch_formats(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> None:
  """Makes ``--config.data.files.<source>.format=<format>`` switch a source's format.

  ``overrides`` are the command line's (``{"data.files.docs.format": "text", ...}``). When one
  names a format whose fields are not the section's, ``data.files.<source>`` of ``config`` is made
  anew for it (in place, locked or not): its defaults, with the values of the fields both formats
  take kept (the common ones among them). A field given for that source that the new format does
  not take is an error naming it.
  """
  for key, value in overrides.items():
    source = key.removeprefix("data.files.").removesuffix(".format")
    if not (key.startswith("data.files.") and key.endswith(".format")) or "." in source:
      continue
    if source not in config.data.files:
      continue   # the command line's own check names it
    takes = {n for n, _, _ in arguments(factory(value, f"--config.{key}"))} | set(COMMON)
    given = {k.removeprefix(f"data.files.{source}.") for k in overrides
             if k.startswith(f"data.files.{source}.") and k != key}
    stray = sorted(f for f in given if f not in takes)
    if stray:
      raise ValueError(f"--config.data.files.{source}.{stray[0]} is not a field of format "
                       f"{value!r} (its fields: {sorted(takes)})")
    section = config.data.files[source]
    have = set(section.keys()) - {"format"}
    if have == takes:
      continue
    keep = {k: section[k] for k in have & takes}
    with config.unlocked():
      config.data.files[source] = source_section(value, **keep)


def command_line_overrides(name: str, argv: Sequence[str]) -> dict[str, str]:
  """``{"data.files.<source>.<field>": value}`` of the ``--<name>.data.files...`` flags of
  ``argv`` (the last of each; a boolean flag's value is ``""``)."""
  pattern = re.compile(rf"^--?(?:no)?{re.escape(name)}\.(data\.files\.[\w.]+)(?:=(.*))?$", re.S)
  out = {}
  for i, arg in enumerate(argv):
    m = pattern.match(arg)
    if m:
      value = m.group(2)
      if value is None and m.group(1).endswith(".format"):
        value = argv[i + 1] if i + 1 < len(argv) else ""   # --config.x.format jsonl
      out[m.group(1)] = value if value is not None else ""
  return out


class _SwitchingParser:
  """A config-file flag's parser that applies :func:`switch_formats` once the file is read."""

  def __init__(self, parser, name: str, argv: Sequence[str] | None):
    self._parser, self._name, self._argv = parser, name, argv

  def __getattr__(self, attr):
    return getattr(self._parser, attr)

  def parse(self, argument):
    config = self._parser.parse(argument)
    if self._argv is not None:
      argv = list(self._argv)
    else:
      from absl import flags
      argv = flags.FLAGS.read_flags_from_files(sys.argv, force_gnu=False)
    if isinstance(config, ml_collections.ConfigDict) and "data" in config and (
        "files" in config.data):
      switch_formats(config, command_line_overrides(self._name, argv))
    return config


def switch_on_parse(flag, argv: Sequence[str] | None = None) -> None:
  """Makes a config-file flag (``config_flags.DEFINE_config_file``'s, e.g. ``FLAGS["config"]``)
  switch formats as soon as the file is read, before the overrides' types are looked up: so that
  ``--config.data.files.x.format=hf --config.data.files.x.dataset=...`` may give the new format's
  fields. ``argv``: the command line (default ``sys.argv`` when the flag is parsed)."""
  flag.parser = _SwitchingParser(flag.parser, flag.name, argv)

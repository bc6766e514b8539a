"""Mixers by name: the ``curriculum.mixer`` config section, made from a factory's typed arguments.

A mixer factory is a function with keyword arguments that have types and defaults, returning a
:class:`~andrea_jax.curriculum.mixer.Mixer` (as ``optax.adamw(b1=...)`` returns a transformation).
The config section of a mixer is its factory's name plus one field per argument, nothing else::

  curriculum.mixer.name = "andrea"            # a built-in name, or "package.module:factory"
  curriculum.mixer.eta = 0.3                  # ... andrea_walk's own arguments
  curriculum.mixer.random_share = 0.25

:func:`mixer_config` makes the section from the signature (``bool``, ``int``, ``float`` and
``str`` arguments become fields of that type; a
:data:`~andrea_jax.curriculum.mixer.SourceWeights` argument a section keyed by source, 1.0 each),
and :func:`build` calls the factory with the section's values, each checked against its type and
every error naming ``curriculum.mixer.<field>``. A mixer of one's own is named
``"package.module:factory"`` and goes through exactly the same two functions as the built-ins:
the same config, the same errors, the same logs.

Switching a run to another mixer changes the section's fields, so it is done where the config is
made: ``mixer_config("static", sources)`` in Python, or the config file's argument on the command
line (``--config=experiments/tiny.py:mixer=static``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import typing
from collections.abc import Callable, Sequence

import ml_collections

from andrea_jax.curriculum import elastic, exp3
from andrea_jax.curriculum import mixer as mixer_lib
from andrea_jax.sources import SOURCES, source_key

BUILTIN: dict[str, Callable[..., mixer_lib.Mixer]] = {
    "andrea": mixer_lib.andrea_walk,
    "bandit_only": mixer_lib.bandit_only,
    "random_only": mixer_lib.random_only,
    "static": mixer_lib.static,
    "exp3": exp3.mixer,
    "elastic": elastic.mixer,
}
"""The built-in mixers' names and factories."""

_SCALARS = (bool, int, float, str)


def factory(name: str) -> Callable[..., mixer_lib.Mixer] | mixer_lib.Mixer:
  """The factory (or mixer object) that ``name`` names: a built-in, or ``"package.module:attr"``
  imported. A ``ValueError`` names ``curriculum.mixer.name`` when it names nothing usable."""
  where = f"curriculum.mixer.name = {name!r}"
  if not isinstance(name, str) or not name:
    raise ValueError(f"{where}: name a built-in mixer ({', '.join(BUILTIN)}) or "
                     "'package.module:factory'")
  if name in BUILTIN:
    return BUILTIN[name]
  module_name, _, attr = name.partition(":")
  if not module_name or not attr:
    raise ValueError(f"{where}: not a built-in mixer ({', '.join(BUILTIN)}); a mixer of your own is "
                     "named 'package.module:factory'")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"{where}: cannot import {module_name!r} ({e})") from None
  found = getattr(module, attr, None)
  if found is None:
    raise ValueError(f"{where}: module {module_name!r} has no {attr!r}")
  if not (mixer_lib.is_mixer(found) or callable(found)):
    raise ValueError(f"{where}: {attr!r} is neither a Mixer nor callable")
  return found


def _kind(hint, default, where: str):
  """The field kind of one factory argument: a scalar type, or ``"sources"``."""
  if hint is mixer_lib.SourceWeights or typing.get_args(hint) and (
      mixer_lib.SourceWeights in typing.get_args(hint)):
    return "sources"
  if hint in _SCALARS:
    return hint
  if hint is inspect.Parameter.empty and type(default) in _SCALARS:
    return type(default)
  raise TypeError(f"{where}: a mixer factory's arguments must be bool, int, float, str or "
                  f"SourceWeights with a default, got {hint!r}")


@functools.lru_cache(maxsize=None)
def arguments(make: Callable) -> tuple[tuple[str, object, object], ...]:
  """``(name, kind, default)`` of each argument of the factory ``make`` (cached per factory)."""
  where = f"mixer factory {getattr(make, '__qualname__', make)!r}"
  try:
    hints = typing.get_type_hints(make)
  except Exception:   # unresolvable annotations: fall back to the defaults' types
    hints = {}
  out = []
  for p in inspect.signature(make).parameters.values():
    if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
      raise TypeError(f"{where} takes *{p.name}: its arguments must be named, with defaults")
    if p.default is p.empty:
      raise TypeError(f"{where}: argument {p.name!r} has no default (a config needs one)")
    out.append((p.name, _kind(hints.get(p.name, p.empty), p.default, f"{where}, {p.name!r}"),
                p.default))
  return tuple(out)


def mixer_config(name: str = "andrea", sources: Sequence[str] = SOURCES,
                 **overrides) -> ml_collections.ConfigDict:
  """The ``curriculum.mixer`` section of mixer ``name``: ``name`` and the factory's arguments at
  their defaults (``overrides`` replace some), a per-source argument as a section keyed by source.

  Example:
    >>> m = mixer_config("andrea", eta=0.5)
    >>> m.name, m.eta, m.random_share
    ('andrea', 0.5, 0.25)
  """
  made = factory(name)
  section = ml_collections.ConfigDict()
  section.name = name    # the mixer: a built-in name or "package.module:factory"
  if mixer_lib.is_mixer(made):
    if overrides:
      raise ValueError(f"curriculum.mixer.name = {name!r} is a Mixer object: it takes no "
                       f"arguments, got {sorted(overrides)}")
    return section
  args = arguments(made)
  unknown = sorted(set(overrides) - {n for n, _, _ in args})
  if unknown:
    raise ValueError(f"mixer {name!r} takes no argument {unknown}; its arguments are "
                     f"{[n for n, _, _ in args]}")
  for arg, kind, default in args:
    value = overrides.get(arg, default)
    if kind == "sources":
      given = [1.0] * len(sources) if value is None else list(value)
      if len(given) != len(sources):
        raise ValueError(f"curriculum.mixer.{arg} has {len(given)} weights for the "
                         f"{len(sources)} sources {list(sources)}")
      section[arg] = ml_collections.ConfigDict(
          {source_key(s): float(w) for s, w in zip(sources, given)})
    else:
      section[arg] = value
  return section


def _value(where: str, kind, value):
  """One scalar field checked against its kind (an int is a float; a bool is neither)."""
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if kind in (int, float) and isinstance(value, bool) or not isinstance(value, kind):
    raise TypeError(f"{where} must be {'an' if kind is int else 'a'} {kind.__name__}, got "
                    f"{value!r}")
  if kind is float and not math.isfinite(value):
    raise ValueError(f"{where} must be finite, got {value}")
  return value


def source_weights(where: str, given, sources: Sequence[str]) -> tuple[float, ...]:
  """Relative weights keyed by source (its config key or its name; a missing source keeps 1.0) as
  a tuple in source order; errors name ``where``."""
  if not isinstance(given, (ml_collections.ConfigDict, dict)):
    raise TypeError(f"{where} must map source names to relative weights, got {given!r}")
  keys = {source_key(s): s for s in sources}
  values = dict(given)
  unknown = sorted(k for k in values if k not in keys and k not in sources)
  if unknown:
    raise ValueError(f"unknown source {unknown[0]!r} in {where}; known sources are: "
                     f"{', '.join(sources)}")
  out = []
  for s in sources:
    v = values.get(source_key(s), values.get(s, 1.0))
    v = _value(f"{where}.{source_key(s)}", float, v)
    if v < 0:
      raise ValueError(f"{where}.{source_key(s)} = {v} is negative: weights are relative "
                       "shares, >= 0")
    out.append(v)
  if not sum(out) > 0:
    raise ValueError(f"{where}: every weight is 0; at least one source needs a positive weight")
  return tuple(out)


def build(section: ml_collections.ConfigDict, sources: Sequence[str] = SOURCES
          ) -> tuple[mixer_lib.Mixer, tuple]:
  """The mixer a ``curriculum.mixer`` section describes, and its identity: ``(name, arguments)``,
  hashable, equal for equal sections (what a jitted step's cache compares).

  Every field is checked against the factory's signature before the factory runs; errors (the
  factory's too) name ``curriculum.mixer.<field>`` and the value.
  """
  if not isinstance(section, (ml_collections.ConfigDict, dict)) or "name" not in section:
    raise ValueError(f"curriculum.mixer must be a section with a name (make it with "
                     f"curriculum.mixer_config(name, sources)), got {section!r}")
  name = section["name"]
  made = factory(name)
  given = {k: v for k, v in dict(section).items() if k != "name"}
  if mixer_lib.is_mixer(made):
    if given:
      raise ValueError(f"curriculum.mixer has fields {sorted(given)}, but {name!r} is a Mixer "
                       "object that takes no arguments")
    return _checked(made, name), (name, ())
  args = arguments(made)
  known = {n for n, _, _ in args}
  unknown = sorted(set(given) - known)
  if unknown:
    raise ValueError(
        f"curriculum.mixer has fields {unknown} that mixer {name!r} does not take (its arguments "
        f"are {sorted(known)}): a section made for another mixer? Make it with "
        f"curriculum.mixer_config({name!r}, sources), or pass mixer={name} to the config file")
  kwargs = {}
  for arg, kind, default in args:
    where = f"curriculum.mixer.{arg}"
    if arg not in given:
      kwargs[arg] = default
    elif kind == "sources":
      kwargs[arg] = source_weights(where, given[arg], sources)
    else:
      kwargs[arg] = _value(where, kind, given[arg])
  try:
    mixer = made(**kwargs)
  except (TypeError, ValueError) as e:   # rebuilt as the base class: a subclass may take more
    base = TypeError if isinstance(e, TypeError) else ValueError
    raise base(f"curriculum.mixer.{e}" if str(e).split(" ")[0].split("[")[0] in known
               else f"curriculum.mixer ({name!r}): {e}") from None
  if not mixer_lib.is_mixer(mixer):
    raise ValueError(f"curriculum.mixer.name = {name!r}: the factory returned "
                     f"{type(mixer).__name__}, not a Mixer (init, observe, decide, metrics)")
  return _checked(mixer, name), (name, tuple(sorted(kwargs.items())))


def _checked(mixer, name: str) -> mixer_lib.Mixer:
  try:
    return mixer_lib.as_mixer(mixer)
  except ValueError as e:
    raise ValueError(f"curriculum.mixer.name = {name!r}: {e}") from None


def apply_name_override(config: ml_collections.ConfigDict, overrides: dict) -> None:
  """Makes ``--config.curriculum.mixer.name=<mixer>`` switch a run's mixer on the command line.

  ``overrides`` are the command line's (``config_flags.get_override_values``). When they name a
  mixer whose arguments are not the section's fields, ``curriculum.mixer`` of ``config`` is made
  anew for it (in place): its defaults, with the values of the fields both mixers take kept. A
  field given on the command line that the new mixer does not take is an error naming it. (A
  mixer's own new fields, e.g. a static mixture, are set in a config file or with
  :func:`andrea_jax.curriculum.set_mixer`.)
  """
  name = overrides.get("curriculum.mixer.name")
  if name is None:
    return
  made = factory(name)
  takes = set() if mixer_lib.is_mixer(made) else {n for n, _, _ in arguments(made)}
  have = set(config.curriculum.mixer.keys()) - {"name"}
  if have == takes:
    return
  given = {k.removeprefix("curriculum.mixer."): v for k, v in overrides.items()
           if k.startswith("curriculum.mixer.") and k != "curriculum.mixer.name"}
  stray = sorted(k for k in given if k.split(".")[0] not in takes)
  if stray:
    raise ValueError(f"--config.curriculum.mixer.{stray[0]} is not an argument of mixer {name!r} "
                     f"(its arguments: {sorted(takes)})")
  keep = {k: config.curriculum.mixer[k] for k in have & takes
          if not isinstance(config.curriculum.mixer[k], ml_collections.ConfigDict)}
  with config.unlocked():
    config.curriculum.mixer = mixer_config(name, config.sources, **keep)


def for_sources(section: ml_collections.ConfigDict, sources: Sequence[str]
                ) -> ml_collections.ConfigDict:
  """``section`` (a ``curriculum.mixer``) over other ``sources``: its scalar fields kept, each
  per-source field keeping the weights of the sources that stay (1.0 for the new ones)."""
  made = factory(section.name)
  if mixer_lib.is_mixer(made):
    return mixer_config(section.name, sources)
  kept = {}
  for arg, kind, _ in arguments(made):
    if arg not in section:
      continue
    if kind == "sources":
      old = section[arg]
      kept[arg] = [float(old[source_key(s)]) if source_key(s) in old else 1.0 for s in sources]
    else:
      kept[arg] = section[arg]
  return mixer_config(section.name, sources, **kept)

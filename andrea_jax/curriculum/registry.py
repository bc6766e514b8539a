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

from collections.abc import Callable, Sequence

import ml_collections

from andrea_jax import plugins
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

arguments = plugins.arguments
source_weights = plugins.source_weights


def factory(name: str) -> Callable[..., mixer_lib.Mixer] | mixer_lib.Mixer:
  """The factory (or mixer object) that ``name`` names: a built-in, or ``"package.module:attr"``
  imported. A ``ValueError`` names ``curriculum.mixer.name`` when it names nothing usable."""
  where = f"curriculum.mixer.name = {name!r}"
  found = plugins.resolve(where, name, BUILTIN, "mixer")
  if not (mixer_lib.is_mixer(found) or callable(found)):
    raise ValueError(f"{where}: {name.partition(':')[2]!r} is neither a Mixer nor callable")
  return found


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
  if mixer_lib.is_mixer(made):
    if overrides:
      raise ValueError(f"curriculum.mixer.name = {name!r} is a Mixer object: it takes no "
                       f"arguments, got {sorted(overrides)}")
    section = ml_collections.ConfigDict()
    section.name = name    # the mixer: a built-in name or "package.module:factory"
    return section
  try:
    return plugins.section(name, made, sources, **overrides)
  except ValueError as e:
    raise ValueError(f"mixer {e}" if str(e).startswith("'") else f"curriculum.mixer.{e}") from None


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
  kwargs = plugins.keyword_arguments(
      "curriculum.mixer", name, made, given, sources, what="mixer",
      hint=f": a section made for another mixer? Make it with curriculum.mixer_config({name!r}, "
           f"sources), or pass mixer={name} to the config file")
  mixer = plugins.call("curriculum.mixer", name, made, kwargs)
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

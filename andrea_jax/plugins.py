"""Plug-ins by name: a config section made from a factory's typed arguments, and the factory called.

Every extension point of the package (the curriculum's mixers, the bandit's rewards, the in-step
probes, the data formats) is opened the same way. A *factory* is a function whose keyword arguments
have types and defaults, returning the plug-in (as ``optax.adamw(b1=...)`` returns a
transformation); a config names it by a built-in name or ``"package.module:factory"`` (a user's
own, imported), and the section holds the name plus one field per argument::

  probes.target_gain.name = "target_gain"          # a built-in, or "package.module:factory"
  probes.target_gain.every = 4                     # ... the factory's own arguments

:func:`arguments` reads the signature (``bool``, ``int``, ``float`` and ``str`` arguments become
fields of that type; a :data:`SourceWeights` argument a section keyed by source, 1.0 each),
:func:`section` makes the section, and :func:`call` calls the factory with the section's values,
each checked against its type, every error naming ``<where>.<field>`` and the value. A factory may
take leading positional arguments that are not config (``skip``): what the run lends the plug-in
(a probe's :class:`~andrea_jax.probes.ProbeEnv`, say).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NewType

import ml_collections

from andrea_jax import checks
from andrea_jax.sources import source_key

SourceWeights = NewType("SourceWeights", tuple)
"""A factory argument holding one relative weight per source, in the run's source order (the
config spells it as a section keyed by source)."""

_SCALARS = (bool, int, float, str)


def resolve(where: str, name, builtins: Mapping[str, Callable], what: str) -> Any:
  """What ``name`` names: a built-in of ``builtins``, or ``"package.module:attr"`` imported. A
  ``ValueError`` names ``where`` (e.g. ``curriculum.mixer.name = 'x'``) when it names nothing;
  ``what`` says what it should be (``"mixer"``)."""
  known = f"a built-in {what} ({', '.join(builtins)}) or " if builtins else ""
  if not isinstance(name, str) or not name:
    raise ValueError(f"{where}: name {known}'package.module:factory'")
  if name in builtins:
    return builtins[name]
  module_name, _, attr = name.partition(":")
  if not module_name or not attr:
    head = f"not a built-in {what} ({', '.join(builtins)})" if builtins else "not a name"
    raise ValueError(f"{where}: {head}; a {what} of your own is named 'package.module:factory'")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"{where}: cannot import {module_name!r} ({e})") from None
  except Exception as e:   # the module itself fails: a SyntaxError, a NameError at import
    raise ValueError(f"{where}: importing {module_name!r} failed ({type(e).__name__}: {e})"
                     ) from e
  found = getattr(module, attr, None)
  if found is None:
    raise ValueError(f"{where}: module {module_name!r} has no {attr!r}")
  return found


def _kind(hint, default, where: str):
  """The field kind of one factory argument: a scalar type, or ``"sources"``."""
  if hint is SourceWeights or typing.get_args(hint) and SourceWeights in typing.get_args(hint):
    return "sources"
  if hint in _SCALARS:
    return hint
  if hint is inspect.Parameter.empty and type(default) in _SCALARS:
    return type(default)
  raise TypeError(f"{where}: a factory's arguments must be bool, int, float, str or "
                  f"SourceWeights with a default, got {hint!r}")


@functools.lru_cache(maxsize=None)
def arguments(make: Callable, skip: int = 0) -> tuple[tuple[str, object, object], ...]:
  """``(name, kind, default)`` of each config argument of ``make`` (its first ``skip``
  positional parameters left out); cached per factory."""
  where = f"factory {getattr(make, '__qualname__', make)!r}"
  try:
    hints = typing.get_type_hints(make)
  except Exception:   # unresolvable annotations: fall back to the defaults' types
    hints = {}
  out = []
  for p in list(inspect.signature(make).parameters.values())[skip:]:
    if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
      raise TypeError(f"{where} takes *{p.name}: its arguments must be named, with defaults")
    if p.default is p.empty:
      raise TypeError(f"{where}: argument {p.name!r} has no default (a config needs one)")
    out.append((p.name, _kind(hints.get(p.name, p.empty), p.default, f"{where}, {p.name!r}"),
                p.default))
  return tuple(out)


def section(name: str, make: Callable, sources: Sequence[str], *, skip: int = 0,
            **overrides) -> ml_collections.ConfigDict:
  """The section of plug-in ``name`` (made by ``make``): ``name`` and the factory's arguments at
  their defaults (``overrides`` replace some), a per-source argument as a section keyed by source.

  Example:
    >>> section("andrea", andrea_walk, SOURCES, eta=0.5).eta
    0.5
  """
  args = arguments(make, skip)
  unknown = sorted(set(overrides) - {n for n, _, _ in args})
  if unknown:
    raise ValueError(f"{name!r} takes no argument {unknown}; its arguments are "
                     f"{[n for n, _, _ in args]}")
  out = ml_collections.ConfigDict()
  out.name = name
  for arg, kind, default in args:
    value = overrides.get(arg, default)
    if kind == "sources":
      given = [1.0] * len(sources) if value is None else list(value)
      if len(given) != len(sources):
        raise ValueError(f"{arg} has {len(given)} weights for the {len(sources)} sources "
                         f"{list(sources)}")
      out[arg] = ml_collections.ConfigDict({source_key(s): float(w)
                                            for s, w in zip(sources, given)})
    else:
      out[arg] = value
  return out


def value(where: str, kind, given):
  """One scalar field checked against its kind (an int is a float; a bool is neither)."""
  if kind is float:
    return checks.number(where, given)
  if kind is int:
    return checks.integer(where, given, int32=False)
  if kind is bool:
    return checks.flag(where, given)
  return checks.text(where, given)


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
    v = checks.number(f"{where}.{source_key(s)}", values.get(source_key(s), values.get(s, 1.0)))
    if v < 0:
      raise ValueError(f"{where}.{source_key(s)} = {v} is negative: weights are relative "
                       "shares, >= 0")
    out.append(v)
  if not sum(out) > 0:
    raise ValueError(f"{where}: every weight is 0; at least one source needs a positive weight")
  return tuple(out)


def keyword_arguments(where: str, name: str, make: Callable, given: Mapping,
                      sources: Sequence[str], *, skip: int = 0, hint: str = "",
                      what: str = "plug-in") -> dict:
  """The factory's keyword arguments from a section's fields ``given`` (less ``name``), each
  checked against its kind; unknown fields are an error naming them (``hint``: how to make a
  section for this plug-in)."""
  args = arguments(make, skip)
  known = {n for n, _, _ in args}
  unknown = sorted(set(given) - known)
  if unknown:
    raise ValueError(f"{where} has fields {unknown} that {what} {name!r} does not take (its arguments "
                     f"are {sorted(known)}){hint}")
  kwargs = {}
  for arg, kind, default in args:
    if arg not in given:
      kwargs[arg] = default
    elif kind == "sources":
      kwargs[arg] = source_weights(f"{where}.{arg}", given[arg], sources)
    else:
      kwargs[arg] = value(f"{where}.{arg}", kind, given[arg])
  return kwargs


def call(where: str, name: str, make: Callable, kwargs: dict, *leading):
  """``make(*leading, **kwargs)``; a ``TypeError`` or ``ValueError`` it raises comes back as its
  base class with ``where`` in front (``where.field must be ...`` when the message starts with an
  argument's name)."""
  try:
    return make(*leading, **kwargs)
  except (TypeError, ValueError) as e:   # rebuilt as the base class: a subclass may take more
    base = TypeError if isinstance(e, TypeError) else ValueError
    first = str(e).split(" ")[0].split("[")[0]
    if str(e).startswith(f"{where}.") or str(e).startswith(f"{where} "):
      raise base(str(e)) from None   # the factory named the field already
    raise base(f"{where}.{e}" if first in kwargs else f"{where} ({name!r}): {e}") from None

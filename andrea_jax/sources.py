"""Source names: the rule every run's names follow, and ANDREA's sixteen as a preset.

A run declares its sources in its config (``config.sources``, an ordered list of names); every
weight vector of the run is in that order. :func:`check_sources` is the rule a list must follow.

ANDREA's sixteen sources (:data:`SOURCES`) are the preset the ANDREA experiments and the synthetic
built-in corpus use. The source document names ten of them (:data:`SEED_SOURCES`); it does not name
the other six, which get neutral names here, ``extra-01`` to ``extra-06`` (:data:`EXTRA_SOURCES`),
and are not part of the document.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

SEED_SOURCES: tuple[str, ...] = (
    "hermes3-general",
    "hermes3-creative",
    "hermes3-roleplay",
    "chat",
    "smoltalk",
    "oasst",
    "gutenberg",
    "dictionary",
    "repo-docs",
    "repo-docstrings",
)
"""The ten sources named in the source document, in the order it lists them."""

EXTRA_SOURCES: tuple[str, ...] = tuple(f"extra-{i:02d}" for i in range(1, 7))
"""Six neutral names for the sources the document counts but does not name."""

SOURCES: tuple[str, ...] = SEED_SOURCES + EXTRA_SOURCES
"""ANDREA's sixteen sources, in ANDREA's order: the preset of the ANDREA experiments."""

NUM_SOURCES: int = len(SOURCES)

WARMUP_SOURCES: tuple[str, ...] = SEED_SOURCES[:7]
"""v2's ``curriculum_warmup_sources``: the seven conversational/prose sources of the first 20K steps."""

POLISH_EXCLUDED: tuple[str, ...] = ("repo-docs", "repo-docstrings")
"""Sources the v3 polish pivot excludes (ceiling 0)."""


def source_index(name: str, sources: Sequence[str] = SOURCES) -> int:
  """Position of ``name`` in ``sources``; ``ValueError`` naming the unknown source otherwise."""
  try:
    return list(sources).index(name)
  except ValueError:
    raise ValueError(
        f"unknown source {name!r}; known sources are: {', '.join(sources)}") from None


def source_indices(names: Iterable[str], sources: Sequence[str] = SOURCES) -> list[int]:
  """Positions of several sources; rejects unknown names and duplicates."""
  names = list(names)
  seen = set()
  for n in names:
    if n in seen:
      raise ValueError(f"source {n!r} is listed twice")
    seen.add(n)
  return [source_index(n, sources) for n in names]


# What the command line can spell: a config key (the name, '-' written '_') must be one word of a
# dotted flag path (--config.data.files.<key>.paths).
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def source_key(name: str) -> str:
  """The config key of a source: ``"hermes3-general" -> "hermes3_general"`` (a flag path cannot
  hold ``-``)."""
  return name.replace("-", "_")


def check_sources(sources: Sequence[str], field: str = "sources") -> tuple[str, ...]:
  """Validate a list of source names; returns it as a tuple.

  Each name is a non-empty string of letters, digits, ``-`` and ``_`` starting with a letter (what
  a command-line override can spell, ``-`` read as ``_``); no name is listed twice, and no two
  names collide once ``-`` is written ``_``. ``field`` names the list in errors.

  Example: ``check_sources(["code", "docs"])`` is ``("code", "docs")``;
  ``check_sources(["a b"])`` raises ``ValueError: sources: 'a b' ...``.
  """
  if isinstance(sources, str):
    raise TypeError(f"{field} must be a sequence of names, got the string {sources!r}")
  out = tuple(sources)
  if not out:
    raise ValueError(f"{field} is empty: a run needs at least one source")
  for s in out:
    if not isinstance(s, str) or not s:
      raise TypeError(f"{field} contains {s!r}, which is not a non-empty string")
    if not _NAME.fullmatch(s):
      raise ValueError(f"{field}: {s!r} has characters a command-line override cannot spell "
                       "(use letters, digits, '-' and '_', starting with a letter)")
  dup = sorted({s for s in out if out.count(s) > 1})
  if dup:
    raise ValueError(f"{field} lists {dup} more than once")
  keys = {}
  for s in out:
    other = keys.setdefault(source_key(s), s)
    if other != s:
      raise ValueError(f"{field}: {other!r} and {s!r} are the same key {source_key(s)!r} once "
                       "'-' is written '_' (as the command line spells it): rename one")
  return out

"""The sixteen data sources of ANDREA, their order, and name <-> index lookups.

This module is the single place where the source names and their order live. Every weight vector in the
package is a ``[16]`` array in this order.

The source document names ten sources (:data:`SEED_SOURCES`). It does not name the other six; they get
neutral names here, ``extra-01`` to ``extra-06`` (:data:`EXTRA_SOURCES`), and are not part of the document.
"""

from __future__ import annotations

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
"""All sixteen sources; the order of every mixture weight vector."""

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


def check_sources(sources: Sequence[str], field: str = "sources") -> tuple[str, ...]:
  """Validate a list of source names (non-empty strings, unique); returns it as a tuple."""
  if isinstance(sources, str):
    raise TypeError(f"{field} must be a sequence of names, got the string {sources!r}")
  out = tuple(sources)
  if not out:
    raise ValueError(f"{field} is empty")
  for s in out:
    if not isinstance(s, str) or not s:
      raise TypeError(f"{field} contains {s!r}, which is not a non-empty string")
  dup = sorted({s for s in out if out.count(s) > 1})
  if dup:
    raise ValueError(f"{field} lists {dup} more than once")
  return out

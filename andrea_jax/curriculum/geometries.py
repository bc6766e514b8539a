"""Geometries: regions of the mixture simplex in force from a start step on, as config entries.

A *geometry* is a region of the mixture simplex in force from a start step on: floors, ceilings
and excluded sources (SPEC §3-5). The ``curriculum.geometries`` section holds them as ConfigDicts
keyed by geometry name, so that every field can be overridden on the command line. Per-source
floors and ceilings list **all** sources under their *keys*, the source name with ``-`` replaced by
``_`` (a locked config accepts overrides of existing fields only, and ``-`` does not survive flag
parsing)::

  --config.curriculum.geometries.v3_polish.floors.hermes3_general=0.6
  --config.curriculum.geometries.v3_polish.ceilings.dictionary=0.2
  --config.curriculum.geometries.v3_polish.exclude=repo-docs,repo-docstrings,extra-01
  --config.curriculum.geometries.v2_firehose.start_step=30000

``only`` and ``exclude`` are comma-separated source names ("" = none): ``only`` pins every other
source at 0 (v2's curriculum warmup sources), ``exclude`` sets ceilings to 0. The builders here
make entries (:func:`geometry`, ANDREA's three regimes over any sources, the whole simplex);
:func:`region` validates one entry into a :class:`~andrea_jax.simplex.Region`, which
:mod:`andrea_jax.curriculum.spec` stacks into the curriculum's tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import ml_collections
import numpy as np

from andrea_jax import checks
from andrea_jax import plugins
from andrea_jax.simplex import Region
from andrea_jax.sources import POLISH_EXCLUDED, SOURCES, WARMUP_SOURCES, source_key

# The source document's three regimes (SPEC §5): start steps of the full 200K-step run.
ANDREA_STEPS = 200_000
FIREHOSE_START = 20_000
POLISH_START = 112_619


def _keys(sources: Sequence[str]) -> dict[str, str]:
  keys = {source_key(s): s for s in sources}
  if len(keys) != len(sources):
    raise ValueError(f"source names {list(sources)} collide once '-' is replaced by '_'")
  return keys


def _names(value: str | Sequence[str]) -> str:
  return value if isinstance(value, str) else ",".join(value)


def geometry(name: str, start_step: int, *, floors: Mapping[str, float] | None = None,
             ceilings: Mapping[str, float] | None = None, only: Sequence[str] | None = None,
             exclude: Sequence[str] = (), sources: Sequence[str] = SOURCES,
             mixture: Mapping[str, float] | None = None) -> ml_collections.ConfigDict:
  """One geometry entry (to store under ``geometries.<name>``), validated now.

  Args:
    name: the geometry's name, used in error messages (the entry is stored under this key).
    start_step: first training step of the geometry.
    floors, ceilings: ``{source name: weight}``; the others get floor 0 and ceiling 1.
    only: if given, the only sources that may have weight; exclude: sources pinned at 0.
    sources: the source order.
    mixture: ``{source name: relative weight}`` (a source left out keeps 1) held while this
      geometry is in force by a static mixer of its own (:func:`andrea_jax.curriculum.static`),
      whatever the run's mixer: that mixer still observes every step and decides the phases of
      the geometries without one. Stored listing all sources, so that
      each can be overridden on the command line. Geometries in turn, each with its mixture,
      make a mixture schedule (e.g. a proxy-fitted mixture, then uniform for the last part of
      the run, or then the elastic mixer).

  Example:
    >>> g = geometry("v3_polish", 112_619, floors={"hermes3-general": 0.7},
    ...              ceilings={"dictionary": 0.25}, exclude=("repo-docs", "repo-docstrings"))
    >>> g.floors.hermes3_general, g.exclude
    (0.7, 'repo-docs,repo-docstrings')
  """
  keys = _keys(sources)
  g = ml_collections.ConfigDict()
  g.start_step = start_step  # first step (optimizer steps) at which this region is in force
  # minimum weight of each source, a fraction of the batch's tokens in [0, 1]
  g.floors = ml_collections.ConfigDict({k: 0.0 for k in keys})
  # maximum weight of each source in [0, 1]; 0 excludes it
  g.ceilings = ml_collections.ConfigDict({k: 1.0 for k in keys})
  for field, given in (("floors", floors or {}), ("ceilings", ceilings or {})):
    for n, v in given.items():
      if source_key(n) not in keys:
        raise ValueError(f"unknown source {n!r} in {field} of geometry {name!r}; known sources "
                         f"are: {', '.join(sources)}")
      g[field][source_key(n)] = float(v)
  if only is not None and not list(only):
    raise ValueError(f"only of geometry {name!r} lists no source (None allows them all)")
  g.only = _names(only) if only is not None else ""  # comma-separated allowed sources; "" = all
  g.exclude = _names(exclude)  # comma-separated excluded sources (ceiling 0); "" = none
  if mixture is not None:
    where = f"curriculum.geometries.{name}.mixture"
    for n in mixture:
      if source_key(n) not in keys:
        raise ValueError(f"unknown source {n!r} in {where}; known sources are: "
                         f"{', '.join(sources)}")
    # relative weights held in this region by a static mixer of its own, whatever the run's mixer
    g.mixture = ml_collections.ConfigDict({k: 1.0 for k in keys})
    for n, v in mixture.items():
      g.mixture[source_key(n)] = v
  _, reg = region(name, g, sources)
  if mixture is not None:
    static_mixture(g.mixture, sources, where, reg)
  return g


def three_regimes(num_steps: int, *, sources: Sequence[str], warmup: Sequence[str],
                  floors: Mapping[str, float] | None = None,
                  ceilings: Mapping[str, float] | None = None, exclude: Sequence[str] = (),
                  scale: float | None = None,
                  names: tuple[str, str, str] = ("warmup", "firehose", "polish")
                  ) -> ml_collections.ConfigDict:
  """ANDREA's curriculum over any sources: three geometries at ANDREA's fractions of the run.

  * ``names[0]`` (warmup) from step 0: only the ``warmup`` sources (a sub-simplex, v2's
    ``curriculum_warmup_sources``);
  * ``names[1]`` (firehose) from ``20_000 * scale``: the full simplex;
  * ``names[2]`` (polish) from ``112_619 * scale``: ``floors``, ``ceilings`` and the ``exclude``
    sources at 0 (v3's pivot), no warmup restriction.

  ``scale`` is ``num_steps / 200_000`` by default: ANDREA's 200K-step run, 10% and 56.3% of the
  way through. Both boundaries are rounded to whole steps and must fall before ``num_steps``.

  Example (a floor on the target source, the noisy one excluded):
    >>> g = three_regimes(1000, sources=("code", "docs", "noise"), warmup=("docs",),
    ...                   floors={"docs": 0.5}, exclude=("noise",))
    >>> [g[n].start_step for n in ("warmup", "firehose", "polish")]
    [0, 100, 563]
  """
  scale = num_steps / ANDREA_STEPS if scale is None else scale
  if not scale > 0 or not math.isfinite(scale):
    raise ValueError(f"scale must be a positive finite number, got {scale!r}")
  firehose, polish = round(FIREHOSE_START * scale), round(POLISH_START * scale)
  if not 0 < firehose < polish < num_steps:
    raise ValueError(f"with scale={scale} the regimes start at 0, {firehose} and {polish}, which "
                     f"do not fit increasing into {num_steps} steps")
  g = ml_collections.ConfigDict()
  g[names[0]] = geometry(names[0], 0, only=warmup, sources=sources)
  g[names[1]] = geometry(names[1], firehose, sources=sources)
  g[names[2]] = geometry(names[2], polish, floors=floors, ceilings=ceilings, exclude=exclude,
                         sources=sources)
  return g


def andrea_geometries(total_steps: int = ANDREA_STEPS, scale: float = 1.0
                      ) -> ml_collections.ConfigDict:
  """ANDREA's three regimes (SPEC §5) over ANDREA's sixteen sources, keyed ``v2_warmup``,
  ``v2_firehose``, ``v3_polish`` (:func:`three_regimes` with ANDREA's preset):

  * ``v2_warmup`` from step 0: only the seven curriculum warmup sources;
  * ``v2_firehose`` from ``20_000 * scale``: the full simplex;
  * ``v3_polish`` from ``112_619 * scale``: ``repo-docs`` and ``repo-docstrings`` excluded,
    ``hermes3-general >= 0.7``, ``dictionary <= 0.25``, and no warmup restriction
    (``curriculum_warmup_steps = 0``: ``only`` is empty).

  ``scale`` shrinks the boundaries for a shorter run (rounded to whole steps); both must fall
  before ``total_steps``.

  Example: ``andrea_geometries(2000, 0.01)`` starts the three regimes at steps 0, 200 and 1126.
  """
  return three_regimes(total_steps, sources=SOURCES, warmup=WARMUP_SOURCES,
                       floors={"hermes3-general": 0.7}, ceilings={"dictionary": 0.25},
                       exclude=POLISH_EXCLUDED, scale=scale,
                       names=("v2_warmup", "v2_firehose", "v3_polish"))


def full_simplex(sources: Sequence[str], name: str = "all") -> ml_collections.ConfigDict:
  """``curriculum.geometries`` holding one geometry, the whole simplex over ``sources``, from
  step 0."""
  g = ml_collections.ConfigDict()
  g[name] = geometry(name, 0, sources=sources)
  return g


def single_geometry(geometries: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """The geometries section reduced to ``name``, in force from step 0 for the whole run."""
  if name not in geometries:
    raise ValueError(f"no geometry {name!r}; have {sorted(geometries.keys())}")
  g = ml_collections.ConfigDict()
  g[name] = ml_collections.ConfigDict(geometries[name].to_dict())
  g[name].start_step = 0
  return g


def _number(field: str, value, *, integer: bool = False):
  # Steps are int32 in the compiled step.
  return checks.integer(field, value) if integer else checks.number(field, value)


def _split_names(field: str, value, sources: Sequence[str]) -> list[str]:
  if not isinstance(value, str):
    raise TypeError(f"{field} must be a comma-separated string of source names, got {value!r}")
  names = [n.strip() for n in value.split(",") if n.strip()]
  for n in names:
    if n not in sources:
      raise ValueError(f"unknown source {n!r} in {field}; known sources are: {', '.join(sources)}")
  return names


def region(name: str, g, sources: Sequence[str], untrained: Sequence[str] = ()
           ) -> tuple[int, Region]:
  """Validates one geometry entry; returns (start step, region). ``untrained`` (``eval.untrained``:
  sources the run evaluates and never trains on) get a ceiling of 0, and a floor on one of them
  is an error naming it."""
  where = f"curriculum.geometries.{name}"
  if not isinstance(g, (ml_collections.ConfigDict, Mapping)):
    raise TypeError(f"{where} must be a ConfigDict, got {g!r}")
  unknown_fields = (set(g.keys())
                    - {"start_step", "floors", "ceilings", "only", "exclude", "mixture"})
  if unknown_fields:
    raise ValueError(f"{where} has unknown fields {sorted(unknown_fields)}")
  if "start_step" not in g or g["start_step"] is None:
    raise ValueError(f"{where}.start_step is missing: every geometry needs a start step")
  start = _number(f"{where}.start_step", g["start_step"], integer=True)
  if start < 0:
    raise ValueError(f"{where}.start_step must be >= 0, got {start}")
  keys = _keys(sources)
  bounds = {}
  for field, default in (("floors", 0.0), ("ceilings", 1.0)):
    given = g.get(field)
    given = {} if given is None else given
    if not isinstance(given, (ml_collections.ConfigDict, Mapping)):
      raise TypeError(f"{where}.{field} must map source names to weights, got {given!r}")
    bounds[field] = {}
    spelt = {}   # source name -> (spelling, value): a source given twice must agree
    for k, v in dict(given).items():
      if k not in keys and k not in sources:
        raise ValueError(f"unknown source {k!r} in {where}.{field}; known sources are: "
                         f"{', '.join(sources)}")
      v = _number(f"{where}.{field}.{k}", v)
      if not 0 <= v <= 1:
        raise ValueError(f"{where}.{field}.{k} = {v} is outside [0, 1]")
      source = keys.get(k, k)
      if source in spelt and spelt[source][1] != v:
        (k1, v1), (k2, v2) = sorted([spelt[source], (k, v)])
        raise ValueError(f"{where}.{field} gives {source!r} twice: {k1} = {v1} and {k2} = {v2}; "
                         f"keep one (the command line sets {source_key(source)})")
      spelt[source] = (k, v)
      if v != default:
        bounds[field][source] = float(v)
  for s, lo in bounds["floors"].items():
    if s in untrained:
      raise ValueError(f"{where}.floors.{source_key(s)} = {lo} on {s!r}, which eval.untrained "
                       "lists: the run never trains on it (remove the floor or the source from "
                       "eval.untrained)")
    hi = bounds["ceilings"].get(s, 1.0)
    if hi < lo:
      raise ValueError(f"{where}: ceiling {hi} of {s!r} is under its floor {lo}")
  only = g.get("only", "")
  only = _split_names(f"{where}.only", only, sources) if only != "" else None
  exclude = _split_names(f"{where}.exclude", g.get("exclude", ""), sources)
  exclude += [s for s in untrained if s not in exclude]
  for s in untrained:   # its ceiling, whatever the geometry says, is 0
    bounds["ceilings"].pop(s, None)
  try:
    region = Region.from_bounds(bounds["floors"], bounds["ceilings"], sources=sources,
                                exclude=exclude, only=only, label=name)
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  return start, region


def static_mixture(given, sources: Sequence[str], where: str,
                    region: Region | None = None) -> np.ndarray:
  """A held mixture (source -> relative weight, missing = 1) normalised, ``[S]``; ``where`` names
  the field in errors.

  A name that is not one of ``sources`` is an error. With ``region`` (the geometry the mixture is
  held in), a mixture that gives no weight to any source the region allows is an error, and so is
  a weight other than the default 1 on a source a geometry's own mixture is held in but the
  region excludes (it could never be drawn).
  """
  w_S = np.asarray(plugins.source_weights(where, {} if given is None else given, sources))
  if region is not None:
    allowed_S = np.asarray(region.upper) > 0
    label = region.label
    if where.startswith("curriculum.geometries."):
      odd = [s for s, w, ok in zip(sources, w_S, allowed_S) if not ok and w not in (0.0, 1.0)]
      if odd:
        raise ValueError(f"{where} weighs {', '.join(repr(s) for s in odd)}, which geometry "
                         f"{label!r} excludes (ceiling 0): that weight could never be drawn")
    if not np.any(w_S * allowed_S > 0):
      raise ValueError(f"{where} gives no weight to any source geometry {label!r} allows "
                       f"({', '.join(s for s, ok in zip(sources, allowed_S) if ok)})")
  return (w_S / w_S.sum()).astype(np.float32)

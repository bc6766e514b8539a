"""The ``curriculum`` config section, its geometry builders, and its validation into a static spec.

A *geometry* is a region of the mixture simplex in force from a start step on: floors, ceilings
and excluded sources (SPEC §3-5). The section holds them as a ConfigDict keyed by geometry name, so
that every field can be overridden on the command line. Per-source floors and ceilings are
ConfigDicts listing **all** sources under their *keys*, the source name with ``-`` replaced by ``_``
(a locked config accepts overrides of existing fields only, and ``-`` does not survive flag
parsing)::

  --config.curriculum.geometries.v3_polish.floors.hermes3_general=0.6
  --config.curriculum.geometries.v3_polish.ceilings.dictionary=0.2
  --config.curriculum.geometries.v3_polish.exclude=repo-docs,repo-docstrings,extra-01
  --config.curriculum.geometries.v2_firehose.start_step=30000

``only`` and ``exclude`` are comma-separated source names ("" = none): ``only`` pins every other
source at 0 (v2's curriculum warmup sources), ``exclude`` sets ceilings to 0.

:func:`spec_from_config` validates the section and turns it into a frozen :class:`CurriculumSpec`
with numpy tables (``[G, S]`` floors and ceilings, ``[G]`` start steps) for the jitted engine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax
import ml_collections
import numpy as np

from andrea_jax.curriculum import mixer as mixer_lib
from andrea_jax.curriculum import registry
from andrea_jax.simplex import Region
from andrea_jax.simplex import sampling
from andrea_jax.sources import (POLISH_EXCLUDED, SOURCES, WARMUP_SOURCES, check_sources,
                                source_key)

MIXERS = tuple(registry.BUILTIN)
"""The built-in mixers' names (:mod:`andrea_jax.curriculum.mixer`); ``"package.module:factory"``
names a mixer of one's own."""

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
  _, region = _region(name, g, sources)
  if mixture is not None:
    _static_mixture(g.mixture, sources, where, region)
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


def curriculum_config(geometries: ml_collections.ConfigDict | None = None,
                      sources: Sequence[str] = SOURCES, mixer: str = "andrea",
                      **mixer_args) -> ml_collections.ConfigDict:
  """The ``curriculum`` section over ``sources``; by default, over ANDREA's sixteen the three
  regimes scaled to a 2000-step run, over other sources the whole simplex.

  ``mixer`` names the mixer (a built-in of :data:`MIXERS` or ``"package.module:factory"``) and
  ``mixer_args`` overrides some of its arguments: the ``mixer`` subsection holds that mixer's
  fields only (:func:`andrea_jax.curriculum.registry.mixer_config`).

  Example:
    >>> c = curriculum_config(mixer="static")
    >>> c.mixer.name, sorted(c.mixer.keys())[:2]
    ('static', ['mixture', 'name'])
  """
  c = ml_collections.ConfigDict()
  # the mixer that decides each phase, and its own arguments only: "andrea" (ANDREA's random and
  # bandit phases; reward "progress" or "target_gain"), "bandit_only", "random_only", "static"
  # (one mixture held, uniform by default), "exp3" (ODM's EXP3), "elastic" (shares in proportion
  # to each source's log-time learning rate), or "package.module:factory" (a mixer of your own)
  c.mixer = registry.mixer_config(mixer, sources, **mixer_args)
  c.phase_min_steps = 7  # shortest phase, steps (> decision_lag + 1)
  c.phase_max_steps = 42  # longest phase, steps; lengths are uniform in [min, max]
  c.decision_lag = 2  # steps between a phase's decision and its start (host-side batch prefetch)
  # regions of the simplex keyed by name, each in force from its start_step (steps) on
  if geometries is None:
    geometries = (andrea_geometries(2000, 0.01) if tuple(sources) == SOURCES
                  else full_simplex(sources))
  c.geometries = geometries
  return c


def set_mixer(config: ml_collections.ConfigDict, mixer: str, **mixer_args) -> None:
  """Switches a run ``config`` (in place, locked or not) to another mixer: ``curriculum.mixer``
  made anew for ``mixer`` over ``config.sources``, every other field kept.

  Example: ``set_mixer(config, "static")``; ``set_mixer(config, "andrea", reward="target_gain")``.
  """
  with config.unlocked():
    config.curriculum.mixer = registry.mixer_config(mixer, config.sources, **mixer_args)


class Mixers:
  """The run's mixers (the run's own first, then a static mixer per held mixture), compared and
  hashed by their identities (a factory's name and arguments), never by their functions: two
  builds of one config give equal specs, and one compiled step."""

  def __init__(self, mixers: Sequence[mixer_lib.Mixer], keys: Sequence[tuple]):
    self.mixers, self.keys = tuple(mixers), tuple(keys)

  def __eq__(self, other):
    return isinstance(other, Mixers) and self.keys == other.keys

  def __hash__(self):
    return hash(self.keys)

  def __repr__(self):
    return f"Mixers({[k[0] for k in self.keys]})"


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class CurriculumSpec:
  """The validated description of a curriculum: hashable by content (a jit static argument), and a
  pytree whose leaves are its tables (a jitted function taking it as an argument compiles once for
  every spec with the same sources, geometry names, decision lag and mixers).

  Attributes:
    sources: source names, the order of every weight vector (``S`` of them).
    geometry_names: ``G`` names, by increasing start step.
    starts: ``[G]`` int32 start step of each geometry (``starts[0] == 0``).
    lowers, uppers: ``[G, S]`` float64 floors and ceilings.
    mixer_name: the run's mixer's name (``curriculum.mixer.name``).
    mixer_set: the run's mixers (:class:`Mixers`): the run's own first, then one static mixer
      per distinct ``mixture`` a geometry holds.
    geometry_mixers: ``[G]`` int32, which of them decides each geometry's phases.
    labels: the run's phase labels: ``"start"`` (the first phase), then every mixer's own, in
      order; a phase's label is logged as ``curriculum/phase_label``.
    label_maps: per mixer, ``[L_m]`` int32: the index in ``labels`` of each of its own labels.
    phase_min_steps, phase_max_steps: phase lengths are uniform in this range (cut at geometry
      boundaries, never below ``phase_min_steps``).
    decision_lag: steps between a phase's decision and its start.
  """
  sources: tuple[str, ...]
  geometry_names: tuple[str, ...]
  starts: np.ndarray
  lowers: np.ndarray
  uppers: np.ndarray
  mixer_name: str
  mixer_set: Mixers
  geometry_mixers: np.ndarray
  labels: tuple[str, ...]
  label_maps: tuple[tuple[int, ...], ...]
  phase_min_steps: int
  phase_max_steps: int
  decision_lag: int

  _LEAVES = ("starts", "lowers", "uppers", "phase_min_steps", "phase_max_steps")
  _AUX = ("sources", "geometry_names", "mixer_name", "mixer_set", "geometry_mixers_key", "labels",
          "label_maps", "decision_lag")

  @property
  def geometry_mixers_key(self) -> tuple[int, ...]:
    return tuple(int(i) for i in self.geometry_mixers)

  def tree_flatten(self):
    return (tuple(getattr(self, n) for n in self._LEAVES),
            tuple(getattr(self, n) for n in self._AUX))

  @classmethod
  def tree_unflatten(cls, aux, leaves):
    spec = object.__new__(cls)
    for n, v in zip(cls._AUX, aux):
      if n == "geometry_mixers_key":
        object.__setattr__(spec, "geometry_mixers", np.asarray(v, np.int32))
      else:
        object.__setattr__(spec, n, v)
    for n, v in zip(cls._LEAVES, leaves):
      object.__setattr__(spec, n, v)
    return spec

  def _key(self):
    return tuple(getattr(self, n) for n in self._AUX) + tuple(
        np.asarray(getattr(self, n)).tobytes() for n in self._LEAVES)

  def __eq__(self, other):
    return isinstance(other, CurriculumSpec) and self._key() == other._key()

  def __hash__(self):
    return hash(self._key())

  @property
  def num_sources(self) -> int:
    return len(self.sources)

  @property
  def mixers(self) -> tuple[mixer_lib.Mixer, ...]:
    """The run's mixers (``mixers[0]`` the run's own)."""
    return self.mixer_set.mixers

  @property
  def mixer(self) -> mixer_lib.Mixer:
    """The run's own mixer (the one ``curriculum.mixer`` names)."""
    return self.mixer_set.mixers[0]

  def region(self, g: int) -> Region:
    """Geometry ``g`` as a :class:`~andrea_jax.simplex.Region` (host-side: plots, tests)."""
    return Region(self.lowers[g], self.uppers[g], names=self.sources, label=self.geometry_names[g])


def used_sources(spec: CurriculumSpec) -> tuple[str, ...]:
  """Sources that some geometry lets have weight (ceiling > 0): the data the run needs."""
  return tuple(s for s, used in zip(spec.sources, np.any(spec.uppers > 0, axis=0)) if used)


def _number(field: str, value, *, integer: bool = False):
  ok = (int,) if integer else (int, float)
  if isinstance(value, bool) or not isinstance(value, ok):
    kind = "an int" if integer else "a number"
    raise TypeError(f"{field} must be {kind}, got {value!r} ({type(value).__name__})")
  if not integer and not math.isfinite(value):
    raise ValueError(f"{field} must be finite, got {value}")
  if integer and not -2**31 <= value < 2**31:
    raise ValueError(f"{field} must fit an int32 (steps are int32 in the compiled step), got "
                     f"{value}")
  return value


def _split_names(field: str, value, sources: Sequence[str]) -> list[str]:
  if not isinstance(value, str):
    raise TypeError(f"{field} must be a comma-separated string of source names, got {value!r}")
  names = [n.strip() for n in value.split(",") if n.strip()]
  for n in names:
    if n not in sources:
      raise ValueError(f"unknown source {n!r} in {field}; known sources are: {', '.join(sources)}")
  return names


def _region(name: str, g, sources: Sequence[str]) -> tuple[int, Region]:
  """Validates one geometry entry; returns (start step, region)."""
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
    hi = bounds["ceilings"].get(s, 1.0)
    if hi < lo:
      raise ValueError(f"{where}: ceiling {hi} of {s!r} is under its floor {lo}")
  only = g.get("only", "")
  only = _split_names(f"{where}.only", only, sources) if only != "" else None
  exclude = _split_names(f"{where}.exclude", g.get("exclude", ""), sources)
  try:
    region = Region.from_bounds(bounds["floors"], bounds["ceilings"], sources=sources,
                                exclude=exclude, only=only, label=name)
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  return start, region


def validate(config: ml_collections.ConfigDict, sources: Sequence[str] = SOURCES) -> None:
  """Raises ``ValueError``/``TypeError`` naming the field and value of the first problem found."""
  spec_from_config(config, sources=sources)


def spec_from_config(config: ml_collections.ConfigDict, sources: Sequence[str] = SOURCES,
                     mixer: mixer_lib.Mixer | None = None) -> CurriculumSpec:
  """Validates the ``curriculum`` section and builds the static :class:`CurriculumSpec`.

  ``mixer`` replaces the one ``curriculum.mixer`` names (e.g. a mixer object built in a notebook;
  the section's name then only labels it).

  Example:
    >>> spec = spec_from_config(curriculum_config())
    >>> spec.geometry_names, spec.starts.tolist(), spec.lowers.shape
    (('v2_warmup', 'v2_firehose', 'v3_polish'), [0, 200, 1126], (3, 16))
  """
  sources = check_sources(sources)
  if len(sources) > sampling.MAX_EXACT_SOURCES:
    # Every mixer compiles the random phases' sampler, whose acceptance step is exact up to that
    # many sources (it enumerates the subsets).
    raise ValueError(f"sources: {len(sources)} sources, more than the "
                     f"{sampling.MAX_EXACT_SOURCES} the curriculum's random phases sample")
  c = config
  unknown = sorted(set(c.keys()) - {"mixer", "phase_min_steps", "phase_max_steps", "decision_lag",
                                    "geometries"})
  if unknown:
    raise ValueError(f"curriculum has unknown fields {unknown} (a mixer's arguments live in "
                     "curriculum.mixer)")
  lo = _number("curriculum.phase_min_steps", c.phase_min_steps, integer=True)
  hi = _number("curriculum.phase_max_steps", c.phase_max_steps, integer=True)
  lag = _number("curriculum.decision_lag", c.decision_lag, integer=True)
  if lag < 0:
    raise ValueError(f"curriculum.decision_lag must be >= 0, got {lag}")
  if lo <= lag + 1:
    raise ValueError(f"curriculum.phase_min_steps = {lo} must exceed decision_lag + 1 = {lag + 1} "
                     "(a phase is decided decision_lag steps before it starts)")
  if hi >= 2**30:   # phase ends are int32 step counts: hi + 1 and later sums must not overflow
    raise ValueError(f"curriculum.phase_max_steps must be < 2**30, got {hi}")
  if hi < 2 * lo - 1:
    raise ValueError(f"curriculum.phase_max_steps = {hi} must be >= 2 * phase_min_steps - 1 = "
                     f"{2 * lo - 1}, so that phases can be cut at a geometry boundary")
  run_mixer, run_key = registry.build(c.mixer, sources)
  name = c.mixer.name
  if mixer is not None:
    if not mixer_lib.is_mixer(mixer):
      raise TypeError(f"mixer must be a curriculum.mixer.Mixer, got {type(mixer).__name__}")
    run_mixer, run_key = mixer_lib.as_mixer(mixer), ("<object>", id(mixer))
  geometries = c.geometries
  if not geometries or not len(geometries.keys()):
    raise ValueError("curriculum.geometries is empty: a geometry starting at step 0 is needed")
  entries = sorted(((_region(n, geometries[n], sources) + (n,)) for n in geometries.keys()),
                   key=lambda e: (e[0], e[2]))
  starts = [s for s, _, _ in entries]
  names = [n for _, _, n in entries]
  if starts[0] != 0:
    raise ValueError(f"no geometry starts at step 0 (the first, {names[0]!r}, starts at "
                     f"{starts[0]}); the start_step of each: {dict(zip(names, starts))}")
  for (s0, _, n0), (s1, _, n1) in zip(entries, entries[1:]):
    if s0 == s1:
      raise ValueError(f"geometries {n0!r} and {n1!r} both start at step {s0}")
    if s1 - s0 < lo:
      raise ValueError(f"geometry {n0!r} lasts {s1 - s0} steps (from {s0} to {n1!r} at {s1}), "
                       f"shorter than phase_min_steps = {lo}")
  mixers, keys, geometry_mixers = [run_mixer], [run_key], []
  for _, region, g in entries:
    own = geometries[g].get("mixture")
    if own is None:
      if name == "static" and mixer is None:   # the run's held mixture must reach the region
        _static_mixture(c.mixer.mixture, sources, "curriculum.mixer.mixture", region)
      geometry_mixers.append(0)
      continue
    m_S = tuple(float(w) for w in _static_mixture(own, sources,
                                                  f"curriculum.geometries.{g}.mixture", region))
    key = ("static", (("mixture", m_S),))
    if key not in keys:
      mixers.append(mixer_lib.static(mixture=m_S))
      keys.append(key)
    geometry_mixers.append(keys.index(key))
  labels = ["start"]
  for m in mixers:
    labels += [x for x in m.labels if x not in labels]
  return CurriculumSpec(
      sources=sources, geometry_names=tuple(names), starts=np.array(starts, np.int32),
      lowers=np.stack([r.lower for _, r, _ in entries]),
      uppers=np.stack([r.upper for _, r, _ in entries]), mixer_name=name,
      mixer_set=Mixers(mixers, keys), geometry_mixers=np.array(geometry_mixers, np.int32),
      labels=tuple(labels),
      label_maps=tuple(tuple(labels.index(x) for x in m.labels) for m in mixers),
      phase_min_steps=lo, phase_max_steps=hi, decision_lag=lag)


def _static_mixture(given, sources: Sequence[str], where: str,
                    region: Region | None = None) -> np.ndarray:
  """A held mixture (source -> relative weight, missing = 1) normalised, ``[S]``; ``where`` names
  the field in errors.

  A name that is not one of ``sources`` is an error. With ``region`` (the geometry the mixture is
  held in), a mixture that gives no weight to any source the region allows is an error, and so is
  a weight other than the default 1 on a source a geometry's own mixture is held in but the
  region excludes (it could never be drawn).
  """
  w_S = np.asarray(registry.source_weights(where, {} if given is None else given, sources))
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

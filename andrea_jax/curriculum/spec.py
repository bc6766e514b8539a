"""The ``curriculum`` config section and its validation into a static :class:`CurriculumSpec`.

:func:`curriculum_config` makes the section (the mixer, the phase lengths, the decision lag, the
geometries of :mod:`andrea_jax.curriculum.geometries`); :func:`spec_from_config` validates it and
turns it into a frozen :class:`CurriculumSpec` with numpy tables (``[G, S]`` floors and ceilings,
``[G]`` start steps) and the run's mixers, for the jitted engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np

from andrea_jax import checks
from andrea_jax.curriculum import mixer as mixer_lib
from andrea_jax.curriculum import registry
from andrea_jax.curriculum import geometries as geometry_lib
from andrea_jax.curriculum.geometries import andrea_geometries, full_simplex, static_mixture
from andrea_jax.simplex import Region
from andrea_jax.simplex import sampling
from andrea_jax.sources import SOURCES, check_sources

MIXERS = tuple(registry.BUILTIN)
"""The built-in mixers' names (:mod:`andrea_jax.curriculum.mixer`); ``"package.module:factory"``
names a mixer of one's own."""


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


def spec_from_config(config: ml_collections.ConfigDict, sources: Sequence[str] = SOURCES,
                     mixer: mixer_lib.Mixer | None = None,
                     untrained: Sequence[str] = ()) -> CurriculumSpec:
  """Validates the ``curriculum`` section and builds the static :class:`CurriculumSpec`.

  ``mixer`` replaces the one ``curriculum.mixer`` names (e.g. a mixer object built in a notebook;
  the section's name then only labels it). ``untrained`` are sources the run evaluates and never
  trains on (``eval.untrained``): every geometry gives them a ceiling of 0, and a floor on one is
  an error.

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
  lo = checks.integer("curriculum.phase_min_steps", c.phase_min_steps)
  hi = checks.integer("curriculum.phase_max_steps", c.phase_max_steps)
  lag = checks.integer("curriculum.decision_lag", c.decision_lag)
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
  entries = sorted(((geometry_lib.region(n, geometries[n], sources, untrained) + (n,))
                    for n in geometries.keys()),
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
        static_mixture(c.mixer.mixture, sources, "curriculum.mixer.mixture", region)
      geometry_mixers.append(0)
      continue
    m_S = tuple(float(w) for w in static_mixture(own, sources,
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



r"""The curriculum engine: phases of a walk on the mixture simplex, as pure functions over a pytree.

**Phases.** The run is cut into phases of a random length, uniform in
``[phase_min_steps, phase_max_steps]`` (7 to 42 steps), drawn from the run's key. Each phase has one
weight vector ``w`` (a point of the region in force when it starts), decided by the run's *mixer*
(:mod:`andrea_jax.curriculum.mixer`: ANDREA's random and bandit phases by default, the static
mixture, EXP3, the elastic mixer, or one of your own), then projected exactly onto the region. The
mixer observes every step; it decides once per phase (the decision lag lets the host build batches
ahead, so no weight can change between a decision and its phase's start).

A region with a ``mixture`` of its own is decided by a static mixer of that mixture
(:func:`andrea_jax.curriculum.static`), whatever the run's mixer: every phase holds it,
restricted to the sources the region allows and renormalised, which keeps its ratios, then
projected onto the region, which moves it only where a floor or ceiling binds. Every mixer of the
run observes every step, also while another decides.

The first phase (step 0, label ``"start"``) is the first region's mixer's ``start`` mixture (a
static mixer's own), else the uniform mixture, projected onto the first region: nothing has been
observed yet.

**Geometries.** ``spec`` holds a schedule of regions by start step (v2 warmup, firehose, v3 polish).
A phase never straddles a region boundary: a phase length that would cross the next boundary, or
leave less than ``phase_min_steps`` before it, is cut so that a phase ends exactly there. Each new
phase first projects the current point onto its region (:func:`andrea_jax.simplex.project`; a no-op
inside it), so at a pivot the walk continues from the closest point of the new region, and the new
floors and ceilings hold from the pivot's first step on; the mixer is told of the pivot (ANDREA's
walk discounts its bandit's statistics there).

**Decision lag.** The weights of a phase are decided ``decision_lag`` steps before it starts, in the
call ``update(step = start - decision_lag - 1)``, so that after ``update(..., step=t)`` the
:class:`Schedule` (the current and the next phase) determines the weights of every step
``<= t + 1 + decision_lag``, and the host can build batches ahead without waiting for the device.
``update`` does the mixer's observation per step (O(S) for the built-in ones); the decision runs
under ``jax.lax.cond`` only at decision steps.

**Exclusions.** :func:`exclude` adds sources with ceiling 0 from the next undecided phase on (the
zombie-cliff detector's remedy), unless the region would become empty; a refused request is
recorded in ``state.rejected``. A later geometry that cannot take them all (a floor on an excluded
source) keeps those it can, in source order, and records the others in ``state.rejected``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import simplex
from andrea_jax.curriculum.spec import CurriculumSpec
from andrea_jax.curriculum.mixer import Decision, Observation

PyTree = Any


@flax.struct.dataclass
class Schedule:
  """What the host needs to build batches: two phases' weights and start steps.

  Attributes:
    weights: ``[2, S]`` float32, the current phase and the next one.
    starts: ``[2]`` int32, their first steps (equal while the next phase is still undecided).
  """
  weights: jax.Array
  starts: jax.Array


@flax.struct.dataclass
class CurriculumState:
  """The whole curriculum state (checkpointed; a resumed run continues bit for bit).

  Slots ``[0]`` and ``[1]`` of the ``[2, ...]`` fields are the current and the next decided phase.

  Attributes:
    step: int32, last step given to :func:`update` (-1 after :func:`init`).
    weights: ``[2, S]`` float32 phase weights.
    starts, labels, geometries, phase_ids: ``[2]`` int32: first step, label (an index into
      ``spec.labels``), geometry index and number of each phase.
    next_start: int32, first step of the phase after slot 1 (not decided yet).
    key: ``[2]`` uint32, raw key data of the curriculum's random stream.
    excluded: ``[S]`` bool, extra exclusions in force (:func:`exclude`).
    rejected: ``[S]`` bool, exclusions refused because the region would have become empty.
    mixer: the states of the run's mixers, a tuple in ``spec.mixers``'s order (the bandit's
      statistics for ANDREA's walk; ``()`` for a static mixer).
  """
  step: jax.Array
  weights: jax.Array
  starts: jax.Array
  labels: jax.Array
  geometries: jax.Array
  phase_ids: jax.Array
  next_start: jax.Array
  key: jax.Array
  excluded: jax.Array
  rejected: jax.Array
  mixer: PyTree


def _tables(spec: CurriculumSpec):
  return (jnp.asarray(spec.lowers, jnp.float32), jnp.asarray(spec.uppers, jnp.float32),
          jnp.asarray(spec.starts, jnp.int32))


def _geometry_at(spec: CurriculumSpec, step: jax.Array) -> jax.Array:
  """Index of the geometry in force at ``step`` (int32)."""
  _, _, starts_G = _tables(spec)
  return (jnp.sum(starts_G <= step) - 1).astype(jnp.int32)


def _bounds(spec: CurriculumSpec, g: jax.Array, excluded: jax.Array):
  """Floors, ceilings with the extra exclusions that fit, and which of them were applied ``[S]``.

  All of ``excluded`` when the region stays non-empty with them all (the usual case, one
  feasibility test); otherwise source by source in index order, each kept if the region stays
  non-empty with it and those kept before it: one exclusion that a geometry cannot take (a source
  with a floor there) does not cancel the others.
  """
  lowers_GxS, uppers_GxS, _ = _tables(spec)
  lower, upper = lowers_GxS[g], uppers_GxS[g]
  upper_all = jnp.where(excluded, 0.0, upper)

  def one_by_one(_):
    def body(i, carry):
      upper_i, applied = carry
      trial = upper_i.at[i].set(0.0)
      fits = excluded[i] & simplex.is_feasible(lower, trial)
      return jnp.where(fits, trial, upper_i), applied.at[i].set(fits)
    return jax.lax.fori_loop(0, excluded.shape[0], body, (upper, jnp.zeros_like(excluded)))

  upper_ex, applied = jax.lax.cond(simplex.is_feasible(lower, upper_all),
                                   lambda _: (upper_all, excluded), one_by_one, None)
  return lower, upper_ex, applied


def _phase_length(spec: CurriculumSpec, key: jax.Array, start: jax.Array) -> jax.Array:
  """Uniform in [min, max], cut so that the phase never crosses nor stops just short of a boundary.

  With ``gap`` the steps from ``start`` to the next boundary: if ``gap - L < min`` the phase ends
  at the boundary (``L = gap``) when ``gap <= max``, else at ``gap - min`` (the next phase then
  fills the last ``min`` steps). Every phase stays in [min, max] (``max >= 2 min - 1`` is
  validated).
  """
  lo, hi = spec.phase_min_steps, spec.phase_max_steps
  length = jax.random.randint(key, (), lo, hi + 1, dtype=jnp.int32)
  _, _, starts_G = _tables(spec)
  big = jnp.iinfo(jnp.int32).max
  gap = jnp.min(jnp.where(starts_G > start, starts_G, big)) - start
  cut = jnp.where(gap <= hi, gap, gap - lo)
  return jnp.where(gap - length < lo, cut, length).astype(jnp.int32)


def _key_data(key: jax.Array) -> jax.Array:
  # A copy: the state owns its buffer (it may be donated).
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jnp.array(jax.random.key_data(key), copy=True)
  return jnp.array(key, jnp.uint32, copy=True)


def init(spec: CurriculumSpec, key: jax.Array) -> CurriculumState:
  """The state before step 0: phase 0 decided, its weights covering steps ``0..decision_lag``+.

  Phase 0 (label ``"start"``) is the first geometry's mixer's ``start`` mixture (a static mixer's
  own), else the uniform mixture, projected onto the first region.

  Args:
    spec: the static curriculum (:func:`spec_from_config`).
    key: a PRNG key (typed or raw ``uint32[2]``); the curriculum's only source of randomness.

  Example:
    >>> spec = spec_from_config(curriculum_config())
    >>> state = init(spec, jax.random.key(0))
    >>> weights_at(schedule(state), 0)[7:].max()   # v2 warmup: only the first seven sources
    0.0
  """
  key = _key_data(key)
  num = spec.num_sources
  lower, upper, _ = _bounds(spec, jnp.int32(0), jnp.zeros((num,), bool))
  first = jax.random.fold_in(jax.random.wrap_key_data(key), 0)
  uniform_S = simplex.project(jnp.full((num,), 1.0 / num, jnp.float32), lower, upper)
  start = spec.mixers[int(spec.geometry_mixers[0])].start
  if start is not None:
    uniform_S = simplex.project(jnp.asarray(start(Decision(
        key=first, start=jnp.int32(0), lower_S=lower, upper_S=upper, current_S=uniform_S,
        pivot=jnp.bool_(False))), jnp.float32), lower, upper)
  length = _phase_length(spec, first, jnp.int32(0))
  two = lambda x: jnp.stack([x, x])
  return CurriculumState(
      step=jnp.int32(-1), weights=two(uniform_S), starts=jnp.zeros((2,), jnp.int32),
      labels=jnp.zeros((2,), jnp.int32), geometries=jnp.zeros((2,), jnp.int32),
      phase_ids=jnp.zeros((2,), jnp.int32), next_start=length, key=key,
      excluded=jnp.zeros((num,), bool), rejected=jnp.zeros((num,), bool),
      mixer=tuple(m.init(num) for m in spec.mixers))


def _mixer_decide(spec: CurriculumSpec, i: int, states: tuple, d: Decision):
  """Mixer ``i`` decides: ``(weights [S], label as an index into spec.labels, all states)``."""
  w_S, label, new = spec.mixers[i].decide(states[i], d)
  own = spec.mixers[i].labels
  if isinstance(label, str):
    if label not in own:
      raise ValueError(f"mixer {i} ({spec.mixer_set.keys[i][0]!r}) labelled a phase {label!r}, "
                       f"not one of its labels {own}")
    label = own.index(label)
  label = jnp.asarray(spec.label_maps[i], jnp.int32)[jnp.asarray(label, jnp.int32)]
  return (jnp.asarray(w_S, jnp.float32), label,
          tuple(new if j == i else s for j, s in enumerate(states)))


def _decide(spec: CurriculumSpec, state: CurriculumState) -> CurriculumState:
  """Decides the phase starting at ``state.next_start``: its mixer, label, weights and length."""
  phase = state.phase_ids[1] + 1
  start = state.next_start
  g = _geometry_at(spec, start)
  lower, upper, applied = _bounds(spec, g, state.excluded)
  rejected = state.rejected | (state.excluded & ~applied)

  pivot = g != state.geometries[1]
  key = jax.random.fold_in(jax.random.wrap_key_data(state.key), phase)
  k_len = jax.random.split(key, 4)[0]   # the mixer splits the same key for its own draws
  here_S = simplex.project(state.weights[1], lower, upper)
  d = Decision(key=key, start=start, lower_S=lower, upper_S=upper, current_S=here_S, pivot=pivot)
  branches = [functools.partial(_mixer_decide, spec, i) for i in range(len(spec.mixers))]
  if len(branches) == 1:
    w_S, label, mixer_states = branches[0](state.mixer, d)
  else:   # the geometry's own mixer decides; the others' states pass through
    which = jnp.asarray(spec.geometry_mixers, jnp.int32)[g]
    w_S, label, mixer_states = jax.lax.switch(which, branches, state.mixer, d)
  # One last exact projection: the floors and zeros hold exactly after float32 rounding.
  w_S = simplex.project(w_S, lower, upper)

  shift = lambda pair, new: jnp.stack([pair[1], jnp.asarray(new, pair.dtype)])
  return state.replace(
      weights=shift(state.weights, w_S), starts=shift(state.starts, start),
      labels=shift(state.labels, label), geometries=shift(state.geometries, g),
      phase_ids=shift(state.phase_ids, phase),
      next_start=start + _phase_length(spec, k_len, start),
      rejected=rejected, mixer=mixer_states)


def update(spec: CurriculumSpec, state: CurriculumState, step: jax.Array, losses: jax.Array,
           tokens: jax.Array, signals: Mapping[str, jax.Array] | None = None) -> CurriculumState:
  """Records the batch of ``step`` and, at a decision step, decides the next phase. Jittable.

  Call once per step, in order, after the batch of ``step`` (inside the jitted train step).

  Args:
    spec: the static curriculum.
    state: the state after ``update(step - 1)`` (or :func:`init` for step 0).
    step: int32 scalar, the step whose batch was just used.
    losses: ``[S]`` mean loss per source on that batch (ignored where ``tokens == 0``).
    tokens: ``[S]`` tokens per source in the batch.
    signals: the probes' measurements at this step, ``{name: [S]}`` (NaN where none:
      :mod:`andrea_jax.probes`), handed to every mixer in its observation; each mixer's own
      ``signals`` must be among them.

  Returns:
    The new state; ``schedule(state)`` then covers every step ``<= step + 1 + decision_lag``.
  """
  signals = dict(signals or {})
  for name, value in (("losses", losses), ("tokens", tokens),
                      *((f"signals[{k!r}]", v) for k, v in signals.items())):
    if jnp.shape(value) != state.excluded.shape:
      raise ValueError(f"update: {name} must be [S] = {state.excluded.shape}, one per source, got "
                       f"shape {jnp.shape(value)}")
  for key, m in zip(spec.mixer_set.keys, spec.mixers):
    missing = [x for x in m.signals if x not in signals]
    if missing:
      raise ValueError(f"mixer {key[0]!r} reads the signals {missing}, which this update was not "
                       f"given (it has {sorted(signals)}): a probe must measure them")
  step = jnp.asarray(step, jnp.int32)
  # The weights this step's batch was drawn from: the schedule before this update covers ``step``.
  obs = Observation(step=step, losses_S=losses, tokens_S=tokens, weights_S=lookup(
      schedule(state), step), signals={k: jnp.asarray(v, jnp.float32) for k, v in signals.items()})
  state = state.replace(step=step, mixer=tuple(
      m.observe(s, obs) for m, s in zip(spec.mixers, state.mixer)))
  due = step >= state.next_start - spec.decision_lag - 1
  return jax.lax.cond(due, functools.partial(_decide, spec), lambda s: s, state)


def schedule(state: CurriculumState) -> Schedule:
  """What the host needs: ``Schedule(weights [2, S], starts [2])``, for :func:`weights_at`."""
  return Schedule(weights=state.weights, starts=state.starts)


def weights_at(sched: Schedule, step) -> np.ndarray:
  """Host-side: the weights of ``step`` (int, or an int array ``[...]`` -> ``[..., S]``) as numpy.

  :func:`lookup` with a check: valid for steps from ``starts[0]`` up to ``t + 1 + decision_lag``
  when ``sched`` was read after ``update(step=t)``; every valid snapshot gives the same weights for
  a step. ``ValueError`` for a step before ``starts[0]`` (an outdated lookup).

  Example:
    >>> sched = Schedule(np.array([[1., 0.], [0.5, 0.5]]), np.array([10, 30]))
    >>> weights_at(sched, 29), weights_at(sched, 30)
    (array([1., 0.]), array([0.5, 0.5]))
  """
  sched = Schedule(weights=np.asarray(sched.weights), starts=np.asarray(sched.starts))
  step = np.asarray(step)
  if np.any(step < sched.starts[0]):
    raise ValueError(f"step {step.min()} is before the schedule's first phase (start "
                     f"{sched.starts[0]}): this schedule was read too late for that step")
  return lookup(sched, step)


def lookup(sched: Schedule, step) -> jax.Array | np.ndarray:
  """The weights of ``step``: ``weights[1]`` from ``starts[1]`` on, else ``weights[0]`` (``[S]``,
  or ``[..., S]`` for an array of steps). numpy in, numpy out (the host's batches); jax arrays or
  tracers in, a jax array out (inside the step). No check: see :func:`weights_at`."""
  xp = np if all(isinstance(x, (np.ndarray, np.generic, int))
                 for x in (sched.weights, sched.starts, step)) else jnp
  return xp.asarray(sched.weights)[(xp.asarray(step) >= xp.asarray(sched.starts)[1]).astype(
      xp.int32)]


def exclude(spec: CurriculumSpec, state: CurriculumState, mask: jax.Array) -> CurriculumState:
  """Excludes the sources of ``mask`` (``[S]`` bool) from the next undecided phase on. Jittable.

  The request is applied as a whole if the region of that phase stays non-empty with it and every
  earlier exclusion that region takes; otherwise it is ignored and its sources are added to
  ``state.rejected``.
  Phases already decided (the schedule's two) keep their weights.
  """
  mask = jnp.asarray(mask, bool)
  if mask.shape != state.excluded.shape:
    raise ValueError(f"exclude: mask must be a [S] = {state.excluded.shape} bool mask of the "
                     f"sources, got shape {mask.shape}")
  candidate = state.excluded | mask
  g = _geometry_at(spec, state.next_start)
  # An earlier exclusion this geometry cannot take (a floor on it here) does not block a new one:
  # the request must apply, and so must every earlier one that applies now.
  # The trainer sends every source flagged so far: only the new ones are this request.
  new = mask & ~state.excluded
  _, _, before = _bounds(spec, g, state.excluded)
  _, _, applied = _bounds(spec, g, candidate)
  ok = jnp.all(applied | ~(new | before))
  refused = state.rejected | (mask & ~state.excluded)
  return state.replace(excluded=jnp.where(ok, candidate, state.excluded),
                       rejected=jnp.where(ok, state.rejected, refused))


def metrics(spec: CurriculumSpec, state: CurriculumState) -> dict[str, jax.Array]:
  """Small arrays for logging, about the phase of ``state.step``. Jittable.

  Keys: ``phase`` (number), ``phase_label`` (an index into ``spec.labels``: ``"start"``, then
  the mixers' own, e.g. ``"random"``, ``"bandit"``, ``"held"``), ``geometry`` (index into
  ``spec.geometry_names``), ``phase_start``, ``next_decision`` (step of the next decision),
  ``weights`` ``[S]``, ``excluded`` and ``rejected`` ``[S]`` (int32), then the run's mixer's own
  (``spec.mixer.metrics``; for ANDREA's walk the bandit's ``ucb``, ``bandit_mean``,
  ``bandit_count``, ``reward``, ``progress`` ``[S]`` and ``reward_scale``).
  """
  slot = (state.step >= state.starts[1]).astype(jnp.int32)
  return {
      "phase": state.phase_ids[slot],
      "phase_label": state.labels[slot],
      "geometry": state.geometries[slot],
      "phase_start": state.starts[slot],
      "next_decision": state.next_start - spec.decision_lag - 1,
      "weights": state.weights[slot],
      "excluded": state.excluded.astype(jnp.int32),
      "rejected": state.rejected.astype(jnp.int32),
      **spec.mixer.metrics(state.mixer[0]),
  }

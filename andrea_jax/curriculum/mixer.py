r"""Mixers: how a curriculum decides each phase's mixture, as pure functions over a state of their own.

A mixer is an optax-style bundle of pure functions (:class:`Mixer`): ``init`` makes its state,
``observe`` folds in each step's per-source losses, ``decide`` picks the weights of a new phase
inside the region in force, and ``metrics`` exposes what is worth logging. The curriculum engine
(:mod:`andrea_jax.curriculum.engine`) owns everything else: the phases' lengths, the geometries and
their pivots, the decision lag, the exclusions and the final exact projection onto the region.
``curriculum.strategy`` names the mixer of a run:

* ``"andrea"`` (:func:`andrea_walk`): the source document's walk. A *random* phase (probability
  ``random_share``) jumps to a point drawn uniformly in the region; a *bandit* phase moves toward
  the UCB-optimal vertex ``v`` of the region (:func:`andrea_jax.simplex.greedy_vertex` of the
  bandit's indices, ties broken at random): ``w <- (1 - eta) w + eta v``. ``"bandit_only"`` and
  ``"random_only"`` are the same walk with ``random_share`` 0 and 1.
* ``"static"`` (:func:`static`): every phase holds the region's mixture (a geometry's own
  ``mixture``, else ``curriculum.static_mixture``, uniform by default).
* ``"exp3"`` and ``"elastic"``: the baselines users compare against (:mod:`.exp3`, ODM's online data
  mixing; :mod:`.elastic`, shares in proportion to each source's log-time learning rate).
* ``"package.module:factory"``: a mixer of the user's own, ``factory(curriculum_section) -> Mixer``
  (or a :class:`Mixer` itself), imported by name, so a run that uses it resumes from the command
  line like any other.

Writing a mixer (greedy on the last observed loss, say)::

  def greedy(section):
    def init(num_sources):
      return jnp.zeros((num_sources,), jnp.float32)
    def observe(last_S, obs):
      return jnp.where(obs.tokens_S > 0, obs.losses_S, last_S)
    def decide(last_S, d):
      vertex_S = simplex.greedy_vertex(last_S, d.lower_S, d.upper_S)
      return 0.5 * d.current_S + 0.5 * vertex_S, KIND_CUSTOM, last_S
    return Mixer(init, observe, decide, lambda last_S: {"last_loss": last_S})

Every function must be jittable; ``decide`` may return any point of the simplex, the engine projects
it onto the region.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from andrea_jax import bandit as bandit_lib
from andrea_jax import simplex

PyTree = Any

KIND_RANDOM, KIND_BANDIT, KIND_FIXED, KIND_EXP3, KIND_ELASTIC, KIND_CUSTOM = range(6)
"""Phase kinds (logged as ``curriculum/phase_kind``): a uniform jump, a step toward the UCB vertex,
a held mixture (the first phase, ``static``, a geometry's own mixture), an EXP3 distribution, an
elastic mixture, and a user's mixer."""

KIND_NAMES = ("random", "bandit", "fixed", "exp3", "elastic", "custom")

# Random tie-breaking of equal UCB indices (e.g. before any observation): far below any real gap.
_TIE_NOISE = 1e-6


class Observation(NamedTuple):
  """One step's batch, as a mixer observes it (all ``[S]`` float32 but ``step``).

  Attributes:
    step: int32, the step whose batch was used.
    losses_S: mean loss per source (anything where ``tokens_S == 0``).
    tokens_S: tokens per source in the batch (0 on a skipped, non-finite step).
    weights_S: the mixture the batch was drawn from (0 = not allowed).
  """
  step: jax.Array
  losses_S: jax.Array
  tokens_S: jax.Array
  weights_S: jax.Array


class Decision(NamedTuple):
  """What a mixer knows when it decides a phase.

  Attributes:
    key: the phase's PRNG key (typed); split it for the mixer's own draws.
    start: int32, the phase's first step.
    lower_S, upper_S: the region in force (floors; ceilings with the exclusions applied).
    current_S: the walk's current point projected onto the region.
    held_S: the region's held mixture, restricted to its allowed sources and renormalised.
    pivot: bool, whether the region changed since the previous phase.
  """
  key: jax.Array
  start: jax.Array
  lower_S: jax.Array
  upper_S: jax.Array
  current_S: jax.Array
  held_S: jax.Array
  pivot: jax.Array


class Mixer(NamedTuple):
  """A mixing strategy as pure functions (every one jittable).

  Attributes:
    init: ``num_sources -> state``, the state before any step (a pytree of arrays).
    observe: ``(state, Observation) -> state``, called once per training step.
    decide: ``(state, Decision) -> (weights [S], kind int32, state)``, called at each phase
      decision (``decision_lag`` steps before the phase starts); ``kind`` is one of ``KIND_*``.
    metrics: ``state -> dict`` of arrays to log (scalars go to ``metrics.jsonl``).
  """
  init: Callable[[int], PyTree]
  observe: Callable[[PyTree, Observation], PyTree]
  decide: Callable[[PyTree, Decision], tuple[jax.Array, jax.Array, PyTree]]
  metrics: Callable[[PyTree], dict[str, jax.Array]]


@functools.lru_cache(maxsize=None)
def static() -> Mixer:
  """The static mixture: every phase holds ``Decision.held_S``; no state, nothing observed."""
  return Mixer(init=lambda num_sources: (), observe=lambda state, obs: state,
               decide=lambda state, d: (d.held_S, jnp.int32(KIND_FIXED), state),
               metrics=lambda state: {})


@functools.lru_cache(maxsize=None)
def andrea_walk(bandit: bandit_lib.BanditParams = bandit_lib.BanditParams(), eta: float = 0.3,
                random_share: float = 0.25) -> Mixer:
  """ANDREA's walk: random phases with probability ``random_share``, bandit phases otherwise.

  Its state is the bandit's (:class:`andrea_jax.bandit.BanditState`). At each decision the bandit
  closes its observation window and, at a pivot, discounts its statistics by
  ``bandit.pivot_discount`` (the model is not reset at a pivot: what it knows of each source's
  learning progress stays informative, but the confidence bonuses grow so that it re-explores the
  new region). A bandit phase moves ``eta`` of the way from the current point to the region's
  vertex of highest UCB index: ``w <- (1 - eta) w + eta v``.

  Example:
    >>> mixer = andrea_walk(eta=0.3, random_share=0.0)      # "bandit_only"
    >>> state = mixer.init(16)
  """
  def observe(state: bandit_lib.BanditState, obs: Observation) -> bandit_lib.BanditState:
    return bandit_lib.observe(state, obs.losses_S, obs.tokens_S)

  def decide(state: bandit_lib.BanditState, d: Decision):
    state = bandit_lib.close_window(bandit, state)
    state = bandit_lib.discount(state, jnp.where(d.pivot, bandit.pivot_discount, 1.0))
    weights_S, kind = walk(d, bandit_lib.ucb_index(bandit, state), eta, random_share)
    return weights_S, kind, state

  def metrics(state: bandit_lib.BanditState) -> dict[str, jax.Array]:
    return {"ucb": bandit_lib.ucb_index(bandit, state),
            "bandit_mean": bandit_lib.means(bandit, state),
            "bandit_count": state.counts,
            "reward": bandit_lib.rewards(bandit, state),
            "progress": bandit_lib.estimates(state),
            "reward_scale": bandit_lib.reward_scale(state)}

  return Mixer(init=bandit_lib.init, observe=observe, decide=decide, metrics=metrics)


def walk(d: Decision, scores_S: jax.Array, eta: float, random_share: float
         ) -> tuple[jax.Array, jax.Array]:
  """One phase of ANDREA's walk: ``(weights [S], kind)``.

  With probability ``random_share`` a random phase, a point drawn uniformly in the region
  (:func:`andrea_jax.simplex.sample_uniform`); otherwise a bandit phase, ``(1 - eta) w + eta v``
  from the current point ``w`` toward the region's vertex ``v`` of highest ``scores_S``
  (:func:`andrea_jax.simplex.greedy_vertex`; ties broken at random). The draws come from
  ``d.key``. :func:`andrea_walk` scores the sources by the bandit's UCB index; a mixer of one's own
  may walk by any other score.
  """
  _, k_kind, k_sample, k_tie = jax.random.split(d.key, 4)

  def random_phase():
    samples, _ = simplex.sample_uniform(k_sample, d.lower_S, d.upper_S, 1)
    return samples[0].astype(jnp.float32)

  def bandit_phase():
    tied_S = scores_S + _TIE_NOISE * jax.random.uniform(k_tie, scores_S.shape, jnp.float32)
    vertex_S = simplex.greedy_vertex(tied_S, d.lower_S, d.upper_S)
    return ((1 - eta) * d.current_S + eta * vertex_S).astype(jnp.float32)

  is_random = jax.random.uniform(k_kind) < random_share
  kind = jnp.where(is_random, KIND_RANDOM, KIND_BANDIT).astype(jnp.int32)
  return jax.lax.cond(is_random, random_phase, bandit_phase), kind


def is_mixer(obj: object) -> bool:
  """Whether ``obj`` has a mixer's four callables."""
  return all(callable(getattr(obj, f, None)) for f in Mixer._fields)


def import_mixer(name: str, section: ml_collections.ConfigDict) -> Mixer:
  """The mixer that ``curriculum.strategy = "package.module:factory"`` names.

  ``factory`` is called with the ``curriculum`` section (so it can read knobs of its own from it)
  unless it is a :class:`Mixer` already. A ``ValueError`` names the field when the module, the name
  or the result is not what it should be.
  """
  module_name, _, attr = name.partition(":")
  where = f"curriculum.strategy = {name!r}"
  if not module_name or not attr:
    raise ValueError(f"{where}: a mixer of your own is named 'package.module:factory'")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"{where}: cannot import {module_name!r} ({e})") from None
  factory = getattr(module, attr, None)
  if factory is None:
    raise ValueError(f"{where}: module {module_name!r} has no {attr!r}")
  if not (is_mixer(factory) or callable(factory)):
    raise ValueError(f"{where}: {attr!r} is neither a Mixer nor callable")
  mixer = factory if is_mixer(factory) else factory(section)
  if not is_mixer(mixer):
    raise ValueError(f"{where}: {attr}(curriculum) returned {type(mixer).__name__}, not a Mixer "
                     "(init, observe, decide, metrics)")
  return Mixer(*(getattr(mixer, f) for f in Mixer._fields))

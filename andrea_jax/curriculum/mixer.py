r"""Mixers: how a curriculum decides each phase's mixture, as pure functions over a state of their own.

A mixer is an optax-style bundle of pure functions (:class:`Mixer`): ``init`` makes its state,
``observe`` folds in each step's per-source losses (and the run's probes' signals, such as the
sources' target gains), ``decide`` picks the weights of a new phase inside the region in force and names
the phase with one of its ``labels``, and ``metrics`` exposes what is worth logging. The curriculum
engine (:mod:`andrea_jax.curriculum.engine`) owns everything else: the phases' lengths, the
geometries and their pivots, the decision lag, the exclusions and the final exact projection onto
the region.

Mixers are made by factories with typed keyword arguments, as ``optax.adamw(b1=...)``; the
``curriculum.mixer`` section of a config holds one factory's name and its arguments, nothing else
(:mod:`andrea_jax.curriculum.registry`). The built-in ones:

* :func:`andrea_walk` (``"andrea"``): the source document's walk. A *random* phase (probability
  ``random_share``) jumps to a point drawn uniformly in the region; a *bandit* phase moves toward
  the UCB-optimal vertex ``v`` of the region (:func:`andrea_jax.simplex.greedy_vertex` of the
  bandit's indices, ties broken at random): ``w <- (1 - eta) w + eta v``. The bandit's reward
  (:mod:`andrea_jax.curriculum.rewards`) is each source's own learning progress
  (``reward="progress"``), its *target gain* (``reward="target_gain"``: how fast a step on it
  lowers the loss on the run's declared target, :mod:`andrea_jax.probes.target_gain`), any probe's
  signal, or a reward of one's own. ``"bandit_only"`` and ``"random_only"`` are the walk with
  ``random_share`` 0 and 1.
* :func:`static` (``"static"``): every phase holds one mixture (uniform by default). A geometry
  with a ``mixture`` of its own is held by a static mixer of that mixture, whatever the run's
  mixer: a held mixture is a mixer like any other.
* ``"exp3"`` and ``"elastic"``: the baselines users compare against (:mod:`.exp3`, ODM's online data
  mixing; :mod:`.elastic`, shares in proportion to each source's log-time learning rate).
* ``"package.module:factory"``: a mixer of the user's own, built the same way.

Writing a mixer (half way to the vertex of the highest last observed loss)::

  def greedy(*, step_size: float = 0.5) -> Mixer:
    def observe(last_S, obs):
      return jnp.where(obs.tokens_S > 0, obs.losses_S, last_S)
    def decide(last_S, d):
      vertex_S = simplex.greedy_vertex(last_S, d.lower_S, d.upper_S)
      return (1 - step_size) * d.current_S + step_size * vertex_S, "greedy", last_S
    return Mixer(lambda n: jnp.zeros((n,)), observe, decide,
                 lambda last_S: {"last_loss": last_S}, labels=("greedy",))

Every function must be jittable; ``decide`` may return any point of the simplex (the engine
projects it onto the region) and names its phase by a label (a string of ``labels``, or an int32
index into them when the choice is traced, as :func:`walk`'s random-or-bandit). A mixer that reads
a probe's signal (:mod:`andrea_jax.probes`) names it in ``signals=("target_gain",)`` and reads
``obs.signals["target_gain"]`` in ``observe``: ``[S]``, NaN where the step measured nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from andrea_jax import checks
from andrea_jax import plugins
from andrea_jax import simplex
from andrea_jax.curriculum import bandit as bandit_lib
from andrea_jax.curriculum import rewards as rewards_lib

PyTree = Any

SourceWeights = plugins.SourceWeights
"""A factory argument holding one relative weight per source, in the run's source order (the
config spells it as a section keyed by source; :mod:`andrea_jax.plugins`)."""

REWARDS = tuple(rewards_lib.BUILTIN)
"""The built-in rewards of ANDREA's bandit (:mod:`andrea_jax.curriculum.rewards`; a probe's signal
or ``"package.module:factory"`` names others)."""

# Random tie-breaking of equal UCB indices (e.g. before any observation): far below any real gap.
_TIE_NOISE = 1e-6


class Observation(NamedTuple):
  """One step's batch, as a mixer observes it (all ``[S]`` float32 but ``step``).

  Attributes:
    step: int32, the step whose batch was used.
    losses_S: mean loss per source (anything where ``tokens_S == 0``).
    tokens_S: tokens per source in the batch (0 on a skipped, non-finite step).
    weights_S: the mixture the batch was drawn from (0 = not allowed).
    signals: the run's probes' measurements at this step, ``{name: [S] float32}``
      (:mod:`andrea_jax.probes`; e.g. ``"target_gain"``, how fast a step on each source lowers the
      loss on the run's target): NaN where nothing was measured (a probe measures every few
      steps, and only the sources the run can sample). A mixer reads the ones it names in
      :attr:`Mixer.signals`, as optax transformations take the extra arguments they know.
  """
  step: jax.Array
  losses_S: jax.Array
  tokens_S: jax.Array
  weights_S: jax.Array
  signals: Mapping[str, jax.Array] = {}


class Decision(NamedTuple):
  """What a mixer knows when it decides a phase.

  Attributes:
    key: the phase's PRNG key (typed); split it for the mixer's own draws.
    start: int32, the phase's first step.
    lower_S, upper_S: the region in force (floors; ceilings with the exclusions applied).
    current_S: the walk's current point projected onto the region.
    pivot: bool, whether the region changed since the previous phase.
  """
  key: jax.Array
  start: jax.Array
  lower_S: jax.Array
  upper_S: jax.Array
  current_S: jax.Array
  pivot: jax.Array


class Mixer(NamedTuple):
  """A mixing strategy as pure functions (every one jittable).

  Attributes:
    init: ``num_sources -> state``, the state before any step (a pytree of arrays).
    observe: ``(state, Observation) -> state``, called once per training step.
    decide: ``(state, Decision) -> (weights [S], label, state)``, called at each phase decision
      (``decision_lag`` steps before the phase starts); ``label`` is one of ``labels`` (a string,
      or an int32 index into ``labels``).
    metrics: ``state -> dict`` of arrays to log (scalars go to ``metrics.jsonl``).
    labels: the names of the phases ``decide`` makes (logged as ``curriculum/phase_label``).
    start: ``Decision -> weights [S]``, the mixture of the run's first phase, before anything is
      observed (labelled ``"start"``); ``None``: the uniform mixture, projected onto the region.
    signals: the probes' signals ``observe`` reads from :attr:`Observation.signals` (the run
      refuses, before anything compiles, a mixer whose signal no probe measures).
  """
  init: Callable[[int], PyTree]
  observe: Callable[[PyTree, Observation], PyTree]
  decide: Callable[[PyTree, Decision], tuple[jax.Array, Any, PyTree]]
  metrics: Callable[[PyTree], dict[str, jax.Array]]
  labels: tuple[str, ...] = ("mixed",)
  start: Callable[[Decision], jax.Array] | None = None
  signals: tuple[str, ...] = ()


def restrict(mixture_S: jax.Array, upper_S: jax.Array) -> jax.Array:
  """``mixture_S`` on the sources ``upper_S`` allows (ceiling > 0), renormalised; uniform over them
  when it gives them nothing (a source excluded at run time). ``[S]`` float32.

  Example: ``restrict([2, 1, 1], [1, 1, 0])`` is ``[2/3, 1/3, 0]``.
  """
  allowed_S = (jnp.asarray(upper_S) > 0).astype(jnp.float32)
  m_S = jnp.asarray(mixture_S, jnp.float32) * allowed_S
  total = jnp.sum(m_S)
  return jnp.where(total > 0, m_S / jnp.where(total > 0, total, 1.0),
                   allowed_S / jnp.maximum(jnp.sum(allowed_S), 1.0))


def static(*, mixture: SourceWeights | None = None) -> Mixer:
  """The static mixture: every phase, the first included, holds ``mixture`` (relative weights,
  one per source; ``None`` = uniform) on the sources the region allows, renormalised
  (:func:`restrict`); the engine then projects it onto the region, which moves it only where a
  floor or ceiling binds. No state, nothing observed.

  Example:
    >>> mixer = static(mixture=(2.0, 1.0, 1.0))      # 1/2, 1/4, 1/4 wherever all three are allowed
  """
  if mixture is None:
    mixture_S = None
  else:
    mixture = tuple(mixture)
    for i, w in enumerate(mixture):
      checks.number(f"mixture[{i}]", w, low=0)
    if not sum(mixture) > 0:
      raise ValueError("mixture: every weight is 0; at least one source needs a positive weight")
    mixture_S = mixture

  def hold(d: Decision) -> jax.Array:
    m_S = jnp.ones_like(d.upper_S) if mixture_S is None else jnp.asarray(mixture_S, jnp.float32)
    return restrict(m_S, d.upper_S)

  return Mixer(init=lambda num_sources: (), observe=lambda state, obs: state,
               decide=lambda state, d: (hold(d), "held", state), metrics=lambda state: {},
               labels=("held",), start=hold)


def andrea_walk(*, eta: float = 0.3, random_share: float = 0.25, reward: str = "progress",
                discount: float = 0.995, exploration: float = 0.05, min_count: float = 1.0,
                prior_count: float = 0.01, reward_knee: float = 1.0,
                pivot_discount: float = 0.25) -> Mixer:
  """ANDREA's walk: random phases with probability ``random_share``, bandit phases otherwise.

  Its state is the bandit's (:class:`andrea_jax.curriculum.bandit.BanditState`). At each decision
  the bandit closes its observation window and, at a pivot, discounts its statistics by
  ``pivot_discount`` (the model is not reset at a pivot: what it knows of each source stays
  informative, but the confidence bonuses grow so that it re-explores the new region). A bandit
  phase moves ``eta`` of the way from the current point to the region's vertex of highest UCB
  index: ``w <- (1 - eta) w + eta v``. The first phase is the uniform mixture (nothing observed).

  Args:
    eta: the step toward the vertex, in (0, 1].
    random_share: the probability that a phase is random, in [0, 1].
    reward: what the bandit is rewarded by (:func:`andrea_jax.curriculum.rewards.get`):
      ``"progress"`` (each source's learning progress, observed on every batch),
      ``"target_gain"`` (how fast a step on each source lowers the loss on the run's target,
      measured by the probe ``probes.target_gain``: the run must declare ``eval.target``), another
      probe's signal by name, or ``"package.module:factory"``.
    discount, exploration, min_count, prior_count, reward_knee, pivot_discount: the bandit's
      (:class:`andrea_jax.curriculum.bandit.BanditParams`, where the formulas are).

  Example:
    >>> mixer = andrea_walk(eta=0.3, random_share=0.0)      # "bandit_only"
    >>> state = mixer.init(16)
  """
  checks.number("eta", eta, low=0, high=1, low_open=True)
  checks.number("random_share", random_share, low=0, high=1)
  rew = rewards_lib.get(reward)
  try:
    bandit = bandit_lib.BanditParams(discount=discount, exploration=exploration,
                                     min_count=min_count, prior_count=prior_count,
                                     reward_knee=reward_knee, pivot_discount=pivot_discount)
  except (TypeError, ValueError) as e:   # "bandit.discount must be ..." -> "discount must be ..."
    raise type(e)(str(e).removeprefix("bandit.")) from None
  eta, random_share = float(eta), float(random_share)

  def decide(state: bandit_lib.BanditState, d: Decision):
    state = rew.close(bandit, state)
    state = bandit_lib.discount(state, jnp.where(d.pivot, bandit.pivot_discount, 1.0))
    weights_S, label = walk(d, bandit_lib.ucb_index(bandit, state), eta, random_share)
    return weights_S, label, state

  def metrics(state: bandit_lib.BanditState) -> dict[str, jax.Array]:
    return {"ucb": bandit_lib.ucb_index(bandit, state),
            "bandit_mean": bandit_lib.means(bandit, state),
            "bandit_count": state.counts,
            "reward": bandit_lib.rewards(bandit, state),
            "progress": bandit_lib.estimates(state),
            "reward_scale": bandit_lib.reward_scale(state)}

  return Mixer(init=bandit_lib.init, observe=rew.observe, decide=decide, metrics=metrics,
               labels=WALK_LABELS, signals=rew.signals)


def bandit_only(*, eta: float = 0.3, reward: str = "progress", discount: float = 0.995,
                exploration: float = 0.05, min_count: float = 1.0, prior_count: float = 0.01,
                reward_knee: float = 1.0, pivot_discount: float = 0.25) -> Mixer:
  """:func:`andrea_walk` with no random phase (``random_share = 0``)."""
  return andrea_walk(**locals(), random_share=0.0)


def random_only() -> Mixer:
  """:func:`andrea_walk` with random phases only (``random_share = 1``): a uniform draw in the
  region every phase."""
  return andrea_walk(random_share=1.0)


WALK_LABELS = ("random", "bandit")
"""The labels :func:`walk` picks between (index 0 and 1)."""


def walk(d: Decision, scores_S: jax.Array, eta: float, random_share: float
         ) -> tuple[jax.Array, jax.Array]:
  """One phase of ANDREA's walk: ``(weights [S], label)``, the label an int32 index into
  :data:`WALK_LABELS` (0 random, 1 bandit).

  With probability ``random_share`` a random phase, a point drawn uniformly in the region
  (:func:`andrea_jax.simplex.sample_uniform`); otherwise a bandit phase, ``(1 - eta) w + eta v``
  from the current point ``w`` toward the region's vertex ``v`` of highest ``scores_S``
  (:func:`andrea_jax.simplex.greedy_vertex`; ties broken at random). The draws come from
  ``d.key``. :func:`andrea_walk` scores the sources by the bandit's UCB index; a mixer of one's own
  may walk by any other score (with ``labels=WALK_LABELS``).
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
  label = jnp.where(is_random, 0, 1).astype(jnp.int32)
  return jax.lax.cond(is_random, random_phase, bandit_phase), label


def is_mixer(obj: object) -> bool:
  """Whether ``obj`` has a mixer's four functions (``labels`` and ``start`` may be absent)."""
  return all(callable(getattr(obj, f, None)) for f in ("init", "observe", "decide", "metrics"))


def as_mixer(obj: object) -> Mixer:
  """``obj`` (anything with a mixer's functions) as a :class:`Mixer`, its labels checked: a
  ``ValueError`` unless they are a non-empty tuple of distinct non-empty strings (``"start"`` is
  the engine's)."""
  labels = getattr(obj, "labels", ("mixed",))
  if (not isinstance(labels, (tuple, list)) or not labels
      or not all(isinstance(x, str) and x for x in labels) or len(set(labels)) != len(labels)):
    raise ValueError(f"the mixer's labels must be a non-empty tuple of distinct non-empty strings, "
                     f"got {labels!r}")
  if "start" in labels:
    raise ValueError(f"the mixer's labels {tuple(labels)} name a phase 'start': that label is the "
                     "engine's (the run's first phase)")
  start = getattr(obj, "start", None)
  if start is not None and not callable(start):
    raise ValueError(f"the mixer's start must be a function of the Decision or None, got {start!r}")
  signals = getattr(obj, "signals", ())
  if (not isinstance(signals, (tuple, list))
      or not all(isinstance(x, str) and x for x in signals)):
    raise ValueError(f"the mixer's signals must be a tuple of probe names, got {signals!r}")
  return Mixer(obj.init, obj.observe, obj.decide, obj.metrics, tuple(labels), start,
               tuple(signals))

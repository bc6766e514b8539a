r"""EXP3 over the data sources with a decaying exploration floor: online data mixing as in ODM.

Albalak et al. (2023), "Efficient Online Data Mixing For Language Model Pre-Training" (ODM), treat
each data source as an arm of an adversarial bandit, reward it with its training loss (a source
whose loss is high has more to teach), and mix with EXP3's exponential weights plus an exploration
floor that decays with the step. The curriculum's mixer ``"exp3"`` uses these pure functions
(:mod:`andrea_jax.curriculum.engine`); they are usable alone.

**Observation, every step.** The batch of step ``t`` was drawn from the mixture ``pi`` (``[S]``);
source ``s`` brought ``n_s`` tokens of mean loss ``l_s``, out of ``N = sum_j n_j``. A source is
*observed* when it was allowed (``pi_s > 0``), had tokens and a finite loss. Its smoothed loss is

.. math::
   \tilde l_s \leftarrow \alpha\, \tilde l_s + (1 - \alpha)\, l_s
   \qquad (\tilde l_s = l_s \text{ at its first observation}),

and its importance-weighted reward for the step

.. math::
   \hat r_s = \tilde l_s \, \frac{n_s / N}{\pi_s}
   \qquad (0 \text{ for an allowed source without tokens}).

Each row of a mixed batch is one EXP3 draw: ODM's estimate ``l / pi`` of the drawn arm, averaged
over the ``N`` tokens of the step, is ``l_s (n_s / N) / pi_s``. When the rows are drawn i.i.d. from
``pi``, ``E[n_s / N] = pi_s`` and ``hat r_s`` is an unbiased estimate of ``tilde l_s``; with the
project's sampler (:func:`andrea_jax.data.sampler.allocate`, systematic rounding to whole rows)
``n_s / N`` is ``pi_s`` to within one row on every step and exactly on average, and a source rounded
up to one row is credited in proportion.

**Cumulative estimate** (classic EXP3; ODM's released code also accumulates): ``G_s <- G_s +
hat r_s`` over the steps where ``s`` was allowed, counted by ``m_s``. A source that joins the region
late (after the v2 curriculum warmup) would start far behind the others, so the score compares mean
rewards over the same horizon: ``g_s = M G_s / m_s`` with ``M`` the steps observed so far
(``g_s = G_s`` for a source allowed from the start); a source never allowed gets the mean score of
the allowed ones that were.

**Distribution** over the ``K`` allowed sources ``A``, for a phase starting at step ``t`` (1-based):

.. math::
   \varepsilon_t = \min\Big(\frac1K, \sqrt{\frac{\ln K}{K t}}\Big), \qquad
   \eta_t = c\, \varepsilon_{t-1}, \qquad
   \pi_s = (1 - K \varepsilon_t)
     \frac{e^{\eta_t g_s}}{\sum_{j \in A} e^{\eta_t g_j}} + \varepsilon_t \quad (s \in A),

with ``epsilon_0 = 1/K``; ``c = 1`` is ODM's rate (its code divided the loss by 10 first: ``c =
0.1``). Every allowed source keeps at least ``epsilon_t`` and the floor decays as ``t^{-1/2}``; the
curriculum then projects ``pi`` onto its region (floors and ceilings).

Numbers stay finite for any input: losses are clipped to ``[-1e6, 1e6]``, token counts below 1e-6
are none, a step's reward to ``+-1e30`` (a tiny ``pi`` with tokens), the cumulative rewards to
``+-1e37``, the logits to float32's range, and the softmax subtracts its maximum.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from andrea_jax.curriculum.bandit import LOSS_CLIP, TOKENS_RANGE, check_numbers
from andrea_jax.curriculum.mixer import Decision, Mixer, Observation

REWARD_CLIP = 1e30   # one step's importance-weighted reward, at most
SUM_CLIP = 1e37      # a source's cumulative reward, at most (float32 ends at 3.4e38)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Exp3Params:
  """Static, validated parameters of the EXP3 mixer (hashable; a pytree of its numbers).

  Attributes:
    smoothing: ``alpha`` in [0, 1), the weight of the past in the smoothed per-source loss.
    lr_scale: ``c`` >= 0, the exponential-weights rate in units of ``epsilon_{t-1}`` (1 = ODM's
      formula on the raw loss; 0 = the uniform distribution over the allowed sources).
  """
  smoothing: float = 0.9
  lr_scale: float = 1.0

  def __post_init__(self):
    rules = (("smoothing", lambda v: 0 <= v < 1, "in [0, 1)"),
              ("lr_scale", lambda v: v >= 0, ">= 0"))
    check_numbers("exp3", self, rules)

  def tree_flatten(self):
    return (self.smoothing, self.lr_scale), None

  @classmethod
  def tree_unflatten(cls, aux, leaves):
    del aux
    params = object.__new__(cls)  # leaves may be tracers: no validation
    object.__setattr__(params, "smoothing", leaves[0])
    object.__setattr__(params, "lr_scale", leaves[1])
    return params


@flax.struct.dataclass
class Exp3State:
  """Per-source statistics (``[S]`` float32 unless noted); a pytree for checkpoints.

  Attributes:
    smoothed_loss: ``tilde l_s``, nats per token (0 before the first observation).
    seen: bool, whether ``s`` has been observed.
    cumulative: ``G_s``, the sum of the importance-weighted rewards.
    plays: ``m_s``, steps where ``s`` was allowed.
    steps: int32 scalar, ``M``, steps with any tokens.
  """
  smoothed_loss: jax.Array
  seen: jax.Array
  cumulative: jax.Array
  plays: jax.Array
  steps: jax.Array


def init(num_sources: int) -> Exp3State:
  """Nothing observed: the distribution is uniform over the allowed sources."""
  # One buffer per field: the trainer donates the state.
  z = lambda: jnp.zeros((num_sources,), jnp.float32)
  return Exp3State(smoothed_loss=z(), seen=jnp.zeros((num_sources,), bool), cumulative=z(),
                   plays=z(), steps=jnp.zeros((), jnp.int32))


def exploration(t: jax.Array, num_allowed: jax.Array) -> jax.Array:
  """``epsilon_t = min(1/K, sqrt(ln K / (K t)))`` for ``t >= 1``; ``1/K`` for ``t <= 0``. Jittable.

  Example: ``K = 16``: ``epsilon_1 = 1/16``, ``epsilon_100 = sqrt(ln 16 / 1600) = 0.04163``.
  """
  k = jnp.maximum(jnp.asarray(num_allowed, jnp.float32), 1.0)
  t = jnp.asarray(t, jnp.float32)
  decayed = jnp.sqrt(jnp.log(k) / (k * jnp.maximum(t, 1.0)))
  return jnp.where(t >= 1, jnp.minimum(1.0 / k, decayed), 1.0 / k)


def observe(params: Exp3Params, state: Exp3State, losses: jax.Array, tokens: jax.Array,
            weights: jax.Array) -> Exp3State:
  """Adds one step: smoothed losses, importance-weighted rewards, counts. O(S), no branch.

  Args:
    params: the mixer's parameters.
    state: the statistics so far.
    losses: ``[S]`` mean loss per source on the step's batch (anything where ``tokens == 0``).
    tokens: ``[S]`` tokens per source in the batch.
    weights: ``[S]`` the mixture ``pi`` the batch was drawn from (0 = not allowed).

  Example (``alpha = 0.5``; the second source is allowed but got no row, the third is excluded):
    >>> s = observe(Exp3Params(0.5), init(3), jnp.array([2., jnp.nan, 9.]),
    ...             jnp.array([30., 0., 0.]), jnp.array([0.75, 0.25, 0.]))
    >>> s.cumulative  # 2 * (30 / 30) / 0.75, 0, nothing
    Array([2.6666667, 0.       , 0.       ], dtype=float32)
  """
  losses = jnp.asarray(losses, jnp.float32)
  tokens = jnp.asarray(tokens, jnp.float32)
  weights = jnp.asarray(weights, jnp.float32)
  allowed = weights > 0
  has = (tokens >= TOKENS_RANGE[0]) & jnp.isfinite(tokens)
  n = jnp.where(has, jnp.minimum(tokens, TOKENS_RANGE[1]), 0.0)
  any_tokens = jnp.sum(n) > 0
  observed = allowed & has & jnp.isfinite(losses)
  l = jnp.clip(jnp.where(observed, losses, 0.0), -LOSS_CLIP, LOSS_CLIP)
  alpha = jnp.asarray(params.smoothing, jnp.float32)
  blended = jnp.where(state.seen, alpha * state.smoothed_loss + (1 - alpha) * l, l)
  smoothed = jnp.where(observed, blended, state.smoothed_loss)
  share = n / jnp.maximum(jnp.sum(n), 1.0)
  # Importance weighting by a tiny pi can overflow float32: rewards and their sums stay finite.
  reward = jnp.clip(jnp.where(observed, smoothed * share / jnp.where(allowed, weights, 1.0), 0.0),
                    -REWARD_CLIP, REWARD_CLIP)
  played = allowed & any_tokens
  return Exp3State(
      smoothed_loss=smoothed, seen=state.seen | observed,
      cumulative=jnp.clip(state.cumulative + jnp.where(played, reward, 0.0), -SUM_CLIP, SUM_CLIP),
      plays=state.plays + played.astype(jnp.float32),
      steps=state.steps + any_tokens.astype(jnp.int32))


def scores(state: Exp3State, allowed: jax.Array) -> jax.Array:
  """``g_s = M G_s / m_s`` (``[S]``); a never-allowed source gets the mean of the allowed played.

  Example: ``G = (10, 3)``, ``m = (10, 5)``, ``M = 10``: ``g = (10, 6)``.
  """
  allowed = jnp.asarray(allowed, bool)
  played = state.plays > 0
  mean_S = state.cumulative / jnp.where(played, state.plays, 1.0)
  g_S = state.steps.astype(jnp.float32) * mean_S
  ref = allowed & played
  fallback = jnp.sum(jnp.where(ref, g_S, 0.0)) / jnp.maximum(jnp.sum(ref), 1)
  return jnp.where(played, g_S, fallback)


def distribution(params: Exp3Params, state: Exp3State, t: jax.Array,
                 allowed: jax.Array) -> jax.Array:
  """EXP3's mixture for a phase starting at step ``t`` (1-based): ``[S]`` float32, 0 off ``A``.

  ``pi_s = (1 - K eps_t) softmax_A(c eps_{t-1} g)_s + eps_t`` on the ``K`` allowed sources (see the
  module docstring). ``allowed`` (``[S]`` bool) must have at least one True.

  Example: nothing observed yet gives the uniform distribution on ``A``:
    >>> distribution(Exp3Params(), init(3), 5, jnp.array([True, True, False]))
    Array([0.5, 0.5, 0. ], dtype=float32)
  """
  allowed = jnp.asarray(allowed, bool)
  k = jnp.sum(allowed)
  eps = exploration(t, k)
  rate = jnp.asarray(params.lr_scale, jnp.float32) * exploration(jnp.asarray(t) - 1, k)
  big = jnp.finfo(jnp.float32).max
  logits_S = jnp.where(allowed, jnp.clip(rate * scores(state, allowed), -big, big), -jnp.inf)
  p_S = jax.nn.softmax(logits_S)
  k = k.astype(jnp.float32)
  return jnp.where(allowed, (1.0 - k * eps) * p_S + eps, 0.0).astype(jnp.float32)


def mixer(*, smoothing: float = 0.9, lr_scale: float = 1.0) -> Mixer:
  """Mixer ``"exp3"``: the statistics observed at every step with the weights the batch was drawn
  from, each phase's mixture :func:`distribution` at its start (then projected onto the region by
  the engine); phases labelled ``"exp3"``. Logs ``exp3_score`` ``[S]``, the scores ``g``.

  Args: ``smoothing`` and ``lr_scale``, :class:`Exp3Params`'s.
  """
  try:
    params = Exp3Params(smoothing=smoothing, lr_scale=lr_scale)
  except (TypeError, ValueError) as e:
    raise type(e)(str(e).removeprefix("exp3.")) from None

  def observe_step(state: Exp3State, obs: Observation) -> Exp3State:
    return observe(params, state, obs.losses_S, obs.tokens_S, obs.weights_S)

  def decide(state: Exp3State, d: Decision):
    return distribution(params, state, d.start + 1, d.upper_S > 0), "exp3", state

  return Mixer(init=init, observe=observe_step, decide=decide,
               metrics=lambda state: {"exp3_score": scores(state, jnp.ones_like(state.seen))},
               labels=("exp3",))

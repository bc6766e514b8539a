r"""A discounted-UCB bandit over the data sources, rewarded by learning progress or a measured signal.

Pure functions over a :class:`BanditState` pytree; the parameters are a validated
:class:`BanditParams`. The curriculum (:mod:`andrea_jax.curriculum`) calls :func:`observe` every
training step and :func:`close_window` + :func:`ucb_index` at each phase decision; the functions are
usable alone (:func:`select` is the classic one-arm-per-round bandit).

**Observation.** Each step brings, per source ``s``, the mean loss ``l_s`` of the source's part of
the batch and its token count ``n_s``; a source is *observed* when ``n_s > 0`` and ``l_s`` is finite
(the loss of an absent source is meaningless and ignored, even if NaN). Every source with weight
> 0 is observed on every step it contributes tokens: the statistics count what each source actually
contributed, not which arm was "pulled". Losses are clipped to ``[-1e6, 1e6]`` nats (cross-entropy
never gets there except through a bug) and token counts to ``[1e-6, 1e12]`` (less is none) so that
nothing overflows, underflows or divides zero by zero. Between two decisions (a *window* of ``L``
steps) the state accumulates each source's token-weighted mean loss ``lbar_s`` and tokens ``T_s``.

**Learning progress.** When the window closes, a source observed in it and in an earlier window (its
*reference*: the last window where it had tokens) has the progress

.. math::
   p_s = \frac{\bar l_s^{\,ref} - \bar l_s}{D_s}, \qquad
   D_s = \max\big(\tfrac12 (T_s^{ref} + T_s),\ 1\big) \quad \text{[nats per token]},

the fall of its loss over the ``D_s`` tokens of ``s`` seen between the token-midpoints of the two
windows (it had none in between). It is the marginal return of giving tokens to ``s``: it fades as
the source is learned and jumps when the source changes (a pivot).

**Discounted statistics** (Garivier & Moulines, 2011), in units of *steps' worth of tokens*: with
``tau = sum_j T_j / L`` the window's tokens per step, the observation weighs ``nu_s = D_s / tau``
(at most ``4 L``), and with the per-step discount ``gamma``

.. math::
   N_s \leftarrow \gamma^L N_s + \nu_s, \qquad P_s \leftarrow \gamma^L P_s + \nu_s p_s,
   \qquad \hat p_s = P_s / N_s .

Since ``nu_s p_s`` is the loss fall itself (over ``tau``), ``hat p_s`` is a discounted *total* loss
fall over *total* tokens: window noise telescopes instead of accumulating, and a window where the
source had a handful of tokens (a huge, noisy ``p_s``) weighs only its handful.

**Reward: progress robustly rescaled.** The estimates are rescaled by ``sigma``, the median of
``|hat p|`` weighted by ``N`` (the well-observed sources set the scale, noisy rare ones do not), and
squashed smoothly into ``(0, 1)``:

.. math::
   \hat r_s = \tfrac12 \Big(1 + \frac{\hat p_s}{|\hat p_s| + \kappa \max(\sigma, \sigma_{min})}
   \Big).

``r = 1/2`` means no progress, ``r = 3/4`` a progress of ``kappa`` scales (``reward_knee``); the
squash never saturates, so more progress always ranks higher. All progress equal (e.g. all zero)
gives equal rewards.

**A measured signal** (the other kind of reward, :mod:`andrea_jax.curriculum.rewards`): instead of
each source's own learning progress, :func:`observe_signal` records a probe's per-source
measurement every few steps (the target gain: how fast a step on each source lowers the loss on the
run's target, :mod:`andrea_jax.probes.target_gain`), and :func:`close_signal_window` folds the window's
mean measurement into the same discounted statistics (one count per measurement). The rescaling
and the index below are the same for every reward.

**Index.** With the optimistic prior reward 1 held by ``n_0`` pseudo-steps (``prior_count``), the
exploration weight ``c`` and the count floor ``n_min``:

.. math::
   I_s = \frac{N_s \hat r_s + n_0}{N_s + n_0}
       + c \sqrt{\frac{\ln \max\!\big(\sum_j N_j,\ e\big)}{N_s + n_{min}}} .

A never-observed source has ``I_s = 1 + c sqrt(ln max(sum N, e) / n_min)``: finite, and above
every observed source. Old observations fade with ``gamma``, so a source unobserved for long regains
a large bonus and is explored again: the index tracks non-stationary progress.
"""

from __future__ import annotations

import dataclasses
import math

import flax.struct
import jax
import jax.numpy as jnp

from andrea_jax import checks

LOSS_CLIP = 1e6
"""Losses are clipped to ``[-LOSS_CLIP, LOSS_CLIP]`` nats before any arithmetic."""

TOKENS_RANGE = (1e-6, 1e12)
"""A step's token count below the first bound counts as none, above the second is clipped to it."""

SCALE_MIN = 1e-20
"""``sigma_min``: the smallest progress scale (nats per token); keeps ``p / sigma`` finite."""

# Counts below this are "never observed" (a long-discounted count may underflow).
_COUNT_MIN = 1e-30

BONUS_MAX = 1e30
"""The confidence bonus is capped here, so that the index is finite for every valid parameter
(an exploration weight up to the largest float, ``n_min`` below float32's smallest number)."""

_FLOAT32_MAX = 3.4028234663852886e38   # the bandit computes in float32


def check_numbers(section: str, params, rules, integers: tuple[str, ...] = ()) -> None:
  """Validates the numeric fields of a parameters dataclass; the error names ``section.field``.

  ``rules`` holds ``(field, predicate, "what it must be")``; a bool, a non-number (a non-integer
  for the fields in ``integers``), a NaN or an infinity is refused (:mod:`andrea_jax.checks`)
  before the predicate is asked.
  """
  for name, ok, what in rules:
    where = f"{section}.{name}"
    value = getattr(params, name)
    if name in integers:
      checks.integer(where, value, int32=False)
    else:
      checks.number(where, value)
    if not ok(value):
      raise ValueError(f"{where} must be {what}, got {value}")


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class BanditParams:
  """Static, validated parameters of the bandit (hashable: usable as a jit static argument).

  Also a pytree whose leaves are the seven numbers, so that a jitted function taking it as an
  argument (not static) compiles once for all values.

  Attributes:
    discount: ``gamma``, per training step, in (0, 1]; the statistics' horizon is ``1/(1-gamma)``.
    exploration: ``c`` >= 0, weight of the confidence bonus (rewards live in [0, 1]).
    min_count: ``n_min`` > 0, steps added to every count in the bonus (caps rare sources' bonus).
    prior_count: ``n_0`` > 0, pseudo-steps of the optimistic prior mean 1.
    reward_knee: ``kappa`` > 0, progress (in running scales) whose reward is 3/4.
    pivot_discount: factor in [0, 1] applied to ``N`` and ``P`` at a change of region (a pivot):
      means are kept, bonuses grow by ``1/sqrt(factor)``; 0 resets the statistics.
  """
  discount: float = 0.995
  exploration: float = 0.05
  min_count: float = 1.0
  prior_count: float = 0.01
  reward_knee: float = 1.0
  pivot_discount: float = 0.25

  def __post_init__(self):
    rules = (
        ("discount", lambda v: 0 < v <= 1, "in (0, 1]"),
        ("exploration", lambda v: v >= 0, ">= 0"),
        ("min_count", lambda v: v > 0, "> 0"),
        ("prior_count", lambda v: 0 < v <= _FLOAT32_MAX, "> 0 and at most float32's largest"),
        ("reward_knee", lambda v: 0 < v <= _FLOAT32_MAX, "> 0 and at most float32's largest"),
        ("pivot_discount", lambda v: 0 <= v <= 1, "in [0, 1]"),
    )
    check_numbers("bandit", self, rules)

  def tree_flatten(self):
    return tuple(getattr(self, f.name) for f in dataclasses.fields(self)), None

  @classmethod
  def tree_unflatten(cls, aux, leaves):
    del aux
    params = object.__new__(cls)  # leaves may be tracers: no validation
    for f, v in zip(dataclasses.fields(cls), leaves):
      object.__setattr__(params, f.name, v)
    return params


@flax.struct.dataclass
class BanditState:
  """Per-source statistics (all ``[S]`` float32 unless noted); a pytree for checkpoints.

  Attributes:
    counts: ``N_s``, discounted steps' worth of observed tokens.
    progress: ``P_s``, discounted sum of ``nu_s p_s``.
    ref_loss, ref_tokens: mean loss and tokens of the source's reference window.
    has_ref: bool, whether the source has a reference window.
    win_loss, win_tokens: in the open window, the weighted mean of what the reward observes and
      its weight (progress: the token-weighted mean loss and the tokens; a signal: the mean
      measurement and the number of measurements; the names are progress's, kept so that
      checkpoints stay readable).
    win_steps: int32 scalar, steps in the open window.
    last_progress: ``p_s`` of the last closed window (NaN where none).
  """
  counts: jax.Array
  progress: jax.Array
  ref_loss: jax.Array
  ref_tokens: jax.Array
  has_ref: jax.Array
  win_loss: jax.Array
  win_tokens: jax.Array
  win_steps: jax.Array
  last_progress: jax.Array


def init(num_sources: int) -> BanditState:
  """A bandit that has observed nothing: every source at the optimistic index."""
  # One buffer per field: a state whose fields share a buffer cannot be donated.
  z = lambda: jnp.zeros((num_sources,), jnp.float32)
  return BanditState(
      counts=z(), progress=z(), ref_loss=z(), ref_tokens=z(),
      has_ref=jnp.zeros((num_sources,), bool), win_loss=z(), win_tokens=z(),
      win_steps=jnp.zeros((), jnp.int32),
      last_progress=jnp.full((num_sources,), jnp.nan, jnp.float32))


def observe(state: BanditState, losses: jax.Array, tokens: jax.Array) -> BanditState:
  """Adds one step to the open window: O(S), no branch, safe for any input.

  ``lbar <- lbar + (l - lbar) n / (T + n)``, ``T <- T + n`` for the observed sources (``n >= 1e-6``
  and ``l`` finite); an incremental mean, so that large losses never overflow a sum.

  Args:
    state: the bandit.
    losses: ``[S]`` mean loss per source on the step's batch (anything where ``tokens == 0``).
    tokens: ``[S]`` tokens per source in the batch.

  Example:
    >>> s = observe(init(2), jnp.array([2.0, jnp.nan]), jnp.array([100., 0.]))
    >>> s.win_loss, s.win_tokens
    (Array([2., 0.], dtype=float32), Array([100.,   0.], dtype=float32))
  """
  losses = jnp.asarray(losses, jnp.float32)
  tokens = jnp.asarray(tokens, jnp.float32)
  if losses.shape != state.win_loss.shape or tokens.shape != state.win_loss.shape:
    raise ValueError(f"observe: losses and tokens must have shape {state.win_loss.shape} (one per "
                     f"source), got {losses.shape} and {tokens.shape}")
  valid = (tokens >= TOKENS_RANGE[0]) & jnp.isfinite(losses) & jnp.isfinite(tokens)
  n = jnp.where(valid, jnp.minimum(tokens, TOKENS_RANGE[1]), 0.0)
  l = jnp.clip(jnp.where(valid, losses, 0.0), -LOSS_CLIP, LOSS_CLIP)
  total = state.win_tokens + n
  frac = jnp.where(valid, n / jnp.where(valid, total, 1.0), 0.0)
  return state.replace(win_loss=state.win_loss + (l - state.win_loss) * frac, win_tokens=total,
                       win_steps=state.win_steps + 1)


def learning_progress(ref_loss: jax.Array, ref_tokens: jax.Array, loss: jax.Array,
                      tokens: jax.Array) -> jax.Array:
  """``p = (ref_loss - loss) / max((ref_tokens + tokens) / 2, 1)``, nats per token, elementwise.

  Example: a loss falling from 3.0 to 2.9 over windows of 100 and 300 tokens: ``0.1 / 200 = 5e-4``.
  """
  return (ref_loss - loss) / jnp.maximum(0.5 * (ref_tokens + tokens), 1.0)


def rescale(progress: jax.Array, scale: jax.Array, reward_knee: float) -> jax.Array:
  """``r = (1 + p / (|p| + kappa max(sigma, sigma_min))) / 2`` in ``(0, 1)``, elementwise.

  Example: ``rescale(2e-4, 1e-4, 2.0) == 0.75``; ``rescale(-3e-4, 1e-4, 1.0) == 0.125``.
  """
  den = jnp.abs(progress) + reward_knee * jnp.maximum(scale, SCALE_MIN)
  # A knee so small that kappa sigma_min underflows leaves 0 / 0 for no progress: reward 1/2.
  return 0.5 * (1.0 + jnp.where(den > 0, progress / jnp.where(den > 0, den, 1.0), 0.0))


def weighted_median(x: jax.Array, weights: jax.Array) -> jax.Array:
  """The lower weighted median of ``x`` (``[S]``) under ``weights >= 0`` (0 if all weights are 0).

  The smallest ``x_i`` such that the weights of ``x_j <= x_i`` reach half the total.

  Example: ``weighted_median([1., 2., 10.], [1., 3., 1.]) == 2``.
  """
  order = jnp.argsort(x)
  x_sorted, w_sorted = x[order], weights[order]
  below = jnp.cumsum(w_sorted)
  k = jnp.argmax(below >= 0.5 * below[-1])
  return jnp.where(below[-1] > 0, x_sorted[k], 0.0)


def close_window(params: BanditParams, state: BanditState) -> BanditState:
  """Ends the open window: learning progress, discounted statistics, new references.

  See the module docstring for the formulas. A source with no tokens in the window keeps its
  reference and gets no observation (its statistics only decay). O(S).

  Example:
    >>> p = BanditParams()
    >>> s = init(2)
    >>> for loss in (3.0, 2.9):  # two windows of one step, 100 tokens each
    ...   s = close_window(p, observe(s, jnp.array([loss, 1.0]), jnp.array([100., 100.])))
    >>> s.last_progress  # 0.1 nats over 100 tokens, and none
    Array([0.001, 0.   ], dtype=float32)
  """
  steps = jnp.maximum(state.win_steps, 1).astype(jnp.float32)   # a divisor: never 0
  observed = state.win_tokens > 0
  has_progress = observed & state.has_ref
  progress = jnp.where(
      has_progress,
      learning_progress(state.ref_loss, state.ref_tokens, state.win_loss, state.win_tokens), 0.0)
  between = jnp.maximum(0.5 * (state.ref_tokens + state.win_tokens), 1.0)
  per_step = jnp.maximum(jnp.sum(state.win_tokens), 1.0) / steps
  nu = jnp.where(has_progress, jnp.minimum(between / per_step, 4.0 * steps), 0.0)
  # gamma^L over the L steps of the window: an empty window (no observe since the last close,
  # e.g. the first decision) decays nothing.
  decay = jnp.asarray(params.discount, jnp.float32) ** state.win_steps.astype(jnp.float32)
  z = lambda: jnp.zeros_like(state.win_tokens)
  return state.replace(
      counts=decay * state.counts + nu,
      progress=decay * state.progress + nu * progress,
      ref_loss=jnp.where(observed, state.win_loss, state.ref_loss),
      ref_tokens=jnp.where(observed, state.win_tokens, state.ref_tokens),
      has_ref=state.has_ref | observed,
      win_loss=z(), win_tokens=z(), win_steps=jnp.zeros_like(state.win_steps),
      last_progress=jnp.where(has_progress, progress, jnp.nan))


def observe_signal(state: BanditState, signal_S: jax.Array) -> BanditState:
  """Adds one measurement of a per-source signal to the open window (a reward from a probe, e.g.
  the target gain: :mod:`andrea_jax.probes.target_gain`): O(S), no branch.

  ``signal_S[s]`` is source ``s``'s measurement (the target gain: how fast a step on ``s`` lowers the
  loss on the run's target, first order, nats per unit step); NaN where the step measured nothing
  (a probe measures every few steps, and only the sources the run can sample). The window keeps
  each source's running mean of its measurements in ``win_loss`` and their number in
  ``win_tokens``; values are clipped to ``[-1e6, 1e6]``.

  Example:
    >>> s = observe_signal(observe_signal(init(2), jnp.array([1.0, jnp.nan])), jnp.array([3.0, 2.0]))
    >>> s.win_loss, s.win_tokens
    (Array([2., 2.], dtype=float32), Array([2., 1.], dtype=float32))
  """
  signal_S = jnp.asarray(signal_S, jnp.float32)
  if signal_S.shape != state.win_loss.shape:
    raise ValueError(f"observe_signal: signal_S must have shape {state.win_loss.shape} (one per "
                     f"source), got {signal_S.shape}")
  valid = jnp.isfinite(signal_S)
  g = jnp.clip(jnp.where(valid, signal_S, 0.0), -LOSS_CLIP, LOSS_CLIP)
  total = state.win_tokens + valid.astype(jnp.float32)
  frac = jnp.where(valid, 1.0 / jnp.where(valid, total, 1.0), 0.0)
  return state.replace(win_loss=state.win_loss + (g - state.win_loss) * frac, win_tokens=total,
                       win_steps=state.win_steps + 1)


def close_signal_window(params: BanditParams, state: BanditState) -> BanditState:
  """Ends a window of measurements (:func:`observe_signal`): the discounted statistics.

  Each source measured ``m_s`` times in the window with mean ``bar a_s`` gets
  ``N_s <- gamma^L N_s + m_s`` and ``P_s <- gamma^L P_s + m_s bar a_s``, so that
  ``hat p_s = P_s / N_s`` is the discounted mean measurement; the reward, the scale and the index
  are then those of learning progress (:func:`rewards`, :func:`ucb_index`). Every source a probe
  measures is measured at every measurement, so their counts, and with them the confidence
  bonuses, stay equal: the index ranks them by the signal. A source never measured (one no region
  lets the run sample) keeps a count of 0, so it never weighs in the scale ``sigma``.

  Example:
    >>> s = close_signal_window(BanditParams(), observe_signal(init(2), jnp.array([1e-3, -1e-3])))
    >>> estimates(s)
    Array([ 0.001, -0.001], dtype=float32)
  """
  observed = state.win_tokens > 0
  decay = jnp.asarray(params.discount, jnp.float32) ** state.win_steps.astype(jnp.float32)
  z = lambda: jnp.zeros_like(state.win_tokens)
  return state.replace(
      counts=decay * state.counts + state.win_tokens,
      progress=decay * state.progress + state.win_tokens * state.win_loss,
      win_loss=z(), win_tokens=z(), win_steps=jnp.zeros_like(state.win_steps),
      last_progress=jnp.where(observed, state.win_loss, jnp.nan))


def estimates(state: BanditState) -> jax.Array:
  """``hat p_s = P_s / N_s``: the discounted learning progress, nats per token (0 if unobserved)."""
  seen = state.counts > _COUNT_MIN
  return jnp.where(seen, state.progress / jnp.where(seen, state.counts, 1.0), 0.0)


def reward_scale(state: BanditState) -> jax.Array:
  """``sigma``: the median of ``|hat p|`` weighted by the counts ``N`` (0 before any progress)."""
  return weighted_median(jnp.abs(estimates(state)), state.counts)


def rewards(params: BanditParams, state: BanditState) -> jax.Array:
  """``hat r_s``: the estimated progress rescaled into ``(0, 1)`` (1/2 for an unobserved source)."""
  return rescale(estimates(state), reward_scale(state), params.reward_knee)


def means(params: BanditParams, state: BanditState) -> jax.Array:
  """``(N_s hat r_s + n_0) / (N_s + n_0)``: the reward with the optimistic prior, ``[S]``.

  An unobserved source with an ``n_0`` below float32's range gets the prior mean 1 (the limit), not
  0 / 0.
  """
  total = state.counts + params.prior_count
  return jnp.where(total > 0, (state.counts * rewards(params, state) + params.prior_count)
                   / jnp.where(total > 0, total, 1.0), 1.0)


def ucb_index(params: BanditParams, state: BanditState) -> jax.Array:
  """The upper confidence bound of each source, ``[S]`` float32, always finite.

  ``I_s = (N_s hat r_s + n_0) / (N_s + n_0) + c sqrt(ln max(sum_j N_j, e) / (N_s + n_min))``.

  Example (hand-worked): ``N = (e^2 - 2, 1, 1)``, ``hat p = (1, 1, 3) 1e-4``: ``sigma = 1e-4`` and,
  with ``kappa = 1``, ``hat r = (0.75, 0.75, 0.875)``; with ``n_0 -> 0``, ``c = 1``, ``n_min = 1``
  and ``ln(sum N) = 2``: ``I = (0.75 + sqrt(2 / (e^2 - 1)), 0.75 + 1, 0.875 + 1)``.
  """
  total = jnp.sum(state.counts)
  log_total = jnp.log(jnp.maximum(total, math.e))
  bonus = params.exploration * jnp.sqrt(
      log_total / jnp.maximum(state.counts + params.min_count, _COUNT_MIN))
  return means(params, state) + jnp.minimum(bonus, BONUS_MAX)


def select(params: BanditParams, state: BanditState, allowed: jax.Array) -> jax.Array:
  """The allowed source of highest index (int32 scalar); ties go to the lower index.

  For a one-source-per-round bandit; the curriculum instead steps toward the region's
  UCB-optimal vertex. ``allowed`` (``[S]`` bool) must have at least one True: excluded sources are
  never selected.
  """
  return jnp.argmax(jnp.where(allowed, ucb_index(params, state), -jnp.inf)).astype(jnp.int32)


def discount(state: BanditState, factor: float | jax.Array) -> BanditState:
  """Scales ``N`` and ``P`` by ``factor`` (a pivot): estimates unchanged, bonuses inflated.

  A well-observed source's bonus grows by about ``1/sqrt(factor)`` (a little less, as ``ln sum N``
  falls too), so the bandit re-explores without forgetting its estimates.

  The learning-progress references are kept: the model is not reset at a pivot, so a source's loss
  stays comparable across it.

  ``factor`` must lie in [0, 1]; a Python number outside raises ``ValueError``, a traced one is
  clipped into [0, 1] with NaN taken as 0 (a reset), so the statistics never become NaN.
  """
  if isinstance(factor, (int, float)) and not 0 <= factor <= 1:
    raise ValueError(f"discount factor must be in [0, 1], got {factor}")
  factor = jnp.clip(jnp.nan_to_num(jnp.asarray(factor, jnp.float32), nan=0.0), 0.0, 1.0)
  return state.replace(counts=factor * state.counts, progress=factor * state.progress)

r"""The elastic mixer: each source's share in proportion to how fast its loss falls in log-time.

Why: on a capacity- and data-limited model a source's loss follows a power law in the tokens it
got, ``l_s ~ a_s - b_s ln n_s``, with very different *elasticities* ``b_s`` across sources
(memorised or unlearnable sources near 0, templated and structured ones high). The equal-weight
mean loss ``mean_s l_s`` under a fixed mixture ``w`` (``n_s = w_s B t``) is then smallest at
``w_s`` proportional to ``b_s`` (maximise ``sum_s b_s ln w_s`` on the simplex). Under a fixed
mixture,

.. math::
   \frac{d l_s}{d \ln t} = -b_s \quad\text{whatever } w_s,

so each source's *log-time learning rate*, read off its own training losses, estimates its
elasticity without any reference model, and it does not depend on the share the source has now:
a mixture set in proportion to it is a fixed point, not a feedback loop. (Per-*token* progress,
the bandit's reward, is ``b_s / n_s``: it depends on the share itself.) A common trend in every
source's loss (transfer, the learning-rate schedule) adds the same amount to every rate: it
shrinks the mixture toward uniform, the safe direction.

**Observation, every step** ``t`` (0-based): every source with tokens ``n_s > 0`` and a finite
loss ``l_s`` adds the point ``(x, y) = (ln(t + 1), l_s)`` with weight ``n_s`` (a batch mean over
more tokens is less noisy) to a weighted least-squares fit of ``y`` on ``x``, from step
``burn_in`` on (the first steps' fall, learning the byte distribution, says nothing about the
sources). Old points fade by a scale-free factor: at step ``t`` a point from step ``t'`` weighs
``((t' + 1) / (t + 1))^lambda`` (``forget``) of a new one: ``lambda = 0`` keeps everything,
``lambda = 1`` fades the first half of the run to at most one half; the same value suits 800 and
200K steps. The fit is kept in
Welford's centred form (weight ``W``, means ``m_x, m_y``, co-moments ``C_xx, C_xy``), stable in
float32 for any run length:

.. math::
   W' = d W + n, \quad m_x \leftarrow m_x + \tfrac{n}{W'}(x - m_x), \quad
   C_{xy} \leftarrow d\, C_{xy} + n \tfrac{d W}{W'} (x - m_x^{old})(y - m_y^{old}),

and the rate is ``b_s = -C_xy / C_xx`` (unknown while ``C_xx`` is zero). The means are updated
with Kahan's compensated summation: late in a long run each step moves them by about one float32
ulp, and plain rounding would bias them, the smallest rates the most.

**Distribution** over the ``K`` allowed sources ``A`` (the region's ceiling above 0), with the
uniform share ``mu`` (``uniform_mix``) kept for robustness:

.. math::
   \pi_s = \frac{\mu}{K} + (1 - \mu) \frac{\max(b_s, 0)}{\sum_{j \in A} \max(b_j, 0)}
   \quad (s \in A),

a source of unknown rate (never observed, e.g. excluded until now) counting with the mean rate of
the known allowed ones; the uniform distribution on ``A`` while no allowed source has a positive
known rate. The curriculum projects ``pi`` onto its region (floors and ceilings) at each phase.

Numbers stay finite for any input: losses are clipped to ``[-1e6, 1e6]``, token counts below 1e-6
are none and above 1e12 are clipped.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from andrea_jax.curriculum.bandit import LOSS_CLIP, TOKENS_RANGE, check_numbers
from andrea_jax.curriculum.mixer import Decision, Mixer, Observation

# Below this ``C_xx`` (squared log-steps times tokens) the rate is unknown: one distinct step.
_CXX_MIN = 1e-12


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class ElasticParams:
  """Static, validated parameters of the elastic mixer (hashable; a pytree of its numbers).

  Attributes:
    uniform_mix: ``mu`` in [0, 1], the share of the mixture kept uniform over the allowed sources
      (1 = the uniform mixture, 0 = purely proportional to the rates).
    burn_in: steps before the fit starts (an int >= 0); the mixture is uniform until a rate is
      known.
    forget: ``lambda`` >= 0, how fast old points fade, in log-time (0 = never).
  """
  uniform_mix: float = 0.5
  burn_in: int = 100
  forget: float = 1.0

  def __post_init__(self):
    rules = (("uniform_mix", lambda v: 0 <= v <= 1, "in [0, 1]"),
              ("burn_in", lambda v: v >= 0, ">= 0"),
              ("forget", lambda v: v >= 0, ">= 0"))
    check_numbers("elastic", self, rules, integers=("burn_in",))

  def tree_flatten(self):
    return (self.uniform_mix, self.burn_in, self.forget), None

  @classmethod
  def tree_unflatten(cls, aux, leaves):
    del aux
    params = object.__new__(cls)  # leaves may be tracers: no validation
    for name, value in zip(("uniform_mix", "burn_in", "forget"), leaves):
      object.__setattr__(params, name, value)
    return params


@flax.struct.dataclass
class ElasticState:
  """Per-source weighted least-squares fit of the loss on ``ln(t + 1)`` (``[S]`` float32).

  Attributes:
    weight: ``W``, the faded sum of the points' weights (tokens).
    mean_x, mean_y: weighted means of ``ln(t + 1)`` and of the loss.
    cxx, cxy: weighted co-moments ``sum n (x - m_x)^2`` and ``sum n (x - m_x)(y - m_y)``.
    comp_x, comp_y: Kahan compensations of ``mean_x`` and ``mean_y`` (their lost low-order bits).
    last_x: scalar, ``ln(t + 1)`` of the last step given to :func:`observe` (the weights are
      faded by ``exp(-lambda (x - last_x))`` at each call: exact for any gaps between steps).
  """
  weight: jax.Array
  mean_x: jax.Array
  mean_y: jax.Array
  cxx: jax.Array
  cxy: jax.Array
  comp_x: jax.Array
  comp_y: jax.Array
  last_x: jax.Array


def init(num_sources: int) -> ElasticState:
  """Nothing observed: every rate unknown, the distribution uniform."""
  # One buffer per field: the trainer donates the state.
  z = lambda: jnp.zeros((num_sources,), jnp.float32)
  return ElasticState(weight=z(), mean_x=z(), mean_y=z(), cxx=z(), cxy=z(), comp_x=z(),
                      comp_y=z(), last_x=jnp.zeros((), jnp.float32))


def observe(params: ElasticParams, state: ElasticState, step: jax.Array, losses: jax.Array,
            tokens: jax.Array) -> ElasticState:
  """Adds step ``step``'s per-source losses to the fit. O(S), no branch, safe for any input.

  Args:
    params: the mixer's parameters.
    state: the fit so far.
    step: int scalar, the step (0-based) whose batch gave ``losses``.
    losses: ``[S]`` mean loss per source on the batch (anything where ``tokens == 0``).
    tokens: ``[S]`` tokens per source in the batch.

  Example (no forgetting, one source, equal tokens at steps 0 and 1):
    >>> p = ElasticParams(burn_in=0, forget=0.0)
    >>> s = observe(p, init(1), 0, jnp.array([3.0]), jnp.array([10.0]))
    >>> s = observe(p, s, 1, jnp.array([2.0]), jnp.array([10.0]))
    >>> rates(s)  # the loss fell by 1 over ln 2 - ln 1
    Array([1.442695], dtype=float32)
  """
  step = jnp.asarray(step, jnp.float32)
  losses = jnp.asarray(losses, jnp.float32)
  tokens = jnp.asarray(tokens, jnp.float32)
  valid = ((tokens >= TOKENS_RANGE[0]) & jnp.isfinite(tokens) & jnp.isfinite(losses)
           & (step >= jnp.asarray(params.burn_in, jnp.float32)))
  n = jnp.where(valid, jnp.minimum(tokens, TOKENS_RANGE[1]), 0.0)
  y = jnp.clip(jnp.where(valid, losses, 0.0), -LOSS_CLIP, LOSS_CLIP)
  x = jnp.log1p(jnp.maximum(step, 0.0))
  # Fade every point by ((t_last + 1) / (t + 1))^lambda: scale-free in log-time.
  fade = jnp.exp(-jnp.asarray(params.forget, jnp.float32) * jnp.maximum(x - state.last_x, 0.0))
  old = fade * state.weight
  total = old + n
  frac = jnp.where(n > 0, n / jnp.where(n > 0, total, 1.0), 0.0)
  dx, dy = x - state.mean_x, y - state.mean_y
  keep = n * jnp.where(n > 0, old / jnp.where(n > 0, total, 1.0), 0.0)
  mean_x, comp_x = _kahan_add(state.mean_x, state.comp_x, frac * dx)
  mean_y, comp_y = _kahan_add(state.mean_y, state.comp_y, frac * dy)
  return ElasticState(weight=total, mean_x=mean_x, mean_y=mean_y, comp_x=comp_x, comp_y=comp_y,
                      cxx=fade * state.cxx + keep * dx * dx,
                      cxy=fade * state.cxy + keep * dx * dy, last_x=jnp.maximum(x, state.last_x))


def _kahan_add(total: jax.Array, comp: jax.Array, value: jax.Array):
  """``total + value`` with Kahan's compensation ``comp``; returns the new total and compensation."""
  corrected = value - comp
  new = total + corrected
  return new, (new - total) - corrected


def known(state: ElasticState) -> jax.Array:
  """``[S]`` bool: whether each source's rate is defined (points at two distinct steps at least)."""
  return state.cxx > _CXX_MIN


def rates(state: ElasticState) -> jax.Array:
  """``b_s = -C_xy / C_xx``: the fall of each source's loss per unit of ``ln t``, ``[S]``.

  NaN where unknown (:func:`known`).
  """
  ok = known(state)
  return jnp.where(ok, -state.cxy / jnp.where(ok, state.cxx, 1.0), jnp.nan)


def distribution(params: ElasticParams, state: ElasticState, allowed: jax.Array) -> jax.Array:
  """The elastic mixture on the allowed sources, ``[S]`` float32, 0 off ``A``.

  ``pi_s = mu / K + (1 - mu) b_s^+ / sum_A b^+`` (see the module docstring). ``allowed`` (``[S]``
  bool) must have at least one True.

  Example: rates (3, 1, unknown) on three allowed sources with ``mu = 0.5``: the unknown one counts
  with the mean rate 2, so ``pi = 1/6 + (3, 1, 2) / 12 = (5, 3, 4) / 12``.
  """
  allowed = jnp.asarray(allowed, bool)
  k = jnp.maximum(jnp.sum(allowed), 1).astype(jnp.float32)
  r_S = jnp.maximum(rates(state), 0.0)                   # NaN where unknown stays NaN
  has = allowed & known(state)
  mean_rate = jnp.sum(jnp.where(has, r_S, 0.0)) / jnp.maximum(jnp.sum(has), 1)
  r_S = jnp.where(allowed, jnp.where(has, r_S, mean_rate), 0.0)
  total = jnp.sum(r_S)
  uniform_S = jnp.where(allowed, 1.0 / k, 0.0)
  prop_S = jnp.where(total > 0, r_S / jnp.where(total > 0, total, 1.0), uniform_S)
  mu = jnp.asarray(params.uniform_mix, jnp.float32)
  return (mu * uniform_S + (1.0 - mu) * prop_S).astype(jnp.float32)


def mixer(*, uniform_mix: float = 0.5, burn_in: int = 100, forget: float = 1.0) -> Mixer:
  """Mixer ``"elastic"``: the log-time fit observed at every step, each phase's mixture
  :func:`distribution` over the region's allowed sources (then projected onto the region by the
  engine); phases labelled ``"elastic"``. Logs ``log_rate`` ``[S]`` (NaN while unknown).

  Args: ``uniform_mix``, ``burn_in`` and ``forget``, :class:`ElasticParams`'s.
  """
  try:
    params = ElasticParams(uniform_mix=uniform_mix, burn_in=burn_in, forget=forget)
  except (TypeError, ValueError) as e:
    raise type(e)(str(e).removeprefix("elastic.")) from None

  def observe_step(state: ElasticState, obs: Observation) -> ElasticState:
    return observe(params, state, obs.step, obs.losses_S, obs.tokens_S)

  def decide(state: ElasticState, d: Decision):
    return distribution(params, state, d.upper_S > 0), "elastic", state

  return Mixer(init=init, observe=observe_step, decide=decide,
               metrics=lambda state: {"log_rate": rates(state)}, labels=("elastic",))

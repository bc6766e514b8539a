"""The elastic mixer: its log-time fit against numpy's weighted least squares, its float32
stability over a 200K-step run, its distribution on hand-worked numbers, and strategy "elastic"
through the curriculum's interface."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import curriculum
from andrea_jax.curriculum import elastic
from andrea_jax.sources import SOURCES


def test_params_are_validated():
  with pytest.raises(ValueError, match=r"elastic.uniform_mix must be in \[0, 1\], got 1.5"):
    elastic.ElasticParams(uniform_mix=1.5)
  with pytest.raises(ValueError, match="elastic.burn_in must be >= 0, got -1"):
    elastic.ElasticParams(burn_in=-1)
  with pytest.raises(TypeError, match="elastic.burn_in must be an integer, got 2.0"):
    elastic.ElasticParams(burn_in=2.0)
  with pytest.raises(ValueError, match="elastic.forget must be finite, got nan"):
    elastic.ElasticParams(forget=math.nan)
  with pytest.raises(TypeError, match="elastic.forget must be a number, got True"):
    elastic.ElasticParams(forget=True)
  c = curriculum.curriculum_config(mixer="elastic")
  c.mixer.uniform_mix = -0.25
  with pytest.raises(ValueError,
                     match=r"curriculum.mixer.uniform_mix must be in \[0, 1\], got -0.25"):
    curriculum.spec_from_config(c)
  c = curriculum.curriculum_config(mixer="elastic")
  with c.unlocked():
    c.mixer.burnin = 3
  with pytest.raises(ValueError, match=r"curriculum.mixer has fields \['burnin'\] that mixer "
                                       r"'elastic' does not take"):
    curriculum.spec_from_config(c)
  spec = curriculum.spec_from_config(curriculum.curriculum_config(mixer="elastic",
                                                                  uniform_mix=0.25))
  assert spec.mixer_name == "elastic"
  assert dict(spec.mixer_set.keys[0][1]) == {"uniform_mix": 0.25, "burn_in": 100, "forget": 1.0}


def _reference_rates(steps, losses, tokens, burn_in, forget):
  """``-slope`` of numpy's weighted least-squares line through ``(ln(t + 1), loss)`` per source,
  the weight of a point from step ``t'`` being ``tokens ((t' + 1) / (t_last + 1))^forget``."""
  last = steps[-1]
  out = []
  for s in range(losses.shape[1]):
    ok = (tokens[:, s] > 0) & np.isfinite(losses[:, s]) & (steps >= burn_in)
    w = tokens[ok, s] * ((steps[ok] + 1.0) / (last + 1.0)) ** forget
    # np.polyfit minimises sum (w_i r_i)^2: pass the square roots of the weights.
    slope, _ = np.polyfit(np.log1p(steps[ok]), losses[ok, s], 1, w=np.sqrt(w))
    out.append(-slope)
  return np.array(out)


@pytest.mark.parametrize("forget", [0.0, 1.0, 2.5])
def test_rates_match_weighted_least_squares(maybe_jit, forget):
  rng = np.random.default_rng(0)
  # Irregular steps (gaps), a burn-in, a source without tokens on some steps and a NaN loss where a
  # source had no tokens (ignored), tokens of very different sizes.
  steps = np.sort(rng.choice(np.arange(0, 400), 120, replace=False))
  num = 4
  losses = 3.0 - np.array([0.1, 0.3, 0.0, 0.5]) * np.log1p(steps)[:, None] + 0.05 * rng.normal(
      size=(len(steps), num))
  tokens = rng.integers(1, 300, size=(len(steps), num)).astype(np.float64)
  tokens[::3, 2] = 0
  losses[::3, 2] = np.nan
  params = elastic.ElasticParams(burn_in=30, forget=forget)
  observe = maybe_jit(elastic.observe)
  state = elastic.init(num)
  for t, l, n in zip(steps, losses, tokens):
    state = observe(params, state, jnp.int32(t), jnp.asarray(l, jnp.float32),
                    jnp.asarray(n, jnp.float32))
  expected = _reference_rates(steps, losses, tokens, 30, forget)
  np.testing.assert_allclose(elastic.rates(state), expected, rtol=2e-3, atol=2e-4)
  assert np.all(elastic.known(state))


def test_exact_power_law_over_a_long_run_in_float32():
  """Losses exactly ``a_s - b_s ln(t + 1)`` over 200K steps: the centred fit returns ``b_s`` to
  float32 precision (raw sums of ``x`` and ``x^2`` would cancel catastrophically here)."""
  b = jnp.array([0.05, 0.2, 0.8], jnp.float32)
  params = elastic.ElasticParams(burn_in=100, forget=1.0)

  def body(state, t):
    losses = 4.0 - b * jnp.log1p(t.astype(jnp.float32))
    return elastic.observe(params, state, t, losses, jnp.full((3,), 2048.0)), None

  state, _ = jax.jit(lambda: jax.lax.scan(body, elastic.init(3), jnp.arange(200_000)))()
  np.testing.assert_allclose(elastic.rates(state), b, rtol=2e-3)


def test_nothing_is_known_before_two_distinct_steps():
  params = elastic.ElasticParams(burn_in=5, forget=0.0)
  s = elastic.init(2)
  for t in range(6):                       # steps 0-4 are burn-in, step 5 is the first point
    s = elastic.observe(params, s, t, jnp.array([3.0, 2.0]), jnp.array([10.0, 10.0]))
  assert not np.any(elastic.known(s)) and np.all(np.isnan(elastic.rates(s)))
  # Garbage (an infinite loss, negative tokens) is ignored, not absorbed.
  s = elastic.observe(params, s, 6, jnp.array([jnp.inf, 2.5]), jnp.array([10.0, -4.0]))
  assert not np.any(elastic.known(s))
  s = elastic.observe(params, s, 7, jnp.array([2.0, 1.0]), jnp.array([10.0, 10.0]))
  np.testing.assert_allclose(elastic.rates(s), 1.0 / (math.log(8) - math.log(6)), rtol=1e-5)


def _state(rates, known=None):
  rates = np.asarray(rates, np.float32)
  known = np.ones(len(rates), bool) if known is None else np.asarray(known)
  z = jnp.zeros(len(rates), jnp.float32)
  return elastic.ElasticState(weight=z + 1, mean_x=z, mean_y=z,
                              cxx=jnp.asarray(np.where(known, 1.0, 0.0), jnp.float32),
                              cxy=jnp.asarray(np.where(known, -rates, 0.0), jnp.float32),
                              comp_x=z, comp_y=z, last_x=jnp.float32(0))


def test_distribution_by_hand(maybe_jit):
  dist = maybe_jit(elastic.distribution)
  half = elastic.ElasticParams(uniform_mix=0.5)
  everyone = jnp.ones(3, bool)
  # Rates (3, 1, unknown): the unknown source counts with the mean known rate, 2.
  np.testing.assert_allclose(dist(half, _state([3, 1, 0], [1, 1, 0]), everyone) * 12, [5, 3, 4],
                             rtol=1e-6)
  # A negative rate counts as 0; an excluded source gets nothing and does not count in K.
  np.testing.assert_allclose(
      dist(half, _state([3, -1, 1, 5]), jnp.array([True, True, True, False])),
      [0.5 / 3 + 0.5 * 3 / 4, 0.5 / 3, 0.5 / 3 + 0.5 / 4, 0.0], rtol=1e-6)
  # mu = 0: purely proportional; mu = 1: uniform whatever the rates.
  np.testing.assert_allclose(dist(elastic.ElasticParams(uniform_mix=0.0), _state([1, 3]),
                                  jnp.ones(2, bool)), [0.25, 0.75], rtol=1e-6)
  np.testing.assert_allclose(dist(elastic.ElasticParams(uniform_mix=1.0), _state([1, 3]),
                                  jnp.ones(2, bool)), [0.5, 0.5], rtol=1e-6)
  # No positive known rate (nothing observed, or every rate <= 0): uniform on the allowed.
  np.testing.assert_allclose(dist(half, elastic.init(3), jnp.array([True, False, True])),
                             [0.5, 0.0, 0.5])
  np.testing.assert_allclose(dist(half, _state([-1, -2]), jnp.ones(2, bool)), [0.5, 0.5])


_update = jax.jit(curriculum.update)


def _drive(spec, num_steps, loss_fn):
  """Runs the curriculum as the trainer does; returns the weights each step's batch used."""
  state = curriculum.init(spec, jax.random.key(3))
  snapshots = {-1: jax.tree.map(np.asarray, curriculum.schedule(state))}
  used = []
  for t in range(num_steps):
    w = curriculum.weights_at(snapshots[max(t - 1 - spec.decision_lag, -1)], t)
    used.append(w)
    tokens = np.floor(w * 64) * 64.0
    losses = np.where(tokens > 0, loss_fn(t), np.nan)
    state = _update(spec, state, t, jnp.asarray(losses, jnp.float32),
                    jnp.asarray(tokens, jnp.float32))
    snapshots[t] = jax.tree.map(np.asarray, curriculum.schedule(state))
  return np.stack(used), state


def _full_simplex_config(**fields):
  c = curriculum.curriculum_config(curriculum.single_geometry(
      curriculum.andrea_geometries(2000, 0.01), "v2_firehose"))
  for k, v in fields.items():
    c[k] = v
  return c


def test_strategy_elastic_through_the_curriculum():
  """Losses ``4 - b_s ln(t + 1)`` on the full simplex: uniform until the burn-in's first phase
  decision, then every phase is ``mu / 16 + (1 - mu) b / sum b`` (worked out from ``b``)."""
  c = _full_simplex_config(mixer=curriculum.mixer_config("elastic", uniform_mix=0.5, burn_in=50,
                                                        forget=1.0))
  spec = curriculum.spec_from_config(c)
  b = np.linspace(0.05, 0.8, 16)
  used, state = _drive(spec, 300, lambda t: 4.0 - b * math.log1p(t))
  np.testing.assert_allclose(used[:50], 1 / 16, rtol=1e-5)
  expected = 0.5 / 16 + 0.5 * b / b.sum()
  np.testing.assert_allclose(used[150:], np.broadcast_to(expected, used[150:].shape), atol=2e-4)
  assert spec.labels[int(state.labels[1])] == "elastic"
  m = curriculum.metrics(spec, state)
  np.testing.assert_allclose(m["log_rate"], b, rtol=1e-3)


def test_strategy_elastic_respects_the_region():
  """Under ANDREA's polish region (hermes3-general >= 0.7, repo-docs* excluded, dictionary <=
  0.25) the elastic mixture is projected: the floors and exclusions hold on every step."""
  c = curriculum.curriculum_config(curriculum.single_geometry(
      curriculum.andrea_geometries(2000, 0.01), "v3_polish"), mixer="elastic")
  spec = curriculum.spec_from_config(c)
  b = np.linspace(0.05, 0.8, 16)
  used, _ = _drive(spec, 250, lambda t: 4.0 - b * math.log1p(t))
  np.testing.assert_allclose(used.sum(axis=1), 1.0, atol=1e-5)
  assert np.all(used[:, SOURCES.index("hermes3-general")] >= 0.7 - 1e-6)
  assert np.all(used[:, SOURCES.index("repo-docs")] == 0)
  assert np.all(used[:, SOURCES.index("repo-docstrings")] == 0)
  # Past the burn-in the 0.3 left is shared by rate: extra-06 (the fastest) above extra-01.
  late = used[200:]
  assert np.all(late[:, SOURCES.index("extra-06")] > late[:, SOURCES.index("extra-01")])

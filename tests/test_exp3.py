"""The EXP3 mixer (ODM): exploration floor, reward bookkeeping and distribution on hand-worked
numbers, concentration on the best arm of a stationary problem, and strategy "exp3" through the
curriculum's interface (weights on the region, every step observed, decisions per phase)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import curriculum
from andrea_jax.curriculum import exp3
from andrea_jax.sources import POLISH_EXCLUDED, SOURCES, WARMUP_SOURCES


def test_exploration_floor(maybe_jit):
  eps = maybe_jit(exp3.exploration)
  np.testing.assert_allclose(eps(1, 16), 1 / 16, rtol=1e-6)            # sqrt(ln16/16) > 1/16
  np.testing.assert_allclose(eps(100, 16), math.sqrt(math.log(16) / 1600), rtol=1e-6)
  np.testing.assert_allclose(eps(0, 16), 1 / 16, rtol=1e-6)            # eps_0 = 1/K
  np.testing.assert_allclose(eps(7, 1), 0.0, atol=0)                   # one arm: no exploration
  # The floor reaches 1/K until t = K ln K, then decays as t^-1/2.
  np.testing.assert_allclose(eps(44, 16), 1 / 16, rtol=1e-6)           # 16 ln 16 = 44.4
  np.testing.assert_allclose(eps(400, 16) / eps(100, 16), 0.5, rtol=1e-6)


def test_params_are_validated():
  with pytest.raises(ValueError, match=r"exp3.smoothing must be in \[0, 1\), got 1.0"):
    exp3.Exp3Params(smoothing=1.0)
  with pytest.raises(ValueError, match="exp3.lr_scale must be >= 0, got -0.5"):
    exp3.Exp3Params(lr_scale=-0.5)
  with pytest.raises(TypeError, match="exp3.lr_scale must be a number, got '1'"):
    exp3.Exp3Params(lr_scale="1")
  c = curriculum.curriculum_config(mixer="exp3")
  c.mixer.smoothing = float("nan")
  with pytest.raises(ValueError, match="curriculum.mixer.smoothing must be finite, got nan"):
    curriculum.spec_from_config(c)
  c.mixer.smoothing = 1.0
  with pytest.raises(ValueError, match=r"curriculum.mixer.smoothing must be in \[0, 1\), got 1.0"):
    curriculum.spec_from_config(c)
  c = curriculum.curriculum_config(mixer="exp3", lr_scale=0.1)
  spec = curriculum.spec_from_config(c)
  assert spec.mixer_name == "exp3" and dict(spec.mixer_set.keys[0][1])["lr_scale"] == 0.1


def test_reward_bookkeeping_by_hand(maybe_jit):
  params = exp3.Exp3Params(smoothing=0.5)
  observe = maybe_jit(exp3.observe)
  s = exp3.init(3)
  # Step 1: source 0 has all 30 tokens under weight 0.75; source 1 (weight 0.25) got no row; source
  # 2 is excluded (its loss, even finite, is ignored).
  s = observe(params, s, jnp.array([2.0, jnp.nan, 9.0]), jnp.array([30.0, 0.0, 0.0]),
              jnp.array([0.75, 0.25, 0.0]))
  np.testing.assert_allclose(s.smoothed_loss, [2.0, 0.0, 0.0])
  np.testing.assert_array_equal(s.seen, [True, False, False])
  np.testing.assert_allclose(s.cumulative, [2.0 * 1.0 / 0.75, 0.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(s.plays, [1, 1, 0])
  assert int(s.steps) == 1
  # Step 2: half the tokens each under weights (0.2, 0.8): source 0 is over-represented (share 0.5
  # for weight 0.2), source 1 under-represented. Smoothed: 0.5 * 2 + 0.5 * 4 = 3 and (first) 1.
  s = observe(params, s, jnp.array([4.0, 1.0, 9.0]), jnp.array([20.0, 20.0, 0.0]),
              jnp.array([0.2, 0.8, 0.0]))
  np.testing.assert_allclose(s.smoothed_loss, [3.0, 1.0, 0.0])
  np.testing.assert_allclose(s.cumulative, [8 / 3 + 3.0 * 0.5 / 0.2, 1.0 * 0.5 / 0.8, 0.0],
                             rtol=1e-6)
  np.testing.assert_allclose(s.plays, [2, 2, 0])
  # A skipped (non-finite) step arrives with no tokens: nothing is counted.
  s2 = observe(params, s, jnp.array([jnp.nan, jnp.inf, 1.0]), jnp.zeros(3),
               jnp.array([0.2, 0.8, 0.0]))
  for a, b in zip(jax.tree.leaves(s2), jax.tree.leaves(s)):
    np.testing.assert_array_equal(a, b)
  # Scores: M G_s / m_s with M = 2 = m_s for both played sources; the unplayed third, if it were
  # allowed, gets their mean.
  g = exp3.scores(s, jnp.array([True, True, True]))
  g0, g1 = 8 / 3 + 7.5, 0.625
  np.testing.assert_allclose(g, [g0, g1, (g0 + g1) / 2], rtol=1e-6)


def test_scores_compare_mean_rewards_over_the_same_horizon():
  s = exp3.Exp3State(smoothed_loss=jnp.ones(2), seen=jnp.ones(2, bool),
                     cumulative=jnp.array([10.0, 3.0]), plays=jnp.array([10.0, 5.0]),
                     steps=jnp.int32(10))
  # The second source joined half-way: its 3 over 5 steps scores 6 over the run's 10.
  np.testing.assert_allclose(exp3.scores(s, jnp.array([True, True])), [10.0, 6.0], rtol=1e-6)


def test_distribution_by_hand(maybe_jit):
  s = exp3.Exp3State(smoothed_loss=jnp.ones(4), seen=jnp.ones(4, bool),
                     cumulative=jnp.array([1.0, 2.0, 0.0, 50.0]), plays=jnp.full((4,), 5.0),
                     steps=jnp.int32(5))
  allowed = jnp.array([True, True, True, False])
  pi = maybe_jit(exp3.distribution)(exp3.Exp3Params(lr_scale=3.0), s, 4, allowed)
  # K = 3: eps_4 = sqrt(ln 3 / 12) = 0.30257 < 1/3; eps_3 = sqrt(ln 3 / 9) = 0.349 > 1/3, so the
  # rate is 3 * (1/3) = 1 and the logits are the scores (1, 2, 0).
  eps = math.sqrt(math.log(3) / 12)
  z = math.exp(1) + math.exp(2) + 1
  want = [(1 - 3 * eps) * math.exp(1) / z + eps, (1 - 3 * eps) * math.exp(2) / z + eps,
          (1 - 3 * eps) / z + eps, 0.0]
  np.testing.assert_allclose(pi, want, rtol=1e-5)
  assert abs(float(jnp.sum(pi)) - 1) < 1e-6
  # Rate 0 is the uniform distribution on the allowed sources; huge scores stay finite.
  np.testing.assert_allclose(exp3.distribution(exp3.Exp3Params(lr_scale=0.0), s, 4, allowed),
                             [1 / 3, 1 / 3, 1 / 3, 0.0], rtol=1e-6)
  big = s.replace(cumulative=jnp.array([1e30, -1e30, 0.0, 0.0]))
  pi = exp3.distribution(exp3.Exp3Params(), big, 10**6, allowed)
  assert np.all(np.isfinite(pi)) and float(pi[0]) > 0.99 and float(pi[1]) > 0


def test_concentrates_on_the_best_arm_of_a_stationary_problem():
  """Five arms with fixed mean losses (the reward); each step a batch of 32 rows is drawn from the
  mixture, the losses are noisy, the mixture is recomputed every step. EXP3 must end on the arm of
  highest mean with the rest at the exploration floor."""
  means = jnp.array([1.0, 1.5, 2.0, 1.2, 0.8])
  params = exp3.Exp3Params(smoothing=0.9, lr_scale=1.0)
  allowed = jnp.ones((5,), bool)
  num_steps = 3000

  def step(state, inputs):
    t, key = inputs
    k_rows, k_noise = jax.random.split(key)
    pi = exp3.distribution(params, state, t, allowed)
    rows = jnp.bincount(jax.random.categorical(k_rows, jnp.log(pi), shape=(32,)), length=5)
    losses = means + 0.3 * jax.random.normal(k_noise, (5,)) / jnp.sqrt(jnp.maximum(rows, 1))
    state = exp3.observe(params, state, jnp.where(rows > 0, losses, jnp.nan),
                         64.0 * rows.astype(jnp.float32), pi)
    return state, pi

  keys = jax.random.split(jax.random.key(0), num_steps)
  _, pis = jax.jit(lambda: jax.lax.scan(step, exp3.init(5), (jnp.arange(1, num_steps + 1), keys)))()
  final = np.asarray(pis[-1])
  floor = math.sqrt(math.log(5) / (5 * num_steps))
  assert final.argmax() == 2
  assert final[2] > 1 - 4 * floor - 0.02
  np.testing.assert_allclose(np.delete(final, 2), floor, rtol=0.5)
  # It got there early: the best arm holds most of the mass over the last two thirds.
  assert float(np.mean(pis[1000:, 2])) > 0.8


def _spec(**fields):
  c = curriculum.curriculum_config(mixer="exp3")
  for k, v in fields.items():
    c[k] = v
  return curriculum.spec_from_config(c)


_update = jax.jit(curriculum.update)


def test_strategy_exp3_through_the_curriculum():
  """The tiny default geometries (warmup, firehose at 200, polish at 1126): every phase after the
  first is an EXP3 phase on its region, and the source with the highest loss gains weight."""
  spec = _spec()
  state = curriculum.init(spec, jax.random.key(1))
  hot = SOURCES.index("extra-04")   # not a warmup source: enters at the firehose
  base = 2.0 + 0.05 * np.arange(16)
  base[hot] = 4.0
  warm = np.array([s in WARMUP_SOURCES for s in SOURCES])
  polish_out = np.array([s in POLISH_EXCLUDED for s in SOURCES])
  snapshots = {-1: jax.tree.map(np.asarray, curriculum.schedule(state))}
  used = []
  for t in range(1300):
    w = curriculum.weights_at(snapshots[max(t - 1 - spec.decision_lag, -1)], t)
    used.append(w)
    tokens = np.floor(w * 32) * 128.0
    losses = np.where(tokens > 0, base, np.nan)
    state = _update(spec, state, t, jnp.asarray(losses, jnp.float32),
                    jnp.asarray(tokens, jnp.float32))
    snapshots[t] = jax.tree.map(np.asarray, curriculum.schedule(state))
  used = np.stack(used)
  np.testing.assert_allclose(used.sum(axis=1), 1.0, atol=1e-5)
  assert np.all(used >= 0)
  assert np.all(used[:200, ~warm] == 0)                       # v2 warmup: the seven sources only
  assert np.all(used[1126:, polish_out] == 0)                 # polish: repo-docs* excluded
  assert np.all(used[1126:, SOURCES.index("hermes3-general")] >= 0.7 - 1e-6)
  assert np.all(used[1126:, SOURCES.index("dictionary")] <= 0.25 + 1e-6)
  assert spec.labels[int(state.labels[1])] == "exp3"
  # Firehose, late: the high-loss source is the heaviest, above the uniform 1/16.
  late = used[900:1100]
  assert np.all(late.argmax(axis=1) == hot) and late[:, hot].min() > 1 / 16
  # The statistics saw every step (M counts steps with tokens).
  assert int(state.mixer[0].steps) == 1300


def test_a_tiny_weight_with_tokens_keeps_every_number_finite():
  # pi = 1e-33 with 512 tokens: the importance weight 1/pi alone is 1e33; with a loss of 1e6 the
  # reward would overflow float32 and the softmax of inf is NaN.
  s = exp3.init(2)
  for _ in range(3):
    s = exp3.observe(exp3.Exp3Params(), s, jnp.array([1e6, 1.0]), jnp.array([512.0, 512.0]),
                     jnp.array([1e-33, 1.0]))
  assert np.isfinite(np.asarray(s.cumulative)).all()
  assert float(s.cumulative[0]) == pytest.approx(3 * exp3.REWARD_CLIP, rel=1e-6)
  pi = np.asarray(exp3.distribution(exp3.Exp3Params(), s, 10, jnp.array([True, True])))
  assert np.isfinite(pi).all() and pi.sum() == pytest.approx(1.0, abs=1e-6)
  assert pi[0] > pi[1] >= exp3.exploration(10, 2)   # the huge reward leads; the floor holds

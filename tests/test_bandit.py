"""The bandit: reward and index on hand-worked numbers, optimism, exclusions, extreme inputs."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andrea_jax.curriculum import bandit


def _state(counts, progress_estimates):
  counts = jnp.asarray(counts, jnp.float32)
  s = bandit.init(len(counts))
  return s.replace(counts=counts, progress=counts * jnp.asarray(progress_estimates, jnp.float32))


def test_index_hand_worked(maybe_jit):
  # N = (e^2 - 2, 1, 1), hat p = (1, 1, 3) 1e-4. The N-weighted median of |hat p| is 1e-4 = sigma;
  # kappa = 1: hat r = (1/2 (1 + 1/2), same, 1/2 (1 + 3/4)) = (0.75, 0.75, 0.875).
  # sum N = e^2, ln = 2; n0 -> 0, c = 1, n_min = 1: bonus_s = sqrt(2 / (N_s + 1)).
  p = bandit.BanditParams(exploration=1.0, min_count=1.0, prior_count=1e-9, reward_knee=1.0)
  s = _state([math.e ** 2 - 2, 1.0, 1.0], [1e-4, 1e-4, 3e-4])
  np.testing.assert_allclose(bandit.reward_scale(s), 1e-4, rtol=1e-6)
  np.testing.assert_allclose(bandit.rewards(p, s), [0.75, 0.75, 0.875], rtol=1e-6)
  index = maybe_jit(lambda s: bandit.ucb_index(p, s))(s)
  want = [0.75 + math.sqrt(2 / (math.e ** 2 - 1)), 0.75 + 1.0, 0.875 + 1.0]
  np.testing.assert_allclose(index, want, rtol=1e-5)


def test_index_with_prior_hand_worked():
  # One observed source (N = 3, hat p = 2e-4 = sigma: hat r = 3/4), one never observed.
  # n0 = 0.5, c = 0.5, n_min = 1, ln max(3, e) = ln 3:
  # I_0 = (3 * 0.75 + 0.5) / 3.5 + 0.5 sqrt(ln 3 / 4);  I_1 = 0.5 / 0.5 + 0.5 sqrt(ln 3 / 1).
  p = bandit.BanditParams(exploration=0.5, min_count=1.0, prior_count=0.5, reward_knee=1.0)
  index = bandit.ucb_index(p, _state([3.0, 0.0], [2e-4, 0.0]))
  want = [2.75 / 3.5 + 0.5 * math.sqrt(math.log(3) / 4), 1.0 + 0.5 * math.sqrt(math.log(3))]
  np.testing.assert_allclose(index, want, rtol=1e-6)


def test_never_observed_is_finite_and_optimistic():
  p = bandit.BanditParams(exploration=0.2, min_count=0.5)
  fresh = bandit.ucb_index(p, bandit.init(4))
  # Nothing observed: mean = n0 / n0 = 1, ln max(0, e) = 1, bonus = c sqrt(1 / n_min).
  np.testing.assert_allclose(fresh, np.full(4, 1 + 0.2 * math.sqrt(1 / 0.5)), rtol=1e-6)
  # Sources 0-2 observed a lot, one of them with a huge progress; source 3 never: still above.
  s = _state([100.0, 50.0, 10.0, 0.0], [1e-3, 1e-6, 1e-6, 0.0])
  index = bandit.ucb_index(p, s)
  assert np.all(np.isfinite(index))
  assert index[3] > index[:3].max()


def test_learning_progress_and_rescale_hand_worked():
  # 3.0 -> 2.9 between windows of 100 and 300 tokens: 0.1 nats over (100 + 300) / 2 tokens.
  np.testing.assert_allclose(bandit.learning_progress(3.0, 100.0, 2.9, 300.0), 0.1 / 200, rtol=1e-5)
  # Fewer than one token between midpoints counts as one token.
  np.testing.assert_allclose(bandit.learning_progress(1.0, 0.2, 0.5, 0.2), 0.5, rtol=1e-6)
  # r = (1 + p / (|p| + kappa sigma)) / 2.
  np.testing.assert_allclose(bandit.rescale(2e-4, 1e-4, 2.0), 0.75, rtol=1e-6)
  np.testing.assert_allclose(bandit.rescale(-3e-4, 1e-4, 1.0), 0.125, rtol=1e-6)
  np.testing.assert_allclose(bandit.rescale(0.0, 0.0, 1.0), 0.5)


def test_weighted_median():
  np.testing.assert_allclose(bandit.weighted_median(jnp.array([1.0, 2.0, 10.0]),
                                                    jnp.array([1.0, 3.0, 1.0])), 2.0)
  np.testing.assert_allclose(bandit.weighted_median(jnp.array([5.0, 1.0]),
                                                    jnp.array([0.6, 0.4])), 5.0)
  assert float(bandit.weighted_median(jnp.array([1.0, 2.0]), jnp.zeros(2))) == 0.0


def test_close_window_hand_worked(maybe_jit):
  p = bandit.BanditParams(discount=0.5, reward_knee=1.0)
  observe = maybe_jit(bandit.observe)
  close = maybe_jit(lambda s: bandit.close_window(p, s))
  s = bandit.init(2)
  # Window 1, two steps: A has 100 tokens at 3.0 then 300 at 2.0 (token mean 2.25, 400 tokens);
  # B is absent (NaN loss, 0 tokens) then has 100 tokens at 4.0.
  s = observe(s, jnp.array([3.0, jnp.nan]), jnp.array([100.0, 0.0]))
  s = observe(s, jnp.array([2.0, 4.0]), jnp.array([300.0, 100.0]))
  np.testing.assert_allclose(s.win_loss, [2.25, 4.0], rtol=1e-6)
  s = close(s)
  np.testing.assert_allclose(s.counts, [0.0, 0.0])  # no reference yet: no progress
  np.testing.assert_allclose(s.ref_tokens, [400.0, 100.0])
  # Window 2, one step: A 200 tokens at 2.05, B 300 tokens at 3.9 (500 tokens per step).
  s = close(observe(s, jnp.array([2.05, 3.9]), jnp.array([200.0, 300.0])))
  between = np.array([(400 + 200) / 2, (100 + 300) / 2])
  p_ab = np.array([0.2, 0.1]) / between                # nats per token between midpoints
  np.testing.assert_allclose(s.last_progress, p_ab, rtol=1e-4)
  nu = between / 500                                    # steps' worth: (0.6, 0.4)
  np.testing.assert_allclose(s.counts, nu, rtol=1e-6)
  np.testing.assert_allclose(s.progress, [0.2 / 500, 0.1 / 500], rtol=1e-4)  # the loss falls / tau
  np.testing.assert_allclose(bandit.estimates(s), p_ab, rtol=1e-4)
  sigma = p_ab[0]                                       # A holds 0.6 of the weight
  np.testing.assert_allclose(bandit.reward_scale(s), sigma, rtol=1e-6)
  np.testing.assert_allclose(bandit.rewards(p, s), 0.5 * (1 + p_ab / (p_ab + sigma)), rtol=1e-4)
  # An empty window only discounts: 0.5^1; the estimates stay.
  s2 = close(observe(s, jnp.array([jnp.nan, jnp.nan]), jnp.zeros(2)))
  np.testing.assert_allclose(s2.counts, 0.5 * nu, rtol=1e-6)
  np.testing.assert_allclose(bandit.estimates(s2), bandit.estimates(s), rtol=1e-6)
  np.testing.assert_allclose(s2.ref_loss, s.ref_loss)  # nothing seen: references kept


def test_all_rewards_equal_gives_one_half():
  p = bandit.BanditParams(discount=0.995, prior_count=0.01)
  s = bandit.init(3)
  for _ in range(4):
    s = bandit.close_window(p, bandit.observe(s, jnp.full(3, 2.0), jnp.full(3, 50.0)))
  np.testing.assert_allclose(bandit.rewards(p, s), 0.5)
  # Three windows with a progress (the first only sets references), one step each, a third each:
  counts = (1 / 3) * (1 + 0.995 + 0.995 ** 2)
  np.testing.assert_allclose(s.counts, counts, rtol=1e-5)
  np.testing.assert_allclose(bandit.means(p, s), (0.5 * counts + 0.01) / (counts + 0.01), rtol=1e-5)
  assert np.all(np.isfinite(bandit.ucb_index(p, s)))


def test_select_never_picks_an_excluded_source():
  p = bandit.BanditParams()
  s = _state([0.0, 10.0, 10.0], [0.0, 3e-4, 1e-4])  # source 0 unobserved: the highest index
  assert int(bandit.select(p, s, jnp.array([True, True, True]))) == 0
  assert int(bandit.select(p, s, jnp.array([False, True, True]))) == 1
  assert int(bandit.select(p, s, jnp.array([False, False, True]))) == 2


def test_discount_keeps_estimates_and_raises_bonuses():
  p = bandit.BanditParams()
  s = _state([800.0, 200.0], [3e-4, 1e-4])
  d = bandit.discount(s, 0.25)
  np.testing.assert_allclose(d.counts, [200.0, 50.0])
  np.testing.assert_allclose(bandit.estimates(d), [3e-4, 1e-4], rtol=1e-6)
  assert np.all(bandit.ucb_index(p, d) - bandit.means(p, d)
                > bandit.ucb_index(p, s) - bandit.means(p, s))


_EXTREME = st.sampled_from([0.0, 1.0, 3.5, -2.0, 1e30, -1e30, 1e-40, -1e-40, float("nan"),
                            float("inf"), float("-inf"), 3.4e38])
_TOKENS = st.sampled_from([0.0, 1.0, 256.0, 1e-40, 1e30, -5.0, float("nan"), float("inf"), 0.5])


@settings(max_examples=25, deadline=None)
@given(losses=st.lists(st.lists(_EXTREME, min_size=4, max_size=4), min_size=6, max_size=6),
       tokens=st.lists(st.lists(_TOKENS, min_size=4, max_size=4), min_size=6, max_size=6))
def test_extreme_inputs_stay_finite(losses, tokens):
  p = bandit.BanditParams()
  s = bandit.init(4)
  for i, (l, n) in enumerate(zip(losses, tokens)):
    s = _observe(s, jnp.asarray(l, jnp.float32), jnp.asarray(n, jnp.float32))
    if i % 2:
      s = _close(p, s)
  for name in ("counts", "progress", "ref_loss", "ref_tokens", "win_loss", "win_tokens"):
    assert np.all(np.isfinite(getattr(s, name))), name
  assert np.all(np.isfinite(_index(p, s)))
  r = _rewards(p, s)
  assert np.all((r >= 0) & (r <= 1))


_observe = jax.jit(bandit.observe)
_close = jax.jit(bandit.close_window)
_index = jax.jit(bandit.ucb_index)
_rewards = jax.jit(bandit.rewards)


def test_finds_the_best_source_one_per_round():
  """A classic bandit: all of each round's tokens go to the selected source.

  Source s's loss falls by rate_s per token (plus noise); the best source must be pulled almost
  always in the second half (discount 1: stationary), and regret per round must shrink.
  """
  rates = jnp.array([1.0, 3.0, 2.0, 0.5]) * 1e-5
  p = bandit.BanditParams(discount=1.0, exploration=0.3)
  tokens_per_round = 1000.0

  def round_(carry, key):
    s, learned = carry
    arm = bandit.select(p, s, jnp.ones(4, bool))
    tokens = jax.nn.one_hot(arm, 4) * tokens_per_round
    losses = 5.0 - learned + 0.002 * jax.random.normal(key, (4,))
    s = bandit.close_window(p, bandit.observe(s, losses, tokens))
    return (s, learned + rates * tokens), arm

  keys = jax.random.split(jax.random.key(0), 2000)
  _, arms = jax.lax.scan(round_, (bandit.init(4), jnp.zeros(4)), keys)
  arms = np.asarray(arms)
  gap = (rates.max() - rates)[arms]
  assert gap[1000:].sum() < 0.5 * gap[:1000].sum()
  assert np.mean(arms[1000:] == 1) > 0.9


@pytest.mark.parametrize("field,value,err,msg", [
    ("discount", 1.5, ValueError, "bandit.discount must be in (0, 1], got 1.5"),
    ("exploration", -1.0, ValueError, "bandit.exploration must be >= 0, got -1.0"),
    ("min_count", float("nan"), ValueError, "bandit.min_count must be finite, got nan"),
    ("reward_knee", "big", TypeError, "bandit.reward_knee must be a number, got 'big'"),
    ("pivot_discount", True, TypeError, "bandit.pivot_discount must be a number, got True"),
])
def test_params_validation(field, value, err, msg):
  with pytest.raises(err) as e:
    bandit.BanditParams(**{field: value})
  assert str(e.value) == msg


def test_params_are_a_pytree_and_hashable():
  p = bandit.BanditParams(exploration=0.7)
  leaves, tree = jax.tree.flatten(p)
  assert leaves == [getattr(p, f.name) for f in dataclasses.fields(p)]
  assert jax.tree.unflatten(tree, leaves) == p
  assert hash(p) == hash(bandit.BanditParams(exploration=0.7))


def test_a_tiny_reward_knee_keeps_rewards_finite():
  # kappa sigma_min = 1e-30 * 1e-20 underflows to 0 in float32: no progress must still read 1/2
  # (not 0/0), and the index of unobserved sources is the prior mean 1 plus the bonus.
  p = bandit.BanditParams(reward_knee=1e-30)
  s = bandit.init(3)
  np.testing.assert_allclose(bandit.rewards(p, s), 0.5)
  default = bandit.ucb_index(bandit.BanditParams(), s)
  np.testing.assert_allclose(bandit.ucb_index(p, s), default)
  # With progress, the squash saturates but stays in [0, 1].
  r = bandit.rewards(p, _state([1.0, 1.0, 1.0], [1e-4, 0.0, -1e-4]))
  np.testing.assert_allclose(r, [1.0, 0.5, 0.0])


def test_parameters_beyond_float32_are_refused():
  for field in ("prior_count", "reward_knee"):
    with pytest.raises(ValueError, match=f"bandit.{field} must be"):
      bandit.BanditParams(**{field: 1e300})


def test_an_empty_window_decays_nothing():
  # N <- gamma^L N over the L steps of the window: L = 0 leaves N as it is.
  p = bandit.BanditParams(discount=0.5)
  s = _state([0.5, 2.0], [1e-4, 1e-4])
  closed = bandit.close_window(p, s)
  np.testing.assert_array_equal(closed.counts, [0.5, 2.0])
  np.testing.assert_array_equal(closed.progress, s.progress)
  # One step in the window: one factor of gamma (no tokens, so no new observation).
  one = bandit.close_window(p, s.replace(win_steps=jnp.int32(1)))
  np.testing.assert_allclose(one.counts, [0.25, 1.0])


def test_observe_refuses_wrong_shapes():
  s = bandit.init(3)
  for losses, tokens in ((jnp.ones(1), jnp.ones(3)), (jnp.ones(3), jnp.ones(2))):
    with pytest.raises(ValueError, match=r"observe: losses and tokens must have shape \(3,\)"):
      bandit.observe(s, losses, tokens)

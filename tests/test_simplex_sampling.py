"""Uniform sampling of {l <= w <= u, sum w = 1}: closed-form marginals, paths against each other,
exact acceptance probabilities against hand-worked areas, binomial sums and Monte Carlo."""

from fractions import Fraction
from math import comb

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from andrea_jax.simplex import Region, acceptance_probabilities, sample_uniform
from andrea_jax.sources import WARMUP_SOURCES

# Fixed seeds make every test deterministic; alpha only says how far from the law a draw may look.
ALPHA = 1e-4

# sample_uniform runs one internal jit per (shapes, num, batch), with the method and the loop bounds
# traced. Tests whose subject is the sampling law run eagerly and under an outer jit (maybe_jit);
# the path-logic tests below call it directly: their code is compiled either way, and an outer jit
# per method would only add compilations. Traced bounds are covered by vmap and by a jitted scan
# over a table of regions.


def sampler(maybe_jit):
  """sample_uniform, eager or jitted (wrappers of one function share their compilations)."""
  return maybe_jit(sample_uniform, static_argnames=("num", "method", "min_acceptance", "batch",
                                                    "max_rounds", "chain_steps"))


def f32(region):
  return jnp.asarray(region.lower, jnp.float32), jnp.asarray(region.upper, jnp.float32)


def polish():
  return Region.from_bounds({"hermes3-general": 0.7}, {"dictionary": 0.25},
                            exclude=("repo-docs", "repo-docstrings"), label="v3_polish")


def test_plain_simplex_marginals_are_beta_1_n_minus_1(maybe_jit):
  # Uniform on the 15-simplex = Dirichlet(1, ..., 1): each w_i ~ Beta(1, 15).
  w, info = sampler(maybe_jit)(jax.random.key(0), jnp.zeros(16), jnp.ones(16), num=2000)
  w = np.asarray(w)
  assert int(info.path) == 0
  assert np.max(np.abs(w.sum(-1) - 1)) <= 1e-6 and np.all(w >= 0)
  pvalues = [stats.kstest(w[:, i], stats.beta(1, 15).cdf).pvalue for i in range(16)]
  assert min(pvalues) > ALPHA
  # A wrong law (e.g. Beta(1, 14)) is caught by the same test.
  assert stats.kstest(w[:, 0], stats.beta(1, 13).cdf).pvalue < ALPHA


def test_floor_shifted_simplex_marginals(maybe_jit):
  # Floors 0.5 + 0.2, no binding ceiling: w_i = l_i + (1 - 0.7) Beta(1, 15).
  r = Region.from_bounds({"hermes3-general": 0.5, "chat": 0.2})
  w, info = sampler(maybe_jit)(jax.random.key(1), *f32(r), num=2000)
  w = np.asarray(w, np.float64)
  assert int(info.path) == 0 and float(info.acceptance) == 1.0
  law = lambda i: stats.beta(1, 15, loc=r.lower[i], scale=0.3).cdf
  assert min(stats.kstest(w[:, i], law(i)).pvalue for i in range(16)) > ALPHA


def test_warmup_sub_simplex(maybe_jit):
  # Seven sources on a 6-simplex: Beta(1, 6) marginals; the nine others exactly 0.
  r = Region.from_bounds(only=WARMUP_SOURCES)
  w, _ = sampler(maybe_jit)(jax.random.key(2), *f32(r), num=2000)
  w = np.asarray(w)
  assert np.all(w[:, 7:] == 0)
  assert min(stats.kstest(w[:, i], stats.beta(1, 6).cdf).pvalue for i in range(7)) > ALPHA


def test_polish_region_samples_exactly_inside(maybe_jit):
  r = polish()
  lower, upper = f32(r)
  w, info = sampler(maybe_jit)(jax.random.key(3), lower, upper, num=2000)
  w = np.asarray(w)
  assert int(info.path) == 0  # the floor side accepts all but (1/6)^13 of its proposals
  assert np.all(w >= np.asarray(lower)) and np.all(w <= np.asarray(upper))  # exactly, no atol
  assert np.all(w[:, r.excluded] == 0)
  assert np.max(np.abs(w.astype(np.float64).sum(-1) - 1)) <= 1e-6
  # hermes3-general = 0.7 + 0.3 Beta(1, 13) (14 free sources); the dictionary cap removes a
  # (1/6)^13 ~ 1e-10 sliver of the shifted simplex, far below what a test can see.
  law = stats.beta(1, 13, loc=0.7, scale=0.3).cdf
  assert stats.kstest(w[:, 0].astype(np.float64), law).pvalue > ALPHA


# A five-source region where the caps bind on both sides (both accept ~41%), one source
# excluded. Every test on it draws 2000 samples, so eager calls share one compilation.
SMALL_LOWER = jnp.array([0.1, 0.0, 0.2, 0.05, 0.0])
SMALL_UPPER = jnp.array([0.5, 0.3, 0.6, 0.25, 0.0])


def assert_inside(w, lower, upper, atol_sum=1e-6):
  w, lower, upper = np.asarray(w), np.asarray(lower), np.asarray(upper)
  assert np.all(w >= lower) and np.all(w <= upper)  # exactly, no tolerance
  assert np.all(w[:, lower == upper] == lower[lower == upper])
  assert np.max(np.abs(w.astype(np.float64).sum(-1) - 1)) <= atol_sum


def test_rejection_sides_and_chain_agree():
  # Floor-side and ceiling-side rejection are two exact samplers of the same law; the chain must
  # agree with them coordinate by coordinate and along a mixed direction.
  f = sample_uniform
  draws = {}
  for i, method in enumerate(("floor", "ceiling", "chain")):
    w, info = f(jax.random.key(4 + i), SMALL_LOWER, SMALL_UPPER, num=2000, method=method)
    assert_inside(w, SMALL_LOWER, SMALL_UPPER)
    draws[method] = np.asarray(w)
    assert int(info.path) == {"floor": 0, "ceiling": 1, "chain": 2}[method]
  mix = np.array([1.0, -2.0, 0.5, 3.0, 0.0])
  for other in ("ceiling", "chain"):
    for i in range(4):
      assert stats.ks_2samp(draws["floor"][:, i], draws[other][:, i]).pvalue > ALPHA
    assert stats.ks_2samp(draws["floor"] @ mix, draws[other] @ mix).pvalue > ALPHA
  # The test can fail: the plain shifted simplex (no caps) is a different law.
  lower = np.asarray(SMALL_LOWER)
  rng = np.random.default_rng(0)
  uncapped = lower + (1 - lower.sum()) * rng.dirichlet(np.ones(4), 2000) @ np.eye(4, 5)
  assert stats.ks_2samp(draws["floor"][:, 1], uncapped[:, 1]).pvalue < ALPHA


def test_auto_picks_the_ceiling_side_when_it_accepts_more(maybe_jit):
  # Caps 0.07 on 16 sources: the floor side (mass 1) almost never fits, the ceiling side (mass
  # 16 * 0.07 - 1 = 0.12) almost always does.
  upper = jnp.full(16, 0.07, jnp.float32)
  w, info = sampler(maybe_jit)(jax.random.key(8), jnp.zeros(16), upper, num=2000)
  assert int(info.path) == 1
  assert float(info.acceptance_ceiling) > 0.99 > 1e-3 > float(info.acceptance_floor)
  assert_inside(w, jnp.zeros(16), upper)


def test_auto_falls_back_to_the_chain_when_both_sides_reject():
  # Eight sources capped at 0.03, seven open, one excluded: p_floor ~ 7e-5, p_ceiling ~ 3e-14.
  upper = jnp.array([0.03] * 8 + [1.0] * 7 + [0.0])
  w, info = sample_uniform(jax.random.key(9), jnp.zeros(16), upper, num=2000,
                               chain_steps=1000)
  assert int(info.path) == 2 and int(info.rounds) == 0
  assert float(info.acceptance) < 1e-3
  assert_inside(w, jnp.zeros(16), upper)
  # The chain leaves its start (all eight capped sources at the same value) and spreads them over
  # [0, 0.03].
  w = np.asarray(w)
  assert np.all(w[:, :8].min(0) < 0.003) and np.all(w[:, :8].max(0) > 0.027)


def test_bounded_rounds_end_in_the_chain():
  # One round of 4096 floor-side proposals yields ~1200 of the 2000 samples; the chain fills in.
  w, info = sample_uniform(jax.random.key(10), SMALL_LOWER, SMALL_UPPER, num=2000,
                               method="floor", max_rounds=1)
  assert int(info.path) == 2 and int(info.rounds) == 1
  assert_inside(w, SMALL_LOWER, SMALL_UPPER)


def test_single_point_regions():
  f = sample_uniform
  # Floors sum to 1: every sample is the floor vector, on every path, without NaN.
  lower = jnp.array([0.5, 0.25, 0.25, 0.0, 0.0])
  upper = jnp.array([1.0, 1.0, 0.25, 0.0, 0.3])
  for method in ("reject", "chain"):
    w, info = f(jax.random.key(11), lower, upper, num=2000, method=method)
    assert int(info.path) == {"reject": 0, "chain": 2}[method]
    np.testing.assert_allclose(w, np.broadcast_to(lower, (2000, 5)), atol=1e-7)
  # One source with room, the rest pinned: the single point (0.3, 0.7, 0, 0, 0).
  w, _ = f(jax.random.key(12), jnp.array([0.3, 0, 0, 0, 0]), jnp.array([0.3, 1, 0, 0, 0]),
           num=2000, method="reject")
  np.testing.assert_allclose(w, np.broadcast_to([0.3, 0.7, 0, 0, 0], (2000, 5)), atol=1e-7)


def test_float64_samples_sum_to_one():
  r = polish()
  with jax.enable_x64(True):
    w, _ = sample_uniform(jax.random.key(13), r.lower, r.upper, num=2000)
    assert w.dtype == jnp.float64
  w = np.asarray(w)
  assert np.max(np.abs(w.sum(-1) - 1)) <= 1e-12
  assert np.all(w >= r.lower) and np.all(w <= r.upper)


def test_vmap_over_a_batch_of_regions():
  regions = [Region.from_bounds(), Region.from_bounds(only=WARMUP_SOURCES), polish(),
             Region(np.zeros(16), np.full(16, 0.07))]
  lowers = jnp.stack([f32(r)[0] for r in regions])
  uppers = jnp.stack([f32(r)[1] for r in regions])
  keys = jax.random.split(jax.random.key(14), len(regions))
  f = jax.vmap(lambda k, l, u: sample_uniform(k, l, u, 64))
  w, info = f(keys, lowers, uppers)
  assert w.shape == (4, 64, 16)
  np.testing.assert_array_equal(info.path, [0, 0, 0, 1])
  for r, wr, lo, up in zip(regions, np.asarray(w), np.asarray(lowers), np.asarray(uppers)):
    assert np.all(wr >= lo) and np.all(wr <= up)
    assert np.all(wr[:, r.upper == 0] == 0)
    assert np.max(np.abs(wr.sum(-1) - 1)) <= 1e-6


def test_acceptance_of_the_seed_region_by_hand(maybe_jit):
  # (H, G, D), H >= 0.5, D <= 0.25. In (G, D) coordinates the region is the quadrilateral
  # (0,0), (0.5,0), (0.25,0.25), (0,0.25) of area 3/32 (shoelace).
  # Floor side: {H >= 0.5} is the triangle (0,0), (0.5,0), (0,0.5) of area 1/8: p = 3/4.
  # Ceiling side: {H <= 1, G <= 1, D <= 0.25} is the triangle with legs 1.25, area 25/32:
  # p = (3/32) / (25/32) = 0.12.
  with jax.enable_x64(True):
    p_floor, p_ceiling = maybe_jit(acceptance_probabilities)(jnp.array([0.5, 0, 0]),
                                                             jnp.array([1.0, 1, 0.25]))
  np.testing.assert_allclose([p_floor, p_ceiling], [0.75, 0.12], atol=1e-14)


def test_acceptance_against_a_binomial_sum(maybe_jit):
  # Eight sources capped at 0.03, seven open, one excluded (k = 15 free). Floor side (mass 1):
  # only the eight caps bind, and by symmetry the inclusion-exclusion collapses to
  # sum_j (-1)^j C(8, j) (1 - 0.03 j)^14, evaluated in exact rationals.
  c = Fraction(3, 100)
  expected = float(sum((-1)**j * comb(8, j) * (1 - j * c)**14 for j in range(9)))
  upper = np.array([0.03] * 8 + [1.0] * 7 + [0.0])
  with jax.enable_x64(True):
    p_floor, _ = maybe_jit(acceptance_probabilities)(np.zeros(16), upper)
  np.testing.assert_allclose(p_floor, expected, rtol=1e-9)


def test_acceptance_against_monte_carlo():
  # Proposals drawn here with numpy's Dirichlet, independently of the code under test.
  lower = np.array([0.1, 0.0, 0.2, 0.0, 0.05])
  upper = np.array([0.5, 0.3, 0.6, 0.25, 1.0])
  with jax.enable_x64(True):
    p_floor, p_ceiling = acceptance_probabilities(lower, upper)
  rng = np.random.default_rng(0)
  num = 400_000
  caps = upper - lower
  y = (1 - lower.sum()) * rng.dirichlet(np.ones(5), num)
  z = (upper.sum() - 1) * rng.dirichlet(np.ones(5), num)
  for p, draws in ((p_floor, y), (p_ceiling, z)):
    mc = np.mean(np.all(draws <= caps, axis=-1))
    assert abs(mc - float(p)) < 5 * np.sqrt(mc * (1 - mc) / num)
  assert 0.05 < float(p_floor) < 0.95 and 0.01 < float(p_ceiling) < 0.95


def test_bad_arguments():
  with pytest.raises(ValueError, match="'gibbs'"):
    sample_uniform(jax.random.key(0), jnp.zeros(3), jnp.ones(3), 4, method="gibbs")
  with pytest.raises(ValueError, match="sample_uniform: num must be >= 1, got 0"):
    sample_uniform(jax.random.key(0), jnp.zeros(3), jnp.ones(3), 0)
  # A bool passed the old isinstance(num, int) check; it is not a count.
  with pytest.raises(TypeError, match="sample_uniform: num must be an integer, got True"):
    sample_uniform(jax.random.key(0), jnp.zeros(3), jnp.ones(3), True)
  with pytest.raises(ValueError, match="vmap"):
    sample_uniform(jax.random.key(0), jnp.zeros((2, 3)), jnp.ones((2, 3)), 4)
  with pytest.raises(ValueError, match="n = 21"):
    acceptance_probabilities(jnp.zeros(21), jnp.ones(21))


def test_bounds_gathered_from_a_table_inside_a_jitted_scan():
  # The curriculum's pattern: one random phase per scan step, bounds read from a table of regions
  # with a traced index; num = 1.
  regions = [Region.from_bounds(only=WARMUP_SOURCES), Region.from_bounds(), polish()]
  table_lower = jnp.stack([f32(r)[0] for r in regions])
  table_upper = jnp.stack([f32(r)[1] for r in regions])

  def phase(key, step):
    idx = step % 3
    w, info = sample_uniform(jax.random.fold_in(key, step), table_lower[idx], table_upper[idx], 1)
    return key, (w[0], info.path)

  _, (w, path) = jax.jit(lambda key: jax.lax.scan(phase, key, jnp.arange(9)))(jax.random.key(15))
  assert np.all(np.asarray(path) == 0)
  for step, wi in enumerate(np.asarray(w)):
    lower, upper = (np.asarray(t[step % 3]) for t in (table_lower, table_upper))
    assert_inside(wi[None], lower, upper)


def test_chain_mixes_in_a_thin_region():
  # One source capped at 1e-4: the region is, to 1e-4, the segment w_1 + w_2 = 1, on which w_1 is
  # uniform on [0, 1] (the law, worked out by hand: the thin coordinate's share of the volume is
  # uniform too). Both sides reject almost everything (acceptance 1e-4 and 2e-4), so auto runs
  # the chain at its default length.
  w, info = sample_uniform(jax.random.key(0), jnp.zeros(3), jnp.array([1e-4, 1.0, 1.0]), 2000)
  w = np.asarray(w, np.float64)
  assert int(info.path) == 2
  assert w[:, 0].max() <= 1e-4 and np.abs(w.sum(1) - 1).max() < 1e-6
  assert stats.kstest(w[:, 1], "uniform").pvalue > ALPHA
  assert stats.kstest(w[:, 0] / 1e-4, "uniform").pvalue > ALPHA


def test_acceptance_probabilities_of_a_batch_are_per_region():
  # Region 0 by hand: H >= 0.5, D <= 0.25. Floor side 1 - (1/2)^2 = 0.75. Ceiling side: mass
  # sum u - 1 = 1.25 over caps (0.5, 1, 0.25), ratios (0.4, 0.8, 0.2), by inclusion-exclusion
  # 1 - (0.6^2 + 0.2^2 + 0.8^2) + (1 - 0.6)^2 = 1 - 1.04 + 0.16 = 0.12. Region 1, the plain
  # simplex: floor side 1; ceiling side mass 2 over caps (1, 1, 1): 1 - 3 (1/2)^2 = 0.25.
  lower = jnp.array([[0.5, 0, 0], [0, 0, 0]])
  upper = jnp.array([[1.0, 1, 0.25], [1, 1, 1]])
  p_floor, p_ceiling = acceptance_probabilities(lower, upper)
  np.testing.assert_allclose(p_floor, [0.75, 1.0], atol=1e-6)
  np.testing.assert_allclose(p_ceiling, [0.12, 0.25], atol=1e-6)
  one = [acceptance_probabilities(lower[k], upper[k]) for k in range(2)]
  np.testing.assert_allclose(p_ceiling, [o[1] for o in one], atol=1e-7)

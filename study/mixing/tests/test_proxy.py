"""Proxy-fitted schedules: the probe design, the elasticity fit and the schedule it makes."""

import itertools

import jax
import numpy as np
import pytest
from scipy import stats

from andrea_jax import curriculum
from andrea_jax.curriculum import simulate
from study.mixing import proxy
from andrea_jax.sources import SOURCES


@pytest.mark.parametrize("n", [1, 2, 4, 8, 12, 16, 20, 24, 32, 44])
def test_hadamard_rows_are_orthogonal_and_normalised(n):
  h = proxy.hadamard(n).astype(np.int64)
  assert set(np.unique(h)) <= {-1, 1}
  np.testing.assert_array_equal(h @ h.T, n * np.eye(n, dtype=np.int64))
  assert (h[0] == 1).all() and (h[:, 0] == 1).all()


def test_hadamard_order_4_by_hand():
  """Sylvester's doubling of [[1, 1], [1, -1]], written out."""
  np.testing.assert_array_equal(proxy.hadamard(4), [[1, 1, 1, 1], [1, -1, 1, -1],
                                                    [1, 1, -1, -1], [1, -1, -1, 1]])


@pytest.mark.parametrize("n", [0, 3, 6, 36, 2.0])
def test_hadamard_refuses_orders_it_cannot_build(n):
  with pytest.raises(ValueError, match="order"):
    proxy.hadamard(n)


@pytest.mark.parametrize("num_sources,runs", [(1, 2), (3, 4), (7, 8), (11, 12), (16, 20), (20, 24)])
def test_probe_design_is_a_two_level_orthogonal_array(num_sources, runs):
  """Every source high in half the runs; every pair of sources, and every pair of levels, in a
  quarter of them (strength 2): the per-source effects separate."""
  d = proxy.probe_design(num_sources).astype(np.int64)
  assert d.shape == (runs, num_sources)
  x = np.concatenate([np.ones((runs, 1), np.int64), d], axis=1)
  np.testing.assert_array_equal(x.T @ x, runs * np.eye(num_sources + 1, dtype=np.int64))
  if runs >= 4:
    for i, j in itertools.combinations(range(num_sources), 2):
      for a, b in itertools.product((-1, 1), repeat=2):
        assert np.sum((d[:, i] == a) & (d[:, j] == b)) == runs // 4


def test_probe_mixtures_by_hand():
  """Three sources: the design is hadamard(4)'s last three columns; high 2, low 1/2, normalised."""
  w = proxy.probe_mixtures(3, ratio=4.0)
  np.testing.assert_allclose(w, [[1 / 3, 1 / 3, 1 / 3], [1 / 6, 2 / 3, 1 / 6],
                                 [2 / 3, 1 / 6, 1 / 6], [1 / 6, 1 / 6, 2 / 3]])


def test_probe_mixtures_hold_the_ratio_on_the_simplex():
  w = proxy.probe_mixtures(16, ratio=9.0)
  d = proxy.probe_design(16)
  assert w.shape == (20, 16)
  np.testing.assert_allclose(w.sum(axis=1), 1.0)
  for row, signs in zip(w[1:], d[1:]):
    np.testing.assert_allclose(row[signs > 0] / row[signs < 0][0], 9.0)


@pytest.mark.parametrize("ratio", [1.0, 0.5, float("nan"), float("inf"), "4"])
def test_probe_mixtures_refuse_a_bad_ratio(ratio):
  with pytest.raises(ValueError, match="ratio"):
    proxy.probe_mixtures(16, ratio=ratio)


def test_fit_elasticity_recovers_an_exact_power_law():
  w = proxy.probe_mixtures(16)
  b = np.linspace(-0.04, 0.71, 16)
  c = np.linspace(1.0, 4.0, 16)
  fit = proxy.fit_elasticity(w, c - b * np.log(16 * w))
  np.testing.assert_allclose(fit.b, b, atol=1e-12)
  np.testing.assert_allclose(fit.intercept, c, atol=1e-12)
  np.testing.assert_allclose(fit.r2, 1.0)


def test_fit_elasticity_matches_scipy_linregress_on_noisy_losses():
  rng = np.random.default_rng(0)
  w = rng.dirichlet(np.ones(5), size=12)
  y = rng.normal(2.0, 0.3, size=(12, 5))
  fit = proxy.fit_elasticity(w, y)
  for s in range(5):
    ref = stats.linregress(np.log(5 * w[:, s]), y[:, s])
    np.testing.assert_allclose(fit.b[s], -ref.slope, rtol=1e-10)
    np.testing.assert_allclose(fit.intercept[s], ref.intercept, rtol=1e-10)
    np.testing.assert_allclose(fit.r2[s], ref.rvalue ** 2, rtol=1e-9)


def test_fit_elasticity_r2_is_nan_for_flat_losses():
  w = proxy.probe_mixtures(3)
  fit = proxy.fit_elasticity(w, np.full((4, 3), 2.0))
  np.testing.assert_allclose(fit.b, 0.0, atol=1e-12)
  assert np.isnan(fit.r2).all()


@pytest.mark.parametrize("where,value,message", [
    ("shares", 0.0, r"shares\[2, 1\] = 0.0"),
    ("shares", np.nan, r"shares\[2, 1\] = nan"),
    ("losses", np.inf, r"losses\[2, 1\] = inf"),
])
def test_fit_elasticity_names_a_bad_entry(where, value, message):
  w, y = proxy.probe_mixtures(3), np.ones((4, 3))
  (w if where == "shares" else y)[2, 1] = value
  with pytest.raises(ValueError, match=message):
    proxy.fit_elasticity(w, y)


def test_fit_elasticity_refuses_what_it_cannot_identify():
  w = proxy.probe_mixtures(3)
  with pytest.raises(ValueError, match=r"\[runs, sources\]"):
    proxy.fit_elasticity(w, np.ones((4, 2)))
  with pytest.raises(ValueError, match="at least 3 runs"):
    proxy.fit_elasticity(w[:2], np.ones((2, 3)))
  same = np.array([[0.5, 0.25, 0.25], [0.5, 0.4, 0.1], [0.5, 0.1, 0.4]])
  with pytest.raises(ValueError, match="source 0's share is the same in every run"):
    proxy.fit_elasticity(same, np.ones((3, 3)))


def test_elasticity_mixture_by_hand():
  np.testing.assert_allclose(proxy.elasticity_mixture([0.3, 0.1, -1.0], lam=1.0, floor=0.1),
                             [0.6, 0.2, 0.2])
  # Half of it, half uniform: (0.6 + 1/3) / 2, ...
  np.testing.assert_allclose(proxy.elasticity_mixture([0.3, 0.1, -1.0], lam=0.5, floor=0.1),
                             [0.3 + 1 / 6, 0.1 + 1 / 6, 0.1 + 1 / 6])
  np.testing.assert_allclose(proxy.elasticity_mixture([0.3, 0.1, 0.5], lam=0.0), 1 / 3)
  # Squared: (0.09, 0.01, 0.01) / 0.11; square root: (0.3 ** 0.5, 0.1 ** 0.5, 0.1 ** 0.5) / sum.
  np.testing.assert_allclose(
      proxy.elasticity_mixture([0.3, 0.1, -1.0], lam=1.0, floor=0.1, power=2.0),
      [9 / 11, 1 / 11, 1 / 11])
  # A large power neither underflows to 0/0 (0.03^400 and 0.02^400 are below the smallest
  # double) nor overflows (30^400): the larger b takes all but (2/3)^400 or (1/3)^400 of it.
  np.testing.assert_allclose(proxy.elasticity_mixture([0.03, 0.02], power=400.0), [1, 0],
                             atol=1e-12)
  np.testing.assert_allclose(proxy.elasticity_mixture([30.0, 10.0], power=400.0), [1, 0],
                             atol=1e-12)
  root = np.sqrt([0.3, 0.1, 0.1])
  np.testing.assert_allclose(
      proxy.elasticity_mixture([0.3, 0.1, -1.0], lam=0.5, floor=0.1, power=0.5),
      0.5 * root / root.sum() + 0.5 / 3)


@pytest.mark.parametrize("kwargs,message", [
    ({"b": [0.1, np.nan]}, "finite"), ({"b": []}, "non-empty"), ({"lam": 1.5}, "lam"),
    ({"floor": 0.0}, "floor"), ({"power": 0.0}, "power must be a finite number > 0, got 0.0"),
    ({"power": np.inf}, "power"), ({"power": -1.0}, "power"),
    ({"floor": np.inf}, "floor must be a finite number > 0, got inf"),
])
def test_elasticity_mixture_refuses_bad_input(kwargs, message):
  args = {"b": [0.1, 0.2], **kwargs}
  with pytest.raises(ValueError, match=message):
    proxy.elasticity_mixture(**args)


def test_scale_elasticity_by_hand():
  # Two sizes a decade apart: b moves by (0.3 - 0.1) per decade on source 0, by -0.2 on source 1.
  sizes, b = [1e5, 1e6], [[0.1, 0.4], [0.3, 0.2]]
  np.testing.assert_allclose(proxy.scale_elasticity(sizes, b, 1e7), [0.5, 0.0], atol=1e-12)
  np.testing.assert_allclose(proxy.scale_elasticity(sizes, b, 10**5.5), [0.2, 0.3])
  np.testing.assert_allclose(proxy.scale_elasticity(sizes, b, 1e5), b[0])
  # The order of the sizes does not matter.
  np.testing.assert_allclose(proxy.scale_elasticity(sizes[::-1], b[::-1], 1e7), [0.5, 0.0],
                             atol=1e-12)


def test_scale_elasticity_matches_numpy_polyfit_on_three_sizes():
  rng = np.random.default_rng(0)
  sizes = np.array([1.3e5, 8.5e5, 2.76e6])
  b = rng.normal(0.2, 0.1, (3, 16))
  want = [np.polyval(np.polyfit(np.log(sizes), b[:, s], 1), np.log(6.43e6)) for s in range(16)]
  np.testing.assert_allclose(proxy.scale_elasticity(sizes, b, 6.43e6), want, rtol=1e-10)


@pytest.mark.parametrize("sizes,b,target,message", [
    ([1e5], [[0.1]], 1e6, "at least 2"),
    ([1e5, 1e6], [[0.1, 0.2]], 1e6, r"\[sizes=2, sources\]"),
    ([1e5, 1e6], [[0.1, 0.2], [0.3]], 1e6, r"lengths \[2, 1\]"),
    ([1e5, 0.0], [[0.1], [0.2]], 1e6, "> 0"),
    ([1e5, 1e5], [[0.1], [0.2]], 1e6, "distinct"),
    ([1e5, 1e6], [[0.1], [np.nan]], 1e6, r"b_KxS\[1, 0\] = nan"),
    ([1e5, 1e6], [[0.1], [0.2]], -1.0, "target_params"),
    ([1e5, 1e6], [[0.1], [0.2]], np.inf, "target_params"),
])
def test_scale_elasticity_refuses_bad_input(sizes, b, target, message):
  with pytest.raises(ValueError, match=message):
    proxy.scale_elasticity(sizes, b, target)


def test_proxy_schedule_holds_the_mixture_then_uniform():
  """The static mixer under the schedule's geometries holds the mixture for the first
  ``hold`` of the run exactly (it lies inside the full simplex), then 1/16 on every source."""
  mixture = proxy.elasticity_mixture(np.linspace(0.05, 0.8, 16))
  c = curriculum.curriculum_config(mixer="static")
  c.geometries = proxy.proxy_schedule(mixture, num_steps=200, hold=0.25)
  spec = curriculum.spec_from_config(c)
  assert spec.geometry_names == ("proxy", "uniform")
  assert spec.starts.tolist() == [0, 50]
  w_NxS = simulate.simulate(spec, jax.random.key(0), 200).weights
  np.testing.assert_allclose(w_NxS[:50], np.broadcast_to(mixture, (50, 16)), atol=1e-6)
  np.testing.assert_allclose(w_NxS[50:], 1 / 16, atol=1e-6)


def test_proxy_schedule_for_the_whole_run_has_one_geometry():
  g = proxy.proxy_schedule(np.full(16, 1 / 16), num_steps=100, hold=1.0)
  assert list(g.keys()) == ["proxy"]


@pytest.mark.parametrize("mixture,hold,message", [
    (np.full(15, 1 / 15), 0.5, "one weight per source"),
    (np.full(16, 1 / 16), 0.0, "hold"),
    (np.full(16, 1 / 16), 1.5, "hold"),
])
def test_proxy_schedule_refuses_bad_input(mixture, hold, message):
  with pytest.raises(ValueError, match=message):
    proxy.proxy_schedule(mixture, num_steps=100, hold=hold, sources=SOURCES)


def test_proxy_schedule_refuses_the_second_geometrys_name():
  with pytest.raises(ValueError, match="name 'uniform' is the second geometry's"):
    proxy.proxy_schedule(np.full(16, 1 / 16), num_steps=100, name="uniform")
  # Held for the whole run there is no second geometry: the name is free.
  assert list(proxy.proxy_schedule(np.full(16, 1 / 16), 100, hold=1.0, name="uniform")) == [
      "uniform"]

"""Exact projection onto {l <= w <= u, sum w = 1}: against a bisection oracle, KKT, optax, FD."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from andrea_jax.simplex import Region, project


def random_cases(rng, batch, n=16):
  """Random (x, lower, upper) float64: floors, ceilings, exclusions, pins and tight sums.

  A quarter of the cases live on a grid of 1/8 (x) and 1/16 (bounds), so that breakpoints
  coincide and the root often falls exactly on one.
  """
  x = rng.normal(0, 1, (batch, n)) * rng.choice([0.05, 0.5, 3.0], (batch, 1))
  upper = np.where(rng.random((batch, n)) < 0.5, rng.uniform(0.02, 1, (batch, n)), 1.0)
  upper = np.where(rng.random((batch, n)) < 0.15, 0.0, upper)
  lower = np.where(rng.random((batch, n)) < 0.4, rng.uniform(0, 1, (batch, n)) * upper, 0.0)
  lower = np.where(rng.random((batch, n)) < 0.05, upper, lower)  # pinned at a non-zero value
  target = rng.uniform(0, 1, (batch, 1))
  target[::17] = 1.0  # every 17th case has floors that sum to 1: a single point
  lower *= np.minimum(1, target / np.maximum(lower.sum(1, keepdims=True), 1e-300))
  short = upper.sum(1) < 1
  upper[short, rng.integers(0, n, short.sum())] = 1.0
  grid = np.arange(batch) % 4 == 1
  x[grid] = rng.integers(-8, 9, (grid.sum(), n)) / 8
  lower[grid] = np.floor(lower[grid] * 16) / 16
  upper[grid] = np.maximum(np.ceil(upper[grid] * 16) / 16, lower[grid])
  return x, lower, upper


def oracle(x, lower, upper, iters=200):
  """Independent float64 answer: bisection on tau for sum(clip(x + tau, l, u)) = 1."""
  lo = np.min(lower - x, axis=-1, keepdims=True)
  hi = np.max(upper - x, axis=-1, keepdims=True)
  for _ in range(iters):
    mid = 0.5 * (lo + hi)
    below = np.clip(x + mid, lower, upper).sum(-1, keepdims=True) < 1
    lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
  return np.clip(x + 0.5 * (lo + hi), lower, upper)


def assert_kkt(w, x, lower, upper, atol):
  """Feasible, and w - x = tau on free coords, >= tau at floors, <= tau at ceilings."""
  assert np.all(w >= lower) and np.all(w <= upper)
  np.testing.assert_allclose(w.sum(-1), 1, atol=atol, rtol=0)
  r = w - x
  movable = lower < upper
  free = movable & (w > lower) & (w < upper)
  at_lower = movable & (w == lower)
  at_upper = movable & (w == upper)
  nfree = free.sum(-1)
  tau = np.where(free, r, 0).sum(-1) / np.maximum(nfree, 1)
  has_free = nfree > 0
  dev = np.abs(np.where(free, r - tau[:, None], 0)).max(-1)
  assert dev[has_free].max(initial=0) <= atol
  assert np.all(np.where(at_lower, r - tau[:, None], np.inf)[has_free] >= -atol)
  assert np.all(np.where(at_upper, r - tau[:, None], -np.inf)[has_free] <= atol)
  # No free coordinate: some tau must fit between the ceiling residuals and the floor residuals.
  upper_max = np.where(at_upper, r, -np.inf).max(-1)
  lower_min = np.where(at_lower, r, np.inf).min(-1)
  assert np.all((upper_max <= lower_min + atol)[~has_free])


@pytest.mark.parametrize("method", ["auto", "pairwise", "sort"])
def test_matches_oracle_kkt_and_idempotent_float64(maybe_jit, method):
  rng = np.random.default_rng(0)
  x, lower, upper = random_cases(rng, 3000)
  expected = oracle(x, lower, upper)
  f = maybe_jit(lambda x, l, u: project(x, l, u, method=method))
  with jax.enable_x64(True):
    w = np.asarray(f(x, lower, upper))
    assert w.dtype == np.float64
    again = np.asarray(f(w, lower, upper))
  np.testing.assert_allclose(w, expected, atol=1e-12, rtol=0)
  assert_kkt(w, x, lower, upper, atol=1e-12)
  np.testing.assert_allclose(again, w, atol=1e-12, rtol=0)


def test_float32_sums_to_one_within_1e6(maybe_jit):
  rng = np.random.default_rng(1)
  x, lower, upper = random_cases(rng, 3000)
  w = np.asarray(maybe_jit(project)(*(a.astype(np.float32) for a in (x, lower, upper))))
  assert w.dtype == np.float32
  assert np.max(np.abs(w.astype(np.float64).sum(-1) - 1)) <= 1e-6
  np.testing.assert_allclose(w, oracle(x, lower, upper), atol=1e-5)


def test_degenerate_cases_by_hand(maybe_jit):
  f = maybe_jit(project)
  with jax.enable_x64(True):
    # Equal coordinates on the plain simplex: the centre.
    np.testing.assert_allclose(f(jnp.full(4, 7.0), jnp.zeros(4), jnp.ones(4)), [0.25] * 4,
                               atol=1e-15)
    # The root sits on three breakpoints: x = (1, 0, -1) is already a vertex (tau = 0).
    np.testing.assert_allclose(f(jnp.array([1.0, 0, -1]), jnp.zeros(3), jnp.ones(3)), [1, 0, 0],
                               atol=1e-15)
    # Ceilings that sum to exactly 1: the only point is w = u, whatever x.
    np.testing.assert_allclose(
        f(jnp.array([-3.0, 5, 0.2, 9]), jnp.zeros(4), jnp.array([0.5, 0.25, 0.25, 0])),
        [0.5, 0.25, 0.25, 0], atol=1e-15)
    # A pinned source (0.3 <= w_0 <= 0.3) and an excluded one; the rest split 0.7 evenly.
    np.testing.assert_allclose(
        f(jnp.array([2.0, 0.0, 0.0, 4.0]), jnp.array([0.3, 0, 0, 0]), jnp.array([0.3, 1, 1, 0])),
        [0.3, 0.35, 0.35, 0], atol=1e-15)


def test_worked_example_by_hand(maybe_jit):
  # Seed region over (H, G, D): H >= 0.5, D <= 0.25. x = (0.9, 0.6, 0.1): tau = -0.25 gives
  # (0.65, 0.35, clip(-0.15) = 0), which sums to 1.
  with jax.enable_x64(True):
    w = maybe_jit(project)(jnp.array([0.9, 0.6, 0.1]), jnp.array([0.5, 0, 0.]),
                           jnp.array([1., 1, .25]))
  np.testing.assert_allclose(w, [0.65, 0.35, 0.0], atol=1e-15)


def test_equals_optax_simplex_projection_and_its_jacobian(maybe_jit):
  rng = np.random.default_rng(2)
  x = rng.normal(0, 0.4, (64, 16)).astype(np.float32)
  x[0] = 0  # all equal: the projection is the centre
  x[1, 3] = 5  # one coordinate far ahead: the vertex e_3
  zeros, ones = jnp.zeros(16), jnp.ones(16)
  ours = maybe_jit(jax.vmap(lambda v: project(v, zeros, ones)))
  ref = jax.jit(jax.vmap(optax.projections.projection_simplex))  # the reference, jitted for speed
  np.testing.assert_allclose(ours(x), ref(x), atol=1e-6)
  jac = maybe_jit(jax.vmap(jax.jacobian(lambda v: project(v, zeros, ones))))
  jac_ref = jax.jit(jax.vmap(jax.jacobian(optax.projections.projection_simplex)))
  np.testing.assert_allclose(jac(x), jac_ref(x), atol=1e-6)


def test_jvp_matches_central_finite_differences(maybe_jit):
  rng = np.random.default_rng(3)
  x, lower, upper = random_cases(rng, 400)
  dx, dl, du = (rng.normal(size=x.shape) for _ in range(3))
  pinned = lower == upper
  dl = np.where(pinned, du, dl)  # a pin moves as one bound
  h = 1e-7
  zero = np.zeros_like(dx)
  with jax.enable_x64(True):
    jvp = maybe_jit(jax.vmap(lambda *a: jax.jvp(project, a[:3], a[3:])))
    w, tangent_x = jvp(x, lower, upper, dx, zero, zero)
    _, tangent_all = jvp(x, lower, upper, dx, dl, du)
    fd_x = (project(x + h * dx, lower, upper) - project(x - h * dx, lower, upper)) / (2 * h)
    plus = project(x + h * dx, lower + h * dl, upper + h * du)
    minus = project(x - h * dx, lower - h * dl, upper - h * du)
    fd_all = (plus - minus) / (2 * h)
  w, plus, minus = np.asarray(w), np.asarray(plus), np.asarray(minus)

  def pattern(v, lo, hi):
    return np.concatenate([v <= lo, v >= hi], axis=-1)

  # Away from breakpoints: the same active set at the centre and at both ends of the difference,
  # no tight sum bound, and no gap between a floor and a ceiling that the moves could close.
  centre = pattern(w, lower, upper)
  ok = np.all(pattern(plus, lower + h * dl, upper + h * du) == centre, -1)
  ok &= np.all(pattern(minus, lower - h * dl, upper - h * du) == centre, -1)
  ok &= (upper.sum(-1) > 1 + 1e-6) & (lower.sum(-1) < 1 - 1e-6)
  ok &= np.all(pinned | (upper - lower > 1e-5), -1)
  assert ok.sum() > 50
  np.testing.assert_allclose(np.asarray(tangent_x)[ok], np.asarray(fd_x)[ok], atol=1e-6)
  np.testing.assert_allclose(np.asarray(tangent_all)[ok], np.asarray(fd_all)[ok], atol=1e-6)


def test_active_set_jacobian_by_hand():
  # x = (0.9, 0.6, 0.1) on the seed region: H and G free, D at its floor. The Jacobian is
  # [[1/2, -1/2, 0], [-1/2, 1/2, 0], [0, 0, 0]].
  jac = jax.jacobian(project)(jnp.array([0.9, 0.6, 0.1]), jnp.array([0.5, 0, 0.]),
                              jnp.array([1., 1, .25]))
  np.testing.assert_allclose(jac, [[.5, -.5, 0], [-.5, .5, 0], [0, 0, 0]], atol=1e-7)


def test_no_nan_when_every_coordinate_sits_at_a_bound(maybe_jit):
  # Floors sum to 1: the region is one point; every coordinate is at a bound for every x.
  lower = jnp.array([0.5, 0.25, 0.25, 0.0])
  upper = jnp.array([1.0, 1.0, 0.25, 0.0])
  x = jnp.array([0.1, -2.0, 0.3, 7.0])
  f = maybe_jit(project)
  np.testing.assert_allclose(f(x, lower, upper), lower, atol=1e-7)
  jac = maybe_jit(jax.jacobian(project))(x, lower, upper)
  assert np.all(np.isfinite(jac)) and np.all(jac == 0)
  grad = maybe_jit(jax.grad(lambda x: jnp.sum(project(x, lower, upper) ** 2)))(x)
  assert np.all(grad == 0)


def test_grad_of_a_loss_through_the_projection(maybe_jit):
  # loss = w . c with w the projection onto the seed region, at a point where H and G are free:
  # dw/dx = P (the free block I - 11^T/2), so grad = P c = ((c_H - c_G)/2, (c_G - c_H)/2, 0).
  c = jnp.array([3.0, 1.0, 5.0])
  loss = lambda x: jnp.dot(project(x, jnp.array([0.5, 0, 0.]), jnp.array([1., 1, .25])), c)
  g = maybe_jit(jax.grad(loss))(jnp.array([0.9, 0.6, 0.1]))
  np.testing.assert_allclose(g, [1.0, -1.0, 0.0], atol=1e-6)


def test_leading_batch_and_vmap_over_regions(maybe_jit):
  rng = np.random.default_rng(4)
  x, lower, upper = random_cases(rng, 12)
  x3 = x.reshape(3, 4, 16)
  f = maybe_jit(project)
  with jax.enable_x64(True):
    batched = np.asarray(f(x3, lower.reshape(3, 4, 16), upper.reshape(3, 4, 16)))
    mapped = np.asarray(maybe_jit(jax.vmap(project))(x, lower, upper))
    one_region = np.asarray(f(x, lower[0], upper[0]))  # [n] bounds shared by the batch
  np.testing.assert_allclose(batched.reshape(12, 16), oracle(x, lower, upper), atol=1e-12)
  np.testing.assert_allclose(mapped, oracle(x, lower, upper), atol=1e-12)
  np.testing.assert_allclose(one_region, oracle(x, lower[:1], upper[:1]), atol=1e-12)


def test_polish_region_excluded_sources_get_exactly_zero(maybe_jit):
  r = Region.from_bounds({"hermes3-general": 0.7}, {"dictionary": 0.25},
                         exclude=("repo-docs", "repo-docstrings"), label="v3_polish")
  x = jax.random.normal(jax.random.key(0), (256, 16))
  w = np.asarray(maybe_jit(project)(x, r.lower.astype(np.float32), r.upper.astype(np.float32)))
  assert np.all(w[:, r.excluded] == 0)
  assert np.all(w[:, 0] >= np.float32(0.7)) and np.all(w[:, 7] <= np.float32(0.25))
  assert np.max(np.abs(w.sum(-1) - 1)) <= 1e-6


def test_unknown_method_is_rejected():
  with pytest.raises(ValueError, match="'bisect'"):
    project(jnp.zeros(3), jnp.zeros(3), jnp.ones(3), method="bisect")


@pytest.mark.parametrize("method", ["pairwise", "sort"])
def test_bounds_outside_the_unit_interval_and_infinite_by_hand(method):
  # Worked by hand: every coordinate free, so w = x + (1 - sum x) / n.
  f = lambda x, l, u: np.asarray(project(jnp.array(x), jnp.array(l), jnp.array(u), method=method))
  with jax.enable_x64(True):
    # Floors below 0 and |x| > 8 (the large-input path): tau = (1 - 9) / 3; and (1 - 20) / 3.
    np.testing.assert_allclose(f([9.0, 0, 0], [-10.0] * 3, [10.0] * 3), [19 / 3, -8 / 3, -8 / 3],
                               atol=1e-12)
    np.testing.assert_allclose(f([20.0, 0, 0], [-10.0] * 3, [10.0] * 3), [10, -4.5, -4.5],
                               atol=1e-12)
    inf = np.inf
    np.testing.assert_allclose(f([0.2, 0.5, 0.1], [0.0] * 3, [inf] * 3),
                               [0.2 + 0.2 / 3, 0.5 + 0.2 / 3, 0.1 + 0.2 / 3], atol=1e-12)
    np.testing.assert_allclose(f([1.0, 2, 3], [-inf] * 3, [inf] * 3), [-2 / 3, 1 / 3, 4 / 3],
                               atol=1e-12)
    # Ceilings of 1, no floors: the third coordinate at its ceiling, tau = -1.5 for the others.
    np.testing.assert_allclose(f([1.0, 2, 3], [-inf] * 3, [1.0] * 3), [-0.5, 0.5, 1], atol=1e-12)
    # A floor of 0.2 that binds and a ceiling of 0.5 that does not, next to infinite bounds:
    # w_2 = 0.6 at its ceiling, w_0 = 0.3 + tau, w_1 = 0.1 + tau with tau = 0 (sum 1).
    np.testing.assert_allclose(f([0.3, 0.1, 5.0], [0.0, -inf, 0.2], [inf, 0.5, 0.6]),
                               [0.3, 0.1, 0.6], atol=1e-12)
  # The sort path is the default past n = 128: 200 equal coordinates, no ceiling.
  w = np.asarray(project(jnp.zeros(200), jnp.zeros(200), jnp.full(200, jnp.inf), method=method))
  np.testing.assert_allclose(w, 0.005, atol=1e-7)

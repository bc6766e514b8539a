"""Directions, perturbation sharpness and slices, checked on problems with known answers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import terrain


def _spd_matrix(seed, eigenvalues):
  """Q diag(lam) Q^T with a random orthogonal Q (numpy, float64)."""
  rng = np.random.default_rng(seed)
  q, _ = np.linalg.qr(rng.normal(size=(len(eigenvalues), len(eigenvalues))))
  return (q * np.asarray(eigenvalues, dtype=np.float64)) @ q.T


# ---------------------------------------------------------------- directions


def test_filter_norm_on_a_hand_checked_dense_layer(maybe_jit):
  # Columns (output units) of the kernel have norms 5 and 2; the bias is 1-D.
  params = {"kernel": jnp.array([[3.0, 0.0], [4.0, 0.0], [0.0, 2.0]]),
            "bias": jnp.array([1.0, -2.0])}
  key = jax.random.key(7)
  d = maybe_jit(functools.partial(terrain.random_direction, filter_norm=True, ignore_1d=True))(
      key, params)
  np.testing.assert_allclose(np.linalg.norm(d["kernel"], axis=0), [5.0, 2.0], rtol=1e-6)
  np.testing.assert_array_equal(d["bias"], [0.0, 0.0])
  # The documented draw: leaf i (tree_flatten order: bias=0, kernel=1) uses fold_in(key, i), and
  # each column keeps the direction of its Gaussian draw.
  g = np.asarray(jax.random.normal(jax.random.fold_in(key, 1), (3, 2), jnp.float32))
  expected = g * np.array([5.0, 2.0]) / np.linalg.norm(g, axis=0)
  np.testing.assert_allclose(d["kernel"], expected, rtol=1e-5)

  kept = terrain.random_direction(key, params, ignore_1d=False)
  np.testing.assert_allclose(np.linalg.norm(kept["bias"]), np.sqrt(5.0), rtol=1e-6)
  np.testing.assert_allclose(kept["kernel"], expected, rtol=1e-5)


def test_filter_norm_conv_kernel_per_output_channel_and_zero_filters():
  w = np.random.default_rng(0).normal(size=(3, 3, 4, 5)).astype(np.float32)
  w[..., 2] = 0.0
  d = terrain.random_direction(jax.random.key(1), {"conv": jnp.asarray(w)})["conv"]
  np.testing.assert_allclose(np.linalg.norm(np.asarray(d).reshape(-1, 5), axis=0),
                             np.linalg.norm(w.reshape(-1, 5), axis=0), rtol=1e-5)
  assert np.all(np.asarray(d[..., 2]) == 0) and np.all(np.isfinite(d))


def test_global_norm_direction_and_leaf_types():
  params = {"a": jnp.ones((4, 3)), "b": 2 * jnp.ones((5,)), "n": jnp.arange(3),
            "h": jnp.ones((2, 2), jnp.bfloat16)}
  d = terrain.random_direction(jax.random.key(3), params, filter_norm=False, ignore_1d=True)
  # ||d|| over the included leaves (a, h) equals ||w|| over them: sqrt(12 + 4).
  sq = float(jnp.sum(d["a"] ** 2) + jnp.sum(d["h"].astype(jnp.float32) ** 2))
  np.testing.assert_allclose(sq, 16.0, rtol=1e-2)  # bfloat16 rounding of h
  np.testing.assert_array_equal(d["b"], np.zeros(5))
  np.testing.assert_array_equal(d["n"], np.zeros(3))
  assert d["h"].dtype == jnp.bfloat16 and d["n"].dtype == params["n"].dtype
  d_all = terrain.random_direction(jax.random.key(3), params, filter_norm=False, ignore_1d=False)
  np.testing.assert_allclose(float(terrain.tree_norm(d_all)) ** 2, 12 + 20 + 4, rtol=1e-2)


def test_perturb_and_tree_norm():
  w = {"x": jnp.array([1.0, 2.0]), "y": jnp.array([[3.0]])}
  d = {"x": jnp.array([1.0, -1.0]), "y": jnp.array([[2.0]])}
  out = terrain.perturb(w, d, 0.5)
  np.testing.assert_allclose(out["x"], [1.5, 1.5])
  np.testing.assert_allclose(out["y"], [[4.0]])
  out2 = terrain.perturb_2d(w, d, d, 1.0, -2.0)
  np.testing.assert_allclose(out2["x"], [0.0, 3.0])
  np.testing.assert_allclose(float(terrain.tree_norm(w)), np.sqrt(14.0), rtol=1e-6)


# ---------------------------------------------------------------- sharpness


def test_sharpness_matches_closed_form_on_a_quadratic():
  """L = w^T A w / 2, d uniform on the sphere of radius r = ||w|| (no filter normalisation).

  L(w + s d) - L(w) = s w^T A d + s^2 d^T A d / 2. With u = d / r uniform on S^{n-1}: E[u u^T] =
  I/n, so the mean is s^2 r^2 tr(A) / (2n). Var(w^T A u) = |A w|^2 / n, Var(u^T A u) = 2 (n tr(A^2)
  - tr(A)^2) / (n^2 (n + 2)), and the two terms are uncorrelated (odd vs even in u).
  """
  n, num = 12, 3000
  lam = np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.2, 0.1, 0.0, -0.1, -0.3, 1.5, 0.7])
  A = _spd_matrix(0, lam)
  w = np.random.default_rng(1).normal(size=n)
  A_j, w_j = jnp.asarray(A, jnp.float32), jnp.asarray(w, jnp.float32)
  loss_fn = lambda v: 0.5 * v @ A_j @ v  # noqa: E731
  sigmas = np.array([0.05, 0.3, 1.0])
  res = jax.jit(lambda p, k: terrain.perturbation_sharpness(
      loss_fn, p, k, sigmas, num, filter_norm=False, ignore_1d=False))(w_j, jax.random.key(2))
  r2, tr, tr2 = w @ w, np.trace(A), np.trace(A @ A)
  mean = sigmas ** 2 * r2 * tr / (2 * n)
  var = (sigmas ** 2 * r2 * np.sum((A @ w) ** 2) / n
         + sigmas ** 4 * r2 ** 2 / 4 * 2 * (n * tr2 - tr ** 2) / (n ** 2 * (n + 2)))
  se = np.sqrt(var / num)
  assert np.all(np.abs(np.asarray(res.mean) - mean) < 4.5 * se + 1e-6), (res.mean, mean, se)
  np.testing.assert_allclose(np.asarray(res.std), np.sqrt(var), rtol=0.1)
  assert res.increase_KxN.shape == (3, num)


def test_sharpness_filter_normalised_closed_form():
  """Centred quadratic L(v) = (v - w)^T A (v - w) / 2 over a Dense kernel W [m, c] (row-major vec).

  The increase is s^2 d^T A d / 2 with d_j = r_j u_j per column j, u_j independent uniform on
  S^{m-1}, r_j = ||W[:, j]||. Mean: s^2/2 sum_j r_j^2 tr(A_jj)/m. Variance of d^T A d:
  sum_j r_j^4 2(m tr(A_jj^2) - tr(A_jj)^2)/(m^2(m+2)) + sum_{j<k} 4 r_j^2 r_k^2 |A_jk|_F^2 / m^2.
  """
  m, c, num = 4, 3, 3000
  A = _spd_matrix(3, np.linspace(0.2, 4.0, m * c))
  W = np.random.default_rng(4).normal(size=(m, c)) * np.array([1.0, 3.0, 0.3])
  idx = [np.arange(m) * c + j for j in range(c)]  # vec index of column j
  r2 = np.sum(W ** 2, axis=0)
  blocks = {(j, k): A[np.ix_(idx[j], idx[k])] for j in range(c) for k in range(c)}
  mean_q = sum(r2[j] * np.trace(blocks[j, j]) / m for j in range(c))
  var_q = sum(r2[j] ** 2 * 2 * (m * np.trace(b @ b) - np.trace(b) ** 2) / (m ** 2 * (m + 2))
              for j, b in ((j, blocks[j, j]) for j in range(c)))
  var_q += sum(4 * r2[j] * r2[k] * np.sum(blocks[j, k] ** 2) / m ** 2
               for j in range(c) for k in range(j + 1, c))
  A_j, W_j = jnp.asarray(A, jnp.float32), jnp.asarray(W, jnp.float32)

  def loss_fn(p):
    e = (p["kernel"] - W_j).reshape(-1)
    return 0.5 * e @ A_j @ e

  s = 0.5
  res = terrain.perturbation_sharpness(loss_fn, {"kernel": W_j}, jax.random.key(5), [s], num,
                                       batch_size=500)
  expected, se = 0.5 * s ** 2 * mean_q, 0.5 * s ** 2 * np.sqrt(var_q / num)
  assert abs(float(res.mean[0]) - expected) < 4.5 * se, (res.mean, expected, se)


def test_sharpness_samples_are_the_documented_directions():
  params = {"k": jnp.asarray(np.random.default_rng(0).normal(size=(3, 2)), jnp.float32),
            "b": jnp.ones(2)}
  def loss_fn(p):
    return jnp.sum(jnp.sin(p["k"])) + jnp.sum(p["k"] ** 2) * jnp.sum(p["b"])

  key, sigmas = jax.random.key(9), jnp.array([0.1, 0.4])
  run = lambda bs: jax.jit(lambda p, k: terrain.perturbation_sharpness(  # noqa: E731
      loss_fn, p, k, sigmas, 3, batch_size=bs))(params, key)
  res = run(None)
  for n in range(3):
    d = terrain.random_direction(jax.random.fold_in(key, n), params)
    for i, s in enumerate([0.1, 0.4]):
      moved = {"k": params["k"] + s * d["k"], "b": params["b"]}
      np.testing.assert_allclose(res.increase_KxN[i, n], loss_fn(moved) - loss_fn(params),
                                 rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(run(2).increase_KxN, res.increase_KxN, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(res.std, np.std(np.asarray(res.increase_KxN), axis=1, ddof=1),
                             rtol=1e-5)


def test_sharpness_rejects_bad_arguments():
  f = lambda p: jnp.sum(p ** 2)  # noqa: E731
  with pytest.raises(ValueError, match="num_samples must be >= 1, got 0"):
    terrain.perturbation_sharpness(f, jnp.ones((2, 2)), jax.random.key(0), [0.1], 0)
  with pytest.raises(TypeError, match="num_samples must be an integer, got True"):
    terrain.perturbation_sharpness(f, jnp.ones((2, 2)), jax.random.key(0), [0.1], True)
  with pytest.raises(ValueError, match="sigmas"):
    terrain.perturbation_sharpness(f, jnp.ones((2, 2)), jax.random.key(0), 0.1, 3)
  with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
    terrain.perturbation_sharpness(f, jnp.ones((2, 2)), jax.random.key(0), [0.1], 3, batch_size=0)
  with pytest.raises(TypeError, match="batch_size must be an integer or None, got 2.0"):
    terrain.perturbation_sharpness(f, jnp.ones((2, 2)), jax.random.key(0), [0.1], 3,
                                   batch_size=2.0)


# ---------------------------------------------------------------- slices


def test_slice_1d_of_a_quadratic_is_the_parabola(maybe_jit):
  with jax.enable_x64(True):
    A = _spd_matrix(6, [3.0, 1.0, -0.5, 2.0, 0.25])
    w = np.random.default_rng(7).normal(size=5)
    d = np.random.default_rng(8).normal(size=5)
    A_j = jnp.asarray(A)
    loss_fn = lambda v: 0.5 * v @ A_j @ v  # noqa: E731
    alphas = np.linspace(-2.0, 2.0, 17)
    got = maybe_jit(lambda p, dd: terrain.loss_slice_1d(loss_fn, p, dd, jnp.asarray(alphas)))(
        jnp.asarray(w), jnp.asarray(d))
    parabola = 0.5 * w @ A @ w + alphas * (w @ A @ d) + 0.5 * alphas ** 2 * (d @ A @ d)
    np.testing.assert_allclose(np.asarray(got), parabola, rtol=1e-12, atol=1e-12)
    chunked = terrain.loss_slice_1d(loss_fn, jnp.asarray(w), jnp.asarray(d), alphas, batch_size=4)
    np.testing.assert_allclose(np.asarray(chunked), parabola, rtol=1e-12, atol=1e-12)


def test_slice_2d_of_a_quadratic_axes_and_values():
  with jax.enable_x64(True):
    A = _spd_matrix(9, [2.0, 1.0, 0.5, 4.0])
    rng = np.random.default_rng(10)
    w, dx, dy = rng.normal(size=4), rng.normal(size=4), rng.normal(size=4)
    A_j = jnp.asarray(A)
    params = {"v": jnp.asarray(w)}
    loss_fn = lambda p: 0.5 * p["v"] @ A_j @ p["v"]  # noqa: E731
    alphas, betas = np.linspace(-1, 1, 5), np.linspace(-0.5, 1.5, 3)
    got = terrain.loss_slice_2d(loss_fn, params, {"v": jnp.asarray(dx)}, {"v": jnp.asarray(dy)},
                                alphas, betas, batch_size=4)
    assert got.shape == (5, 3)
    a, b = alphas[:, None], betas[None, :]
    g = A @ w
    expected = (0.5 * w @ A @ w + a * (g @ dx) + b * (g @ dy)
                + 0.5 * a ** 2 * (dx @ A @ dx) + a * b * (dx @ A @ dy)
                + 0.5 * b ** 2 * (dy @ A @ dy))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-12)


def test_slices_reject_bad_coordinates():
  f = lambda p: jnp.sum(p ** 2)  # noqa: E731
  with pytest.raises(ValueError, match="alphas"):
    terrain.loss_slice_1d(f, jnp.ones(3), jnp.ones(3), jnp.ones((2, 2)))
  with pytest.raises(ValueError, match="betas"):
    terrain.loss_slice_2d(f, jnp.ones(3), jnp.ones(3), jnp.ones(3), [0.0], [])
  with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
    terrain.loss_slice_1d(f, jnp.ones(3), jnp.ones(3), [0.0, 1.0], batch_size=0)
  with pytest.raises(TypeError, match="batch_size must be an integer or None, got True"):
    terrain.loss_slice_1d(f, jnp.ones(3), jnp.ones(3), [0.0, 1.0], batch_size=True)

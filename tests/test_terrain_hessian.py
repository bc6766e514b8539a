"""HVPs, Lanczos top eigenvalues and the Hutchinson trace against exact answers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from andrea_jax import terrain


def _sym(seed, eigenvalues):
  rng = np.random.default_rng(seed)
  q, _ = np.linalg.qr(rng.normal(size=(len(eigenvalues), len(eigenvalues))))
  return (q * np.asarray(eigenvalues, dtype=np.float64)) @ q.T, q


def _mlp_loss():
  rng = np.random.default_rng(0)
  x, y = jnp.asarray(rng.normal(size=(6, 3)), jnp.float32), jnp.asarray(rng.normal(size=(6, 2)),
                                                                        jnp.float32)
  params = {"dense": {"kernel": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
                      "bias": jnp.asarray(rng.normal(size=(4,)), jnp.float32)},
            "out": {"kernel": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}}

  def loss_fn(p):
    h = jnp.tanh(x @ p["dense"]["kernel"] + p["dense"]["bias"][None, :])
    return jnp.mean((h @ p["out"]["kernel"] - y) ** 2)

  return loss_fn, params


@functools.lru_cache(maxsize=None)
def _mlp_hessian():
  """The MLP's dense Hessian by jax.hessian (forward-over-reverse Jacobian of the gradient)."""
  loss_fn, params = _mlp_loss()
  flat, unravel = ravel_pytree(params)
  return np.asarray(jax.jit(jax.hessian(lambda f: loss_fn(unravel(f))))(flat), dtype=np.float64)


def test_hvp_quadratic_and_against_the_full_hessian():
  A, _ = _sym(0, [3.0, -1.0, 0.5, 2.0])
  A_j = jnp.asarray(A, jnp.float32)
  v = jnp.array([1.0, -2.0, 0.5, 0.0])
  got = jax.jit(functools.partial(terrain.hvp, lambda w: 0.5 * w @ A_j @ w))(jnp.ones(4), v)
  np.testing.assert_allclose(got, A @ np.asarray(v), rtol=1e-5, atol=1e-6)

  loss_fn, params = _mlp_loss()
  flat, unravel = ravel_pytree(params)
  vf = np.random.default_rng(1).normal(size=flat.shape).astype(np.float32)
  got = ravel_pytree(jax.jit(functools.partial(terrain.hvp, loss_fn))(params, unravel(vf)))[0]
  np.testing.assert_allclose(got, _mlp_hessian() @ vf, rtol=1e-4, atol=1e-5)


@functools.partial(jax.jit, static_argnames=("k", "num_iters"))
def _quadratic_top(A, key, *, k, num_iters):
  """Top eigenpairs of the Hessian (= A) of w^T A w / 2, A an argument: one compile per shape."""
  return terrain.hessian_top_eigenvalues(lambda w: 0.5 * w @ A @ w, jnp.zeros(A.shape[0], A.dtype),
                                         key, k=k, num_iters=num_iters, return_vectors=True)


def test_lanczos_recovers_known_eigenvalues_float64():
  lam = np.concatenate([[10.0, 6.0, 4.5], np.linspace(-2.0, 1.0, 37)])
  # "Top" is algebraic: for a negative definite Hessian the least negative eigenvalues come first.
  lam_neg = -np.linspace(0.5, 9.0, 40)
  with jax.enable_x64(True):
    for seed, spectrum in [(1, lam), (4, lam_neg)]:
      A, _ = _sym(seed, spectrum)
      eig, _ = _quadratic_top(jnp.asarray(A), jax.random.key(0), k=5, num_iters=40)
      np.testing.assert_allclose(np.asarray(eig), np.sort(spectrum)[::-1][:5], rtol=1e-10,
                                 atol=1e-10)


def test_lanczos_float32_matches_to_1e5_and_returns_eigenvectors():
  lam = np.concatenate([[10.0, 6.0, 4.5], np.linspace(-2.0, 1.0, 57)])
  A, Q = _sym(2, lam)
  A_j = jnp.asarray(A, jnp.float32)
  params = {"w": jnp.zeros((6, 10), jnp.float32)}  # a pytree; vec(w) indexes A row-major
  loss_fn = lambda p: 0.5 * p["w"].reshape(-1) @ A_j @ p["w"].reshape(-1)  # noqa: E731
  run = jax.jit(lambda p, k: terrain.hessian_top_eigenvalues(
      loss_fn, p, k, k=3, num_iters=30, return_vectors=True))
  eig, vecs = run(params, jax.random.key(3))
  np.testing.assert_allclose(np.asarray(eig), [10.0, 6.0, 4.5], atol=1e-5, rtol=0)
  assert vecs["w"].shape == (3, 6, 10)
  top_q = Q[:, np.argsort(lam)[::-1][:3]]  # true eigenvectors, columns
  for i in range(3):
    v = np.asarray(vecs["w"][i]).reshape(-1)
    np.testing.assert_allclose(np.linalg.norm(v), 1.0, rtol=1e-5)
    np.testing.assert_allclose(abs(v @ top_q[:, i]), 1.0, atol=1e-4)


def test_breakdown_on_zero_and_low_rank_hessians_gives_no_nan():
  # A zero Hessian breaks down at once; a rank-2 one after two steps (its Krylov space is
  # exhausted). The restarts keep T exact: the remaining Ritz values are the zero eigenvalues.
  u, _ = np.linalg.qr(np.random.default_rng(5).normal(size=(10, 2)))
  for A, expected in [(np.zeros((10, 10)), [0.0, 0.0, 0.0]),
                      (u @ np.diag([3.0, 1.5]) @ u.T, [3.0, 1.5, 0.0])]:
    eig, vecs = _quadratic_top(jnp.asarray(A, jnp.float32), jax.random.key(1), k=3, num_iters=10)
    np.testing.assert_allclose(np.asarray(eig), expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(vecs), axis=1), 1.0, rtol=1e-5)


def test_lanczos_on_a_nonlinear_pytree_loss_matches_dense_eigh():
  loss_fn, params = _mlp_loss()
  H = _mlp_hessian()
  expected = np.linalg.eigvalsh(0.5 * (H + H.T))[::-1][:2]
  eig = terrain.hessian_top_eigenvalues(loss_fn, params, jax.random.key(2), k=2,
                                        num_iters=H.shape[0])
  np.testing.assert_allclose(np.asarray(eig), expected, rtol=1e-4, atol=1e-5)


def test_lanczos_rejects_bad_k():
  with pytest.raises(ValueError, match=r"hessian_top_eigenvalues: k must be <= 3, got 4 \(at most "
                                       r"min\(num_iters, num_params\)\)"):
    terrain.hessian_top_eigenvalues(lambda w: w @ w, jnp.ones(3), jax.random.key(0), k=4)
  with pytest.raises(ValueError, match="hessian_top_eigenvalues: k must be >= 1, got 0"):
    terrain.hessian_top_eigenvalues(lambda w: w @ w, jnp.ones(3), jax.random.key(0), k=0)
  for bad, error, rule in ((0, ValueError, ">= 1"), (-3, ValueError, ">= 1"),
                           (2.0, TypeError, "an integer")):
    with pytest.raises(error, match=rf"hessian_top_eigenvalues: num_iters must be {rule}, "
                                    rf"got {bad!r}"):
      terrain.hessian_top_eigenvalues(lambda w: w @ w, jnp.ones(3), jax.random.key(0), k=1,
                                      num_iters=bad)


@functools.partial(jax.jit, static_argnames=("num",))
def _quadratic_trace(A, key, *, num):
  """Hutchinson trace of w^T A w / 2 over a (2, 3) pytree leaf, A an argument (one compile)."""
  return terrain.hessian_trace(lambda p: 0.5 * p["a"].reshape(-1) @ A @ p["a"].reshape(-1),
                               {"a": jnp.zeros((2, 3))}, key, num, batch_size=1000)


def test_hutchinson_trace_exact_for_diagonal_and_unbiased_in_general():
  num = 4000
  d = np.array([1.0, -2.0, 3.5, 0.25, 0.0, 1.0])
  tr, se = _quadratic_trace(jnp.asarray(np.diag(d), jnp.float32), jax.random.key(0), num=num)
  # z_i^2 = 1 for Rademacher z: every sample equals the trace exactly.
  np.testing.assert_allclose(float(tr), 3.75, rtol=1e-6)
  np.testing.assert_allclose(float(se), 0.0, atol=1e-6)

  A, _ = _sym(6, [4.0, 2.0, 1.0, -1.0, 0.5, 3.0])
  tr, se = _quadratic_trace(jnp.asarray(A, jnp.float32), jax.random.key(1), num=num)
  # Var(z^T A z) = 2 sum_{i != j} A_ij^2 for Rademacher z.
  se_exact = np.sqrt(2 * (np.sum(A ** 2) - np.sum(np.diag(A) ** 2)) / num)
  assert abs(float(tr) - np.trace(A)) < 4.5 * se_exact, (float(tr), np.trace(A), se_exact)
  np.testing.assert_allclose(float(se), se_exact, rtol=0.1)

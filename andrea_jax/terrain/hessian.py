"""Curvature of the loss at ``w`` from Hessian-vector products: top eigenvalues (Lanczos) and trace.

The Hessian of a 120M-parameter model is never formed. Everything here goes through
``hvp(v) = H v = d/dt grad L(w + t v) |_{t=0}``, computed forward-over-reverse (``jax.jvp`` of
``jax.grad``): one HVP costs about two gradient evaluations and the memory of one.

The loss must be twice differentiable in forward-over-reverse mode: a fused attention kernel with a
hand-written backward pass and no JVP rule (cuDNN's) cannot be used; build the model with XLA
attention (``attention_impl="xla"``) for these measurements.

The top eigenvalue ``lambda_max`` is the curvature of the sharpest direction; a wide basin has a
small one (a step of size ``> 2 / lambda_max`` along that direction is unstable for plain gradient
descent).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from andrea_jax import checks

PyTree = Any


def hvp(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, v: PyTree) -> PyTree:
  """Hessian-vector product ``H(w) v`` of a scalar loss, forward-over-reverse.

  Args:
    loss_fn: ``params -> scalar``.
    params: the point ``w`` at which the Hessian is taken.
    v: a pytree with the structure of ``params``.

  Returns:
    ``H v`` with the structure of ``params``.

  Example:
    >>> hvp(lambda w: 0.5 * w @ A @ w, w, v)  # == A @ v for symmetric A
  """
  return jax.jvp(jax.grad(loss_fn), (params,), (v,))[1]


def _orthogonalise(V_mxn: jax.Array, x_n: jax.Array) -> jax.Array:
  # Classical Gram-Schmidt twice ("twice is enough", Parlett): unused rows of V are zero.
  x_n = x_n - V_mxn.T @ (V_mxn @ x_n)
  return x_n - V_mxn.T @ (V_mxn @ x_n)


def _lanczos(matvec: Callable[[jax.Array], jax.Array], v0_n: jax.Array, num_iters: int,
             on_step: Callable[[], Any] | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``num_iters`` Lanczos steps with full reorthogonalisation.

  Returns ``(alpha_m, beta_m, V_mxn)``: the tridiagonal ``T = diag(alpha) + offdiag(beta[:-1])`` and
  the orthonormal Lanczos basis, with ``V A V^T ~= T``. On breakdown (an invariant subspace is
  exhausted, ``beta ~ 0``: e.g. a zero or low-rank Hessian) the iteration restarts from a vector
  orthogonal to the basis and records ``beta = 0``, so ``T`` stays exact instead of dividing by
  zero. The restart vector is the coordinate vector ``e_i`` least covered by the basis,
  orthogonalised: with ``j < n`` orthonormal rows, ``sum_i |V[:, i]|^2 = j``, so some ``e_i`` keeps
  at least ``1 - j/n`` of its norm squared. ``on_step()`` is called on the host after each step.
  """
  n = v0_n.shape[0]
  dtype = v0_n.dtype
  tol = 10 * jnp.finfo(dtype).eps

  def restart(V_mxn: jax.Array) -> jax.Array:
    i = jnp.argmin(jnp.sum(V_mxn * V_mxn, axis=0))
    r_n = _orthogonalise(V_mxn, jnp.zeros((n,), dtype).at[i].set(1))
    r_norm = jnp.linalg.norm(r_n)  # 0 only once the basis spans R^n, after the last step
    return r_n / jnp.where(r_norm > 0, r_norm, 1)

  def body(j, carry):
    V_mxn, alpha_m, beta_m, v_n, scale = carry
    V_mxn = V_mxn.at[j].set(v_n)
    w_n = matvec(v_n)
    a = jnp.vdot(v_n, w_n)
    if on_step is not None:   # after the step's HVP: its argument depends on it
      jax.debug.callback(lambda _: on_step(), a)
    # Removing all basis components also performs the three-term recurrence (a v_j + b v_{j-1}).
    w_n = _orthogonalise(V_mxn, w_n)
    b = jnp.linalg.norm(w_n)
    scale = jnp.maximum(scale, jnp.maximum(jnp.abs(a), b))
    broke = b <= tol * scale
    v_next = jax.lax.cond(broke, lambda: restart(V_mxn), lambda: w_n / jnp.where(broke, 1, b))
    alpha_m = alpha_m.at[j].set(a)
    beta_m = beta_m.at[j].set(jnp.where(broke, 0, b))
    return V_mxn, alpha_m, beta_m, v_next, scale

  init = (jnp.zeros((num_iters, n), dtype), jnp.zeros((num_iters,), dtype),
          jnp.zeros((num_iters,), dtype), v0_n / jnp.linalg.norm(v0_n), jnp.zeros((), dtype))
  V_mxn, alpha_m, beta_m, _, _ = jax.lax.fori_loop(0, num_iters, body, init)
  return alpha_m, beta_m, V_mxn


def hessian_top_eigenvalues(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, key: jax.Array,
                            k: int = 1, num_iters: int = 30, *, return_vectors: bool = False,
                            on_step: Callable[[], Any] | None = None
                            ) -> jax.Array | tuple[jax.Array, PyTree]:
  """The ``k`` algebraically largest Hessian eigenvalues at ``w``, by Lanczos on HVPs.

  Runs ``m = min(num_iters, n)`` Lanczos steps (``m`` HVPs, ``n`` = number of parameters) from a
  random start vector, with full reorthogonalisation, then returns the top ``k`` Ritz values of the
  ``m x m`` tridiagonal matrix. Extreme eigenvalues converge first: ``m`` of 20-50 usually pins
  ``lambda_max`` to several digits; with ``m = n`` the result is exact up to rounding. Memory: the
  Lanczos basis holds ``m * n`` numbers (30 x 120M float32 = 14 GB), on top of one HVP. Precision is
  that of ``params`` (cast them to float32 first if they are bfloat16). Traceable; jit it with
  ``loss_fn`` and the ints bound.

  Args:
    loss_fn: ``params -> scalar`` loss (close over the batch).
    params: the point ``w``.
    key: PRNG key for the start vector.
    k: how many eigenvalues, ``1 <= k <= m``.
    num_iters: Lanczos steps (HVPs).
    return_vectors: also return the Ritz vectors.
    on_step: called with no argument on the host after each Lanczos step (``jax.debug.callback``),
      e.g. a progress bar's ``update``; ``None``: nothing.

  Returns:
    ``eigenvalues_k`` in descending order, or ``(eigenvalues_k, vectors)`` where ``vectors`` is a
    pytree like ``params`` with a leading axis of size ``k`` (unit norm over all leaves together;
    the sign is arbitrary).

  Example:
    >>> lam = hessian_top_eigenvalues(loss_fn, params, jax.random.key(0), k=3, num_iters=40)
    >>> lam[0]  # the sharpest curvature
  """
  num_iters = checks.integer("hessian_top_eigenvalues: num_iters", num_iters, minimum=1)
  flat_n, unravel = ravel_pytree(params)
  n = flat_n.shape[0]
  m = min(int(num_iters), n)
  k = checks.integer("hessian_top_eigenvalues: k", k, minimum=1, maximum=m,
                     hint="at most min(num_iters, num_params)")
  if not jnp.issubdtype(flat_n.dtype, jnp.floating):
    raise TypeError(f"params must be floating point, got dtype {flat_n.dtype}")

  def matvec(v_n: jax.Array) -> jax.Array:
    return ravel_pytree(hvp(loss_fn, params, unravel(v_n)))[0].astype(flat_n.dtype)

  v0_n = jax.random.normal(key, (n,), flat_n.dtype)
  alpha_m, beta_m, V_mxn = _lanczos(matvec, v0_n, m, on_step)
  off = beta_m[:-1]
  T_mxm = jnp.diag(alpha_m) + jnp.diag(off, 1) + jnp.diag(off, -1)
  theta_m, Y_mxm = jnp.linalg.eigh(T_mxm)  # ascending
  eigenvalues_k = theta_m[::-1][:k]
  if not return_vectors:
    return eigenvalues_k
  vecs_kxn = (V_mxn.T @ Y_mxm[:, ::-1][:, :k]).T
  return eigenvalues_k, jax.vmap(unravel)(vecs_kxn)


def hessian_trace(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, key: jax.Array,
                  num_samples: int, *,
                  batch_size: int | None = None) -> tuple[jax.Array, jax.Array]:
  """Hutchinson estimate of ``trace(H)``: the mean of ``z^T H z`` over Rademacher vectors ``z``.

  ``E[z^T H z] = trace(H)`` because ``E[z z^T] = I``; the variance of one sample is
  ``2 * sum_{i != j} H_ij^2`` (zero for a diagonal Hessian). ``trace(H) / n`` is the mean
  curvature, the isotropic counterpart of :func:`hessian_top_eigenvalues`. Sample ``s`` draws ``z``
  leaf by leaf from ``fold_in(fold_in(key, s), leaf_index)``; ``batch_size`` as in
  :func:`andrea_jax.terrain.sharpness.perturbation_sharpness`.

  Returns:
    ``(estimate, standard_error)``, both scalars (the standard error is 0 when
    ``num_samples == 1``).

  Example:
    >>> tr, se = hessian_trace(loss_fn, params, jax.random.key(0), num_samples=16)
  """
  num_samples = checks.integer("hessian_trace: num_samples", num_samples, minimum=1)
  q_S = hutchinson_samples(loss_fn, params, key, jnp.arange(num_samples), batch_size=batch_size)
  if num_samples > 1:
    stderr = jnp.std(q_S, ddof=1) / jnp.sqrt(num_samples)
  else:
    stderr = jnp.zeros_like(q_S[0])
  return jnp.mean(q_S), stderr


def hutchinson_samples(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, key: jax.Array,
                       samples: Sequence[int] | jax.Array, *,
                       batch_size: int | None = None) -> jax.Array:
  """``q_S[i] = z_{n_i}^T H z_{n_i}`` for the sample indices ``n_i`` of ``samples``.

  ``z_n`` is a Rademacher vector drawn leaf by leaf from ``fold_in(fold_in(key, n), leaf_index)``:
  the samples of :func:`hessian_trace` (whose estimate is the mean of ``q`` over
  ``samples = 0..S-1``), computable a chunk at a time. ``batch_size``: samples evaluated together,
  ``None`` vmaps over all (one HVP's memory per sample), an int ``b`` uses ``jax.lax.map``.

  Returns:
    ``[S]`` quadratic forms (at least float32).

  Example:
    >>> hutchinson_samples(loss_fn, params, jax.random.key(0), jnp.arange(8, 12))  # [4]
  """
  batch_size = checks.integer("batch_size", batch_size, minimum=1, optional=True)
  leaves, treedef = jax.tree_util.tree_flatten(params)
  leaves = [jnp.asarray(x) for x in leaves]

  def quad_form(n: jax.Array) -> jax.Array:
    sample_key = jax.random.fold_in(key, n)
    z = [jax.random.rademacher(jax.random.fold_in(sample_key, i), x.shape, x.dtype)
         for i, x in enumerate(leaves)]
    z = jax.tree_util.tree_unflatten(treedef, z)
    hz = hvp(loss_fn, params, z)
    parts = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
        lambda a, b: jnp.vdot(a, b).astype(jnp.promote_types(a.dtype, jnp.float32)), z, hz))
    return sum(parts[1:], parts[0])

  samples_S = jnp.asarray(samples)
  if batch_size is None:
    return jax.vmap(quad_form)(samples_S)
  return jax.lax.map(quad_form, samples_S, batch_size=batch_size)

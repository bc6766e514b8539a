"""1-D and 2-D slices of the loss terrain around ``w`` along given directions (Li et al. 2018).

``L(w + alpha d)`` over a line and ``L(w + alpha d_x + beta d_y)`` over a plane. With
filter-normalised random directions (:func:`andrea_jax.terrain.directions.random_direction`),
``alpha = 1`` moves every filter by its own norm, so slices of different models or checkpoints share
a scale.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from andrea_jax import checks
from andrea_jax.terrain.directions import perturb, perturb_2d

PyTree = Any


def _map(f: Callable[[jax.Array], jax.Array], xs: jax.Array, batch_size: int | None) -> jax.Array:
  if batch_size is None:
    return jax.vmap(f)(xs)
  # optional: the message says what the field takes (None, handled above, or an int >= 1).
  batch_size = checks.integer("batch_size", batch_size, minimum=1, optional=True)
  return jax.lax.map(f, xs, batch_size=batch_size)


def _coords(name: str, x: Any) -> jax.Array:
  x = jnp.asarray(x)
  if x.ndim != 1 or x.shape[0] == 0:
    raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {x.shape}")
  return x


def loss_slice_1d(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, direction: PyTree,
                  alphas: Sequence[float] | jax.Array, *,
                  batch_size: int | None = None) -> jax.Array:
  """``loss_A[i] = L(w + alphas[i] * d)``.

  Args:
    loss_fn: ``params -> scalar`` loss.
    params: the centre ``w``.
    direction: ``d``, a pytree like ``params``.
    alphas: ``[A]`` coordinates along ``d``.
    batch_size: points evaluated together; ``None`` vmaps over all ``A`` (``A`` copies of the
      weights in memory), an int uses ``jax.lax.map`` in chunks of that size.

  Returns:
    ``[A]`` losses.

  Example:
    >>> d = random_direction(jax.random.key(0), params)
    >>> loss_slice_1d(loss_fn, params, d, jnp.linspace(-1, 1, 21))  # [21]
  """
  alphas_A = _coords("alphas", alphas)
  return _map(lambda a: loss_fn(perturb(params, direction, a)), alphas_A, batch_size)


def loss_slice_2d(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, dir_x: PyTree,
                  dir_y: PyTree, alphas: Sequence[float] | jax.Array,
                  betas: Sequence[float] | jax.Array, *,
                  batch_size: int | None = None) -> jax.Array:
  """``loss_AxB[i, j] = L(w + alphas[i] * d_x + betas[j] * d_y)``.

  The first axis follows ``d_x`` (``alphas``), the second ``d_y`` (``betas``); ``plot_slice_2d``
  puts ``alphas`` on the horizontal axis. ``batch_size`` counts grid points, as in
  :func:`loss_slice_1d`.

  Returns:
    ``[A, B]`` losses.

  Example:
    >>> kx, ky = jax.random.split(jax.random.key(0))
    >>> dx, dy = random_direction(kx, params), random_direction(ky, params)
    >>> grid = jnp.linspace(-1, 1, 11)
    >>> loss_slice_2d(loss_fn, params, dx, dy, grid, grid)  # [11, 11]
  """
  alphas_A = _coords("alphas", alphas)
  betas_B = _coords("betas", betas)
  a_AxB, b_AxB = jnp.meshgrid(alphas_A, betas_B, indexing="ij")
  loss_P = loss_on_plane(loss_fn, params, dir_x, dir_y, a_AxB.reshape(-1), b_AxB.reshape(-1),
                         batch_size=batch_size)
  return loss_P.reshape(a_AxB.shape)


def loss_on_plane(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, dir_x: PyTree,
                  dir_y: PyTree, alphas: Sequence[float] | jax.Array,
                  betas: Sequence[float] | jax.Array, *,
                  batch_size: int | None = None) -> jax.Array:
  """``loss_P[i] = L(w + alphas[i] * d_x + betas[i] * d_y)`` at ``P`` points of the plane.

  The points of :func:`loss_slice_2d`'s grid in any order or subset, so a grid can be evaluated
  a chunk of points at a time. ``batch_size`` as in :func:`loss_slice_1d`.

  Returns:
    ``[P]`` losses.

  Example:
    >>> loss_on_plane(loss_fn, params, dx, dy, [0.0, 0.5], [0.0, -0.5])  # [L(w), L(w + (dx-dy)/2)]
  """
  alphas_P = _coords("alphas", alphas)
  betas_P = _coords("betas", betas)
  if alphas_P.shape != betas_P.shape:
    raise ValueError(f"alphas and betas must have the same shape, got {alphas_P.shape} and "
                     f"{betas_P.shape}")
  ab_Px2 = jnp.stack([alphas_P, betas_P], axis=1)
  return _map(lambda ab: loss_fn(perturb_2d(params, dir_x, dir_y, ab[0], ab[1])), ab_Px2,
              batch_size)

"""Filter-normalised random directions in weight space (Li et al. 2018) and moves along them.

A loss terrain around weights ``w`` is probed along directions ``d`` (pytrees shaped like ``w``). A
raw Gaussian direction is meaningless across layers whose weights have different scales, so Li et
al., "Visualizing the Loss Landscape of Neural Nets" (NeurIPS 2018), rescale each *filter* of ``d``
to the norm of the matching filter of ``w``: a step of ``alpha * d`` then moves every filter by
``alpha`` times its own size, and a "relative size" ``sigma`` means the same thing in every layer.

What a filter is here: for a leaf with ``ndim >= 2`` the **last axis indexes the filters** and a
filter is everything else, ``leaf[..., j]``. For a Flax ``Dense`` kernel ``[in, out]`` that is one
output unit (the column feeding unit ``j``); for a ``Conv`` kernel ``[h, w, in, out]`` one output
channel; for an embedding table ``[vocab, d_model]`` one embedding coordinate. Leaves with
``ndim <= 1`` (biases, LayerNorm scales, scalars) are zeroed when ``ignore_1d`` (Li et al.'s
``ignore='biasbn'``), otherwise treated as a single filter: the whole vector is rescaled to the
vector's norm. Non-float leaves get a zero direction.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def _is_float(x: jax.Array) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def _included(leaf: jax.Array, ignore_1d: bool) -> bool:
  return _is_float(leaf) and not (ignore_1d and jnp.ndim(leaf) <= 1)


def _filter_normalise(d: jax.Array, w: jax.Array) -> jax.Array:
  """Rescales each filter ``d[..., j]`` to ``||w[..., j]||`` (whole leaf as one filter if ndim <=
  1)."""
  cdt = jnp.promote_types(w.dtype, jnp.float32)
  d32, w32 = d.astype(cdt), w.astype(cdt)
  axes = tuple(range(d.ndim - 1)) if d.ndim >= 2 else None
  d_norm = jnp.sqrt(jnp.sum(d32 * d32, axis=axes, keepdims=True))
  w_norm = jnp.sqrt(jnp.sum(w32 * w32, axis=axes, keepdims=True))
  # A zero Gaussian filter has probability 0, but must still not produce NaN.
  scale = jnp.where(d_norm > 0, w_norm / jnp.where(d_norm > 0, d_norm, 1.0), 0.0)
  return (d32 * scale).astype(d.dtype)


def random_direction(key: jax.Array, params: PyTree, *, filter_norm: bool = True,
                     ignore_1d: bool = True) -> PyTree:
  """A random direction in weight space, shaped like ``params``.

  Draws ``g ~ N(0, I)`` per leaf, then

  * ``filter_norm=True``: ``d[..., j] = g[..., j] * ||w[..., j]|| / ||g[..., j]||`` for every filter
    ``j`` of every included leaf (see the module docstring for what a filter is);
  * ``filter_norm=False``: ``d = g * ||w|| / ||g||`` with both norms over all included leaves
    together, i.e. a uniformly random direction on the sphere of radius ``||w||``.

  Leaves with ``ndim <= 1`` are zero when ``ignore_1d`` (and then also left out of ``||w||``);
  non-float leaves are always zero. Each leaf draws from its own ``jax.random.fold_in(key,
  leaf_index)``.

  Args:
    key: PRNG key.
    params: the weights ``w`` (any pytree of arrays).
    filter_norm: per-filter (Li et al.) instead of global normalisation.
    ignore_1d: zero the direction on biases, norm scales and scalars.

  Returns:
    A pytree with the structure, shapes and dtypes of ``params``.

  Example:
    >>> params = {"kernel": jnp.ones((3, 2)), "bias": jnp.ones((2,))}
    >>> d = random_direction(jax.random.key(0), params)
    >>> jnp.linalg.norm(d["kernel"], axis=0)  # == ||column of w|| == sqrt(3)
    >>> d["bias"]  # zeros
  """
  leaves, treedef = jax.tree_util.tree_flatten(params)
  out = []
  for i, w in enumerate(leaves):
    w = jnp.asarray(w)
    if not _included(w, ignore_1d):
      out.append(jnp.zeros_like(w))
      continue
    # Draw and normalise in at least float32 (bfloat16 norms are too coarse), float64 under x64.
    cdt = jnp.promote_types(w.dtype, jnp.float32)
    g = jax.random.normal(jax.random.fold_in(key, i), w.shape, cdt)
    out.append(_filter_normalise(g, w) if filter_norm else g)
  if not filter_norm:
    inc = [_included(jnp.asarray(w), ignore_1d) for w in leaves]
    g_sq = sum((jnp.sum(g * g) for g, keep in zip(out, inc) if keep), jnp.float32(0))
    w_sq = sum((jnp.sum(jnp.square(jnp.asarray(w).astype(g.dtype)))
                for w, g, keep in zip(leaves, out, inc) if keep), jnp.float32(0))
    scale = jnp.where(g_sq > 0, jnp.sqrt(w_sq / jnp.where(g_sq > 0, g_sq, 1.0)), 0.0)
    out = [g * scale if keep else g for g, keep in zip(out, inc)]
  out = [d.astype(jnp.asarray(w).dtype) for d, w in zip(out, leaves)]
  return jax.tree_util.tree_unflatten(treedef, out)


def perturb(params: PyTree, direction: PyTree, alpha: jax.Array | float) -> PyTree:
  """``w + alpha * d`` leaf by leaf, keeping each leaf's dtype.

  Example:
    >>> perturb({"w": jnp.ones(2)}, {"w": jnp.array([1., -1.])}, 0.5)  # {"w": [1.5, 0.5]}
  """
  return jax.tree_util.tree_map(
      lambda w, d: (w + alpha * d).astype(jnp.result_type(w)), params, direction)


def perturb_2d(params: PyTree, dir_x: PyTree, dir_y: PyTree, alpha: jax.Array | float,
               beta: jax.Array | float) -> PyTree:
  """``w + alpha * d_x + beta * d_y`` leaf by leaf, keeping each leaf's dtype."""
  return jax.tree_util.tree_map(
      lambda w, dx, dy: (w + alpha * dx + beta * dy).astype(jnp.result_type(w)),
      params, dir_x, dir_y)


def tree_norm(tree: PyTree) -> jax.Array:
  """Euclidean norm of all float leaves of a pytree together, computed in at least float32."""
  leaves = [jnp.asarray(x) for x in jax.tree_util.tree_leaves(tree) if _is_float(x)]
  sq = [jnp.sum(jnp.square(x.astype(jnp.promote_types(x.dtype, jnp.float32)))) for x in leaves]
  return jnp.sqrt(sum(sq, jnp.float32(0)))

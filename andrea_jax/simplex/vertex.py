"""Vertices of the region ``{l <= w <= u, sum w = 1}``: the score-maximising one, and all of them.

A vertex has ``n - 1`` linearly independent active bounds besides the sum, so every coordinate but
at most one sits at its floor or its ceiling, and the odd one takes the remaining mass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Enumeration visits 2^k ceiling patterns of the k unpinned coordinates.
_MAX_ENUMERATED = 20


def _greedy_1d(scores, lower, upper):
  order = jnp.argsort(scores, descending=True, stable=True)  # ties: lower index first
  cap_sorted = (upper - lower)[order]
  room = 1 - jnp.sum(lower)
  taken_before = jnp.cumsum(cap_sorted) - cap_sorted  # caps of the better-scored coordinates
  fill_sorted = jnp.clip(room - taken_before, 0, cap_sorted)
  # The clip only catches l + (u - l) rounding one ulp above u.
  w = jnp.clip(lower + jnp.zeros_like(lower).at[order].set(fill_sorted), lower, upper)
  # A NaN score has no rank (the sort would put it first and give it the mass): never hidden.
  return jnp.where(jnp.any(jnp.isnan(scores)), jnp.nan, w)


def greedy_vertex(scores: jax.Array, lower: jax.Array, upper: jax.Array) -> jax.Array:
  """The point of ``{l <= w <= u, sum w = 1}`` that maximises ``scores . w`` (a vertex).

  Start from the floors and pour the remaining mass ``1 - sum l`` into the coordinates by
  descending score, each up to its ceiling: with ``pi`` the order (ties: lower index first),

      w_pi(k) = l_pi(k) + clip(1 - sum l - sum_{j < k} (u - l)_pi(j), 0, (u - l)_pi(k)).

  This is the exact LP optimum (an exchange argument: moving mass from a better-scored coordinate
  to a worse one never helps). A NaN among the scores makes the whole point NaN. Excluded sources (``u = l = 0``) have no room and never get mass.
  One sort and one cumulative sum, no loop over coordinates; jit/vmap-safe with traced bounds.
  Leading batch axes ``[..., n]`` are broadcast explicitly and vmapped.

  Args:
    scores: ``[..., n]`` (e.g. the UCB of each source).
    lower, upper: ``[..., n]`` floors and ceilings of a feasible region.

  Returns:
    ``w``, ``[..., n]``.

  Example:
    >>> greedy_vertex(jnp.array([0., 1., 2.]), jnp.array([.5, 0., 0.]), jnp.array([1., 1., .25]))
    Array([0.5 , 0.25, 0.25], dtype=float32)
  """
  dtype = jnp.result_type(scores, lower, upper, jnp.float32)
  shape = jnp.broadcast_shapes(jnp.shape(scores), jnp.shape(lower), jnp.shape(upper))
  args = [jnp.broadcast_to(jnp.asarray(a, dtype), shape) for a in (scores, lower, upper)]
  return _greedy_batched(*args)


@jax.jit  # one compiled program per shape for eager calls; inlined inside a user's jit
def _greedy_batched(scores, lower, upper):
  f = _greedy_1d
  for _ in range(scores.ndim - 1):
    f = jax.vmap(f)
  return f(scores, lower, upper)


def vertices(lower, upper, *, atol: float = 1e-12) -> np.ndarray:
  """All vertices of ``{l <= w <= u, sum w = 1}`` (host-side numpy, for plots and tests).

  Enumerates which unpinned coordinates sit at their ceiling (``S``); the others sit at their
  floor except possibly one, ``j``, that takes the residual ``r = 1 - sum l - sum_S (u - l)``. The
  pattern is a vertex when ``r = 0`` (no odd coordinate) or when ``0 < r < u_j - l_j`` for some
  ``j`` outside ``S``. Pinned coordinates (``l = u``) stay put.

  Args:
    lower, upper: ``[n]`` floors and ceilings (at most 20 unpinned coordinates).
    atol: residuals within ``atol`` of 0 or of a cap count as equal to it; duplicates within
      ``atol`` are merged.

  Returns:
    float64 ``[num_vertices, n]`` in descending lexicographic order; ``[0, n]`` if empty.

  Example (the source document's quadrilateral over (H, G, D), H >= 0.5, D <= 0.25):
    >>> vertices([0.5, 0, 0], [1, 1, 0.25])
    array([[1.  , 0.  , 0.  ],
           [0.75, 0.  , 0.25],
           [0.5 , 0.5 , 0.  ],
           [0.5 , 0.25, 0.25]])
  """
  lower = np.asarray(lower, dtype=np.float64)
  upper = np.asarray(upper, dtype=np.float64)
  n = lower.size
  cap = upper - lower
  movable = np.flatnonzero(cap > atol)
  k = movable.size
  if k > _MAX_ENUMERATED:
    raise ValueError(f"vertices() enumerates 2^k ceiling patterns; k = {k} unpinned coordinates "
                     f"is more than {_MAX_ENUMERATED}")
  if np.any(cap < -atol) or lower.sum() > 1 + atol or upper.sum() < 1 - atol:
    return np.zeros((0, n))
  at_cap_PxK = ((np.arange(2**k)[:, None] >> np.arange(k)[None, :]) & 1).astype(bool)
  base_PxN = np.broadcast_to(lower, (2**k, n)).copy()
  base_PxN[:, movable] += np.where(at_cap_PxK, cap[movable], 0.0)
  residual_P = 1 - base_PxN.sum(axis=1)
  exact = base_PxN[np.abs(residual_P) <= atol]
  # Pattern p with odd coordinate movable[j]: needs j off its cap and 0 < r < cap_j strictly.
  odd_PxK = (~at_cap_PxK & (residual_P[:, None] > atol)
             & (residual_P[:, None] < cap[movable][None, :] - atol))
  p_idx, j_idx = np.nonzero(odd_PxK)
  odd = base_PxN[p_idx]
  odd[np.arange(p_idx.size), movable[j_idx]] += residual_P[p_idx]
  found = np.concatenate([exact, odd])
  if found.size == 0:
    return np.zeros((0, n))
  found = found[np.lexsort(found.T[::-1])[::-1]]  # descending lexicographic
  keep = np.ones(len(found), dtype=bool)
  keep[1:] = np.any(np.abs(np.diff(found, axis=0)) > atol, axis=1)
  return found[keep]

"""Exact, differentiable Euclidean projection onto the capped simplex {l <= w <= u, sum w = 1}.

The problem ``min_w 1/2 ||w - x||^2  s.t.  l <= w <= u,  1^T w = 1`` has the KKT conditions

    w_i - x_i = tau + mu_i - nu_i,  mu_i, nu_i >= 0,  mu_i (w_i - l_i) = 0,  nu_i (u_i - w_i) = 0,

so ``w = clip(x + tau, l, u)`` for the one scalar ``tau`` (the multiplier of the sum constraint)
that solves ``g(tau) = sum_i clip(x_i + tau, l_i, u_i) = 1``. ``g`` is continuous, non-decreasing
and piecewise affine: coordinate ``i`` leaves its floor at the breakpoint ``a_i = l_i - x_i`` and
reaches its ceiling at ``b_i = u_i - x_i``; between consecutive breakpoints ``g`` has slope
``|F|``, the number of free coordinates. No bisection, no tolerance: we read the active set off
the breakpoints,

    L = {i : g(a_i) >= 1}  (at the floor),   U = {i : g(b_i) <= 1}  (at the ceiling),   F = rest,

(``g`` is non-decreasing, so ``g(a_i) >= 1`` iff ``a_i`` is at or beyond the root) and solve the
affine piece of ``g`` through the root exactly:

    tau = (1 - sum_{i in L} l_i - sum_{i in U} u_i - sum_{i in F} x_i) / |F|.

Two ways to find the active set, with the same answer:

* ``"pairwise"`` evaluates ``g`` at all ``2n`` breakpoints at once: ``O(n^2)`` work but no sort and
  no reduction across breakpoints, the fastest for the sixteen sources (and up to n ~ 128 on CPU);
* ``"sort"`` sorts the breakpoints, accumulates ``g`` along them with a cumulative sum of slopes and
  takes the active set of the segment where ``g`` crosses 1: ``O(n log n)``, for long vectors.

Rounding can only mislabel a coordinate whose breakpoint is within rounding of the root, i.e. a
coordinate within rounding of its bound; every labelling of such a coordinate gives an affine piece
through the root, so ``tau`` stays exact to rounding.

Large inputs (``|x| > 8``, up to the largest float, infinities included) would cancel in
``x + tau``; they are first shifted by an anchor, one of the ``x_k``, so that the root lies in
``[-1, 1]`` and every number is of order 1 (see :func:`_anchored`); this needs bounds in
``[0, 1]``, a mixture's, and a row with other bounds keeps its ``x`` (exact to rounding relative
to ``|x|``). Infinite bounds (a floor of ``-inf``, a ceiling of ``+inf``) are allowed in both
methods. A NaN in a point makes the whole point NaN: it is never hidden.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp

Method = Literal["auto", "pairwise", "sort"]

# Up to this length the O(n^2) pairwise evaluation beats sorting on CPU (measured: 2x at n = 64,
# even at n = 128, sort ahead at n = 256; XLA's CPU sort of short rows is slow).
_PAIRWISE_MAX_N = 128


# Beyond this magnitude x + tau loses digits (float32: ulp(8) ~ 1e-6); such points are anchored.
_MODERATE = 8.0

# The core works on [B, n] arrays (a batch of points); the public function reshapes to it.


def _anchored(x_BxN, lo_BxN, hi_BxN):
  """``clip(x - c, -2, 2)``, ``c`` an anchor among the ``x_k``: the same projection, small numbers.

  With ``xs`` the sorted ``x``, ``G_k = g(-xs_k) = sum_i clip(x_i - xs_k, l_i, u_i)`` is computed
  from exact differences (no cancellation) and does not increase with ``k``. Take ``c = xs_j``,
  ``j = min(#{k : G_k >= 1}, n - 1)`` (a binary search). The root of ``g`` then lies in
  ``-c + [-1, 1]``: past the gap between two consecutive ``x`` every coordinate sits at a bound
  (all ``l, u`` lie in [0, 1]). On that interval a coordinate with ``x_i - c`` beyond ``+-2`` is
  at its bound whatever its exact value, so clipping the shifted ``x`` changes nothing.
  """
  n = x_BxN.shape[-1]
  xs_BxN = jnp.sort(x_BxN, axis=-1)

  def g_at(k_Bx1):
    c_Bx1 = jnp.take_along_axis(xs_BxN, jnp.minimum(k_Bx1, n - 1), axis=-1)
    return jnp.sum(jnp.clip(x_BxN - c_Bx1, lo_BxN, hi_BxN), axis=-1, keepdims=True)

  def halve(_, ab):
    a_Bx1, b_Bx1 = ab   # G_k >= 1 for every k < a, G_k < 1 for every k >= b
    mid_Bx1 = (a_Bx1 + b_Bx1) // 2
    open_Bx1 = a_Bx1 < b_Bx1
    high_Bx1 = g_at(mid_Bx1) >= 1
    return (jnp.where(open_Bx1 & high_Bx1, mid_Bx1 + 1, a_Bx1),
            jnp.where(open_Bx1 & ~high_Bx1, mid_Bx1, b_Bx1))

  start = (jnp.zeros(x_BxN.shape[:-1] + (1,), jnp.int32), jnp.full(x_BxN.shape[:-1] + (1,), n,
                                                                     jnp.int32))
  j_Bx1, _ = jax.lax.fori_loop(0, n.bit_length(), halve, start)
  c_Bx1 = jnp.take_along_axis(xs_BxN, jnp.minimum(j_Bx1, n - 1), axis=-1)
  return jnp.clip(x_BxN - c_Bx1, -2, 2)


def _moderate(x_BxN, lo_BxN, hi_BxN):
  """``x`` when every ``|x_i| <= 8``, else :func:`_anchored` (infinities as the largest float).

  The anchoring assumes bounds in ``[0, 1]`` (a mixture's); a row with a bound outside it keeps
  its ``x``: exact still, to rounding relative to ``|x|``.
  """
  big = jnp.finfo(x_BxN.dtype).max
  x_BxN = jnp.clip(x_BxN, -big, big)   # +-inf: the limit of the projection; NaN stays NaN
  unit_Bx1 = jnp.all((lo_BxN >= 0) & (hi_BxN <= 1), axis=-1, keepdims=True)

  def anchored(x, lo, hi):
    return jnp.where(unit_Bx1, _anchored(x, lo, hi), x)

  return jax.lax.cond(jnp.any(jnp.abs(x_BxN) > _MODERATE), anchored,
                      lambda x, lo, hi: x, x_BxN, lo_BxN, hi_BxN)


def _active_pairwise(x_BxN, lo_BxN, hi_BxN):
  """Active sets ``(at_lower, at_upper)`` ``[B, n]`` from g at every breakpoint, no sort.

  g is non-decreasing, so coordinate i sits at its floor iff its breakpoint a_i is at or beyond
  the root, i.e. iff g(a_i) >= 1, and at its ceiling iff g(b_i) <= 1. (A tie means the coordinate
  is exactly at that bound at the root: either label gives the same tau.)
  """
  n = x_BxN.shape[-1]
  a_BxN, b_BxN = lo_BxN - x_BxN, hi_BxN - x_BxN
  t_BxT = jnp.concatenate([a_BxN, b_BxN], axis=-1)  # T = 2n breakpoints
  # g(t) = sum_i x_i + clip(t, a_i, b_i), at every breakpoint at once. Unrolled over the n
  # coordinates (n <= 64), XLA fuses the chain into one pass over [B, T]: no [B, T, n] table and
  # no reduction over a short minor axis (the fastest layout on CPU, see bench/simplex.py).
  h_BxT = jnp.zeros_like(t_BxT)
  for i in range(n):
    h_BxT = h_BxT + jnp.clip(t_BxT, a_BxN[:, i:i + 1], b_BxN[:, i:i + 1])
  target_Bx1 = 1 - jnp.sum(x_BxN, axis=-1, keepdims=True)  # g(t) <= 1  <=>  h(t) <= 1 - sum x
  at_lower = h_BxT[:, :n] >= target_Bx1
  at_upper = (h_BxT[:, n:] <= target_Bx1) & ~at_lower
  return at_lower, at_upper


def _active_sort(x_BxN, lo_BxN, hi_BxN):
  """Active sets ``(at_lower, at_upper)`` ``[B, n]`` by sorting the breakpoints."""
  n = x_BxN.shape[-1]
  t_BxT = jnp.concatenate([lo_BxN - x_BxN, hi_BxN - x_BxN], axis=-1)
  # Crossing a floor breakpoint frees a coordinate (+1 slope), a ceiling breakpoint binds one (-1).
  step_BxT = jnp.concatenate([jnp.ones_like(x_BxN), -jnp.ones_like(x_BxN)], axis=-1)
  order_BxT = jnp.argsort(t_BxT, axis=-1)
  t_BxT = jnp.take_along_axis(t_BxT, order_BxT, axis=-1)
  slope_BxT = jnp.cumsum(jnp.take_along_axis(step_BxT, order_BxT, axis=-1), axis=-1)
  # g at the breakpoints: g at the first finite one, t_0, plus the rises of the finite segments.
  # An infinite bound puts its breakpoint at -inf (a floor of -inf: g(-inf) = -inf) or +inf (a
  # ceiling of +inf: g(+inf) = +inf); such segments never enter the sum. With finite bounds t_0
  # is the first breakpoint, where every coordinate is at its floor: g(t_0) = sum l.
  finite_BxT = jnp.isfinite(t_BxT)
  first_Bx1 = jnp.argmax(finite_BxT, axis=-1, keepdims=True)
  t0_Bx1 = jnp.where(jnp.any(finite_BxT, axis=-1, keepdims=True),
                     jnp.take_along_axis(t_BxT, first_Bx1, axis=-1), 0)
  # Every bound finite: t_0 is the first breakpoint and g(t_0) = sum l exactly (x + (l - x) may
  # round off l, and the active set would move by an ulp at ties).
  g0_Bx1 = jnp.where(jnp.all(finite_BxT, axis=-1, keepdims=True),
                     jnp.sum(lo_BxN, axis=-1, keepdims=True),
                     jnp.sum(jnp.clip(x_BxN + t0_Bx1, lo_BxN, hi_BxN), axis=-1, keepdims=True))
  segment_BxT1 = finite_BxT[:, :-1] & finite_BxT[:, 1:]
  rise_BxT1 = jnp.where(segment_BxT1, slope_BxT[:, :-1] * jnp.diff(
      jnp.where(finite_BxT, t_BxT, 0), axis=-1), 0)
  climb_BxT = jnp.concatenate([jnp.zeros_like(rise_BxT1[:, :1]), jnp.cumsum(rise_BxT1, axis=-1)],
                              axis=-1)
  g_BxT = g0_Bx1 + climb_BxT - jnp.take_along_axis(climb_BxT, first_Bx1, axis=-1)
  g_BxT = jnp.where(finite_BxT, g_BxT, jnp.where(t_BxT < 0, -jnp.inf, jnp.inf))
  # The consecutive breakpoints t_lo <= t_hi around g = 1; the active set of the open segment
  # between them is the one at a point inside it (its midpoint when both ends are finite).
  k_Bx1 = jnp.clip(jnp.sum(g_BxT <= 1, axis=-1, keepdims=True), 1, 2 * n - 1)
  t_lo_Bx1 = jnp.take_along_axis(t_BxT, k_Bx1 - 1, axis=-1)
  t_hi_Bx1 = jnp.take_along_axis(t_BxT, k_Bx1, axis=-1)
  lo_inf, hi_inf = jnp.isinf(t_lo_Bx1), jnp.isinf(t_hi_Bx1)
  t_mid_Bx1 = jnp.where(lo_inf & hi_inf, 0, jnp.where(
      hi_inf, t_lo_Bx1 + 1, jnp.where(lo_inf, t_hi_Bx1 - 1, 0.5 * (t_lo_Bx1 + t_hi_Bx1))))
  at_lower = x_BxN + t_mid_Bx1 <= lo_BxN
  at_upper = (x_BxN + t_mid_Bx1 >= hi_BxN) & ~at_lower
  return at_lower, at_upper


def _solve(x_BxN, lo_BxN, hi_BxN, at_lower, at_upper):
  """The exact tau of the affine piece of g with this active set, and w."""
  free = ~(at_lower | at_upper)
  num_free_Bx1 = jnp.maximum(jnp.sum(free, axis=-1, keepdims=True), 1)
  bound_BxN = jnp.where(at_lower, lo_BxN, hi_BxN)
  # On this piece g(t) = held + |F| t, held = sum of the bounds held plus the free x.
  held_Bx1 = jnp.sum(jnp.where(free, x_BxN, bound_BxN), axis=-1, keepdims=True)
  tau_Bx1 = (1 - held_Bx1) / num_free_Bx1
  # No free coordinate: the bounds alone sum to 1, and tau is not needed.
  w_BxN = jnp.where(free, jnp.clip(x_BxN + tau_Bx1, lo_BxN, hi_BxN), bound_BxN)
  # x_i + tau cancels when |x| >> w (float32, |x| ~ 5: ~ulp(5) per coordinate, ~1e-6 on the sum).
  # One Newton step on the affine piece, applied to the small numbers w, removes it.
  residual_Bx1 = 1 - jnp.sum(w_BxN, axis=-1, keepdims=True)
  return jnp.where(free, jnp.clip(w_BxN + residual_Bx1 / num_free_Bx1, lo_BxN, hi_BxN), w_BxN)


def _make_projection(active_sets):
  """A custom_jvp projection ``(x, lower, upper) [B, n] -> w [B, n]`` using ``active_sets``."""

  @jax.custom_jvp
  def proj(x_BxN, lo_BxN, hi_BxN):
    m_BxN = _moderate(x_BxN, lo_BxN, hi_BxN)
    w_BxN = _solve(m_BxN, lo_BxN, hi_BxN, *active_sets(m_BxN, lo_BxN, hi_BxN))
    return jnp.where(jnp.any(jnp.isnan(x_BxN), axis=-1, keepdims=True), jnp.nan, w_BxN)

  @proj.defjvp
  def proj_jvp(primals, tangents):
    x_BxN, lo_BxN, hi_BxN = primals
    dx, dlo, dhi = tangents
    w_BxN = proj(x_BxN, lo_BxN, hi_BxN)
    at_lower = w_BxN <= lo_BxN
    at_upper = (w_BxN >= hi_BxN) & ~at_lower
    free = ~(at_lower | at_upper)
    # Bound coordinates follow their bound; the free ones share the shift dtau keeping sum dw = 0.
    dbound = jnp.where(at_lower, dlo, jnp.where(at_upper, dhi, 0))
    num_free_Bx1 = jnp.sum(free, axis=-1, keepdims=True)
    dtau_Bx1 = -(jnp.sum(jnp.where(free, dx, dbound), axis=-1, keepdims=True)
                 / jnp.maximum(num_free_Bx1, 1))
    return w_BxN, jnp.where(free, dx + dtau_Bx1, dbound)

  return proj


_PROJECTIONS = {
    "pairwise": _make_projection(_active_pairwise),
    "sort": _make_projection(_active_sort),
}


def project(x: jax.Array, lower: jax.Array, upper: jax.Array, *,
            method: Method = "auto") -> jax.Array:
  r"""Euclidean projection of ``x`` onto ``{w : lower <= w <= upper, sum(w) = 1}``, exactly.

  Computes ``w = clip(x + tau, lower, upper)`` with the one ``tau`` for which ``sum(w) = 1`` (the
  KKT form of the projection), found from the breakpoints ``lower_i - x_i`` and ``upper_i - x_i``
  by a finite algorithm (see the module docstring); no tolerance, no iteration count.

  Differentiable through a ``jax.custom_jvp`` with the active-set Jacobian: with ``F`` the free
  coordinates (``lower_i < w_i < upper_i``),

      dw_i = dx_i - (1/|F|) (sum_{j in F} dx_j + sum_{j not in F} dbound_j)   for i in F,
      dw_i = dbound_i  (dlower_i or dupper_i, 0 for constant bounds)          otherwise.

  With constant bounds the free block is ``I - 11^T/|F|`` and the rest is 0; with every coordinate
  at a bound (``F`` empty) the tangent is ``dbound`` and never NaN.

  Works in float32 and float64, under ``jit``, ``vmap`` and ``grad``; nothing branches in Python on
  the values of the bounds, so they may be traced. A leading batch is accepted: ``x``, ``lower``
  and ``upper`` are broadcast explicitly to one shape ``[..., n]`` and projected row by row in
  one vectorised pass (the same result as ``jax.vmap(project)``, and the faster way to project a
  batch).

  Args:
    x: points to project, ``[..., n]``.
    lower: floors ``l``, ``[..., n]`` (or ``[n]``, shared by the batch); ``l <= u``.
    upper: ceilings ``u``, same shape rules; ``sum(l) <= 1 <= sum(u)`` (see ``is_feasible``).
    method: ``"pairwise"`` (``O(n^2)``, no sort), ``"sort"`` (``O(n log n)``) or ``"auto"``
      (pairwise up to n = 128). Static.

  Returns:
    ``w``, ``[..., n]``: the closest point of the region to ``x``.

  Example:
    The source document's region over (H, G, D), H >= 0.5, D <= 0.25; tau = -0.25:

    >>> project(jnp.array([0.9, 0.6, 0.1]), jnp.array([0.5, 0., 0.]), jnp.array([1., 1., 0.25]))
    Array([0.65      , 0.35000002, 0.        ], dtype=float32)
    >>> project(x_Bx3, lower, upper)  # a batch [B, 3] of points, one region for all
    >>> jax.vmap(project)(x_Bx3, lower_Bx3, upper_Bx3)  # one region per point, also fine
  """
  x = jnp.asarray(x)
  dtype = jnp.result_type(x, lower, upper, jnp.float32)
  shape = jnp.broadcast_shapes(jnp.shape(x), jnp.shape(lower), jnp.shape(upper))
  x, lower, upper = (jnp.broadcast_to(jnp.asarray(a, dtype), shape) for a in (x, lower, upper))
  if method == "auto":
    method = "pairwise" if shape[-1] <= _PAIRWISE_MAX_N else "sort"
  if method not in _PROJECTIONS:
    raise ValueError(f"method must be 'auto', 'pairwise' or 'sort', got {method!r}")
  return _project_batched(x, lower, upper, method=method)


# Jitted once per shape and method, so that eager calls (notebooks, tests) run one compiled
# program instead of dispatching op by op; inside a user's jit it is inlined.
@functools.partial(jax.jit, static_argnames=("method",))
def _project_batched(x, lower, upper, *, method):
  shape = x.shape
  x_BxN, lo_BxN, hi_BxN = (a.reshape(-1, shape[-1]) for a in (x, lower, upper))
  return _PROJECTIONS[method](x_BxN, lo_BxN, hi_BxN).reshape(shape)

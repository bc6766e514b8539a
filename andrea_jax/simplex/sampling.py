"""Uniform sampling of the region ``{l <= w <= u, sum w = 1}`` (a "random phase" of the curriculum).

Uniform means: with respect to the Lebesgue measure of the region's own dimension (on the affine
hull of the free coordinates ``F = {i : l_i < u_i}``); pinned and excluded coordinates sit exactly
at their bound.

Two exact rejection samplers and a fallback chain:

* **floor side** (path 0): ``y = w - l`` lives on the simplex of mass ``m_l = 1 - sum l`` over ``F``
  cut by the caps ``c = u - l``. Uniform on a scaled simplex is ``m E / sum E`` with ``E_i`` i.i.d.
  Exp(1) over ``F``; keep the proposals with ``y <= c``.
* **ceiling side** (path 1): ``z = u - w`` lives on the simplex of mass ``m_u = sum u - 1`` over
  ``F`` cut by the same caps. A tight floor such as 0.7 on one of 16 sources makes the floor side
  easy; many small ceilings make the ceiling side easy.
* **chain** (path 2): hit-and-run from an interior point, for when both acceptances are below
  ``min_acceptance`` or the rejection rounds ran out.

The acceptance of a side is the volume fraction of the capped simplex, by inclusion-exclusion over
the caps (``k = |F|``):

    P(y <= c) = sum_{J subset F} (-1)^{|J|} max(0, 1 - sum_{j in J} c_j / m)^{k - 1}.
"""

from __future__ import annotations

import functools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import checks

Method = Literal["auto", "reject", "floor", "ceiling", "chain"]

# The inclusion-exclusion table has 2^n entries.
MAX_EXACT_SOURCES = _MAX_N = 20

# Rounding allowed on the sums of the bounds (float32 bounds of a region that is tight in float64).
_SUM_TOL = 1e-5


def _check_bounds(lower, upper) -> None:
  """Concrete bounds: ``ValueError`` unless finite, ``0 <= l <= u`` and ``sum l <= 1 <= sum u``."""
  lo, hi = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
  for name, b in (("lower", lo), ("upper", hi)):
    bad = np.flatnonzero(~np.isfinite(b) | (b < 0))
    if bad.size:
      raise ValueError(f"{name}[{bad[0]}] = {b[bad[0]]} must be finite and >= 0")
  bad = np.flatnonzero(lo > hi)
  if bad.size:
    raise ValueError(f"upper[{bad[0]}] = {hi[bad[0]]} is under lower[{bad[0]}] = {lo[bad[0]]}")
  if lo.sum() > 1 + _SUM_TOL or hi.sum() < 1 - _SUM_TOL:
    raise ValueError(f"the region is empty: the floors sum to {lo.sum():.6g} (must be <= 1) and "
                     f"the ceilings to {hi.sum():.6g} (must be >= 1)")


class SampleInfo(NamedTuple):
  """What :func:`sample_uniform` did (scalars; batched under vmap).

  Attributes:
    path: int32, 0 = rejection from the floor side, 1 = rejection from the ceiling side, 2 = the
      chain produced some or all of the samples.
    acceptance: exact acceptance probability of the side rejection used (the larger of the two
      when the chain ran).
    acceptance_floor: exact acceptance probability of the floor side.
    acceptance_ceiling: exact acceptance probability of the ceiling side.
    rounds: int32, batched rejection rounds run.
  """
  path: jax.Array
  acceptance: jax.Array
  acceptance_floor: jax.Array
  acceptance_ceiling: jax.Array
  rounds: jax.Array


def _subset_table(ratio):
  """Sums of ``ratio`` over every subset and their signs ``(-1)^|J|``, as ``[2^(n-h), 2^h]``.

  The outer sum of the two halves' ``2^(n/2)``-entry tables: small to compile, quick to run.
  """
  def half(r_H):
    h = r_H.shape[0]
    bits_SxH = (jnp.arange(2**h, dtype=jnp.int32)[:, None]
                >> jnp.arange(h, dtype=jnp.int32)[None, :]) & 1
    sums_S = jnp.sum(jnp.where(bits_SxH == 1, r_H[None, :], 0), axis=-1)
    signs_S = (1 - 2 * (jnp.sum(bits_SxH, axis=-1) % 2)).astype(r_H.dtype)
    return sums_S, signs_S

  h = ratio.shape[0] // 2
  sums_lo, signs_lo = half(ratio[:h])
  sums_hi, signs_hi = half(ratio[h:])
  return sums_hi[:, None] + sums_lo[None, :], signs_hi[:, None] * signs_lo[None, :]


def _capped_fraction(mass, caps, free):
  """Volume fraction of {y >= 0 on F, sum y = mass, y <= caps} in the simplex, by incl.-excl."""
  k = jnp.sum(free)
  # A coordinate outside F must never enter J: its ratio 2 makes every subset holding it vanish.
  ratio = jnp.where(free, caps / jnp.where(mass > 0, mass, 1), 2)
  sums, signs = _subset_table(ratio)
  base = jnp.maximum(1 - sums, 0)
  terms = signs * jnp.where(base > 0, base ** jnp.maximum(k - 1, 1).astype(caps.dtype), 0)
  frac = jnp.clip(jnp.sum(terms), 0, 1)
  # One free coordinate or no mass to spread: the side is a single point, always accepted.
  return jnp.where((k <= 1) | (mass <= 0), jnp.ones_like(frac), frac)


def acceptance_probabilities(lower: jax.Array, upper: jax.Array) -> tuple[jax.Array, jax.Array]:
  r"""Exact acceptance probabilities ``(p_floor, p_ceiling)`` of the two rejection samplers.

  With ``F = {i : l_i < u_i}``, ``k = |F|``, caps ``c = u - l`` and masses ``m_l = 1 - sum l``,
  ``m_u = sum u - 1``, each is the fraction of the simplex ``{y >= 0 on F, sum y = m}`` that
  satisfies ``y <= c`` (its volume relative to the simplex), by inclusion-exclusion:

      p(m, c) = sum_{J subset F} (-1)^{|J|} max(0, 1 - sum_{j in J} c_j / m)^{k - 1}

  (the set where ``y_j > c_j`` for all ``j in J`` is a copy of the simplex shrunk by
  ``1 - sum_J c_j / m``). ``p = 1`` when ``k <= 1`` or ``m = 0``. Evaluated as a ``2^n`` table
  (``n <= 20``), jittable with traced bounds; bounds ``[..., n]`` give one pair per region,
  ``[...]`` each. The alternating sum cancels: exact to ~1e-14 in
  float64, but in float32 it loses ~1e-5 absolute when many of 16 caps bind (e.g. 9e-6 for a true
  1.7e-14). That only moves the choice of path near ``min_acceptance``, never the law of the
  samples; enable float64 (``jax.enable_x64``) for precise values.

  Example (three sources, H >= 0.5, D <= 0.25: floor side mass 0.5, D's cap binds):
    >>> acceptance_probabilities(jnp.array([.5, 0, 0]), jnp.array([1., 1, .25]))[0]  # 1 - (1/2)^2
    Array(0.75, dtype=float32)
  """
  lower, upper = jnp.asarray(lower), jnp.asarray(upper)
  dtype = jnp.result_type(lower, upper, jnp.float32)
  shape = jnp.broadcast_shapes(lower.shape, upper.shape)
  if not shape:
    raise ValueError("lower and upper must be [..., n], got scalars")
  lower, upper = (jnp.broadcast_to(a.astype(dtype), shape) for a in (lower, upper))
  if shape[-1] > _MAX_N:
    raise ValueError(f"acceptance_probabilities enumerates 2^n subsets; n = {shape[-1]} "
                     f"is more than {_MAX_N}")
  f = _acceptance
  for _ in range(len(shape) - 1):   # a leading batch of regions: one pair per region
    f = jax.vmap(f)
  return f(lower, upper)


@jax.jit  # one compiled program per shape for eager calls; inlined inside a user's jit
def _acceptance(lower, upper):
  free = lower < upper
  caps = upper - lower
  return (_capped_fraction(1 - jnp.sum(lower), caps, free),
          _capped_fraction(jnp.sum(upper) - 1, caps, free))


def _propose(key, side, lower, upper, free, batch):
  """``batch`` uniform points of the side's simplex and whether they respect the caps."""
  n = lower.shape[-1]
  caps = upper - lower
  floor_side = side == 0
  mass = jnp.where(floor_side, 1 - jnp.sum(lower), jnp.sum(upper) - 1)
  mass = jnp.maximum(mass, 0)
  # Exp(1) as -log(1 - U), U in [0, 1), as jax.random.exponential does.
  e_BxN = -jnp.log1p(-jax.random.uniform(key, (batch, n), lower.dtype))
  e_BxN = jnp.where(free[None, :], e_BxN, 0)
  total_Bx1 = jnp.sum(e_BxN, axis=-1, keepdims=True)
  y_BxN = mass * e_BxN / jnp.where(total_Bx1 > 0, total_Bx1, 1)
  ok_B = jnp.all(y_BxN <= caps[None, :], axis=-1)
  w_BxN = jnp.where(floor_side, lower[None, :] + y_BxN, upper[None, :] - y_BxN)
  # The clip only removes rounding (l + (u - l) may round above u); it keeps pinned coords exact.
  return jnp.clip(w_BxN, lower[None, :], upper[None, :]), ok_B


def _reject(key, side, run, lower, upper, free, num, batch, max_rounds):
  """Fill ``[num, n]`` with accepted proposals; returns (samples, filled, rounds)."""
  n = lower.shape[-1]

  def cond(state):
    _, filled, rounds = state
    return run & (filled < num) & (rounds < max_rounds)

  def body(state):
    buf_MxN, filled, rounds = state
    w_BxN, ok_B = _propose(jax.random.fold_in(key, rounds), side, lower, upper, free, batch)
    slot_B = filled + jnp.cumsum(ok_B, dtype=jnp.int32) - 1
    slot_B = jnp.where(ok_B, slot_B, num)  # slot num (and beyond) is dropped by the scatter
    buf_MxN = buf_MxN.at[slot_B].set(w_BxN, mode="drop")
    filled = jnp.minimum(filled + jnp.sum(ok_B, dtype=jnp.int32), num)
    return buf_MxN, filled, rounds + 1

  init = (jnp.zeros((num, n), lower.dtype), jnp.int32(0), jnp.int32(0))
  buf_MxN, filled, rounds = jax.lax.while_loop(cond, body, init)
  return buf_MxN, filled, rounds


def _hit_and_run(key, lower, upper, free, num, steps, active):
  """``num`` independent hit-and-run chains of ``steps`` moves (none unless ``active``).

  Each move picks two distinct free coordinates ``i, j`` uniformly and moves along ``e_i - e_j``
  to a uniform point of the chord (the interval of ``t`` that keeps ``w_i + t`` and ``w_j - t``
  within their bounds): a random-direction hit-and-run whose directions are symmetric, so it leaves
  the uniform law invariant. Unlike isotropic directions, these stay long in a thin region (a cap
  of 1e-4 on one source does not shorten the moves between the others).
  """
  n = lower.shape[-1]
  room = jnp.sum(upper - lower)
  theta = jnp.where(room > 0, (1 - jnp.sum(lower)) / jnp.where(room > 0, room, 1), 0)
  start = lower + theta * (upper - lower)  # interior in every free coordinate when dim > 0
  if n < 2:   # one coordinate: the region is the point (1,)
    return jnp.broadcast_to(start, (num, n))
  lo_1xN, hi_1xN, free_1xN = lower[None, :], upper[None, :], free[None, :]
  two_free = jnp.sum(free) >= 2
  cols_1xN = jnp.arange(n)[None, :]

  def move(state):
    w_MxN, step = state
    # One draw per move: n uniforms rank the free coordinates (the first two move), one places the
    # point on the chord. Dense [M, n] operations only (no scatter: slow on CPU).
    u_MxN1 = jax.random.uniform(jax.random.fold_in(key, step), (num, n + 1), lower.dtype)
    score_MxN = jnp.where(free_1xN, u_MxN1[:, :n], -1)
    is_i = cols_1xN == jnp.argmax(score_MxN, axis=-1)[:, None]
    is_j = cols_1xN == jnp.argmax(jnp.where(is_i, -2, score_MxN), axis=-1)[:, None]
    d_MxN = is_i.astype(lower.dtype) - is_j.astype(lower.dtype)   # e_i - e_j
    moving = d_MxN != 0
    safe_d = jnp.where(moving, d_MxN, 1)
    t1, t2 = (lo_1xN - w_MxN) / safe_d, (hi_1xN - w_MxN) / safe_d
    t_min_Mx1 = jnp.max(jnp.where(moving, jnp.minimum(t1, t2), -jnp.inf), -1, keepdims=True)
    t_max_Mx1 = jnp.min(jnp.where(moving, jnp.maximum(t1, t2), jnp.inf), -1, keepdims=True)
    # w is feasible, so 0 lies on the chord; clamping only absorbs rounding.
    t_min_Mx1, t_max_Mx1 = jnp.minimum(t_min_Mx1, 0), jnp.maximum(t_max_Mx1, 0)
    t_Mx1 = jnp.where(two_free, t_min_Mx1 + u_MxN1[:, n:] * (t_max_Mx1 - t_min_Mx1), 0)
    return jnp.clip(w_MxN + t_Mx1 * d_MxN, lo_1xN, hi_1xN), step + 1

  # A while_loop rather than a cond: under vmap over regions it runs as long as the region that
  # needs the most moves, and not at all when no region needs the chain.
  w_MxN, _ = jax.lax.while_loop(lambda s: active & (s[1] < steps), move,
                                (jnp.broadcast_to(start, (num, n)), jnp.int32(0)))
  # Rounding drifts the sum over thousands of moves: spread the residual over the coordinates
  # strictly inside their bounds (a rounding-sized move), as the projection's last step does.
  inside_MxN = (w_MxN > lo_1xN) & (w_MxN < hi_1xN)
  count_Mx1 = jnp.maximum(jnp.sum(inside_MxN, -1, keepdims=True), 1)
  residual_Mx1 = 1 - jnp.sum(w_MxN, -1, keepdims=True)
  return jnp.clip(jnp.where(inside_MxN, w_MxN + residual_Mx1 / count_Mx1, w_MxN), lo_1xN, hi_1xN)


def sample_uniform(key: jax.Array, lower: jax.Array, upper: jax.Array, num: int, *,
                   method: Method = "auto", min_acceptance: float = 1e-3,
                   batch: int | None = None, max_rounds: int | None = None,
                   chain_steps: int | None = None) -> tuple[jax.Array, SampleInfo]:
  r"""``num`` points drawn uniformly from ``{l <= w <= u, sum w = 1}``.

  Uniform for the Lebesgue measure of the region's own dimension; coordinates with ``l_i = u_i``
  (excluded sources, ``u_i = 0``) are exactly at their bound, ``l <= w <= u`` holds exactly and
  ``sum w = 1`` up to rounding.

  ``method="auto"`` computes both exact acceptance probabilities (:func:`acceptance_probabilities`)
  and runs batched rejection from the better side (floor side: ``w = l + m_l E / sum E``, ceiling
  side: ``w = u - m_u E / sum E``, ``E`` i.i.d. Exp(1) over the free coordinates, accepted when
  every free coordinate respects the caps ``u - l``) when that probability is at least
  ``min_acceptance``, and hit-and-run otherwise. Rejection proposes ``batch`` candidates per
  ``while_loop`` round for at most ``max_rounds`` rounds; samples still missing then come from the
  chain. Both are exact in law except the chain, which is a Markov chain run for ``chain_steps``
  hit-and-run moves (two free coordinates picked uniformly trade mass: a uniform point on that
  chord) from
  ``l + t (u - l)``, ``t = (1 - sum l) / sum(u - l)``.

  Jittable with traced bounds; ``num`` and the keyword arguments are Python values. One program is
  compiled per (n, dtype, ``num``, ``batch``): the method and the loop bounds are traced inside
  it, so switching them does not recompile. For a batch of regions use
  ``jax.vmap(lambda k, l, u: sample_uniform(k, l, u, num))``: the rejection loop then runs until
  every region is filled, and the chain only if some region needs it.

  Args:
    key: PRNG key.
    lower, upper: ``[n]`` floors and ceilings of a feasible region (``n <= 20``): finite,
      ``0 <= l <= u``, ``sum l <= 1 <= sum u``. Concrete bounds that are not raise ``ValueError``;
      traced ones give NaN samples.
    num: number of samples (static).
    method: ``"auto"``; ``"reject"`` (better side, whatever its acceptance); ``"floor"`` or
      ``"ceiling"`` (that side); ``"chain"`` (hit-and-run only).
    min_acceptance: below this acceptance ``"auto"`` goes straight to the chain.
    batch: candidates per rejection round; default ``max(64, min(4 num, 4096))``.
    max_rounds: default enough for ``4 num + 16`` expected acceptances at ``min_acceptance``.
    chain_steps: hit-and-run moves per chain; default ``20 n^2``.

  Returns:
    ``(samples [num, n], SampleInfo)``.

  Example (v3 polish: the floor side accepts almost everything):
    >>> r = Region.from_bounds({"hermes3-general": .7}, {"dictionary": .25},
    ...                        exclude=("repo-docs", "repo-docstrings"))
    >>> w, info = sample_uniform(jax.random.key(0), r.lower, r.upper, 1000)
    >>> int(info.path), bool(w[:, 8].max() == 0), bool(w[:, 0].min() >= 0.7)
    (0, True, True)
  """
  lower, upper = jnp.asarray(lower), jnp.asarray(upper)
  dtype = jnp.result_type(lower, upper, jnp.float32)
  lower, upper = lower.astype(dtype), upper.astype(dtype)
  if lower.ndim != 1 or lower.shape != upper.shape:
    raise ValueError(f"lower and upper must both be [n]; got {lower.shape} and {upper.shape} "
                     "(vmap sample_uniform for a batch of regions)")
  n = lower.shape[0]
  num = checks.integer("sample_uniform: num", num, minimum=1)   # a static shape: a Python int
  if method not in _MODES:
    raise ValueError(f"method must be 'auto', 'reject', 'floor', 'ceiling' or 'chain', "
                     f"got {method!r}")
  if not 0 < min_acceptance <= 1:
    raise ValueError(f"min_acceptance must be in (0, 1], got {min_acceptance}")
  if not isinstance(lower, jax.core.Tracer) and not isinstance(upper, jax.core.Tracer):
    _check_bounds(lower, upper)
  batch = batch or max(64, min(4 * num, 4096))
  max_rounds = max_rounds or math.ceil((4 * num + 16) / (min_acceptance * batch))
  chain_steps = chain_steps or 20 * n * n

  mode = _MODES.index(method)
  return _sample(key, lower, upper, jnp.int32(mode), jnp.asarray(min_acceptance, dtype),
                 jnp.int32(max_rounds), jnp.int32(chain_steps), num=num, batch=batch)


_MODES = ("auto", "reject", "floor", "ceiling", "chain")


# Jitted once per (shapes, num, batch): called eagerly, the loops and the 2^n table would otherwise
# be traced and compiled op by op at every call; the method and the loop bounds are traced, so
# every method shares one compilation. Inside a user's jit it is inlined.
@functools.partial(jax.jit, static_argnames=("num", "batch"))
def _sample(key, lower, upper, mode, min_acceptance, max_rounds, chain_steps, *, num, batch):
  free = lower < upper
  p_floor, p_ceiling = acceptance_probabilities(lower, upper)
  better = jnp.where(p_floor >= p_ceiling, 0, 1)
  side = jnp.select([mode == 2, mode == 3], [0, 1], better).astype(jnp.int32)
  run = jnp.select([mode == 0, mode == 4], [jnp.maximum(p_floor, p_ceiling) >= min_acceptance,
                                            False], True)
  key_reject, key_chain = jax.random.split(key)
  samples, filled, rounds = _reject(key_reject, side, run, lower, upper, free, num, batch,
                                    max_rounds)
  chained = _hit_and_run(key_chain, lower, upper, free, num, chain_steps, active=filled < num)
  samples = jnp.where((jnp.arange(num) >= filled)[:, None], chained, samples)
  # Traced bounds cannot raise: an empty or non-finite region gives NaN, never plausible numbers.
  valid = (jnp.all(jnp.isfinite(lower) & jnp.isfinite(upper) & (lower <= upper))
           & (jnp.sum(lower) <= 1 + _SUM_TOL) & (jnp.sum(upper) >= 1 - _SUM_TOL))
  samples = jnp.where(valid, samples, jnp.nan)
  path = jnp.where(filled < num, 2, side).astype(jnp.int32)
  acceptance = jnp.where(side == 0, p_floor, p_ceiling)
  info = SampleInfo(path=path, acceptance=acceptance, acceptance_floor=p_floor,
                    acceptance_ceiling=p_ceiling, rounds=rounds)
  return samples, info

"""The accessible region of the mixture simplex: ``{w : l <= w <= u, sum w = 1}``.

:class:`Region` is the validated, host-side description (floors, ceilings, source names, a label for
error messages); :func:`is_feasible` is the jittable check the curriculum runs on traced bounds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax.simplex import vertex
from andrea_jax.sources import SOURCES, check_sources, source_index

# A sum bound within this of 1 counts as tight (float64 rounding of a few floor additions).
_SUM_ATOL = 1e-12


def is_feasible(lower: jax.Array, upper: jax.Array, atol: float | None = None) -> jax.Array:
  """Whether ``{l <= w <= u, sum w = 1}`` is non-empty: ``all(l <= u)`` and ``sum l <= 1 <= sum u``.

  The sums may miss 1 by ``atol``: by default the rounding of summing ``n`` bounds in their
  dtype, ``4 n eps`` (float32, n = 16: 7.6e-6; ten floors of 0.1 sum to 1.0000001 in float32 and
  are feasible), at least 1e-12. ``l <= u`` is exact.

  Jittable on traced bounds (the curriculum uses it to decide whether an extra exclusion can be
  applied at run time). Reduces over the last axis: ``[..., n] -> [...]`` bool.

  Example:
    >>> is_feasible(jnp.array([0.7, 0.4]), jnp.array([1., 1.]))   # floors sum to 1.1
    Array(False, dtype=bool)
  """
  lower, upper = jnp.asarray(lower), jnp.asarray(upper)
  if atol is None:
    dtype = jnp.result_type(lower, upper, jnp.float32)
    atol = max(_SUM_ATOL, 4 * max(lower.shape[-1] if lower.ndim else 1, 1)
               * float(jnp.finfo(dtype).eps))
  return (jnp.all(lower <= upper, axis=-1) & (jnp.sum(lower, axis=-1) <= 1 + atol)
          & (jnp.sum(upper, axis=-1) >= 1 - atol))


def _fmt(v: float) -> str:
  return f"{v:.6g}"


@dataclasses.dataclass(frozen=True, eq=False)
class Region:
  """Floors and ceilings cutting the simplex: the polytope ``{w : lower <= w <= upper, sum w = 1}``.

  Attributes:
    lower: floors ``l``, float64 ``[n]`` (read-only).
    upper: ceilings ``u``, float64 ``[n]`` (read-only); a ceiling of 0 excludes a source.
    names: the source of each coordinate, or None.
    label: the region's name in error messages (``"region 'v3_polish'"``).

  Validated on construction: finite, ``0 <= l <= u <= 1``, ``sum l <= 1 <= sum u``, equal lengths.

  Example (the source document's quadrilateral):
    >>> r = Region.from_bounds({"H": 0.5}, {"D": 0.25}, sources=("H", "G", "D"), label="seed")
    >>> r.dim, r.vertices().shape
    (2, (4, 3))
  """
  lower: np.ndarray
  upper: np.ndarray
  names: tuple[str, ...] | None = None
  label: str = "region"

  def __post_init__(self):
    where = f"for region {self.label!r}"
    lower = np.array(self.lower, dtype=np.float64)
    upper = np.array(self.upper, dtype=np.float64)
    if lower.ndim != 1 or upper.ndim != 1:
      raise ValueError(f"floors and ceilings must be vectors, got shapes {lower.shape} and "
                       f"{upper.shape} {where}")
    if lower.shape != upper.shape:
      raise ValueError(f"{lower.size} floors but {upper.size} ceilings {where}")
    names = self.names
    if names is not None:
      names = check_sources(names, field=f"names of region {self.label!r}")
      if len(names) != lower.size:
        raise ValueError(f"{len(names)} names but {lower.size} floors {where}")
    name = (lambda i: repr(names[i])) if names is not None else (lambda i: f"source {i}")
    for kind, b in (("floor", lower), ("ceiling", upper)):
      for i in np.flatnonzero(~np.isfinite(b)):
        raise ValueError(f"{kind} of {name(i)} is {b[i]} {where}")
      for i in np.flatnonzero((b < 0) | (b > 1)):
        raise ValueError(f"{kind} of {name(i)} {_fmt(b[i])} is outside [0, 1] {where}")
    for i in np.flatnonzero(upper < lower):
      raise ValueError(f"ceiling of {name(i)} {_fmt(upper[i])} is under its floor "
                       f"{_fmt(lower[i])} {where}")
    if lower.sum() > 1 + _SUM_ATOL:
      raise ValueError(f"floors sum to {_fmt(lower.sum())} > 1 {where}")
    if upper.sum() < 1 - _SUM_ATOL:
      raise ValueError(f"ceilings sum to {_fmt(upper.sum())} < 1 {where}")
    lower.flags.writeable = False
    upper.flags.writeable = False
    object.__setattr__(self, "lower", lower)
    object.__setattr__(self, "upper", upper)
    object.__setattr__(self, "names", names)

  @classmethod
  def from_bounds(cls, floors: Mapping[str, float] | None = None,
                  ceilings: Mapping[str, float] | None = None, *,
                  sources: Sequence[str] = SOURCES, exclude: Sequence[str] = (),
                  only: Sequence[str] | None = None, label: str = "region") -> Region:
    """A region from floors and ceilings given by source name.

    Unlisted sources get floor 0 and ceiling 1; ``exclude`` sets ceilings to 0; ``only`` sets the
    ceiling of every source it does not list to 0. Unknown names, a floor on a source that ends up
    excluded, and an explicit non-zero ceiling on an excluded source are ``ValueError``s.

    Example (v3 polish):
      >>> Region.from_bounds({"hermes3-general": 0.7}, {"dictionary": 0.25},
      ...                    exclude=("repo-docs", "repo-docstrings"), label="v3_polish").dim
      13
    """
    floors = dict(floors or {})
    ceilings = dict(ceilings or {})
    sources = check_sources(sources)
    where = f"for region {label!r}"
    for field, names in (("floors", floors), ("ceilings", ceilings), ("exclude", exclude),
                         ("only", only or ())):
      if isinstance(names, str):
        raise TypeError(f"{field} must be a collection of source names, got the string {names!r}")
      unknown = [n for n in names if n not in sources]
      if unknown:
        raise ValueError(f"unknown sources {unknown} in {field} {where}; known sources are: "
                         f"{', '.join(sources)}")
      if field in ("exclude", "only") and len(set(names)) != len(list(names)):
        raise ValueError(f"{field} lists a source twice: {list(names)} {where}")
    lower = np.zeros(len(sources))
    upper = np.ones(len(sources))
    for n, v in floors.items():
      lower[source_index(n, sources)] = v
    for n, v in ceilings.items():
      upper[source_index(n, sources)] = v
    excluded = set(exclude)
    if only is not None:
      excluded |= set(sources) - set(only)
    for n in sorted(excluded, key=sources.index):
      if floors.get(n, 0) != 0:
        raise ValueError(f"floor {_fmt(floors[n])} on excluded source {n!r} {where}")
      if ceilings.get(n, 0) != 0:
        raise ValueError(f"ceiling {_fmt(ceilings[n])} on excluded source {n!r} {where}")
      upper[source_index(n, sources)] = 0.0
    return cls(lower, upper, names=sources, label=label)

  @property
  def n(self) -> int:
    """Number of coordinates (sources)."""
    return int(self.lower.size)

  @property
  def excluded(self) -> np.ndarray:
    """Bool ``[n]``: sources with ceiling 0."""
    return self.upper == 0

  @property
  def dim(self) -> int:
    """Dimension of the region (of its affine hull).

    With ``k`` coordinates not pinned (``l_i < u_i``), the region is ``k - 1`` dimensional when
    ``sum l < 1 < sum u`` (the point ``l + t (u - l)``, ``t = (1 - sum l) / sum(u - l)``, is then
    interior to every free coordinate); a tight sum bound (``sum l = 1`` or ``sum u = 1``) pins
    every coordinate and leaves a single point.
    """
    k = int(np.sum(self.lower < self.upper))
    if abs(self.lower.sum() - 1) <= _SUM_ATOL or abs(self.upper.sum() - 1) <= _SUM_ATOL:
      return 0
    return max(k - 1, 0)

  def contains(self, w, atol: float | None = None) -> np.ndarray | bool:
    """Whether ``w`` (``[..., n]``) lies in the region, up to ``atol`` on each bound and the sum.

    The check is ``l - atol <= w <= u + atol`` and ``|sum w - 1| <= atol``, in float64. The default
    ``atol`` follows the precision ``w`` was computed in: ``max(1e-9, 4 n eps)`` with ``eps`` the
    machine epsilon of ``w``'s floating dtype (float64 for lists, Python floats and integers), since
    each coordinate carries an ulp or so of rounding and the sum gathers ``n`` of them. So float32
    points from :func:`~andrea_jax.simplex.project`, :func:`~andrea_jax.simplex.sample_uniform`
    and :func:`~andrea_jax.simplex.greedy_vertex` are inside (the float32 floor ``0.7`` is
    ``0.69999999``, 1.2e-8 under the float64 floor), while float64 points keep the tight ``1e-9``.
    An explicit ``atol`` replaces the default whatever the dtype.

    Example (n = 16 in float32: ``atol = 64 * 2^-23 = 7.6e-6``):
      >>> r = Region.from_bounds({"hermes3-general": 0.7})
      >>> r.contains(project(jnp.zeros(16), r.lower, r.upper))   # float32
      True
      >>> r.contains(np.full(16, 1 / 16) + 1e-3 * (np.arange(16) == 0))   # sum is 1.001
      False
    """
    if atol is None:
      dtype = getattr(w, "dtype", None)
      if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        dtype = np.float64
      # float16 and bfloat16 are judged as float32: their eps (1e-3, 8e-3) would pass points a
      # whole percent off a bound; pass ``atol`` to loosen it knowingly.
      eps = min(float(jnp.finfo(dtype).eps), float(jnp.finfo(jnp.float32).eps))
      atol = max(1e-9, 4 * max(self.n, 1) * eps)
    w = np.asarray(w, dtype=np.float64)
    ok = (np.all(w >= self.lower - atol, axis=-1) & np.all(w <= self.upper + atol, axis=-1)
          & (np.abs(w.sum(axis=-1) - 1) <= atol))
    return bool(ok) if ok.ndim == 0 else ok

  def vertices(self) -> np.ndarray:
    """The vertices, ``[k, n]``, exact and deduplicated, in descending lexicographic order."""
    return vertex.vertices(self.lower, self.upper)

  def __eq__(self, other):
    if not isinstance(other, Region):
      return NotImplemented
    return (np.array_equal(self.lower, other.lower) and np.array_equal(self.upper, other.upper)
            and self.names == other.names and self.label == other.label)

  def __hash__(self):
    return hash((self.lower.tobytes(), self.upper.tobytes(), self.names, self.label))

  def __repr__(self):
    return (f"Region(label={self.label!r}, lower={self.lower.tolist()}, "
            f"upper={self.upper.tolist()}, names={self.names})")

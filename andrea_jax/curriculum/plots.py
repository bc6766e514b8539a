"""Figures of a curriculum run: the mixture over time, and a walk on the seed's triangle.

Matplotlib through its object API with the Agg canvas (no pyplot, no global backend switch), so the
functions are safe in scripts, tests and notebooks alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_SQRT3_2 = np.sqrt(3.0) / 2


def _block_mean(x_NxS: np.ndarray, max_points: int) -> tuple[np.ndarray, int]:
  """Means over consecutive blocks, at most ``max_points`` rows; returns (rows, block)."""
  n = len(x_NxS)
  block = max(1, -(-n // max_points))
  full = n // block * block
  rows = x_NxS[:full].reshape(-1, block, x_NxS.shape[-1]).mean(axis=1)
  if full < n:
    rows = np.concatenate([rows, x_NxS[full:].mean(axis=0, keepdims=True)])
  return rows, block


def plot_weights(weights_NxS: np.ndarray, sources: Sequence[str], path: str, *,
                 geometry_starts: Sequence[int] = (), geometry_names: Sequence[str] = (),
                 first_step: int = 0, max_points: int = 800, title: str | None = None) -> None:
  """Stacked areas of the ``S`` weights over the run, with each geometry's start marked.

  Args:
    weights_NxS: the weights used at each step (``[N, S]``); averaged over blocks of steps down to
      ``max_points`` columns (exact: a mean of simplex points is a simplex point).
    sources: the ``S`` names (legend).
    path: the PNG to write.
    geometry_starts, geometry_names: regimes to mark (a dashed line at each start but step 0).
    first_step: step of the first row.
    title: figure title.
  """
  w_NxS = np.asarray(weights_NxS, np.float64)
  rows, block = _block_mean(w_NxS, max_points)
  x = first_step + block * np.arange(len(rows)) + 0.5 * block
  fig = Figure(figsize=(12, 5.5), layout="constrained")
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  colors = [colormaps["tab20"](i % 20) for i in range(len(sources))]
  ax.stackplot(x, rows.T, labels=list(sources), colors=colors, linewidth=0)
  end = first_step + len(w_NxS)
  bounds = list(geometry_starts) + [end]
  for i, (s, name) in enumerate(zip(geometry_starts, geometry_names)):
    if s > first_step:
      ax.axvline(s, color="black", linestyle="--", linewidth=1.2)
    lo, hi = max(s, first_step), min(bounds[i + 1], end)
    if hi > lo:
      ax.text(0.5 * (lo + hi), 1.01, name.replace("_", " "), ha="center", va="bottom",
              transform=ax.get_xaxis_transform(), fontsize=10)
  ax.set_xlim(first_step, end)
  ax.set_ylim(0, 1)
  ax.set_xlabel("step")
  ax.set_ylabel("mixture weight")
  ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
  if title:
    ax.set_title(title, pad=22)
  fig.savefig(path, dpi=110)


def ternary_xy(w_Kx3: np.ndarray) -> np.ndarray:
  """Barycentric ``(a, b, c)`` -> plane ``[K, 2]``: ``a`` at (0, 0), ``b`` at (1, 0), ``c`` on top.

  ``x = b + c / 2``, ``y = c sqrt(3) / 2``. Example: ``ternary_xy([[0, 0, 1]]) == [[0.5, 0.866]]``.
  """
  w = np.asarray(w_Kx3, np.float64)
  return np.stack([w[..., 1] + 0.5 * w[..., 2], _SQRT3_2 * w[..., 2]], axis=-1)


def plot_triangle_walk(points_Kx3: np.ndarray, region_vertices_Vx3: np.ndarray, path: str, *,
                       names: Sequence[str] = ("H", "G", "D"), kinds: Sequence[str] | None = None,
                       title: str | None = None) -> None:
  """A walk of mixtures of three sources on the triangle, with the accessible region shaded.

  Args:
    points_Kx3: the successive phase weights (``[K, 3]``, rows on the simplex).
    region_vertices_Vx3: the vertices of the accessible region (any order).
    path: the PNG to write.
    names: the three corners, in coordinate order.
    kinds: per point its phase's label, ``"random"``, ``"bandit"``, ``"start"``, ``"held"``,
      ``"exp3"`` or ``"elastic"`` (marker
      shapes), optional.
    title: figure title.
  """
  fig = Figure(figsize=(6.5, 6.0), layout="constrained")
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  corners = ternary_xy(np.eye(3))
  ax.fill(*np.r_[corners, corners[:1]].T, facecolor="none", edgecolor="black", linewidth=1.2)
  poly = ternary_xy(region_vertices_Vx3)
  center = poly.mean(axis=0)
  poly = poly[np.argsort(np.arctan2(poly[:, 1] - center[1], poly[:, 0] - center[0]))]
  ax.fill(*poly.T, facecolor="tab:blue", alpha=0.18, edgecolor="tab:blue", linewidth=1.0,
          label="accessible region")
  xy = ternary_xy(points_Kx3)
  ax.plot(*xy.T, color="0.35", linewidth=0.8, zorder=2)
  kinds = list(kinds) if kinds is not None else ["bandit"] * len(xy)
  for kind, marker, color in (("random", "o", "tab:orange"), ("bandit", "^", "tab:green"),
                              ("start", "s", "tab:purple"), ("held", "v", "tab:gray"),
                              ("exp3", "D", "tab:brown"), ("elastic", "P", "tab:pink")):
    sel = np.array([k == kind for k in kinds], bool)
    if sel.any():
      ax.scatter(*xy[sel].T, marker=marker, s=22, color=color, zorder=3, label=f"{kind} phase")
  ax.scatter(*xy[-1], marker="*", s=160, color="tab:red", zorder=4, label="last phase")
  for (x, y), name, (dx, dy) in zip(corners, names, ((-0.04, -0.05), (0.04, -0.05), (0, 0.03))):
    ax.text(x + dx, y + dy, name, ha="center", va="center", fontsize=12)
  ax.set_aspect("equal")
  ax.set_axis_off()
  ax.legend(loc="upper right", fontsize=8, frameon=False)
  if title:
    ax.set_title(title)
  fig.savefig(path, dpi=110)

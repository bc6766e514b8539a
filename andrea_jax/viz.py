"""Figures for the notebooks: the seed's triangle as a ternary plot, attention maps, ablation curves.

The run-level figures live with what they draw (:mod:`andrea_jax.curriculum.plots`: the mixture
over a run and a walk on the triangle; :mod:`andrea_jax.terrain.plots`: slices and sharpness;
:mod:`andrea_jax.plots`: a run's summary). This module adds what the notebooks draw beyond them:

* ternary axes on which several layers go (the region, uniform samples, projections as arrows,
  the UCB vertex), reusing :func:`andrea_jax.curriculum.plots.ternary_xy`;
* attention maps of several heads with document boundaries marked;
* curves and end values of an ablation grouped by one hyper-parameter, seeds as thin lines.

Matplotlib through its object API (``Figure`` with the Agg canvas, no ``pyplot``); in a notebook
with ``%matplotlib inline`` a returned Figure displays itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from andrea_jax.curriculum.plots import ternary_xy

ArrayLike = Any


def figure(width: float, height: float) -> Figure:
  """A Figure of ``width x height`` inches with the Agg canvas and constrained layout."""
  fig = Figure(figsize=(width, height), layout="constrained")
  FigureCanvasAgg(fig)
  return fig


def ternary_axes(ax: Axes, names: Sequence[str] = ("H", "G", "D"), *, grid: float = 0.25) -> Axes:
  """Turns ``ax`` into a ternary plot: the triangle, its corner names, iso-lines every ``grid``.

  Corner ``i`` is the pure mixture ``e_i``: ``names[0]`` bottom left, ``names[1]`` bottom right,
  ``names[2]`` on top (:func:`~andrea_jax.curriculum.plots.ternary_xy`). Points off the triangle
  but on the plane ``sum w = 1`` (a negative coordinate) land outside it, where they belong.

  Example:
    >>> fig = figure(5, 5); ax = ternary_axes(fig.add_subplot(), ("H", "G", "D"))
  """
  corners_3x2 = ternary_xy(np.eye(3))
  ax.fill(*np.r_[corners_3x2, corners_3x2[:1]].T, facecolor="none", edgecolor="black",
          linewidth=1.2, zorder=1)
  if grid:
    for level in np.arange(grid, 1.0, grid):
      for i in range(3):
        # The segment where coordinate i equals `level`, between the two other edges.
        j, k = (i + 1) % 3, (i + 2) % 3
        a, b = np.zeros(3), np.zeros(3)
        a[i], a[j] = level, 1 - level
        b[i], b[k] = level, 1 - level
        ax.plot(*ternary_xy(np.stack([a, b])).T, color="0.85", linewidth=0.6, zorder=0)
  # Bottom corners' names hang below them, the top corner's sits above it.
  for (x, y), name, dy, va in zip(corners_3x2, names, (-0.03, -0.03, 0.03),
                                  ("top", "top", "bottom")):
    ax.text(x, y + dy, name, ha="center", va=va, fontsize=11)
  ax.set_aspect("equal")
  ax.set_axis_off()
  return ax


def ternary_region(ax: Axes, vertices_Vx3: ArrayLike, *, label: str | None = "accessible region",
                   color: str = "tab:blue", alpha: float = 0.18, **kwargs: Any) -> None:
  """Shades the convex polygon with these vertices (any order) on ternary axes.

  The vertices are sorted by angle around their mean, which orders any convex polygon.
  """
  xy_Vx2 = ternary_xy(np.asarray(vertices_Vx3, np.float64))
  center = xy_Vx2.mean(axis=0)
  xy_Vx2 = xy_Vx2[np.argsort(np.arctan2(xy_Vx2[:, 1] - center[1], xy_Vx2[:, 0] - center[0]))]
  ax.fill(*xy_Vx2.T, facecolor=color, alpha=alpha, edgecolor=color, linewidth=1.0, label=label,
          zorder=1, **kwargs)
  ax.scatter(*xy_Vx2.T, color=color, s=18, zorder=2)


def ternary_scatter(ax: Axes, points_Kx3: ArrayLike, **kwargs: Any) -> None:
  """Scatters mixtures of three sources (``[K, 3]``, rows summing to 1) on ternary axes."""
  ax.scatter(*ternary_xy(np.asarray(points_Kx3, np.float64)).T, **kwargs)


def ternary_arrows(ax: Axes, start_Kx3: ArrayLike, end_Kx3: ArrayLike, *, color: str = "tab:red",
                   label: str | None = None, **kwargs: Any) -> None:
  """Draws an arrow from each ``start`` to its ``end`` (``[K, 3]`` each) on ternary axes.

  Example (a projection): ``ternary_arrows(ax, x_Kx3, project(x_Kx3, lower, upper))``.
  """
  a_Kx2 = ternary_xy(np.asarray(start_Kx3, np.float64))
  b_Kx2 = ternary_xy(np.asarray(end_Kx3, np.float64))
  if a_Kx2.shape != b_Kx2.shape:
    raise ValueError(f"start and end must have the same shape, got {a_Kx2.shape} and "
                     f"{b_Kx2.shape}")
  d_Kx2 = b_Kx2 - a_Kx2
  ax.quiver(a_Kx2[:, 0], a_Kx2[:, 1], d_Kx2[:, 0], d_Kx2[:, 1], angles="xy", scale_units="xy",
            scale=1.0, color=color, width=0.004, label=label, zorder=3, **kwargs)


def attention_maps(weights_HxTxS: ArrayLike, *, boundaries: Sequence[int] = (),
                   titles: Sequence[str] | None = None, title: str | None = None,
                   cols: int = 4, size: float = 2.8, power: float = 0.5,
                   label: str = "attention weight") -> Figure:
  """One heat map per head of attention probabilities ``[H, T, S]`` (query down, key across).

  ``boundaries`` are the first positions of documents after the first: each is drawn as a line on
  both axes, so the blocks a document mask allows are the squares on the diagonal. Colours show
  ``weight ** power`` (default the square root: causal rows spread their mass thinly, and on a
  linear scale only the diagonal would show); pass ``power=1`` for masks.

  Example:
    >>> attention_maps(att_BxHxTxS[0], boundaries=[77], title="layer 0")
  """
  w = np.asarray(weights_HxTxS, np.float64)
  if w.ndim != 3:
    raise ValueError(f"weights must be [H, T, S], got shape {w.shape}")
  h = w.shape[0]
  cols = min(cols, h)
  rows = -(-h // cols)
  fig = figure(size * cols + 0.8, size * rows + (0.4 if title else 0.0))
  axes = fig.subplots(rows, cols, squeeze=False)
  image = None
  for i, ax in enumerate(axes.flat):
    if i >= h:
      ax.set_axis_off()
      continue
    image = ax.imshow(w[i] ** power, cmap="magma", vmin=0.0, vmax=1.0, interpolation="nearest")
    for b in boundaries:
      ax.axvline(b - 0.5, color="tab:cyan", linewidth=0.8)
      ax.axhline(b - 0.5, color="tab:cyan", linewidth=0.8)
    ax.set_title(titles[i] if titles is not None else f"head {i}", fontsize=9)
    ax.set_xlabel("key position", fontsize=8)
    ax.set_ylabel("query position", fontsize=8)
    ax.tick_params(labelsize=7)
  if image is not None:
    bar = fig.colorbar(image, ax=axes, shrink=0.8,
                       label=label if power == 1 else f"({label}) ^ {power:g}")
    bar.ax.tick_params(labelsize=7)
  if title:
    fig.suptitle(title)
  return fig


def _smooth(y_KxN: np.ndarray, window: int) -> np.ndarray:
  """Trailing moving average over ``window`` points (the first points average what exists; a
  non-finite point is left out, and a window of only non-finite points gives NaN)."""
  if window <= 1:
    return y_KxN
  finite = np.isfinite(y_KxN)   # NaN and +-inf (a diverged variant) are left out alike
  c = np.cumsum(np.where(finite, y_KxN, 0.0), axis=-1)
  n = np.cumsum(finite, axis=-1)
  c = np.concatenate([np.zeros_like(c[..., :1]), c], axis=-1)
  n = np.concatenate([np.zeros_like(n[..., :1]), n], axis=-1)
  hi = np.arange(1, y_KxN.shape[-1] + 1)
  lo = np.maximum(hi - window, 0)
  with np.errstate(invalid="ignore", divide="ignore"):
    return (c[..., hi] - c[..., lo]) / (n[..., hi] - n[..., lo])


def _group_colors(groups: list) -> dict:
  cmap = colormaps["viridis"]
  return {g: cmap(i / max(len(groups) - 1, 1) * 0.9) for i, g in enumerate(groups)}


def grouped_curves(curves_KxN: ArrayLike, groups_K: Sequence[Any], *, x_N: ArrayLike | None = None,
                   smooth: int = 1, group_name: str = "group", xlabel: str = "step",
                   ylabel: str = "loss", title: str | None = None, logy: bool = False,
                   ylim: tuple[float, float] | None = None, ax: Axes | None = None) -> Figure:
  """Curves of ``K`` runs grouped by a value: each run thin, each group's mean thick.

  Args:
    curves_KxN: one curve per run.
    groups_K: the group of each run (e.g. its warmup length); groups sorted by value.
    x_N: abscissae (default ``0 .. N - 1``).
    smooth: trailing moving-average window applied to every curve (NaN-aware).
    group_name: legend prefix (``"warmup = 20"``).
    xlabel, ylabel, title, logy, ylim: axes settings.
    ax: draw into this Axes instead of a new Figure.

  Returns:
    The Figure.
  """
  y_KxN = _smooth(np.asarray(curves_KxN, np.float64), smooth)
  if y_KxN.ndim != 2 or len(groups_K) != y_KxN.shape[0]:
    raise ValueError(f"curves must be [K, N] with K = len(groups) = {len(groups_K)}, got "
                     f"{y_KxN.shape}")
  x = np.arange(y_KxN.shape[1]) if x_N is None else np.asarray(x_N)
  fig = ax.figure if ax is not None else figure(7.5, 4.5)
  ax = ax if ax is not None else fig.add_subplot()
  groups = sorted(set(groups_K))
  colors = _group_colors(groups)
  for g in groups:
    sel = np.array([gk == g for gk in groups_K])
    for row in y_KxN[sel]:
      ax.plot(x, row, color=colors[g], linewidth=0.5, alpha=0.45)
    ax.plot(x, np.nanmean(y_KxN[sel], axis=0), color=colors[g], linewidth=2.0,
            label=f"{group_name} = {g} ({sel.sum()} runs)")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if logy:
    ax.set_yscale("log")
  if ylim is not None:
    ax.set_ylim(*ylim)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  if title:
    ax.set_title(title)
  return fig


def grouped_values(groups_K: Sequence[Any], values_K: ArrayLike, *, xlabel: str = "group",
                   ylabel: str = "value", title: str | None = None, logx: bool = False,
                   ax: Axes | None = None, label: str | None = None) -> Figure:
  """One value per run against its group: runs as dots, each group's mean and +-1 std as a line.

  Example:
    >>> grouped_values([0, 0, 20, 20], [2.1, 2.3, 1.9, 1.95], xlabel="warmup steps")
  """
  v_K = np.asarray(values_K, np.float64)
  g_K = np.asarray(groups_K, np.float64)
  if v_K.shape != g_K.shape:
    raise ValueError(f"values have shape {v_K.shape}, groups {g_K.shape}")
  fig = ax.figure if ax is not None else figure(5.5, 4.0)
  ax = ax if ax is not None else fig.add_subplot()
  groups = np.unique(g_K)
  mean = np.array([np.nanmean(v_K[g_K == g]) for g in groups])
  std = np.array([np.nanstd(v_K[g_K == g]) for g in groups])
  (line,) = ax.plot(groups, mean, marker="o", linewidth=1.8, label=label)
  ax.fill_between(groups, mean - std, mean + std, color=line.get_color(), alpha=0.2)
  ax.scatter(g_K, v_K, color=line.get_color(), s=12, alpha=0.6, zorder=3)
  if logx:
    ax.set_xscale("symlog", linthresh=max(1.0, float(np.min(groups[groups > 0], initial=1.0))))
  ax.set_xticks(groups, [f"{g:g}" for g in groups])
  ax.minorticks_off()
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  if label:
    ax.legend(fontsize=8)
  if title:
    ax.set_title(title)
  return fig


def sharpness_curves(sigmas: ArrayLike, curves: dict[str, tuple[ArrayLike, ArrayLike]], *,
                     ax: Axes | None = None, title: str | None = None) -> Figure:
  """Loss increase against the relative perturbation size for several points, +-1 std bars.

  ``curves`` maps a label to ``(mean [K], std [K])`` (e.g. :class:`andrea_jax.terrain.Sharpness`'s
  ``mean`` and ``std``). Log sigma axis, linear loss axis: at small sigma the increase is within
  the noise of the directions (it may be slightly negative), which a log axis would magnify.

  Example:
    >>> s = perturbation_sharpness(loss_fn, params, key, sigmas, 8)
    >>> sharpness_curves(sigmas, {"before": (s.mean, s.std)})
  """
  sigmas_K = np.asarray(sigmas, np.float64)
  fig = ax.figure if ax is not None else figure(5.5, 4.0)
  ax = ax if ax is not None else fig.add_subplot()
  for label, (mean, std) in curves.items():
    mean_K, std_K = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    if mean_K.shape != sigmas_K.shape or std_K.shape != sigmas_K.shape:
      raise ValueError(f"curve {label!r}: mean {mean_K.shape} and std {std_K.shape} must match "
                       f"sigmas {sigmas_K.shape}")
    ax.errorbar(sigmas_K, mean_K, yerr=std_K, marker="o", capsize=3, label=label)
  ax.axhline(0.0, color="grey", linewidth=0.8)
  ax.set_xscale("log")
  ax.set_xlabel("relative perturbation size sigma")
  ax.set_ylabel("loss increase L(w + sigma d) - L(w)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  if title:
    ax.set_title(title)
  return fig


def run_timeline(records: Iterable[Mapping[str, Any]], *, sources: Sequence[str] = (),
                 expected: ArrayLike | None = None, score: ArrayLike | None = None,
                 threshold: float | None = None, marks: Sequence[tuple[int, str]] = (),
                 title: str | None = None) -> Figure:
  """A run's training records (``metrics.jsonl``) as stacked panels over steps.

  ``records`` may be every line of ``metrics.jsonl``: only the training-step records, those with a
  ``step`` and a ``loss``, are drawn; the others (the evaluation records, ``eval/...``) are
  skipped. Of those ``N`` training records, panels: the training loss (with ``expected``, a ``[N]``
  baseline, dashed) and each source's ``loss/<source>``; the ``weight/<source>`` of those sources;
  and, if given, a ``[N]`` ``score`` with its ``threshold``. ``marks`` are ``(step, label)`` drawn
  as vertical lines on every panel (a planted event, a detector's flag).

  Raises:
    ValueError: no training record, or ``expected``/``score`` not of length ``N``.

  Example:
    >>> records = logs.read_jsonl("runs/zc/metrics.jsonl")
    >>> run_timeline(records, sources=["repo-docs"], marks=[(150, "flag")])
  """
  records = list(records)
  total = len(records)
  records = [r for r in records if "step" in r and "loss" in r]
  if not records:
    raise ValueError(f"records holds no training record (one with 'step' and 'loss') among its "
                     f"{total}")
  for name, values in (("expected", expected), ("score", score)):
    if values is not None and np.shape(values) != (len(records),):
      raise ValueError(f"{name} must have one value per training record, shape "
                       f"({len(records)},), got {np.shape(values)}")
  steps = np.array([r["step"] for r in records])
  panels = 3 if score is not None else 2
  fig = figure(10, 2.6 * panels + 0.4)
  axes = fig.subplots(panels, 1, sharex=True)
  ax = axes[0]
  ax.plot(steps, [r["loss"] for r in records], color="black", linewidth=1.0, label="loss")
  if expected is not None:
    ax.plot(steps, np.asarray(expected, np.float64), color="black", linestyle="--",
            linewidth=0.8, label="expected by the detector")
  colors = [colormaps["tab10"](i % 10) for i in range(len(sources))]
  for name, color in zip(sources, colors):
    ax.plot(steps, [r.get(f"loss/{name}", np.nan) for r in records], color=color,
            linewidth=0.8, label=f"loss/{name}")
    axes[1].plot(steps, [r.get(f"weight/{name}", np.nan) for r in records], color=color,
                 linewidth=1.2, label=name)
  ax.set_ylabel("loss (nats/token)")
  ax.legend(fontsize=8, ncol=2)
  axes[1].set_ylabel("mixture weight")
  if sources:
    axes[1].legend(fontsize=8)
  if score is not None:
    axes[2].plot(steps, np.asarray(score, np.float64), color="tab:purple", linewidth=1.0,
                 label="robust z")
    if threshold is not None:
      axes[2].axhline(threshold, color="tab:red", linestyle=":", label=f"threshold {threshold:g}")
    axes[2].set_ylabel("detector score")
    axes[2].legend(fontsize=8)
  for a in axes:
    a.grid(alpha=0.3)
    for step, label in marks:
      a.axvline(step, color="tab:red", linewidth=0.8, linestyle="--")
  for i, (step, label) in enumerate(marks):
    # Marks at the same step (a flag on the planted step) alternate between the top and the middle.
    axes[0].annotate(label, (step, 0.98 - 0.5 * (i % 2)), xycoords=("data", "axes fraction"),
                     rotation=90, va="top", ha="right", fontsize=8, color="tab:red")
  axes[-1].set_xlabel("step")
  if title:
    fig.suptitle(title)
  return fig

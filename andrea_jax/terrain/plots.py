"""Figures of the terrain: a 1-D slice as a curve, a 2-D slice as a contour map, sharpness.

Figures are built with ``matplotlib.figure.Figure`` directly, never through ``pyplot``: no global
figure registry, no backend switch in the caller's process, PNGs rendered by Agg. In a notebook the
returned Figure displays itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

ArrayLike = Any


def _finish(fig: Figure, path: str | os.PathLike | None) -> Figure:
  fig.tight_layout()
  if path is not None:
    fig.savefig(os.fspath(path), dpi=120)
  return fig


def plot_slice_1d(alphas: ArrayLike, losses: ArrayLike | Mapping[str, ArrayLike], *,
                  path: str | os.PathLike | None = None, title: str | None = None,
                  xlabel: str = "alpha (filter-normalised direction)") -> Figure:
  """The curve ``alpha -> L(w + alpha d)``, with the centre ``alpha = 0`` marked.

  Args:
    alphas: ``[A]`` coordinates.
    losses: ``[A]`` losses, or ``{label: [A] losses}`` to overlay several curves (checkpoints,
      runs).
    path: where to save a PNG (optional).
    title: figure title.
    xlabel: horizontal axis label.

  Returns:
    The Figure.

  Example:
    >>> plot_slice_1d(alphas, loss_slice_1d(loss_fn, params, d, alphas), path="slice_1d.png")
  """
  alphas_A = np.asarray(alphas, dtype=np.float64)
  curves = dict(losses) if isinstance(losses, Mapping) else {None: losses}
  fig = Figure(figsize=(5.5, 4.0))
  ax = fig.add_subplot()
  for label, loss in curves.items():
    loss_A = np.asarray(loss, dtype=np.float64)
    if loss_A.shape != alphas_A.shape:
      raise ValueError(f"losses{'' if label is None else f'[{label!r}]'} has shape {loss_A.shape}, "
                       f"alphas has shape {alphas_A.shape}")
    ax.plot(alphas_A, loss_A, marker=".", label=label)
  ax.axvline(0.0, color="grey", lw=0.8, ls="--")
  ax.set_xlabel(xlabel)
  ax.set_ylabel("loss")
  if title:
    ax.set_title(title)
  if isinstance(losses, Mapping):
    ax.legend()
  ax.grid(alpha=0.3)
  return _finish(fig, path)


def plot_slice_2d(alphas: ArrayLike, betas: ArrayLike, losses: ArrayLike, *,
                  path: str | os.PathLike | None = None, title: str | None = None,
                  levels: int | Sequence[float] = 20) -> Figure:
  """Contour map of ``loss[i, j] = L(w + alphas[i] d_x + betas[j] d_y)``, centre marked.

  Args:
    alphas: ``[A]`` coordinates along ``d_x`` (horizontal axis).
    betas: ``[B]`` coordinates along ``d_y`` (vertical axis).
    losses: ``[A, B]`` losses, as returned by ``loss_slice_2d``.
    path: where to save a PNG (optional).
    title: figure title.
    levels: number of contour levels or their values.

  Returns:
    The Figure.

  Example:
    >>> plot_slice_2d(grid, grid, loss_slice_2d(loss_fn, params, dx, dy, grid, grid), path="s.png")
  """
  alphas_A = np.asarray(alphas, dtype=np.float64)
  betas_B = np.asarray(betas, dtype=np.float64)
  loss_AxB = np.asarray(losses, dtype=np.float64)
  if loss_AxB.shape != (alphas_A.size, betas_B.size):
    raise ValueError(f"losses has shape {loss_AxB.shape}, expected (len(alphas), len(betas)) = "
                     f"{(alphas_A.size, betas_B.size)}")
  fig = Figure(figsize=(5.5, 4.5))
  ax = fig.add_subplot()
  # contour wants Z[y, x]; non-finite points (a diverged perturbation) are left blank.
  z_BxA = np.ma.masked_invalid(loss_AxB.T)
  filled = ax.contourf(alphas_A, betas_B, z_BxA, levels=levels, cmap="viridis")
  ax.contour(alphas_A, betas_B, z_BxA, levels=filled.levels, colors="k", linewidths=0.4)
  fig.colorbar(filled, ax=ax, label="loss")
  ax.plot([0.0], [0.0], marker="*", color="red", markersize=10, ls="none", label="w")
  ax.set_xlabel("alpha (direction x)")
  ax.set_ylabel("beta (direction y)")
  ax.set_aspect("equal" if np.ptp(alphas_A) == np.ptp(betas_B) else "auto")
  if title:
    ax.set_title(title)
  return _finish(fig, path)


def plot_sharpness(sigmas: ArrayLike, mean: ArrayLike, std: ArrayLike | None = None, *,
                   path: str | os.PathLike | None = None, title: str | None = None) -> Figure:
  """Mean loss increase against the relative perturbation size, with a +-1 std band.

  Example:
    >>> s = perturbation_sharpness(loss_fn, params, key, sigmas, 8)
    >>> plot_sharpness(s.sigmas, s.mean, s.std, path="sharpness.png")
  """
  sigmas_K = np.asarray(sigmas, dtype=np.float64)
  mean_K = np.asarray(mean, dtype=np.float64)
  if mean_K.shape != sigmas_K.shape:
    raise ValueError(f"mean has shape {mean_K.shape}, sigmas has shape {sigmas_K.shape}")
  fig = Figure(figsize=(5.5, 4.0))
  ax = fig.add_subplot()
  ax.plot(sigmas_K, mean_K, marker="o")
  if std is not None:
    std_K = np.asarray(std, dtype=np.float64)
    ax.fill_between(sigmas_K, mean_K - std_K, mean_K + std_K, alpha=0.25)
  ax.set_xlabel("relative perturbation size sigma")
  ax.set_ylabel("loss increase L(w + sigma d) - L(w)")
  if title:
    ax.set_title(title)
  ax.grid(alpha=0.3)
  return _finish(fig, path)

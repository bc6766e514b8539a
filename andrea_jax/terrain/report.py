"""One call that measures the basin around ``w`` and returns (or writes) every number and figure.

:func:`basin_report` gathers the perturbation-sharpness curve, the top Hessian eigenvalues, the
Hessian trace and a 1-D and a 2-D slice into one JSON-serialisable dict; :func:`write_basin_report`
also writes ``basin.json``, ``slice_1d.png``, ``slice_2d.png`` and ``sharpness.png`` into a
directory.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax.terrain.directions import random_direction, tree_norm
from andrea_jax.terrain.hessian import hessian_top_eigenvalues, hessian_trace
from andrea_jax.terrain.plots import plot_sharpness, plot_slice_1d, plot_slice_2d
from andrea_jax.terrain.sharpness import perturbation_sharpness
from andrea_jax.terrain.slices import loss_slice_1d, loss_slice_2d

PyTree = Any

# Sub-streams of the report's key, one per measurement, so that dropping one leaves the others
# unchanged.
_SHARPNESS, _HESSIAN, _TRACE, _DIR_X, _DIR_Y = range(5)


def _floats(x: Any) -> Any:
  """Nested lists of Python floats; non-finite values become None (strict JSON has no NaN/inf)."""
  arr = np.asarray(x, dtype=np.float64)
  if arr.ndim == 0:
    v = float(arr)
    return v if math.isfinite(v) else None
  return [_floats(a) for a in arr]


def _check_count(name: str, value: Any, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def basin_report(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, key: jax.Array, *,
                 sigmas: Sequence[float] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
                 num_samples: int = 8, hessian_k: int = 3, hessian_iters: int = 30,
                 trace_samples: int = 8, slice_points: int = 21, slice_range: float = 1.0,
                 filter_norm: bool = True, ignore_1d: bool = True,
                 batch_size: int | None = None) -> dict[str, Any]:
  """Every basin-width number at ``w`` as a JSON-serialisable dict.

  Measurements (each jitted once, ``params`` passed as an argument, never baked in as a constant):

  * ``sharpness``: :func:`perturbation_sharpness` over ``sigmas`` with ``num_samples`` directions;
  * ``hessian``: the ``hessian_k`` top eigenvalues (:func:`hessian_top_eigenvalues`,
    ``hessian_iters`` Lanczos steps; skipped when ``hessian_k == 0``) and the Hutchinson trace with
    ``trace_samples`` Rademacher vectors (skipped when 0), with ``trace / num_params`` as the mean
    curvature;
  * ``slice_1d``: ``L(w + alpha d_x)`` and ``slice_2d``: ``L(w + alpha d_x + beta d_y)`` on
    ``slice_points`` evenly spaced coordinates in ``[-slice_range, slice_range]``; ``d_x``, ``d_y``
    are random directions, so the 1-D slice is the ``beta = 0`` line of the 2-D one.

  Non-finite numbers (a perturbation that diverged) appear as ``None``.

  Args:
    loss_fn: ``params -> scalar`` loss (close over a fixed evaluation batch).
    params: the weights ``w``.
    key: PRNG key; each measurement uses its own ``fold_in`` of it.
    sigmas, num_samples: sharpness sizes and sample count.
    hessian_k, hessian_iters: eigenvalue count and Lanczos steps.
    trace_samples: Hutchinson samples.
    slice_points, slice_range: slice grid.
    filter_norm, ignore_1d: direction normalisation (see :func:`random_direction`).
    batch_size: perturbations evaluated together (``None``: all at once; set it for large models).

  Returns:
    ``{"num_params", "param_norm", "loss", "settings", "sharpness", "hessian", "slice_1d",
    "slice_2d"}``.

  Example:
    >>> rep = basin_report(loss_fn, params, jax.random.key(0), hessian_k=1, slice_points=11)
    >>> rep["hessian"]["top_eigenvalues"][0], rep["sharpness"]["mean_increase"]
  """
  _check_count("num_samples", num_samples, 1)
  _check_count("hessian_k", hessian_k, 0)
  _check_count("hessian_iters", hessian_iters, 1)
  _check_count("trace_samples", trace_samples, 0)
  _check_count("slice_points", slice_points, 2)
  num_params = int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))
  if hessian_k > min(hessian_iters, num_params):   # Lanczos finds at most as many as it iterates
    raise ValueError(
        f"hessian_k = {hessian_k} exceeds " + (
            f"hessian_iters = {hessian_iters}: raise hessian_iters or ask for fewer eigenvalues"
            if hessian_iters <= num_params else
            f"the {num_params} parameters: a Hessian has no more eigenvalues than that"))
  if not (isinstance(slice_range, (int, float)) and not isinstance(slice_range, bool)
          and math.isfinite(slice_range) and slice_range > 0):
    raise ValueError(f"slice_range must be a finite number > 0, got {slice_range!r}")
  sigmas_K = np.asarray(sigmas, dtype=np.float64)
  if sigmas_K.ndim != 1 or sigmas_K.size == 0 or not np.all(np.isfinite(sigmas_K)):
    raise ValueError(f"sigmas must be a non-empty 1-D sequence of finite numbers, got {sigmas!r}")
  key_of = lambda i: jax.random.fold_in(key, i)  # noqa: E731
  dir_kw = dict(filter_norm=filter_norm, ignore_1d=ignore_1d)

  sharp = jax.jit(lambda p, k: perturbation_sharpness(
      loss_fn, p, k, jnp.asarray(sigmas_K), num_samples, batch_size=batch_size,
      **dir_kw))(params, key_of(_SHARPNESS))
  hessian: dict[str, Any] = {}
  if hessian_k > 0:
    m = min(hessian_iters, num_params)
    eig_k = jax.jit(lambda p, k: hessian_top_eigenvalues(
        loss_fn, p, k, k=min(hessian_k, m), num_iters=m))(params, key_of(_HESSIAN))
    hessian.update(top_eigenvalues=_floats(eig_k), num_iters=m)
  if trace_samples > 0:
    tr, tr_se = jax.jit(lambda p, k: hessian_trace(
        loss_fn, p, k, trace_samples, batch_size=batch_size))(params, key_of(_TRACE))
    hessian.update(trace=_floats(tr), trace_stderr=_floats(tr_se),
                   mean_curvature=_floats(tr / num_params), trace_samples=trace_samples)

  grid_P = np.linspace(-slice_range, slice_range, slice_points)

  @jax.jit
  def slices(p, kx, ky):
    dx = random_direction(kx, p, **dir_kw)
    dy = random_direction(ky, p, **dir_kw)
    g = jnp.asarray(grid_P)
    return (loss_slice_1d(loss_fn, p, dx, g, batch_size=batch_size),
            loss_slice_2d(loss_fn, p, dx, dy, g, g, batch_size=batch_size))

  s1_P, s2_PxP = slices(params, key_of(_DIR_X), key_of(_DIR_Y))
  return {
      "num_params": num_params,
      "param_norm": _floats(tree_norm(params)),
      "loss": _floats(sharp.base_loss),
      "settings": {
          "sigmas": _floats(sigmas_K), "num_samples": num_samples, "hessian_k": hessian_k,
          "hessian_iters": hessian_iters, "trace_samples": trace_samples,
          "slice_points": slice_points, "slice_range": float(slice_range),
          "filter_norm": bool(filter_norm), "ignore_1d": bool(ignore_1d),
      },
      "sharpness": {"sigmas": _floats(sigmas_K), "mean_increase": _floats(sharp.mean),
                    "std_increase": _floats(sharp.std)},
      "hessian": hessian,
      "slice_1d": {"alphas": _floats(grid_P), "losses": _floats(s1_P)},
      "slice_2d": {"alphas": _floats(grid_P), "betas": _floats(grid_P), "losses": _floats(s2_PxP)},
  }


def _nan_for_none(x: Any) -> np.ndarray:
  return np.array(x, dtype=np.float64)  # numpy reads None as NaN for a float dtype


def write_basin_report(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, key: jax.Array,
                       out_dir: str | os.PathLike, *, title: str | None = None,
                       **kw: Any) -> dict[str, Any]:
  """:func:`basin_report`, written to ``out_dir`` as ``basin.json`` plus three PNG figures.

  Files: ``basin.json`` (the dict, strict JSON), ``slice_1d.png``, ``slice_2d.png``,
  ``sharpness.png``.
  The directory is created if needed; existing files of these names are replaced.

  Args:
    loss_fn, params, key: as in :func:`basin_report`.
    out_dir: destination directory.
    title: prefix for the figure titles (e.g. ``"v2, step 112000"``).
    **kw: forwarded to :func:`basin_report`.

  Returns:
    The report dict.

  Example:
    >>> write_basin_report(loss_fn, params, jax.random.key(0), "runs/v2/basin/112000",
    ...                    title="step 112000", batch_size=4)
  """
  report = basin_report(loss_fn, params, key, **kw)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "basin.json"), "w") as f:
    json.dump(report, f, indent=1, allow_nan=False)
  prefix = f"{title}: " if title else ""
  s1, s2, sh = report["slice_1d"], report["slice_2d"], report["sharpness"]
  plot_slice_1d(s1["alphas"], _nan_for_none(s1["losses"]),
                path=os.path.join(out_dir, "slice_1d.png"), title=f"{prefix}1-D slice")
  plot_slice_2d(s2["alphas"], s2["betas"], _nan_for_none(s2["losses"]),
                path=os.path.join(out_dir, "slice_2d.png"), title=f"{prefix}2-D slice")
  plot_sharpness(sh["sigmas"], _nan_for_none(sh["mean_increase"]),
                 _nan_for_none(sh["std_increase"]), path=os.path.join(out_dir, "sharpness.png"),
                 title=f"{prefix}perturbation sharpness")
  return report

"""One call that measures the basin around ``w`` and returns (or writes) every number and figure.

:func:`basin_report` gathers the loss at ``w``, the perturbation-sharpness curve, a 1-D slice, the
top Hessian eigenvalues, the Hessian trace and a 2-D slice into one JSON-serialisable dict,
measured in that order (the cheapest first) under one progress bar. Every part evaluates its
perturbations in chunks sized from a memory budget (:mod:`andrea_jax.terrain.budget`), so peak
memory grows with the chunk, never with the grid. :func:`write_basin_report` rewrites
``basin.json`` and the part's figure (``sharpness.png``, ``slice_1d.png``, ``slice_2d.png``) as
each part finishes: an interrupted run keeps what it measured (``"complete": false`` and the parts
done so far).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from andrea_jax import checks, storage
from andrea_jax.terrain import budget as budget_lib
from andrea_jax.terrain.directions import random_direction, tree_norm
from andrea_jax.terrain.hessian import hessian_top_eigenvalues, hutchinson_samples
from andrea_jax.terrain.plots import plot_sharpness, plot_slice_1d, plot_slice_2d
from andrea_jax.terrain.sharpness import perturbed_losses
from andrea_jax.terrain.slices import loss_on_plane

PyTree = Any

# Sub-streams of the report's key, one per measurement, so that dropping one leaves the others
# unchanged.
_SHARPNESS, _HESSIAN, _TRACE, _DIR_X, _DIR_Y = range(5)

# The parts of a report, in the order they are measured: the cheap ones first, so an interrupted
# run has them.
PARTS = ("loss", "sharpness", "slice_1d", "hessian", "trace", "slice_2d")


def _floats(x: Any) -> Any:
  """Nested lists of Python floats; non-finite values become None (strict JSON has no NaN/inf)."""
  arr = np.asarray(x, dtype=np.float64)
  if arr.ndim == 0:
    v = float(arr)
    return v if math.isfinite(v) else None
  return [_floats(a) for a in arr]


def _in_chunks(fn: Callable[..., jax.Array], args: tuple[Any, ...], xs: np.ndarray, chunk: int,
               tick: Callable[[int], Any], weight: int = 1) -> np.ndarray:
  """``jax.jit(fn)(*args, x)`` over ``xs`` (leading axis ``P``) a chunk ``x`` at a time,
  concatenated: ``[P, ...]``.

  Every call gets the same number of rows (the last chunk is padded with copies of its last row,
  whose results are dropped), so ``fn`` compiles once; the chunks are made as even as possible so
  the padding stays below their number. ``tick(rows * weight)`` after each chunk. The compiled
  program is dropped on return: XLA's CPU runtime keeps an executable's buffers between its calls,
  and a finished part must not hold them while the next one runs.
  """
  jitted = jax.jit(fn)
  num = len(xs)
  num_chunks = -(-num // max(1, min(chunk, num)))
  size = -(-num // num_chunks)
  out = []
  for lo in range(0, num, size):
    x = xs[lo:lo + size]
    real = len(x)
    x = np.concatenate([x, np.repeat(x[-1:], size - real, axis=0)])
    out.append(np.asarray(jax.device_get(jitted(*args, x)))[:real])
    tick(real * weight)
  return np.concatenate(out)


def chunk_plan(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, *,
               memory_budget: int | None = None, batch_size: int | None = None,
               hvps: bool = True, lanczos_iters: int = 0) -> dict[str, Any]:
  """How many perturbations :func:`basin_report` evaluates together, from a memory budget.

  With ``batch_size`` every chunk has that many perturbations and nothing is measured. Otherwise,
  with ``B = memory_budget`` (default :func:`andrea_jax.terrain.budget.default_memory_budget`),
  ``b_L`` the bytes of one perturbed loss and ``b_H`` of one Hessian-vector product (XLA's plan,
  :func:`~andrea_jax.terrain.budget.point_bytes`, :func:`~andrea_jax.terrain.budget.hvp_bytes`)
  and ``b_w`` of the weights:

  * ``points = B // b_L`` slice points per chunk;
  * ``sharpness_samples = B // (b_L + b_w)`` sharpness directions per chunk (each holds its
    direction and evaluates its sizes one after the other);
  * ``trace_samples = B // (b_H + b_w)`` Hutchinson vectors per chunk;
  * the Lanczos basis, ``lanczos_iters * num_params`` numbers, must fit with one HVP.

  Raises ``ValueError`` (naming the sizes) when one of them does not fit even once.

  Returns:
    ``{"memory_budget_bytes", "perturbed_loss_bytes", "hvp_bytes", "points",
    "sharpness_samples", "trace_samples"}`` (the bytes ``None`` with ``batch_size``).

  Example:
    >>> chunk_plan(loss_fn, params, memory_budget=2**30)["points"]  # slice points per chunk
  """
  if batch_size is not None:
    checks.integer("chunk_plan: batch_size", batch_size, minimum=1)
    return {"memory_budget_bytes": None, "perturbed_loss_bytes": None, "hvp_bytes": None,
            "points": batch_size, "sharpness_samples": batch_size, "trace_samples": batch_size}
  budget = budget_lib.default_memory_budget() if memory_budget is None else int(memory_budget)
  if budget < 1:
    raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
  leaves = jax.tree_util.tree_leaves(params)
  weight_bytes = int(sum(np.size(x) * np.dtype(jnp.result_type(x)).itemsize for x in leaves))
  b_loss = budget_lib.point_bytes(loss_fn, params)
  plan = {"memory_budget_bytes": budget, "perturbed_loss_bytes": b_loss, "hvp_bytes": None,
          "points": budget_lib.per_chunk(b_loss, budget, what="perturbed loss"),
          "sharpness_samples": budget_lib.per_chunk(b_loss + weight_bytes, budget,
                                                    what="sharpness sample (direction and loss)"),
          "trace_samples": 1}
  if hvps or lanczos_iters:
    b_hvp = budget_lib.hvp_bytes(loss_fn, params)
    plan["hvp_bytes"] = b_hvp
    plan["trace_samples"] = budget_lib.per_chunk(b_hvp + weight_bytes, budget,
                                                 what="Hutchinson sample (vector and HVP)")
    if lanczos_iters:
      num = int(sum(np.size(x) for x in leaves))
      basis = lanczos_iters * num * np.dtype(jnp.result_type(*leaves)).itemsize
      if basis + b_hvp > budget:
        raise ValueError(
            f"{lanczos_iters} Lanczos steps (hessian_iters) keep a basis of "
            f"{budget_lib.format_bytes(basis)} beside one HVP of {budget_lib.format_bytes(b_hvp)}, "
            f"over the memory budget of {budget_lib.format_bytes(budget)}: lower hessian_iters "
            "or raise the budget")
  return plan


def basin_report(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, key: jax.Array, *,
                 sigmas: Sequence[float] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
                 num_samples: int = 8, hessian_k: int = 3, hessian_iters: int = 30,
                 trace_samples: int = 8, slice_points: int = 21, slice_range: float = 1.0,
                 filter_norm: bool = True, ignore_1d: bool = True,
                 batch_size: int | None = None, memory_budget: int | None = None,
                 progress: bool = False,
                 on_part: Callable[[dict[str, Any], str], Any] | None = None) -> dict[str, Any]:
  """Every basin-width number at ``w`` as a JSON-serialisable dict.

  Parts, measured in this order (:data:`PARTS`), each jitted once with ``params`` passed as an
  argument, never baked in as a constant:

  * ``loss``: ``L(w)``;
  * ``sharpness``: :func:`~andrea_jax.terrain.perturbation_sharpness` over ``sigmas`` with
    ``num_samples`` directions (mean and sample std of ``L(w + sigma d_n) - L(w)``);
  * ``slice_1d``: ``L(w + alpha d_x)`` on ``slice_points`` evenly spaced ``alpha`` in
    ``[-slice_range, slice_range]``;
  * ``hessian``: the ``hessian_k`` top eigenvalues (:func:`hessian_top_eigenvalues`,
    ``hessian_iters`` Lanczos steps; skipped when ``hessian_k == 0``);
  * ``trace``: the Hutchinson trace with ``trace_samples`` Rademacher vectors (skipped when 0), with
    ``trace / num_params`` as the mean curvature (into ``hessian``);
  * ``slice_2d``: ``L(w + alpha d_x + beta d_y)`` on the grid of the same coordinates; ``d_x``,
    ``d_y`` are random directions, so the 1-D slice is the ``beta = 0`` line of the 2-D one.

  Memory: the perturbations of a part go through the model a chunk at a time, the chunk sizes
  from :func:`chunk_plan` (``batch_size``, or else ``memory_budget`` bytes). Peak memory is that of
  one chunk, whatever the grid; the loss itself may also chunk its batch (the held-out loss of
  :func:`andrea_jax.terrain.run.heldout_loss_fn` does). Chunking changes no number beyond float32
  rounding.

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
    batch_size: perturbations per chunk (``None``: as many as ``memory_budget`` allows).
    memory_budget: bytes the evaluations may allocate (``None``: the default budget).
    progress: show a tqdm bar counting the evaluations (perturbed losses and HVPs).
    on_part: called as ``on_part(report_so_far, part_name)`` after each part.

  Returns:
    ``{"num_params", "param_norm", "loss", "settings", "chunks", "sharpness", "slice_1d",
    "hessian", "slice_2d", "seconds", "complete"}``.

  Example:
    >>> rep = basin_report(loss_fn, params, jax.random.key(0), hessian_k=1, slice_points=11)
    >>> rep["hessian"]["top_eigenvalues"][0], rep["sharpness"]["mean_increase"]
  """
  num_params = _check_settings(params, sigmas, num_samples, hessian_k, hessian_iters,
                               trace_samples, slice_points, slice_range)
  sigmas_K = np.asarray(sigmas, dtype=np.float64)
  m = min(hessian_iters, num_params)
  plan = chunk_plan(loss_fn, params, memory_budget=memory_budget, batch_size=batch_size,
                    hvps=trace_samples > 0, lanczos_iters=m if hessian_k > 0 else 0)
  report: dict[str, Any] = {
      "num_params": num_params,
      "param_norm": _floats(tree_norm(params)),
      "settings": {
          "sigmas": _floats(sigmas_K), "num_samples": num_samples, "hessian_k": hessian_k,
          "hessian_iters": hessian_iters, "trace_samples": trace_samples,
          "slice_points": slice_points, "slice_range": float(slice_range),
          "filter_norm": bool(filter_norm), "ignore_1d": bool(ignore_1d),
      },
      "chunks": plan, "seconds": {}, "complete": False,
  }
  total = (1 + num_samples * sigmas_K.size + slice_points + (m if hessian_k else 0)
           + trace_samples + slice_points ** 2)
  with tqdm(total=total, unit="eval", disable=not progress, dynamic_ncols=True) as bar:
    ctx = _Context(loss_fn=loss_fn, params=params, key=key, plan=plan, update=bar.update,
                   dir_kw={"filter_norm": filter_norm, "ignore_1d": ignore_1d},
                   grid_P=np.linspace(-slice_range, slice_range, slice_points),
                   sigmas_K=sigmas_K, num_samples=num_samples, hessian_k=hessian_k,
                   lanczos_iters=m, trace_samples=trace_samples, num_params=num_params)
    for name in PARTS:
      t0 = time.perf_counter()
      bar.set_description(name)
      _PART_FNS[name](ctx, report)
      # A part's compiled programs keep their buffers (XLA's CPU runtime) until they are
      # collected, and some sit in reference cycles: collect them now, so parts' memory never
      # adds up.
      gc.collect()
      report["seconds"][name] = round(time.perf_counter() - t0, 3)
      report["complete"] = name == PARTS[-1]
      if on_part is not None:
        on_part(report, name)
  return report


def _check_settings(params: PyTree, sigmas: Sequence[float], num_samples: int, hessian_k: int,
                    hessian_iters: int, trace_samples: int, slice_points: int,
                    slice_range: float) -> int:
  """:func:`basin_report`'s settings checked (``ValueError`` naming the field, ``TypeError`` for
  a value of the wrong type); returns the parameter count."""
  for name, value, minimum in (("num_samples", num_samples, 1), ("hessian_k", hessian_k, 0),
                               ("hessian_iters", hessian_iters, 1),
                               ("trace_samples", trace_samples, 0),
                               ("slice_points", slice_points, 2)):
    checks.integer(f"basin_report: {name}", value, minimum=minimum)
  num_params = int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))
  if hessian_k > min(hessian_iters, num_params):   # Lanczos finds at most as many as it iterates
    raise ValueError(
        f"hessian_k = {hessian_k} exceeds " + (
            f"hessian_iters = {hessian_iters}: raise hessian_iters or ask for fewer eigenvalues"
            if hessian_iters <= num_params else
            f"the {num_params} parameters: a Hessian has no more eigenvalues than that"))
  checks.number("basin_report: slice_range", slice_range, low=0, low_open=True)
  sigmas_K = np.asarray(sigmas, dtype=np.float64)
  if sigmas_K.ndim != 1 or sigmas_K.size == 0 or not np.all(np.isfinite(sigmas_K)):
    raise ValueError(f"sigmas must be a non-empty 1-D sequence of finite numbers, got {sigmas!r}")
  return num_params


@dataclasses.dataclass
class _Context:
  """What the parts of one :func:`basin_report` share."""
  loss_fn: Callable[[PyTree], jax.Array]
  params: PyTree
  key: jax.Array
  plan: dict[str, Any]
  update: Callable[[int], Any]        # the progress bar's
  dir_kw: dict[str, bool]
  grid_P: np.ndarray
  sigmas_K: np.ndarray
  num_samples: int
  hessian_k: int
  lanczos_iters: int
  trace_samples: int
  num_params: int
  base_loss: float = 0.0
  plane_args: tuple = ()              # (params, d_x, d_y) of the slices

  def key_of(self, i: int) -> jax.Array:
    return jax.random.fold_in(self.key, i)

  def on_plane(self, p, dx, dy, ab_Px2):
    return loss_on_plane(self.loss_fn, p, dx, dy, ab_Px2[:, 0], ab_Px2[:, 1])


def _loss_part(ctx: _Context, report: dict[str, Any]) -> None:
  """The loss at ``w``."""
  ctx.base_loss = float(jax.jit(ctx.loss_fn)(ctx.params))
  ctx.update(1)
  report["loss"] = _floats(ctx.base_loss)


def _sharpness_part(ctx: _Context, report: dict[str, Any]) -> None:
  """Perturbation sharpness: the directions a chunk of samples at a time."""
  loss_NxK = _in_chunks(
      lambda p, k, ids: perturbed_losses(ctx.loss_fn, p, k, jnp.asarray(ctx.sigmas_K), ids,
                                         **ctx.dir_kw),
      (ctx.params, ctx.key_of(_SHARPNESS)), np.arange(ctx.num_samples),
      ctx.plan["sharpness_samples"], ctx.update, weight=ctx.sigmas_K.size)
  increase_KxN = loss_NxK.T.astype(np.float64) - ctx.base_loss
  with np.errstate(invalid="ignore"):   # a diverged perturbation: inf - inf, reported as None
    mean_K = np.mean(increase_KxN, axis=1)
    std_K = (np.std(increase_KxN, axis=1, ddof=1) if ctx.num_samples > 1
             else np.zeros(ctx.sigmas_K.size))
  report["sharpness"] = {"sigmas": _floats(ctx.sigmas_K), "mean_increase": _floats(mean_K),
                         "std_increase": _floats(std_K)}


def _slice_1d_part(ctx: _Context, report: dict[str, Any]) -> None:
  """The 1-D slice, as the ``beta = 0`` line of the plane (the 2-D slice's function)."""
  directions = jax.jit(lambda p, k: random_direction(k, p, **ctx.dir_kw))
  ctx.plane_args = (ctx.params, directions(ctx.params, ctx.key_of(_DIR_X)),
                    directions(ctx.params, ctx.key_of(_DIR_Y)))
  line_Px2 = np.stack([ctx.grid_P, np.zeros_like(ctx.grid_P)], axis=1)
  s1_P = _in_chunks(ctx.on_plane, ctx.plane_args, line_Px2, ctx.plan["points"], ctx.update)
  report["slice_1d"] = {"alphas": _floats(ctx.grid_P), "losses": _floats(s1_P)}


def _hessian_part(ctx: _Context, report: dict[str, Any]) -> None:
  """The top Hessian eigenvalues: one Lanczos run, one HVP per step."""
  report["hessian"] = {}
  if ctx.hessian_k > 0:
    m = ctx.lanczos_iters
    eig_k = jax.jit(lambda p, k: hessian_top_eigenvalues(
        ctx.loss_fn, p, k, k=min(ctx.hessian_k, m), num_iters=m,
        on_step=lambda: ctx.update(1)))(ctx.params, ctx.key_of(_HESSIAN))
    report["hessian"].update(top_eigenvalues=_floats(eig_k), num_iters=m)


def _trace_part(ctx: _Context, report: dict[str, Any]) -> None:
  """The Hutchinson trace: the Rademacher vectors a chunk at a time."""
  if ctx.trace_samples == 0:
    return
  q_S = _in_chunks(lambda p, k, ids: hutchinson_samples(ctx.loss_fn, p, k, ids),
                   (ctx.params, ctx.key_of(_TRACE)), np.arange(ctx.trace_samples),
                   ctx.plan["trace_samples"], ctx.update).astype(np.float64)
  with np.errstate(invalid="ignore"):
    tr = np.mean(q_S)
    tr_se = np.std(q_S, ddof=1) / np.sqrt(ctx.trace_samples) if ctx.trace_samples > 1 else 0.0
  report["hessian"].update(trace=_floats(tr), trace_stderr=_floats(tr_se),
                           mean_curvature=_floats(tr / ctx.num_params),
                           trace_samples=ctx.trace_samples)


def _slice_2d_part(ctx: _Context, report: dict[str, Any]) -> None:
  """The 2-D slice: the grid's points a chunk at a time."""
  a_PxP, b_PxP = np.meshgrid(ctx.grid_P, ctx.grid_P, indexing="ij")
  plane_Qx2 = np.stack([a_PxP.reshape(-1), b_PxP.reshape(-1)], axis=1)
  s2_PxP = _in_chunks(ctx.on_plane, ctx.plane_args, plane_Qx2, ctx.plan["points"],
                      ctx.update).reshape(a_PxP.shape)
  report["slice_2d"] = {"alphas": _floats(ctx.grid_P), "betas": _floats(ctx.grid_P),
                        "losses": _floats(s2_PxP)}


_PART_FNS = {"loss": _loss_part, "sharpness": _sharpness_part, "slice_1d": _slice_1d_part,
             "hessian": _hessian_part, "trace": _trace_part, "slice_2d": _slice_2d_part}


def _nan_for_none(x: Any) -> np.ndarray:
  return np.array(x, dtype=np.float64)  # numpy reads None as NaN for a float dtype


def write_basin_report(loss_fn: Callable[[PyTree], jax.Array], params: PyTree, key: jax.Array,
                       out_dir: str | os.PathLike, *, title: str | None = None,
                       **kw: Any) -> dict[str, Any]:
  """:func:`basin_report`, written to ``out_dir`` as ``basin.json`` plus three PNG figures.

  Files: ``basin.json`` (the dict, strict JSON), ``sharpness.png``, ``slice_1d.png``,
  ``slice_2d.png``. Each is written as soon as its part is measured (``basin.json`` after every
  part, replaced atomically, with ``"complete": false`` until the last), so an interrupted run
  leaves what it measured. The directory is created if needed; existing files of these names are
  replaced.

  Args:
    loss_fn, params, key: as in :func:`basin_report`.
    out_dir: destination directory.
    title: prefix for the figure titles (e.g. ``"v2, step 112000"``).
    **kw: forwarded to :func:`basin_report`; an ``on_part`` hook there runs before each write, so
      it may add fields to the file.

  Returns:
    The report dict.

  Example:
    >>> write_basin_report(loss_fn, params, jax.random.key(0), "runs/v2/basin/112000",
    ...                    title="step 112000", memory_budget=8 * 2**30, progress=True)
  """
  os.makedirs(out_dir, exist_ok=True)
  prefix = f"{title}: " if title else ""
  user_on_part = kw.pop("on_part", None)

  def write(report: dict[str, Any], part: str) -> None:
    if user_on_part is not None:   # first: it may add fields to what is written
      user_on_part(report, part)
    # A reader never sees half a file, nor a report that lost a part it had.
    storage.atomic_write(os.path.join(out_dir, "basin.json"),
                         json.dumps(report, indent=1, allow_nan=False),
                         "the parts of the report written before are intact")
    if part == "sharpness":
      sh = report["sharpness"]
      plot_sharpness(sh["sigmas"], _nan_for_none(sh["mean_increase"]),
                     _nan_for_none(sh["std_increase"]), path=os.path.join(out_dir, "sharpness.png"),
                     title=f"{prefix}perturbation sharpness")
    elif part == "slice_1d":
      s1 = report["slice_1d"]
      plot_slice_1d(s1["alphas"], _nan_for_none(s1["losses"]),
                    path=os.path.join(out_dir, "slice_1d.png"), title=f"{prefix}1-D slice")
    elif part == "slice_2d":
      s2 = report["slice_2d"]
      plot_slice_2d(s2["alphas"], s2["betas"], _nan_for_none(s2["losses"]),
                    path=os.path.join(out_dir, "slice_2d.png"), title=f"{prefix}2-D slice")

  return basin_report(loss_fn, params, key, on_part=write, **kw)

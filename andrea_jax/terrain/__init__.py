"""The loss terrain around a point ``w``: how wide is the basin?

Every function takes a ``loss_fn(params) -> scalar`` and a parameter pytree, nothing else from the
trainer, so it works on any model (close ``loss_fn`` over a fixed evaluation batch).

* :mod:`~andrea_jax.terrain.directions` -- filter-normalised random directions (Li et al. 2018).
* :mod:`~andrea_jax.terrain.sharpness` -- loss increase under random perturbations of relative size
  sigma.
* :mod:`~andrea_jax.terrain.hessian` -- Hessian-vector products, top eigenvalues (Lanczos), trace.
* :mod:`~andrea_jax.terrain.slices` -- 1-D and 2-D slices of the loss.
* :mod:`~andrea_jax.terrain.plots` -- their figures.
* :mod:`~andrea_jax.terrain.budget` -- the memory budget and the chunk sizes it allows.
* :mod:`~andrea_jax.terrain.report` -- all of it as one JSON-serialisable dict, or written to a
  directory, in chunks sized from the budget.
"""

from andrea_jax.terrain.budget import default_memory_budget
from andrea_jax.terrain.directions import (
    perturb,
    perturb_2d,
    random_direction,
    tree_norm,
)
from andrea_jax.terrain.hessian import (
    hessian_top_eigenvalues,
    hessian_trace,
    hutchinson_samples,
    hvp,
)
from andrea_jax.terrain.plots import plot_sharpness, plot_slice_1d, plot_slice_2d
from andrea_jax.terrain.report import basin_report, chunk_plan, write_basin_report
from andrea_jax.terrain.sharpness import (
    Sharpness,
    perturbation_sharpness,
    perturbed_losses,
)
from andrea_jax.terrain.slices import loss_on_plane, loss_slice_1d, loss_slice_2d

__all__ = [
    "Sharpness", "basin_report", "chunk_plan", "default_memory_budget", "hessian_top_eigenvalues",
    "hessian_trace", "hutchinson_samples", "hvp", "loss_on_plane", "loss_slice_1d", "loss_slice_2d",
    "perturb", "perturb_2d", "perturbation_sharpness", "perturbed_losses", "plot_sharpness",
    "plot_slice_1d", "plot_slice_2d", "random_direction", "tree_norm", "write_basin_report",
]

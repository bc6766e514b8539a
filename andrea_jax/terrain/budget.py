"""The memory budget of a terrain measurement, and the chunk sizes it allows.

A terrain measurement evaluates the loss at many points (perturbed weights) on many held-out
windows. Evaluated all at once, that is ``points x windows`` forward passes in flight, a memory that
grows with the grid times the windows. Every measurement here instead runs in chunks, and a chunk's
size follows from a budget of bytes:

* held-out windows per loss evaluation (:func:`andrea_jax.terrain.run.windows_per_chunk`): as many
  as one Hessian-vector product, the costliest single evaluation, can hold beside the Lanczos basis;
* perturbed losses per chunk: ``budget // bytes(one perturbed loss)``; Hessian-vector products per
  chunk: ``budget // bytes(one HVP)``. A chunk of ``g`` points is ``vmap`` ped, and everything it
  allocates is per point (the perturbed copy of the weights, the activations), so it needs ``g``
  times the bytes of one.

The bytes of one evaluation are XLA's own plan for the compiled program
(``jax.stages.Compiled.memory_analysis()``: its temporaries and outputs, the arguments excluded, since
the weights and windows are resident anyway), measured on abstract shapes: compiling, never running.
So the budget bounds what the measurements allocate on top of the parameters, the directions and
the held-out windows, whatever the model and the platform.

The default budget is half of the memory jax reports for the accelerator (``bytes_limit`` of
``Device.memory_stats()``; the other half holds the weights, the directions and the allocator's
slack), and 2 GiB where it reports none (a CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from andrea_jax import checks
from andrea_jax.terrain.directions import perturb
from andrea_jax.terrain.hessian import hvp

PyTree = Any

GIB = 2 ** 30
CPU_BUDGET = 2 * GIB      # where jax reports no device memory
DEVICE_FRACTION = 0.5     # of the memory jax reports for an accelerator


def default_memory_budget(device: jax.Device | None = None) -> int:
  """Bytes the terrain's evaluations may allocate: half the accelerator's memory, or 2 GiB on a CPU.

  ``DEVICE_FRACTION * memory_stats()["bytes_limit"]`` of ``device`` (default the first local
  device) where jax reports it; ``CPU_BUDGET`` where it does not (a CPU reports nothing).

  Example:
    >>> default_memory_budget()  # on a CPU
    2147483648
  """
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001 -- some backends raise instead of returning None
    stats = None
  limit = (stats or {}).get("bytes_limit")
  return int(DEVICE_FRACTION * limit) if limit else CPU_BUDGET


def budget_bytes(gib: float | None, *, name: str = "memory_budget_gib") -> int:
  """A budget given in GiB (``None`` or 0: :func:`default_memory_budget`) as bytes, validated."""
  gib = checks.number(name, gib, low=0, optional=True, hint="a number of GiB; 0 = automatic")
  if not gib:   # None or 0
    return default_memory_budget()
  return max(1, int(gib * GIB))


def format_bytes(n: float) -> str:
  """``1536 * 2**20 -> '1.50 GiB'``, ``3 * 2**20 -> '3.0 MiB'``."""
  for unit, size in (("GiB", GIB), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
    if abs(n) >= size:
      return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
  return f"{int(n)} B"


def _abstract(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree)


def compiled_bytes(fn: Callable[..., Any], *args: Any) -> int:
  """Bytes one call of ``jax.jit(fn)(*args)`` allocates besides its arguments, as XLA plans it.

  ``temp_size_in_bytes + output_size_in_bytes - alias_size_in_bytes`` of the compiled program's
  memory analysis. ``args`` may be arrays or ``jax.ShapeDtypeStruct`` s: the program is compiled on
  their shapes and never run.

  Example:
    >>> compiled_bytes(lambda x: jnp.outer(x, x).sum(), jnp.ones(1000))  # the 1000 x 1000 temp
    4000004
  """
  stats = jax.jit(fn).lower(*_abstract(args)).compile().memory_analysis()
  if stats is None:   # a backend without the analysis: nothing to bound by
    raise RuntimeError("this jax backend reports no compiled memory analysis; pass explicit chunk "
                       "sizes (batch_size) instead of a memory budget")
  return int(stats.temp_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes)


def point_bytes(loss_fn: Callable[[PyTree], jax.Array], params: PyTree) -> int:
  """Bytes of one perturbed loss ``L(w + alpha d)``: the perturbed weights and one forward pass."""
  return compiled_bytes(lambda p, d, a: loss_fn(perturb(p, d, a)), params, params,
                        jnp.zeros((), jnp.float32))


def hvp_bytes(loss_fn: Callable[[PyTree], jax.Array], params: PyTree) -> int:
  """Bytes of one Hessian-vector product ``H v`` (forward-over-reverse) and its output."""
  return compiled_bytes(lambda p, v: hvp(loss_fn, p, v), params, params)


def per_chunk(unit_bytes: int, budget: int, *, what: str, limit: int | None = None) -> int:
  """How many units of ``unit_bytes`` fit in ``budget`` (at most ``limit``), at least one.

  Raises ``ValueError`` when not even one fits: the budget is too small for the measurement, and
  the message says how much one unit needs.

  Example:
    >>> per_chunk(300, 1000, what="perturbed losses")
    3
  """
  if unit_bytes > budget:
    raise ValueError(f"one {what} needs {format_bytes(unit_bytes)}, over the memory budget of "
                     f"{format_bytes(budget)}: raise the budget (memory_budget; the terrain command's "
                     "--memory_budget_gib)")
  count = budget // max(unit_bytes, 1)
  return int(count if limit is None else min(count, limit))

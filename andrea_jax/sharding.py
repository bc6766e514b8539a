"""The device mesh and the shardings of a run: data parallel over ``data``, fully sharded (FSDP)
over ``fsdp``.

The mesh has two axes, ``("data", "fsdp")``, sized by the ``mesh`` config section
(``mesh.data = -1`` takes every device the ``fsdp`` axis leaves). The same config runs on one CPU,
on eight simulated CPU devices, on one GPU, on several GPU hosts and on a TPU slice: only the device
count changes.

Where each array lives:

* **batch** ``[B, ...]``: rows split over both axes, ``P(("data", "fsdp"))``: every device holds
  ``B / (data * fsdp)`` rows;
* **parameters and optimizer moments** (the FSDP rule): an array with at least
  ``mesh.fsdp_min_size`` elements is split over the ``fsdp`` axis along its *largest* dimension
  divisible by the ``fsdp`` size (the lowest-numbered such dimension on ties); a smaller array, or
  one with no divisible dimension, is replicated. With ``fsdp = 1`` everything is replicated (plain
  data parallelism). For ANDREA-120M on ``fsdp = 8`` that splits every matrix and embedding
  (``wte [50304, 768]`` along its rows, ``c_fc [768, 3072]`` along its columns) and replicates the
  biases and LayerNorms. XLA gathers a parameter before its use and reduce-scatters its gradient;
* **everything else** in the training state (step, curriculum, detector): replicated.

Parameters are created directly in their shards: :func:`init_sharded` traces the initialiser with
``jax.eval_shape`` (no memory), derives the shardings from the abstract shapes, then runs the
initialiser jitted with those ``out_shardings``. The random values do not depend on the mesh
(``jax_threefry_partitionable``, on by default), so every mesh starts from the same weights.

Multi-host: each process builds only the rows of the global batch its devices hold
(:func:`process_rows`) and :func:`global_batch` assembles the global array from them with
``jax.make_array_from_process_local_data``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from andrea_jax import checks

PyTree = Any

AXES = ("data", "fsdp")
BATCH_SPEC = P(("data", "fsdp"))


def mesh_section() -> ml_collections.ConfigDict:
  """The ``mesh`` section of a run config."""
  m = ml_collections.ConfigDict()
  m.data = -1               # devices on the data-parallel axis; -1 = all the devices fsdp leaves
  m.fsdp = 1                # devices on the fully-sharded axis (parameters, moments split); 1 = DP
  m.fsdp_min_size = 2**16   # elements; smaller parameters stay replicated even when fsdp > 1
  return m


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """The ``mesh`` section, validated (:meth:`from_config`): ``data`` devices on the
  data-parallel axis (-1: all that ``fsdp`` leaves), ``fsdp`` on the fully-sharded one, and the
  smallest parameter (elements) that FSDP splits."""
  data: int = -1
  fsdp: int = 1
  fsdp_min_size: int = 2**16

  @classmethod
  def from_config(cls, cfg) -> "MeshSpec":
    """Each field checked, the error naming ``mesh.<field>`` and the value."""
    fsdp = checks.integer("mesh.fsdp", cfg.fsdp, minimum=1)
    min_size = checks.integer("mesh.fsdp_min_size", cfg.fsdp_min_size, minimum=0, int32=False)
    data = checks.integer("mesh.data", cfg.data, minimum=-1)
    if data == 0:
      raise ValueError("mesh.data must be -1 (all remaining devices) or an integer >= 1, got 0")
    return cls(data=data, fsdp=fsdp, fsdp_min_size=min_size)


def mesh_shape(cfg: MeshSpec | ml_collections.ConfigDict, device_count: int) -> tuple[int, int]:
  """``(data, fsdp)`` sizes for ``device_count`` devices; validates the ``mesh`` section.

  ``mesh.data = -1`` resolves to ``device_count / mesh.fsdp``. The product must equal the device
  count (a mesh that leaves devices idle is almost always a mistake).

  Example:
    >>> mesh_shape(MeshSpec(data=-1, fsdp=4), 8)
    (2, 4)
  """
  spec = cfg if isinstance(cfg, MeshSpec) else MeshSpec.from_config(cfg)
  data, fsdp = spec.data, spec.fsdp
  if data == -1:
    if device_count % fsdp:
      raise ValueError(f"mesh.fsdp = {fsdp} does not divide the {device_count} devices")
    return device_count // fsdp, fsdp
  if data * fsdp != device_count:
    what = ("needs more than" if data * fsdp > device_count else
            "does not divide" if device_count % (data * fsdp) else "uses only part of")
    raise ValueError(f"mesh.data x mesh.fsdp = {data} x {fsdp} = {data * fsdp} {what} the "
                     f"{device_count} devices; set mesh.data = -1 to take all of them")
  return int(data), fsdp


def _process_contiguous(devices_flat: Sequence[Any]) -> bool:
  """Whether each process's devices form one run in the flattened (data, fsdp) order."""
  seen, last = set(), None
  for d in devices_flat:
    p = d.process_index
    if p != last:
      if p in seen:
        return False
      seen.add(p)
      last = p
  return True


def make_mesh(cfg: MeshSpec | ml_collections.ConfigDict, devices: Sequence[Any] | None = None) -> Mesh:
  """The ``("data", "fsdp")`` mesh over ``devices`` (default: all devices of all processes).

  Devices come in ``jax.make_mesh``'s topology-aware order. Flattened, the mesh order is the batch
  order (``P(("data", "fsdp"))``), so each process must own one contiguous run of it to build its
  rows alone; when the topology order breaks that, the devices are ordered by process instead.

  Example:
    >>> mesh = make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=2, fsdp_min_size=1)))
    >>> dict(mesh.shape)          # on 8 devices
    {'data': 4, 'fsdp': 2}
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(cfg, len(devices))
  auto = (jax.sharding.AxisType.Auto,) * len(AXES)
  mesh = jax.make_mesh(shape, AXES, axis_types=auto, devices=devices)
  if not _process_contiguous(mesh.devices.flat):
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(ordered).reshape(shape), AXES, axis_types=auto)
  return mesh


def fsdp_spec(shape: Sequence[int], fsdp: int, min_size: int) -> P:
  """The FSDP rule for one array of ``shape`` (see the module docstring).

  Example:
    >>> fsdp_spec((768, 3072), 8, 2**16), fsdp_spec((3072,), 8, 2**16), fsdp_spec((5, 7), 2, 1)
    (PartitionSpec(None, 'fsdp'), PartitionSpec(), PartitionSpec())
  """
  size = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
  if fsdp == 1 or not shape or size < max(min_size, 1):
    return P()
  divisible = [i for i, n in enumerate(shape) if n % fsdp == 0]
  if not divisible:
    return P()
  dim = max(divisible, key=lambda i: (shape[i], -i))
  return P(*("fsdp" if i == dim else None for i in range(len(shape))))


def fsdp_shardings(tree: PyTree, mesh: Mesh, min_size: int) -> PyTree:
  """``NamedSharding`` of every leaf (arrays or ``ShapeDtypeStruct``) by the FSDP rule."""
  fsdp = mesh.shape["fsdp"]
  return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(x.shape, fsdp, min_size)), tree)


def replicated(tree: PyTree, mesh: Mesh) -> PyTree:
  """A replicated ``NamedSharding`` for every leaf of ``tree`` (or for one value if not a tree)."""
  return jax.tree.map(lambda _: NamedSharding(mesh, P()), tree)


def state_shardings(abstract_state: Any, mesh: Mesh, min_size: int) -> Any:
  """Shardings of a training state: ``params`` and ``opt_state`` by the FSDP rule, the rest
  replicated.

  ``abstract_state`` is a ``flax.struct`` dataclass with ``params`` and ``opt_state`` fields (such
  as :class:`andrea_jax.step.TrainState`), of arrays or ``ShapeDtypeStruct``. AdamW's moments have
  their parameter's shape, so the rule puts each moment next to its parameter.
  """
  out = replicated(abstract_state, mesh)
  return out.replace(params=fsdp_shardings(abstract_state.params, mesh, min_size),
                     opt_state=fsdp_shardings(abstract_state.opt_state, mesh, min_size))


def init_sharded(init_fn: Callable[[], Any],
                 shardings_fn: Callable[[Any], Any]) -> tuple[Any, Any]:
  """``(state, shardings)``: ``init_fn()`` built directly in its shards.

  ``shardings_fn`` maps the abstract state (``jax.eval_shape(init_fn)``, no memory used) to its
  shardings; the state is then computed by ``jax.jit(init_fn, out_shardings=...)``, so no device
  ever holds a whole parameter that is meant to be split.

  Example:
    >>> state, shardings = init_sharded(lambda: init_state(run, keys),
    ...                                 lambda s: state_shardings(s, mesh, 2**16))
  """
  shardings = shardings_fn(jax.eval_shape(init_fn))
  return jax.jit(init_fn, out_shardings=shardings)(), shardings


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows (dimension 0) split over ``("data", "fsdp")``; the other dimensions whole."""
  return NamedSharding(mesh, BATCH_SPEC)


def process_rows(sharding: NamedSharding, global_batch_size: int) -> tuple[int, int]:
  """``(lo, hi)``: the rows ``[lo, hi)`` of the global batch held by this process's devices.

  Raises ``ValueError`` if they are not one contiguous run (:func:`make_mesh` avoids that).

  Example:
    >>> process_rows(batch_sharding(mesh), 16)     # process 1 of 2, 4 devices each
    (8, 16)
  """
  index_map = sharding.addressable_devices_indices_map((global_batch_size,))
  spans = sorted({(s[0].start or 0, global_batch_size if s[0].stop is None else s[0].stop)
                  for s in index_map.values()})
  lo, hi = spans[0][0], spans[0][1]
  for a, b in spans[1:]:
    if a != hi:
      raise ValueError(f"process {jax.process_index()} holds rows {spans} of the global batch, "
                       "not one contiguous run")
    hi = b
  return lo, hi


def global_batch(local: dict[str, np.ndarray], sharding: NamedSharding,
                 global_batch_size: int) -> dict[str, jax.Array]:
  """The global batch arrays from this process's rows (``[b, ...]`` each, ``b = hi - lo``).

  ``jax.make_array_from_process_local_data``: process ``p`` supplies only the rows
  :func:`process_rows` gives it; the result has ``global_batch_size`` rows, split as ``sharding``.

  Example:
    >>> batch = global_batch(sampler.batch(step, w), batch_sharding(mesh), 512)
    >>> batch["inputs"].shape      # whatever the number of processes
    (512, 1024)
  """
  return {k: jax.make_array_from_process_local_data(sharding, v,
                                                    (global_batch_size,) + v.shape[1:])
          for k, v in local.items()}


def put_rows(batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
  """A batch every process holds whole (the held-out rows), as arrays split as ``sharding``:
  each device gets its rows from the host's copy, so no process needs the others' data."""
  return {k: jax.make_array_from_callback(v.shape, sharding, lambda idx, v=v: v[idx])
          for k, v in batch.items()}


"""Multi-host start-up: ``jax.distributed.initialize`` from the config or the environment.

One process per host (per GPU host, or per TPU VM worker). The coordinator address, the number of
processes and this process's id come, in order of precedence, from the ``distributed`` config section,
from the ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` environment variables,
or from the cluster's own environment (SLURM, Open MPI, TPU VM metadata), which
``jax.distributed.initialize()`` detects by itself. A single process with nothing set does nothing.

Call it before anything touches a device. Initialising starts JAX's preemption service, whose own
SIGTERM handler (it replaces any installed before, such as :mod:`andrea_jax.signals`'s) lets every
process agree on the step at which to checkpoint and stop (see ``andrea_jax.train``).
"""

from __future__ import annotations

import os

import jax
import ml_collections

from andrea_jax import checks


def distributed_config() -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.coordinator_address = ""   # "host:port" of process 0; "" = from the environment, or single process
  d.num_processes = 0          # total processes (hosts); 0 = from the environment
  d.process_id = -1            # this process's index; -1 = from the environment
  d.local_device_ids = ""      # comma-separated local device ids this process uses; "" = all
  d.auto = False               # True: jax.distributed.initialize() finds everything (TPU VM slices)
  return d


def maybe_initialize(config: ml_collections.ConfigDict) -> bool:
  """Initialise the multi-process runtime when the config or the environment asks; returns whether.

  Example (process 1 of 2, both on this machine):
    >>> c.distributed.update(coordinator_address="127.0.0.1:12345", num_processes=2, process_id=1)
    >>> maybe_initialize(c)
    True
  """
  d = config.distributed
  addr = d.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
  for name, value, least in (("num_processes", d.num_processes, 0),
                             ("process_id", d.process_id, -1)):
    checks.integer(f"distributed.{name}", value, minimum=least)
  num = d.num_processes or _env_int("JAX_NUM_PROCESSES", 0)
  pid = d.process_id if d.process_id >= 0 else _env_int("JAX_PROCESS_ID", -1)
  if num < 0:
    raise ValueError(f"JAX_NUM_PROCESSES must be >= 0, got {num}")
  if pid < -1:
    raise ValueError(f"JAX_PROCESS_ID must be >= 0 (or unset), got {pid}")
  try:
    local = [int(x) for x in d.local_device_ids.split(",")] if d.local_device_ids else None
  except ValueError:
    local = None
  if d.local_device_ids and (local is None or min(local) < 0 or len(set(local)) != len(local)):
    raise ValueError(f"distributed.local_device_ids must be distinct comma-separated integers "
                     f">= 0, got {d.local_device_ids!r}")
  if addr:
    if num < 1 or pid < 0:
      raise ValueError(f"distributed.coordinator_address = {addr!r} needs num_processes (got {num}) "
                       f"and process_id (got {pid}), from the config or JAX_NUM_PROCESSES / "
                       "JAX_PROCESS_ID")
    if pid >= num:
      raise ValueError(f"distributed.process_id = {pid} must be < num_processes = {num}")
    _initialize(coordinator_address=addr, num_processes=num, process_id=pid,
                local_device_ids=local)
    return True
  cluster = d.auto or _in_multiprocess_job()
  if not cluster:
    # More than one process without a coordinator: every host would train alone into the same
    # workdir. (num_processes 1 and process_id 0 describe this single process: fine.)
    given = [f"{where} = {value!r}" for where, value, several in (
        ("distributed.num_processes" if d.num_processes else "JAX_NUM_PROCESSES", num, num > 1),
        ("distributed.process_id" if d.process_id >= 0 else "JAX_PROCESS_ID", pid, pid > 0))
             if several]
    if given:
      raise ValueError(f"{', '.join(given)} without a coordinator: set "
                       "distributed.coordinator_address (or JAX_COORDINATOR_ADDRESS), or "
                       "distributed.auto on a cluster JAX detects")
    return False
  _initialize(num_processes=num or None, process_id=pid if pid >= 0 else None,
              local_device_ids=local)
  return True


def _env_int(name: str, default: int) -> int:
  value = os.environ.get(name, "")
  if not value:
    return default
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"environment variable {name} = {value!r} is not an integer") from None


def _in_multiprocess_job() -> bool:
  """Whether the environment is a cluster job of several processes that JAX can set up: a SLURM
  job step of more than one task, an Open MPI world of more than one, or a TPU VM slice. A
  single-task SLURM allocation (an ``salloc`` shell, a one-task batch job) is a single process."""
  def count(*names):
    for name in names:
      try:
        return int(os.environ[name])
      except (KeyError, ValueError):
        continue
    return 1
  if "SLURM_JOB_ID" in os.environ and "SLURM_STEP_NODELIST" in os.environ:
    if count("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") > 1:
      return True
  if count("OMPI_COMM_WORLD_SIZE") > 1:
    return True
  return any(v in os.environ for v in ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS"))


def _initialize(**kwargs) -> None:
  """``jax.distributed.initialize`` with gloo for CPU collectives; its failures name the section."""
  _cpu_collectives()
  try:
    jax.distributed.initialize(**kwargs)
  except (RuntimeError, ValueError) as e:
    raise ValueError(f"distributed: jax.distributed.initialize failed ({e}); set "
                     "distributed.coordinator_address, num_processes and process_id (or "
                     "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID)") from e


def _cpu_collectives() -> None:
  # CPU processes talk through gloo over TCP (the default from jax 0.4.36; older versions had none,
  # and a multi-process CPU run then failed at its first collective). GPUs and TPUs ignore it.
  try:
    if jax.config.jax_cpu_collectives_implementation is None:
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except AttributeError:
    pass

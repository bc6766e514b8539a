"""Host-side feed of mixture weights (which weights build the batch of step t), and the batches.

The curriculum runs on device, inside the jitted step; the batches are built on the host, ahead of time,
by a background thread. The curriculum decides each phase's weights ``decision_lag`` steps before the
phase starts, so the schedule it returns after step ``s`` fixes the weights of every step up to
``s + 1 + lag``. To build batch ``t`` the host therefore reads the schedule recorded after step
``t - 1 - lag``: a step dispatched long before, so the read never makes the device wait, and the answer
is the same whichever run (fresh or resumed) asks.
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import numpy as np

from andrea_jax import curriculum
from andrea_jax import data as data_lib
from andrea_jax import sharding
from andrea_jax import probes as probes_lib


class Closed(RuntimeError):
  """The feed was closed while a reader waited (the training loop stopped)."""


class ScheduleFeed:
  """Thread-safe map ``step -> weights`` backed by schedules recorded after each step.

  ``initial`` is the schedule of the state the loop starts from (fresh or restored), valid for steps
  ``start .. start + lag``. The loop calls :meth:`record` after dispatching each step with the step's
  (device) schedule; the batch thread calls :meth:`weights` for the step it builds.
  """

  def __init__(self, initial: Any, start_step: int, lag: int):
    self._initial = jax.tree.map(np.asarray, initial)
    self._start = start_step
    self._lag = lag
    self._recorded: dict[int, Any] = {}
    self._cond = threading.Condition()
    self._closed = False
    self._used: dict[int, np.ndarray] = {}

  def record(self, step: int, schedule: Any) -> None:
    with self._cond:
      self._recorded[step] = schedule
      for old in [s for s in self._recorded if s < step - 4 * (self._lag + 2)]:
        del self._recorded[old]
      self._cond.notify_all()

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._cond.notify_all()

  def weights(self, step: int) -> np.ndarray:
    """Mixture weights ``[S]`` of the batch of ``step`` (blocks until the schedule it needs exists)."""
    source = step - 1 - self._lag
    if source < self._start:
      sched = self._initial
    else:
      with self._cond:
        while source not in self._recorded:
          if self._closed:
            raise Closed(f"feed closed while waiting for the schedule of step {source}")
          self._cond.wait(timeout=1.0)
        sched = self._recorded[source]
      sched = jax.tree.map(np.asarray, sched)   # waits for that step only, long finished
    w = np.asarray(curriculum.weights_at(sched, step), np.float64)
    with self._cond:
      self._used[step] = w
    return w

  def used(self, step: int) -> np.ndarray | None:
    """The weights handed out for ``step`` (for logging); forgets every earlier step."""
    with self._cond:
      for old in [s for s in self._used if s < step]:
        del self._used[old]
      return self._used.get(step)


def batches(run, data: data_lib.PreparedData, batch_sharding: jax.sharding.NamedSharding,
            feed: ScheduleFeed, start: int, end: int) -> data_lib.Prefetcher:
  """The batches of steps ``start .. end - 1``, built ahead in a thread (the host-to-device copy
  too) with the weights ``feed`` gives. This process builds only the rows its devices hold, slot
  k of the global batch's P equal slices, and the rows of the run's probes beside them
  (:class:`andrea_jax.probes.HostRows`: each probe's own rows at its measuring steps, on sampler
  streams of its own). ``run`` is the :class:`andrea_jax.runconfig.Run`."""
  rows = run.data.global_batch_size
  lo, hi = sharding.process_rows(batch_sharding, rows)
  slot = dict(process_index=lo // (hi - lo), process_count=rows // (hi - lo))
  sampler = data_lib.MixtureSampler(data, seq_len=run.data.seq_len, global_batch_size=rows,
                                    seed=run.seed, **slot)

  def make_sampler(*, global_batch_size: int, salt: int, split: str = "train"):
    return data_lib.MixtureSampler(data, seq_len=run.data.seq_len,
                                   global_batch_size=global_batch_size, seed=run.seed ^ salt,
                                   split=split, **slot)

  probe_rows = probes_lib.HostRows(run.step.probes, make_sampler) if run.step.probes else None

  def build(t):
    batch = sharding.global_batch(sampler.batch(t, feed.weights(t)), batch_sharding, rows)
    if probe_rows is not None:
      for key, (n, value) in probe_rows.rows(t).items():
        batch.update(sharding.global_batch({key: value}, batch_sharding, n))
    return batch

  return data_lib.Prefetcher(build, start_step=start, end_step=end,
                             depth=max(2, run.data.prefetch))

"""A background thread keeping the next batches ready, so the accelerator never waits for data."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

_POLL_S = 0.1  # how often a blocked producer looks whether it was closed


class Prefetcher:
  """Iterates ``make_batch(step)`` for ``step = start_step, start_step + 1, ...``, in step order.

  A daemon thread calls ``make_batch`` ahead of the consumer and keeps up to ``depth`` batches
  ready. An exception raised by ``make_batch`` is re-raised by ``next()`` in the consumer, after the
  batches of the earlier steps, with a note naming the step (``exc.__notes__``). numpy releases
  the GIL in its copies, so the producer runs while the main thread waits on the device.

  Example:
    >>> with Prefetcher(lambda step: sampler.batch(step, weights_at(step)), start_step=100) as it:
    ...   for step in range(100, num_steps):
    ...     state, metrics = train_step(state, next(it))   # it.next_step == step + 1 now
  """

  def __init__(self, make_batch: Callable[[int], Any], start_step: int, depth: int = 2,
               end_step: int | None = None):
    """Starts the producer thread.

    Args:
      make_batch: ``step -> batch``; may block briefly (e.g. to look up the mixture of that step).
      start_step: the first step produced.
      depth: batches kept ready (>= 1).
      end_step: stop before this step (``None``: never stop).
    """
    if depth < 1:
      raise ValueError(f"depth must be >= 1, got {depth}")
    if end_step is not None and end_step < start_step:
      raise ValueError(f"end_step {end_step} is before start_step {start_step}")
    self._make_batch, self._end = make_batch, end_step
    self.next_step = int(start_step)  # the step whose batch the next ``next()`` returns
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._closed = threading.Event()
    self._done = False
    self._thread = threading.Thread(target=self._produce, args=(int(start_step),),
                                    name="andrea-prefetch", daemon=True)
    self._thread.start()

  def _put(self, item: tuple) -> bool:
    while not self._closed.is_set():
      try:
        self._queue.put(item, timeout=_POLL_S)
        return True
      except queue.Full:
        continue
    return False

  def _produce(self, step: int) -> None:
    while not self._closed.is_set() and (self._end is None or step < self._end):
      try:
        batch = self._make_batch(step)
      except BaseException as e:  # pylint: disable=broad-except  -- handed to the consumer
        self._put(("error", step, e))
        return
      if not self._put(("batch", step, batch)):
        return
      step += 1
    self._put(("end", step, None))

  def __iter__(self) -> Iterator[Any]:
    return self

  def __next__(self) -> Any:
    if self._done:
      raise StopIteration
    while True:
      try:
        kind, step, payload = self._queue.get(timeout=_POLL_S)
        break
      except queue.Empty:
        if self._closed.is_set() or not self._thread.is_alive() and self._queue.empty():
          self._done = True
          raise StopIteration from None
    if kind == "batch":
      self.next_step = step + 1
      return payload
    self._done = True
    if kind == "error":
      if isinstance(payload, (StopIteration, StopAsyncIteration)):
        # Re-raised as is it would end the consumer's loop as if end_step were reached (PEP 479).
        raise RuntimeError(f"make_batch raised {type(payload).__name__} at step {step}: "
                           f"{payload!r}") from payload
      if hasattr(payload, "add_note"):
        payload.add_note(f"raised by make_batch while producing the batch of step {step}")
        raise payload
      raise RuntimeError(f"make_batch failed at step {step}: {payload!r}") from payload
    raise StopIteration

  def close(self) -> None:
    """Stops the producer and waits for it (at most one ``make_batch`` call)."""
    self._closed.set()
    self._done = True
    self._thread.join()

  def __enter__(self) -> Prefetcher:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

"""SIGTERM and SIGINT over a run's whole life: recorded from the first milliseconds, acted on at a
step boundary, never lost.

A signal (a preemption, a scheduler's time limit, Ctrl-C) can come at any moment, including while
Python imports jax, the flags load the config file and ``jax.distributed`` connects. Two stages, one
module:

1. :func:`hold`, called first thing by :func:`andrea_jax.main.run` (the console script
   ``andrea-train`` and ``python -m andrea_jax.main``): a signal becomes a note in
   :data:`RECEIVED`. The command line exits 0 before training if it came before the run was set up.
   This stage imports nothing heavy.
2. :class:`Signals`, held by :func:`andrea_jax.train.train_and_evaluate` for the whole call: a
   signal (or the first one :data:`RECEIVED` noted) stops the run at its next step boundary with a
   checkpoint. Several processes must all stop after the same step (the checkpoint is a collective
   write): there SIGTERM is left to JAX's preemption service, which tells every process and picks a
   step they all reach, and a SIGINT is passed on to it as a SIGTERM.

A second Ctrl-C stops at once, in either stage. :func:`release` gives the default actions back.
"""

from __future__ import annotations

import os
import signal

# Process-wide by nature: signal handlers belong to the process, and so does what they received.
RECEIVED: list[int] = []


def _record(signum, frame):
  del frame
  if signum == signal.SIGINT and signal.SIGINT in RECEIVED:
    raise KeyboardInterrupt   # a second Ctrl-C stops at once
  RECEIVED.append(signum)


def hold() -> None:
  """Record SIGTERM and SIGINT in :data:`RECEIVED` from now on (main thread only)."""
  for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, _record)


def release() -> None:
  """Back to Python's defaults: SIGTERM ends the process, SIGINT raises KeyboardInterrupt."""
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  signal.signal(signal.SIGINT, signal.default_int_handler)


class Signals:
  """A run's handlers, as a context manager: ``stop(step)`` says whether to checkpoint and exit
  after ``step``. Entered, it acts on the first signal :data:`RECEIVED` noted before (and clears
  the notes), as if it came then; nested entries install the handlers once.

  Example:
    >>> with Signals() as signals:
    ...   for t in range(steps):
    ...     ...
    ...     if signals.stop(t):
    ...       break   # checkpoint first
  """

  def __init__(self):
    import jax
    self.received: int | None = None
    self._old = {}
    self._depth = 0
    # Without jax.distributed (a TPU slice started without it) there is no service: each process
    # then handles its own signals, and a notice must reach all of them (distributed.auto = True).
    self._shared = (jax.process_count() > 1 and jax.distributed.is_initialized()
                    and bool(jax.config.jax_enable_preemption_service))

  def __enter__(self):
    self._depth += 1
    if self._depth > 1:
      return self
    for sig in (signal.SIGINT,) if self._shared else (signal.SIGTERM, signal.SIGINT):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:   # not the main thread (e.g. a notebook worker): no handlers
        pass
    if RECEIVED:   # noted while no run held the handlers: it counts from now, whenever it came
      first = RECEIVED[0]
      RECEIVED.clear()   # acted on once
      self._handle(first, None)
    return self

  def _handle(self, signum, frame):
    del frame
    if self.received is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt   # a second Ctrl-C stops at once
    self.received = signum
    if self._shared:
      os.kill(os.getpid(), signal.SIGTERM)   # to the preemption service's own handler

  def stop(self, step: int) -> bool:
    """Whether to checkpoint and exit after ``step`` (the same answer on every process)."""
    if self._shared:
      from jax.experimental import multihost_utils
      if not multihost_utils.reached_preemption_sync_point(step):
        return False
      self.received = self.received or signal.SIGTERM
      return True
    return self.received is not None

  def __exit__(self, *exc):
    self._depth -= 1
    if self._depth:
      return
    for sig, old in self._old.items():
      signal.signal(sig, old)
    self._old = {}

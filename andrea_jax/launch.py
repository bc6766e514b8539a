"""Signals before the trainer holds its own handlers: recorded, never fatal, never lost.

A SIGTERM (a preemption, a scheduler's time limit) or SIGINT (Ctrl-C) can come at any moment of a
run's life, including its first second, while Python imports jax, the flags load the config file
and ``jax.distributed`` connects. Until :mod:`andrea_jax.train` installs its handlers,
:func:`hold` makes such a signal a note in :data:`RECEIVED`: the command line then exits 0 before
training if it came before the run was set up, or hands it to the trainer, which checkpoints at its
first step boundary.
A second Ctrl-C still stops at once. This module imports nothing heavy, and
:func:`andrea_jax.main.run` (the console script ``andrea-train`` and ``python -m andrea_jax.main``)
calls :func:`hold` before anything else, so the handlers are in place within milliseconds of the
interpreter starting; only the interpreter's own start-up (before any of the program runs) keeps
the default action.
"""

from __future__ import annotations

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

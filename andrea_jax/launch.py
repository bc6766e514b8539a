"""Signals before the trainer holds its own handlers: recorded, never fatal, never lost.

A SIGTERM (a preemption, a scheduler's time limit) or SIGINT (Ctrl-C) can come at any moment of a
run's life, including its first second, while Python imports jax, the flags load the config file
and ``jax.distributed`` connects. Until :mod:`andrea_jax.train` installs its handlers,
:func:`hold` makes such a signal a note in :data:`RECEIVED`: the command line then exits 0 before
training if it came before the run was set up, or hands it to the trainer, which checkpoints at its
first step boundary.
A second Ctrl-C still stops at once. This module imports nothing heavy, so that the console script
(``andrea-train``, :func:`console_script`) and ``python -m andrea_jax.main`` both install the
handlers within milliseconds of the interpreter starting; only the interpreter's own start-up (about
20 ms, before any of the program runs) keeps the default action.
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


def console_script() -> None:
  """Entry point of ``andrea-train``: the handlers first, then absl, the flags and the run.

  ``--help`` lists the key flags of the program's main module, which absl names ``sys.argv[0]``:
  here that is the generated ``andrea-train`` script, while the flags belong to
  :mod:`andrea_jax.main`; so they are declared key flags of the script too, and the script shows
  :mod:`andrea_jax.main`'s docstring as its usage text, as ``python -m andrea_jax.main --help`` does.
  """
  hold()
  import sys  # pylint: disable=import-outside-toplevel

  from absl import flags  # pylint: disable=import-outside-toplevel

  from andrea_jax import main  # pylint: disable=import-outside-toplevel
  for flag in flags.FLAGS.get_key_flags_for_module(main.__name__):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  script = sys.modules.get("__main__")
  if script is not None and not getattr(script, "__doc__", None):
    script.__doc__ = main.__doc__
  main.run()

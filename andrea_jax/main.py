r"""Command line: ``andrea-train --config=experiments/tiny.py --workdir=runs/tiny [--config.x.y=value]``.

Flags only; the work is :func:`andrea_jax.train.train_and_evaluate`. A config file may take an argument
after a colon (``--config=experiments/andrea120m.py:v2``). Every field of the config can be overridden on
the command line; unknown fields and wrong types are rejected by ml-collections (the config is locked).
"""

import contextlib
import signal

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Run configuration file (experiments/*.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and plots; "
                               "re-running with the same workdir resumes the run.")
flags.mark_flags_as_required(["config", "workdir"])


class _StoppedBeforeStart(Exception):
  """SIGTERM/SIGINT arrived while the program was still importing: nothing to save yet."""


@contextlib.contextmanager
def _stop_cleanly_while_importing():
  """Until the trainer installs its own handlers, a SIGTERM/SIGINT ends the program cleanly."""
  def stop(signum, frame):
    raise _StoppedBeforeStart(signum)
  old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for s, handler in old.items():
      signal.signal(s, handler)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # orbax logs every save at INFO; --verbosity=0 shows it
  try:
    with _stop_cleanly_while_importing():
      import jax
      from andrea_jax import distributed
      from andrea_jax import train
  except _StoppedBeforeStart as e:
    print(f"signal {e.args[0]} before the run started: nothing to save; the checkpoints in "
          f"{_WORKDIR.value} are as they were. Run the same command again to resume.")
    return
  # After the handlers above are restored: with several processes, initialising installs JAX's
  # preemption-service SIGTERM handler, which restoring them would remove.
  distributed.maybe_initialize(_CONFIG.value)
  # From here train_and_evaluate holds the handlers: a signal stops the run at a step boundary.
  summary = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  if jax.process_index() == 0:
    where = _WORKDIR.value
    if "interrupted_at" in summary:
      print(f"interrupted at step {summary['interrupted_at']}; checkpoint saved. "
            f"Run the same command again to resume. Everything is in {where}/")
    else:
      final = summary.get("final_eval", {})
      mean = final.get("eval/mean_loss")
      print(f"done: {summary['end_step']} steps"
            + (f", held-out mean loss {mean:.3f}" if mean is not None else "")
            + f". Wrote {where}/metrics.jsonl, {where}/samples.txt, {where}/summary.png, "
            f"{where}/tensorboard/ and {where}/checkpoints/")


def run():
  """Console-script entry point (``andrea-train``)."""
  app.run(main)


if __name__ == "__main__":
  run()

r"""Command line: ``andrea-train --config=experiments/tiny.py --workdir=runs/tiny [--config.x.y=value]``.

Flags only; the work is :func:`andrea_jax.train.train_and_evaluate`. A config file may take an argument
after a colon (``--config=experiments/andrea120m.py:v2``). Every field of the config can be overridden on
the command line; unknown fields and wrong types are rejected by ml-collections (the config is locked).
"""

import signal


# A SIGTERM/SIGINT before the trainer holds its own handlers (while Python imports jax, while the
# flags load the config file, during jax.distributed start-up) is recorded here, not fatal: the
# program then exits 0 before training, the checkpoints as they were. Installed first thing when run
# as ``python -m andrea_jax.main``, and in :func:`run` for the console script.
_EARLY_SIGNALS: list[int] = []


def _record_early_signal(signum, frame):
  del frame
  _EARLY_SIGNALS.append(signum)


def _hold_signals_until_training():
  for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, _record_early_signal)


if __name__ == "__main__":
  _hold_signals_until_training()


from absl import app  # noqa: E402  (after the handlers above)
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Run configuration file (experiments/*.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and plots; "
                               "re-running with the same workdir resumes the run.")
flags.mark_flags_as_required(["config", "workdir"])


def _stopped_before_start() -> bool:
  if not _EARLY_SIGNALS:
    return False
  print(f"signal {_EARLY_SIGNALS[0]} before the run started: nothing to save; the checkpoints in "
        f"{_WORKDIR.value} are as they were. Run the same command again to resume.")
  return True


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # orbax logs every save at INFO; --verbosity=0 shows it
  import jax
  from andrea_jax import distributed
  from andrea_jax import train
  if _stopped_before_start():
    return
  # With several processes this installs JAX's preemption-service SIGTERM handler (kept from here).
  distributed.maybe_initialize(_CONFIG.value)
  if _stopped_before_start():
    return
  # From here train_and_evaluate holds the handlers: a signal stops the run at a step boundary (and
  # afterwards, during the last prints, one is recorded and ignored: the run is complete).
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
  _hold_signals_until_training()
  app.run(main)


if __name__ == "__main__":
  run()

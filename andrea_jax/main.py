r"""Command line: ``andrea-train --config=experiments/tiny.py --workdir=runs/tiny [--config.x.y=value]``.

Flags only; the work is :func:`andrea_jax.train.train_and_evaluate`. A config file may take an argument
after a colon (``--config=experiments/andrea120m.py:v2``). Every field of the config can be overridden on
the command line; unknown fields and wrong types are rejected by ml-collections (the config is locked).
"""

import sys

from andrea_jax import signals

# Defined by run(), after signals.hold(): absl and the config file load with the handlers in place.
_CONFIG = _WORKDIR = None


def _define_flags() -> None:
  global _CONFIG, _WORKDIR
  from absl import flags
  from ml_collections import config_flags
  from andrea_jax.data import formats
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "Run configuration file (experiments/*.py).", lock_config=True)
  # --config.data.files.<source>.format=<format> switches a source's format: its section made for
  # it as soon as the file is read, so that the other overrides may give the new format's fields.
  formats.switch_on_parse(flags.FLAGS["config"])
  _WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and plots; "
                                 "re-running with the same workdir resumes the run.")
  flags.mark_flags_as_required(["config", "workdir"])


def _stopped_before_start() -> bool:
  if not signals.RECEIVED:
    return False
  print(f"signal {signals.RECEIVED[0]} before the run started: nothing to save; the checkpoints in "
        f"{_WORKDIR.value} are as they were. Run the same command again to resume.")
  return True


def main(argv):
  """Validates the config, then trains; bad input ends the command with one ``error:`` line."""
  from absl import app, flags, logging
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # orbax logs every save at INFO; --verbosity=0 shows it
  import jax
  from andrea_jax import distributed
  from andrea_jax import runconfig
  from andrea_jax import rundir
  from andrea_jax import storage
  from andrea_jax import train
  from andrea_jax.checkpoint import CheckpointError
  from andrea_jax.curriculum import registry
  from ml_collections import config_flags
  FLAGS = flags.FLAGS
  from andrea_jax.data import DataError
  from andrea_jax.lock import WorkdirBusy, WorkdirLost
  if _stopped_before_start():
    return
  kept = f"the checkpoints in {_WORKDIR.value} are as they were"
  try:
    # With several processes this installs JAX's preemption-service SIGTERM handler. A signal
    # recorded from here on is handed to the trainer once its own handlers are in place (never
    # dropped; with several processes passed to the service, so that all stop at the same step).
    try:
      # --config.curriculum.mixer.name=<mixer> switches the mixer: its section made for it. (A
      # source's --config.data.files.<source>.format switched while the flags were read.)
      registry.apply_name_override(_CONFIG.value, config_flags.get_override_values(FLAGS["config"]))
      distributed.maybe_initialize(_CONFIG.value)   # validates the distributed section first
      run_spec = runconfig.build(_CONFIG.value)   # the config, read once
      rundir.make_workdir(_WORKDIR.value)
    except (ValueError, TypeError) as e:
      _fail(e, kept)                   # an invalid value, before anything ran
    try:
      summary = train.train_and_evaluate(run_spec, _WORKDIR.value)
    except (DataError, CheckpointError) as e:
      _fail(e, kept)                   # raised while opening the data or the checkpoints
    except WorkdirLost as e:           # taken over mid-run: what this run wrote stays
      _fail(e, f"the checkpoints this run committed in {_WORKDIR.value} are kept")
    except WorkdirBusy as e:           # another run holds the workdir: this one wrote nothing
      _fail(e, f"nothing in {_WORKDIR.value} was changed by this command")
    except OSError as e:               # a full disk, a read-only workdir: the message says more
      error = e if isinstance(e, storage.WriteError) else storage.write_error(
          e, e.filename or _WORKDIR.value, "Free some space and run the same command again")
      if error is None:
        raise
      _fail(error, f"the complete checkpoints in {_WORKDIR.value} are intact")
    except train.TrainingHalted as e:
      _fail(e, "the last checkpoint holds the last good state; run the command again, changed as "
               "suggested, to resume from it")
  finally:
    signals.release()   # the run is over: a signal now takes its default action again
  if jax.process_index() == 0:
    where = _WORKDIR.value
    if "interrupted_at" in summary:
      print(f"interrupted at step {summary['interrupted_at']}; checkpoint saved. "
            f"Run the same command again to resume. Everything is in {where}/")
    else:
      final = summary.get("final_eval", {})
      mean = final.get("eval/mean_loss")
      wrote = [f"{where}/{name}" for name in summary["outputs"]]   # only what this run wrote
      stopped = "stopped_at" in summary
      print(f"{'stopped at train.stop_step' if stopped else 'done'}: {summary['end_step']} steps"
            + (f", held-out mean loss {mean:.3f}" if mean is not None else "")
            + f". Wrote {', '.join(wrote[:-1])} and {wrote[-1]}"
            + (". Run it again with a larger train.stop_step (0: train.num_steps) to go on"
               if stopped else ""))


def _fail(error: Exception, state_of_checkpoints: str):
  """Ends the command on bad input: the message names the field, file or step, and a traceback
  would only bury it (``--verbosity`` given: the traceback too). Every process that fails prints
  it, named when there are several: a file missing on one host shows up in that host's log."""
  from absl import flags, logging  # noqa: F401  (absl.logging defines --verbosity)
  if flags.FLAGS["verbosity"].present:
    raise error
  import jax
  who = (f"process {jax.process_index()} of {jax.process_count()}: "
         if jax.process_count() > 1 else "")
  print(f"error: {who}{error}\n({state_of_checkpoints}; --verbosity=0 shows the traceback)",
        file=sys.stderr)
  sys.exit(1)


def run() -> None:
  """Entry point of ``andrea-train`` and ``python -m andrea_jax.main``: the signal handlers first
  (:func:`andrea_jax.signals.hold`), then absl, the flags and the run.

  ``--help`` lists the key flags of the program's main module, which absl names ``sys.argv[0]``:
  for the console script that is the generated ``andrea-train`` script, while the flags belong to
  this module; so they are declared key flags of the script too, and the script shows this
  module's docstring as its usage text, as ``python -m andrea_jax.main --help`` does.
  """
  signals.hold()
  from absl import app, flags
  _define_flags()
  for flag in flags.FLAGS.get_key_flags_for_module(__name__):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  script = sys.modules.get("__main__")
  if script is not None and not getattr(script, "__doc__", None):
    script.__doc__ = __doc__
  app.run(main)


if __name__ == "__main__":
  run()

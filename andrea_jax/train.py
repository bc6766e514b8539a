"""``train_and_evaluate(config, workdir)``: the training loop around the jitted step.

In the order a newcomer should read it (:func:`train_and_evaluate`, then :func:`train_loop`):

1. validate the whole config into a :class:`andrea_jax.runconfig.Run` (nothing compiles before
   this passes; below this point nothing reads the ``ConfigDict``);
2. open the run directory (:mod:`andrea_jax.rundir`: the lock, a source check, the checkpoints);
3. open the data, the tokenizer, the device mesh, a fresh sharded state and the step, jitted once
   with the state donated (:func:`setup`);
4. resume from the newest trustworthy checkpoint, if any (:mod:`andrea_jax.resume`): the resumed
   run is identical to an uninterrupted one (the batches are a pure function of (seed, step,
   weights), everything else is in the state), and so are its logs, rewound to the start step;
5. run the steps (:func:`train_loop`): a background thread builds batch t+1, t+2 while step t runs;
   the metrics are read one log step late, after the next step is dispatched, so the host never
   makes the device wait; periodic work (logging, evaluation, checkpoints) is a list of hooks;
6. at the end (or ``train.stop_step``), a last evaluation and checkpoint, and ``summary.png``.

SIGTERM and SIGINT at any moment stop the run at the next step boundary with a checkpoint
(:mod:`andrea_jax.signals`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from andrea_jax import cliff as cliff_lib
from andrea_jax import curriculum
from andrea_jax import data as data_lib
from andrea_jax import evaluate as eval_lib
from andrea_jax import feed as feed_lib
from andrea_jax import hooks as hooks_lib
from andrea_jax import plots
from andrea_jax import resume as resume_lib
from andrea_jax import rundir as rundir_lib
from andrea_jax import runconfig
from andrea_jax import sharding
from andrea_jax import signals as signals_lib
from andrea_jax import step as step_lib
from andrea_jax.model import flops_per_token, init_params


TrainingHalted = hooks_lib.TrainingHalted
Hook = hooks_lib.Hook
StepInfo = hooks_lib.StepInfo


def train_and_evaluate(config: ml_collections.ConfigDict | runconfig.Run, workdir: str, *,
                       hooks: Sequence[hooks_lib.Hook] = ()) -> dict:
  """Train (or resume) the run ``config`` describes (a ``ConfigDict``, or the ``Run`` it was
  validated into) in ``workdir``; returns a summary dict. ``hooks`` are the caller's periodic
  work (:class:`andrea_jax.hooks.Hook`: ``Hook(every=100, fn=my_metric)``), run after those the
  config names (``train.hooks``), the loop's own log record and evaluation, and before its
  checkpoint; a hook's returned mapping is a record of its step in ``metrics.jsonl``.

  Writes under ``workdir``: ``checkpoints/``, ``metrics.jsonl``, ``throughput.jsonl``,
  ``tensorboard/`` (``train.tensorboard``), ``samples.txt`` (when evaluations sample text),
  ``config.json`` and, at the end, ``summary.png`` (``train.plot``); a completed run's summary
  lists under ``outputs`` those of them it wrote (less ``config.json`` and ``throughput.jsonl``).
  ``train.stop_step`` ends the call after that step as at the run's end (an evaluation, a
  checkpoint; ``stopped_at`` in the summary): a later call with a larger one resumes from there and
  writes the logs an uninterrupted run would.
  The call holds ``workdir``'s lock (:mod:`andrea_jax.lock`) from before its first write to
  its return: a second run on the same workdir is refused with ``WorkdirBusy``. A write that fails
  for want of room or permission raises ``andrea_jax.storage.WriteError`` naming the file; the
  checkpoints saved before stay intact, and the same call, once there is room, resumes from them.
  SIGTERM and SIGINT during the call, or noted before it (:func:`andrea_jax.signals.hold`), stop
  the run at the next step boundary with a checkpoint; one during the final evaluation or
  checkpoint lets them finish.
  """
  with signals_lib.Signals() as signals:
    run = config if isinstance(config, runconfig.Run) else runconfig.build(config)
    with rundir_lib.open_run_dir(workdir, run.sources, keep=run.train.keep_checkpoints,
                                 keep_period=run.train.keep_period) as rd:
      run, source = resume_lib.init_source(run, os.path.join(rd.path, "checkpoints"))   # init.*
      opened = setup(run)
      start, opened.state = resume_lib.resume(rd.checkpoints, opened.state, run.record,
                                              opened.data_digest)
      opened.state = resume_lib.start_from(source, opened.state, run)
      end = resume_lib.end_step(run.train.num_steps, run.train.stop_step, start,
                                rd.checkpoints.directory)
      rd.begin(start, run.config_json, tensorboard=run.train.tensorboard)
      summary = train_loop(run, rd, opened, start, end, signals, (*run.train.hooks, *hooks))
      rd.close()   # the logs whole before the plot reads them, the workdir still held
      return _finish(run, workdir, summary, end)


def every(n: int, also: Callable[[int], bool] = lambda done: True) -> Callable[[int], bool]:
  """``due`` of a hook that runs every ``n`` steps (never if ``n`` is 0) where ``also`` agrees."""
  return lambda done: bool(n) and done % n == 0 and also(done)


@dataclasses.dataclass
class Opened:
  """What a run opens before its first step: the data, the mesh, the state and the step."""
  tokenizer: data_lib.Tokenizer
  data: data_lib.PreparedData
  data_digest: str
  keys: dict[str, jax.Array]
  mesh: jax.sharding.Mesh
  batch_sharding: jax.sharding.NamedSharding
  step_fn: Callable[[step_lib.TrainState, step_lib.Batch], tuple[step_lib.TrainState, dict]]
  state: step_lib.TrainState      # fresh, in its shards; replaced by a resumed one


def train_loop(run: runconfig.Run, rd: rundir_lib.RunDir, opened: Opened, start: int, end: int,
               signals: signals_lib.Signals, hooks: Sequence[hooks_lib.Hook] = ()) -> dict:
  """Steps ``start .. end - 1`` and the hooks after each; returns the summary (``interrupted_at``
  when a signal stopped it). Stops with :class:`andrea_jax.lock.WorkdirLost` if another run
  took the workdir's lock."""
  feed = feed_lib.ScheduleFeed(curriculum.schedule(opened.state.curriculum), start,
                               run.curriculum.decision_lag)
  batches = feed_lib.batches(run, opened.data, opened.batch_sharding, feed, start, end)
  loop = _LoopState(opened.state, saved=set(rd.checkpoints.all_steps()))
  bar = _progress_bar(run, start, end)
  closers = [feed.close, batches.close] + ([bar.close] if bar is not None else [])
  try:
    log, evaluate, checkpoint = _builtin_hooks(run, rd, opened, loop, feed, bar, start, end)
    own = [hooks_lib.recorded(h, rd.logger, log.flush) for h in hooks]
    periodic = [log.hook(), evaluate, *own, checkpoint]
    info = lambda done, metrics=None: hooks_lib.StepInfo(done, loop.state, metrics, run, rd.path)
    summary: dict[str, Any] = {"start_step": start}
    if 0 < start < end:
      # The interrupted run may have written their records before checkpoint `start`, but its
      # logs were cut back to the steps before `start`: they belong to the segment from here.
      for hook in (evaluate, *own):
        if hook.is_due(start):
          hook.fn(info(start))
    for t in range(start, end):
      rd.lock.raise_if_lost()
      loop.state, metrics = opened.step_fn(loop.state, next(batches))
      feed.record(t, metrics["schedule"])
      log.flush()           # read the previous log step now that step t is queued
      if bar is not None:
        bar.update(1)
      for hook in periodic:
        if hook.is_due(t + 1):
          hook.fn(info(t + 1, metrics))
      if signals.stop(t):
        print(f"\nsignal {signals.received} at step {t + 1}: checkpointing and exiting")
        checkpoint.fn(info(t + 1))
        summary["interrupted_at"] = t + 1
        break
    else:
      log.flush()
      hooks_lib.raise_if_halted(run, loop.state.halted_at)   # a streak between log steps too
      # At a stop_step as at num_steps; a run resumed from checkpoint `end` drops this record and
      # makes the evaluation at `end` only if eval.every asks for it, as an uninterrupted run.
      summary["final_eval"] = evaluate.fn(info(end))
      checkpoint.fn(info(end))
  except BaseException:
    _close_all(closers, quiet=True)
    raise
  _close_all(closers)
  return summary


@dataclasses.dataclass
class _LoopState:
  """What the loop changes: the state, and the steps checkpointed."""
  state: step_lib.TrainState
  saved: set = dataclasses.field(default_factory=set)


def _builtin_hooks(run: runconfig.Run, rd: rundir_lib.RunDir, opened: Opened, loop: _LoopState,
                   feed: feed_lib.ScheduleFeed, bar, start: int, end: int):
  """The loop's own periodic work: the log (:class:`andrea_jax.hooks.StepLog`), the evaluation
  (held-out losses and samples, every ``eval.every`` steps before the end) and the checkpoint."""
  epochs_per_row = [run.data.seq_len / max(opened.data.num_tokens(s, "train"), 1)
                    if s in run.trainable else 0.0 for s in run.sources]
  log = hooks_lib.StepLog(run, rd.logger, feed.used, epochs_per_row, start,
                          flops_per_token(run.model, run.data.seq_len), bar)
  held_out = eval_lib.HeldOut(run, opened.data, opened.tokenizer, mesh=opened.mesh)
  ctx = eval_lib.EvalContext(run, opened.data, opened.tokenizer, held_out)
  evaluation = eval_lib.evaluation(
      held_out.record,
      eval_lib.Samples(run, opened.tokenizer, opened.keys["eval"], rd.samples_path,
                       vocabulary=data_lib.corpus_vocabulary(run.data)).record,
      *(factory(ctx) for factory in run.eval.metrics))

  def evaluate(info: hooks_lib.StepInfo) -> dict:
    log.flush()   # the records of steps < at come first, as in a run resumed at step `at`
    record = evaluation(info.state.params, info.step)
    rd.logger.write(record)
    return record

  def checkpoint(info: hooks_lib.StepInfo) -> None:
    # Every record of a step < at is in metrics.jsonl before checkpoint `at` exists: a run
    # resumed from it keeps exactly those (logs.truncate_jsonl) and writes the rest again.
    at = info.step
    log.flush()
    hooks_lib.raise_if_halted(run, loop.state.halted_at)   # nothing past the last good state
    if at not in loop.saved:
      rd.checkpoints.save(at, loop.state, {"step": at, "config": run.record,
                                           "data": opened.data_digest,
                                           "sources": list(run.sources)})
      loop.saved.add(at)

  return (log, hooks_lib.Hook(run.eval.every, evaluate, due=every(run.eval.every,
                                                                  lambda done: done < end)),
          hooks_lib.Hook(run.train.checkpoint_every, checkpoint))


def _progress_bar(run: runconfig.Run, start: int, end: int):
  if jax.process_index() != 0 or not run.train.progress_bar:
    return None
  from tqdm.auto import tqdm
  return tqdm(total=end, initial=start, unit="step", dynamic_ncols=True)


def _close_all(closers: list[Callable[[], None]], quiet: bool = False) -> None:
  """Calls every closer, each even if another failed (a full disk fails several); raises the
  first failure unless ``quiet`` (an earlier failure is the one to report)."""
  failure = None
  for close in closers:
    try:
      close()
    except Exception as e:
      failure = failure or e
  if failure is not None and not quiet:
    raise failure


def run_keys(seed: int) -> dict[str, jax.Array]:
  """The run's named random streams, all derived from its one seed."""
  root = jax.random.PRNGKey(seed)
  names = ("params", "curriculum", "eval")
  return {n: jax.random.fold_in(root, i) for i, n in enumerate(names)}


def init_state(run: runconfig.Run, keys: dict[str, jax.Array]) -> step_lib.TrainState:
  """A fresh training state: initialised parameters, optimizer, curriculum and detector states."""
  params = init_params(run.model, keys["params"])
  return step_lib.TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=run.step.tx.init(params),
      curriculum=curriculum.init(run.curriculum, keys["curriculum"]),
      cliff=cliff_lib.cliff_init(len(run.sources), run.cliff.window),
      nonfinite_streak=jnp.zeros((), jnp.int32),
      halted_at=jnp.full((), -1, jnp.int32),
      rows_seen=jnp.zeros((len(run.sources),), jnp.int32),
  )


def setup(run: runconfig.Run) -> Opened:
  """The data, the device mesh, a fresh sharded state and the jitted step."""
  tokenizer = run.data.tokenizer   # loaded once, by runconfig.build
  data = data_lib.open_training_data(run.data, required=run.evaluated)
  keys = run_keys(run.seed)
  mesh = sharding.make_mesh(run.mesh)
  state, state_shardings = sharding.init_sharded(
      lambda: init_state(run, keys),
      lambda s: sharding.state_shardings(s, mesh, run.mesh.fsdp_min_size))
  batch_sharding = sharding.batch_sharding(mesh)
  return Opened(
      tokenizer=tokenizer, data=data, data_digest=resume_lib.training_data_digest(data),
      keys=keys, mesh=mesh, batch_sharding=batch_sharding,
      step_fn=step_lib.jit_step(run.step, state_shardings, batch_sharding), state=state)


def _finish(run: runconfig.Run, workdir: str, summary: dict, end: int) -> dict:
  """The summary's last fields, and ``summary.png`` (process 0, a completed call only)."""
  interrupted = "interrupted_at" in summary
  summary["end_step"] = summary.get("interrupted_at", end)
  if end < run.train.num_steps and not interrupted:
    summary["stopped_at"] = end
  if interrupted:
    return summary
  if jax.process_index() == 0 and run.train.plot:
    regimes = list(zip(run.curriculum.starts.tolist(), run.curriculum.geometry_names))
    summary["plot"] = plots.summary_plot(workdir, run.sources, regimes)
  written = {"metrics.jsonl": True, "samples.txt": "samples" in summary["final_eval"],
             "summary.png": "plot" in summary, "tensorboard/": run.train.tensorboard,
             "checkpoints/": True}
  summary["outputs"] = [name for name, wrote in written.items() if wrote]
  return summary

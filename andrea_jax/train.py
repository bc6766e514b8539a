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
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from andrea_jax import cliff as cliff_lib
from andrea_jax import curriculum
from andrea_jax import data as data_lib
from andrea_jax import evaluate as eval_lib
from andrea_jax import feed as feed_lib
from andrea_jax import logs
from andrea_jax import plots
from andrea_jax import resume as resume_lib
from andrea_jax import rundir as rundir_lib
from andrea_jax import runconfig
from andrea_jax import sharding
from andrea_jax import signals as signals_lib
from andrea_jax import step as step_lib
from andrea_jax.model import flops_per_token, init_params


class TrainingHalted(RuntimeError):
  """Too many consecutive non-finite steps: the run stopped (its last checkpoint is intact)."""


def train_and_evaluate(config: ml_collections.ConfigDict | runconfig.Run, workdir: str) -> dict:
  """Train (or resume) the run ``config`` describes (a ``ConfigDict``, or the ``Run`` it was
  validated into) in ``workdir``; returns a summary dict.

  Writes under ``workdir``: ``checkpoints/``, ``metrics.jsonl``, ``throughput.jsonl``,
  ``tensorboard/`` (``train.tensorboard``), ``samples.txt`` (when evaluations sample text),
  ``config.json`` and, at the end, ``summary.png`` (``train.plot``); a completed run's summary
  lists under ``outputs`` those of them it wrote (less ``config.json`` and ``throughput.jsonl``).
  ``train.stop_step`` ends the call after that step as at the run's end (an evaluation, a
  checkpoint; ``stopped_at`` in the summary): a later call with a larger one resumes from there and
  writes the logs an uninterrupted run would.
  The call holds ``workdir``'s lock (:mod:`andrea_jax.workdir`) from before its first write to
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
      opened = setup(run)
      start, opened.state = resume_lib.resume(rd.checkpoints, opened.state, run.record,
                                              opened.data_digest)
      end = resume_lib.end_step(run.train.num_steps, run.train.stop_step, start,
                                rd.checkpoints.directory)
      rd.begin(start, run.config_json, tensorboard=run.train.tensorboard)
      summary = train_loop(run, rd, opened, start, end, signals)
      rd.close()   # the logs whole before the plot reads them, the workdir still held
      return _finish(run, workdir, summary, end)


class Hook(NamedTuple):
  """Periodic work of the loop: ``fn(done, metrics)`` after a step when ``due(done)``, ``done``
  the number of steps done (``t + 1`` after step ``t``)."""
  due: Callable[[int], bool]
  fn: Callable[[int, dict], None]


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
               signals: signals_lib.Signals) -> dict:
  """Steps ``start .. end - 1`` and the hooks after each; returns the summary (``interrupted_at``
  when a signal stopped it). Stops with :class:`andrea_jax.workdir.WorkdirLost` if another run
  took the workdir's lock."""
  feed = feed_lib.ScheduleFeed(curriculum.schedule(opened.state.curriculum), start,
                               run.curriculum.decision_lag)
  batches = feed_lib.batches(run, opened.data, opened.batch_sharding, feed, start, end)
  loop = _LoopState(opened.state, saved=set(rd.checkpoints.all_steps()))
  bar = _progress_bar(run, start, end)
  closers = [feed.close, batches.close] + ([bar.close] if bar is not None else [])
  try:
    evaluator = eval_lib.Evaluator(
        run, opened.data, opened.tokenizer, opened.keys["eval"], rd.samples_path,
        mesh=opened.mesh, vocabulary=data_lib.corpus_vocabulary(run.data))
    log, flush = _logging(run, rd, feed, bar, start)
    evaluate = lambda at, _=None: _evaluate(rd, evaluator, loop, flush, at)
    checkpoint = lambda at, _=None: _checkpoint(run, rd, opened, loop, flush, at)
    hooks = [Hook(lambda done: done % run.train.log_every == 0 or done == run.train.num_steps,
                  log),
             Hook(every(run.eval.every, lambda done: done < end), evaluate),
             Hook(every(run.train.checkpoint_every), checkpoint)]
    summary: dict[str, Any] = {"start_step": start}
    if every(run.eval.every, lambda done: 0 < done < end)(start):
      # The interrupted run may have written it before checkpoint `start`, but its logs were cut
      # back to the steps before `start`: an evaluation belongs to the segment that begins there.
      evaluate(start)
    for t in range(start, end):
      rd.lock.raise_if_lost()
      loop.state, metrics = opened.step_fn(loop.state, next(batches))
      feed.record(t, metrics["schedule"])
      flush()               # read the previous log step now that step t is queued
      if bar is not None:
        bar.update(1)
      for hook in hooks:
        if hook.due(t + 1):
          hook.fn(t + 1, metrics)
      if signals.stop(t):
        print(f"\nsignal {signals.received} at step {t + 1}: checkpointing and exiting")
        checkpoint(t + 1)
        summary["interrupted_at"] = t + 1
        break
    else:
      flush()
      _raise_if_halted(run, loop.state.halted_at)   # also if a streak ended between log steps
      # At a stop_step as at num_steps; a run resumed from checkpoint `end` drops this record and
      # makes the evaluation at `end` only if eval.every asks for it, as an uninterrupted run.
      summary["final_eval"] = evaluate(end)
      checkpoint(end)
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


def _logging(run: runconfig.Run, rd: rundir_lib.RunDir, feed: feed_lib.ScheduleFeed, bar,
             start: int):
  """The log hook (a step's metrics kept to be read one step late, and its throughput) and
  ``flush``, which reads and writes the pending step's record."""
  pending: list[tuple[int, dict]] = []
  tokens_per_step = run.data.global_batch_size * run.data.seq_len   # global
  flops = flops_per_token(run.model, run.data.seq_len)
  peak = logs.peak_flops()   # this process's devices
  peak = peak * jax.process_count() if peak else None
  last = [time.perf_counter(), start]   # the time and step of the last throughput record

  def log(done: int, metrics: dict) -> None:
    t = done - 1
    pending.append((t, metrics))
    now = time.perf_counter()
    tps = tokens_per_step * (done - last[1]) / max(now - last[0], 1e-9)
    last[:] = [now, done]
    perf = {"step": t, "tokens_per_s": tps}
    if peak:
      perf["mfu"] = tps * flops / peak
    rd.logger.write(perf, deterministic=False)
    if bar is not None:
      bar.set_postfix(tok_s=f"{tps:,.0f}",
                      **({"mfu": f"{perf['mfu']:.1%}"} if "mfu" in perf else {}))

  def flush() -> None:
    while pending:
      t, metrics = pending.pop(0)
      m = jax.device_get(metrics)
      _raise_if_halted(run, m["halted_at"])
      rec = logs.step_record(run.sources, run.curriculum.labels, m, feed.used(t))
      rd.logger.write(rec)
      if bar is not None:
        bar.set_description(f"loss {rec['loss']:.3f}")
      if "cliff/source" in rec:
        print("\n" + logs.cliff_message(rec, t, run.curriculum.geometry_names,
                                        run.cliff.respond))

  return log, flush


def _evaluate(rd: rundir_lib.RunDir, evaluator: eval_lib.Evaluator, loop: _LoopState,
              flush: Callable[[], None], at: int) -> dict:
  flush()   # the records of steps < at come first, as in a run resumed at step `at`
  record = evaluator.run(loop.state.params, at)
  rd.logger.write(record)
  return record


def _checkpoint(run: runconfig.Run, rd: rundir_lib.RunDir, opened: Opened, loop: _LoopState,
                flush: Callable[[], None], at: int) -> None:
  # Every record of a step < at is in metrics.jsonl before checkpoint `at` exists: a run resumed
  # from it keeps exactly those (logs.truncate_jsonl) and writes the rest again.
  flush()
  _raise_if_halted(run, loop.state.halted_at)   # a halted run saves nothing past its last good state
  if at not in loop.saved:
    rd.checkpoints.save(at, loop.state, {"step": at, "config": run.record,
                                         "data": opened.data_digest,
                                         "sources": list(run.sources)})
    loop.saved.add(at)


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
  )


def setup(run: runconfig.Run) -> Opened:
  """The data, the device mesh, a fresh sharded state and the jitted step."""
  tokenizer = run.data.tokenizer   # loaded once, by runconfig.build
  data = data_lib.open_training_data(run.data, required=run.used_sources)
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


def _raise_if_halted(run: runconfig.Run, halted_at) -> None:
  """``TrainingHalted`` when a streak of non-finite steps reached the limit (``halted_at >= 0``)."""
  first = int(jax.device_get(halted_at))
  if first >= 0:
    limit = run.step.max_nonfinite_steps
    raise TrainingHalted(
        f"{limit} consecutive steps with a non-finite loss, gradient or update (steps "
        f"{first}..{first + limit - 1}); they were skipped and the weights are unchanged. Lower "
        "optim.peak_lr, raise optim.warmup_steps or check the data.")

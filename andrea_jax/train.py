"""``train_and_evaluate(config, workdir)``: the training loop around the jitted step.

The loop, in the order a newcomer should read it:

1. validate the whole config (nothing compiles before this passes);
2. open the data (the built-in corpus is generated and prepared once, then cached) and the tokenizer;
3. build the model, the optimizer, the curriculum and the step, jitted once with the state donated,
   on the device mesh of :mod:`andrea_jax.sharding` (parameters and moments created in their shards;
   each process builds only its rows of the global batch);
4. restore the newest trustworthy checkpoint of ``workdir``, if any: the resumed run is identical to an
   uninterrupted one (the batches are a pure function of (seed, step, weights), and everything else is
   in the state), and so are its logs: those of an earlier run are cut back to the records of steps
   before the checkpoint's, all written before it was saved (see :mod:`andrea_jax.logs`);
5. run the steps: a background thread builds batch t+1, t+2 while step t runs; metrics are read only at
   log intervals, after the next step is dispatched (or before an evaluation or a checkpoint, which
   wait for the step anyway), so the host never makes the device wait;
6. evaluate every ``eval.every`` steps, checkpoint every ``train.checkpoint_every`` steps and on
   SIGTERM/SIGINT, and at the end write ``summary.png``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import cliff as cliff_lib
from andrea_jax import curriculum
from andrea_jax import data as data_lib
from andrea_jax import evaluate as eval_lib
from andrea_jax import feed as feed_lib
from andrea_jax import logs
from andrea_jax import plots
from andrea_jax import runconfig
from andrea_jax import sharding
from andrea_jax import step as step_lib
from andrea_jax.model import flops_per_token, init_params


class TrainingHalted(RuntimeError):
  """Too many consecutive non-finite steps: the run stopped (its last checkpoint is intact)."""


def run_keys(seed: int) -> dict[str, jax.Array]:
  """The run's named random streams, all derived from its one seed."""
  root = jax.random.PRNGKey(seed)
  names = ("params", "curriculum", "eval")
  return {n: jax.random.fold_in(root, i) for i, n in enumerate(names)}


def init_state(run: runconfig.Run, keys: dict[str, jax.Array]) -> step_lib.TrainState:
  """A fresh training state: initialised parameters, optimizer, curriculum and detector states."""
  params = init_params(run.model_config, keys["params"])
  return step_lib.TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=run.step_config.tx.init(params),
      curriculum=curriculum.init(run.curriculum_spec, keys["curriculum"]),
      cliff=cliff_lib.cliff_init(len(run.sources), run.cliff_cfg.window),
      nonfinite_streak=jnp.zeros((), jnp.int32),
      halted_at=jnp.full((), -1, jnp.int32),
  )


class _Signals:
  """SIGTERM/SIGINT stop the run cleanly: it checkpoints and exits at a step boundary.

  One process: a handler sets a flag that the loop reads after each step. Several processes must all
  stop after the same step (the checkpoint is a collective write), so there SIGTERM is left to JAX's
  preemption service, which tells every process and picks a step they all reach
  (``multihost_utils.reached_preemption_sync_point``); a SIGINT is passed on to it as a SIGTERM.
  """

  def __init__(self):
    self.received: int | None = None
    self._old = {}
    self._depth = 0   # nested entries (the whole run, then the loop) install the handlers once
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
    return self

  def _handle(self, signum, frame):
    if self.received is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt   # a second Ctrl-C stops at once
    self.received = signum
    if self._shared:
      os.kill(os.getpid(), signal.SIGTERM)   # to the preemption service's own handler

  def deliver(self, signum: int) -> None:
    """Act on a signal that arrived before these handlers were installed, as if it came now."""
    self._handle(signum, None)

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


# Fields a resumed run may change without changing what it computes: when and how it stops,
# logs, evaluates and checkpoints, where its data and devices come from, and how its checkpoints
# are read afterwards (terrain: the basin report's memory budget).
RESUME_FREE = ("train.stop_step", "train.log_every", "train.progress_bar", "train.plot",
               "train.tensorboard", "train.checkpoint_every", "train.keep_checkpoints",
               "train.keep_period", "eval.",
               "data.workers", "data.cache_dir", "data.prefetch", "data.verify", "mesh.",
               "distributed.", "terrain.")


def config_changes(saved: dict | None, current: dict) -> list[str]:
  """``"field: old -> new"`` for each field that differs between the config a checkpoint was saved
  under and the resuming one, outside :data:`RESUME_FREE` (a field only one side has counts too);
  ``[]`` when the checkpoint holds no config.

  Example: ``config_changes({"seed": 0}, {"seed": 7})`` is ``["seed: 0 -> 7"]``.
  """
  if not isinstance(saved, dict):
    return []

  def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
      if isinstance(v, dict) and v:
        out.update(flat(v, f"{prefix}{k}."))
      else:
        out[f"{prefix}{k}"] = v
    return out

  old, new = flat(saved), flat(current)
  missing = object()
  out = []
  for key in sorted(set(old) | set(new)):
    if any(key == free or (free.endswith(".") and key.startswith(free)) for free in RESUME_FREE):
      continue
    a, b = old.get(key, missing), new.get(key, missing)
    # Through JSON a tuple comes back a list: compare the values as JSON would.
    if isinstance(a, tuple):
      a = list(a)
    if isinstance(b, tuple):
      b = list(b)
    if a != b:
      out.append(f"{key}: {'(absent)' if a is missing else repr(a)} -> "
                 f"{'(absent)' if b is missing else repr(b)}")
  return out


def training_data_digest(data) -> str:
  """SHA-256 of what a run trains and evaluates on: the tokenizer's fingerprint and every shard's
  SHA-256 (the manifest's), per source the run uses. Saved with each checkpoint; a resume on other
  data warns."""
  h = hashlib.sha256(data.fingerprint.encode())
  for source in data.required:
    entry = data.manifest.get("sources", {}).get(source, {})
    for split in sorted(entry.get("shards", {})):
      for shard in entry["shards"][split]:
        h.update(f"{source}/{split}/{shard.get('sha256')}".encode())
  return h.hexdigest()


def make_workdir(workdir: str) -> None:
  """Creates ``workdir`` (and its parents); a clear ``ValueError`` when it cannot be one."""
  if not isinstance(workdir, (str, os.PathLike)) or not os.fspath(workdir):
    raise ValueError(f"the workdir must be a directory path, got {workdir!r}")
  for path in (workdir, os.path.join(workdir, "checkpoints")):
    if os.path.exists(path) and not os.path.isdir(path):
      raise ValueError(f"{path} is a file, not a directory: give another workdir")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ValueError(f"cannot create the workdir {workdir}: {e.strerror or e}") from e


def _honour_signals(train_fn):
  """Hold the SIGTERM/SIGINT handlers for the whole run, not only its loop: a signal during
  start-up stops the run at its first step boundary (with a checkpoint), and one during the final
  evaluation or checkpoint lets them finish, so the process always exits cleanly."""

  # Not train_fn's annotations, nor a __wrapped__ that sends introspection (help,
  # inspect.signature) to train_fn's internal third parameter: callers call this signature.
  @functools.wraps(train_fn, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
  def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                         early_signals: Sequence[int] = ()) -> dict:
    with _Signals() as signals:
      # Read only now that the handlers are installed, so that a signal recorded by the caller while
      # they were not (andrea_jax.launch) is seen here, whenever it came.
      if early_signals:
        signals.deliver(early_signals[0])
      return train_fn(config, workdir, signals)

  del train_and_evaluate.__wrapped__
  return train_and_evaluate


def _step_record(run: runconfig.Run, m: dict, weights: np.ndarray) -> dict:
  """The deterministic log line of one step, from its fetched metrics."""
  rec: dict[str, Any] = {"step": int(m["step"]), "loss": float(m["loss"]),
                         "grad_norm": float(m["grad_norm"]), "lr": float(m["lr"]),
                         "finite": bool(m["finite"])}
  tokens = np.asarray(m["source_tokens"], np.float64)
  share = tokens / max(tokens.sum(), 1.0)
  for i, name in enumerate(run.sources):
    rec[f"weight/{name}"] = float(weights[i])
    rec[f"share/{name}"] = float(share[i])
    if tokens[i] > 0:
      rec[f"loss/{name}"] = float(m["source_loss"][i])
  for k, v in m["curriculum"].items():
    v = np.asarray(v)
    if v.ndim == 0:
      rec[f"curriculum/{k}"] = v.item()
  ev = m["cliff"]
  if bool(ev.flag):
    rec["cliff/source"] = run.sources[int(ev.source)] if int(ev.source) >= 0 else None
    rec["cliff/score"] = float(ev.score)
  return rec


@_honour_signals
def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       signals: _Signals | None = None) -> dict:
  """Train (or resume) the run described by ``config`` in ``workdir``; returns a summary dict.

  Writes under ``workdir``: ``checkpoints/``, ``metrics.jsonl``, ``throughput.jsonl``,
  ``tensorboard/`` (``train.tensorboard``), ``samples.txt`` (when evaluations sample text),
  ``config.json`` and, at the end, ``summary.png`` (``train.plot``); a completed run's summary
  lists under ``outputs`` those of them it wrote (less ``config.json`` and ``throughput.jsonl``).
  ``train.stop_step`` ends the call after that step as at the run's end (an evaluation, a
  checkpoint; ``stopped_at`` in the summary): a later call with a larger one resumes from there and
  writes the logs an uninterrupted run would.
  SIGTERM and SIGINT during the call stop the run at the next step boundary with a checkpoint;
  the keyword ``early_signals`` (the signals a caller recorded before calling, see
  :mod:`andrea_jax.launch`) acts the same way.
  """
  run = runconfig.build(config)            # validates everything; raises before any compilation
  make_workdir(workdir)
  is_main = jax.process_index() == 0

  tokenizer = data_lib.load_tokenizer(config.data.tokenizer)
  data = data_lib.open_training_data(config.data, tokenizer, required=run.used_sources)
  data_digest = training_data_digest(data)
  keys = run_keys(config.seed)
  mesh_cfg = runconfig.mesh_config(config)
  mesh = sharding.make_mesh(mesh_cfg)
  state, state_shardings = sharding.init_sharded(
      lambda: init_state(run, keys),
      lambda s: sharding.state_shardings(s, mesh, mesh_cfg.fsdp_min_size))
  batch_sharding = sharding.batch_sharding(mesh)
  step_fn = step_lib.jit_step(run.step_config, state_shardings, batch_sharding)
  checkpoints = ckpt_lib.Checkpoints(os.path.join(workdir, "checkpoints"),
                                     keep=config.train.keep_checkpoints,
                                     keep_period=config.train.get("keep_period", 0))

  restored = checkpoints.restore_latest(jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state))
  start = 0
  if restored is not None:
    start, state, meta = restored
    print(f"resuming from step {start} ({checkpoints.directory}/{start})")
    changed = config_changes(meta.get("config") if isinstance(meta, dict) else None,
                             config.to_dict())
    saved_data = meta.get("data") if isinstance(meta, dict) else None
    if saved_data is not None and saved_data != data_digest and is_main:
      # The same config on other tokens: a retrained tokenizer at the same path, new files.
      print(f"warning: the checkpoint at step {start} was saved on other data (the tokenizer or "
            "the prepared shards differ); the run goes on with this data, it is not the "
            "uninterrupted run", file=sys.stderr)
    streak = int(jax.device_get(state.nonfinite_streak))
    if int(jax.device_get(state.halted_at)) >= 0 or (streak and changed):
      # A halt (saved by an older version) or a streak resumed under changed values (the halt's
      # advice taken): the new values start a fresh count; the weights are the last good ones
      # (skipped steps never reach them). The same command again resumes the streak as saved, so
      # it halts where the uninterrupted run does.
      print(f"the checkpoint at step {start} was saved during a streak of non-finite steps; "
            "resumed under other values, the run starts a fresh count", file=sys.stderr)
      state = state.replace(
          nonfinite_streak=jax.device_put(jnp.int32(0), state.nonfinite_streak.sharding),
          halted_at=jax.device_put(jnp.int32(-1), state.halted_at.sharding))
    if changed and is_main:
      print(f"warning: the checkpoint at step {start} was saved under another configuration: "
            f"{'; '.join(changed)}. The run goes on with the new values; it is not the "
            "uninterrupted run of either config", file=sys.stderr)
  elif is_main:
    print(f"starting from step 0 (no checkpoint in {checkpoints.directory})")
  num_steps = config.train.num_steps
  # This call's last step: train.stop_step ends a run's first part early, the learning-rate schedule
  # and the curriculum unchanged (laid out over num_steps).
  end = config.train.get("stop_step", 0) or num_steps
  refusal = None
  if start > num_steps:   # the weights are past the run's end: nothing here could be right
    refusal = (f"the checkpoint at step {start} in {checkpoints.directory} is past "
               f"train.num_steps = {num_steps}; resume with train.num_steps >= {start}, or use "
               "another workdir")
  elif start > end:
    refusal = (f"the checkpoint at step {start} in {checkpoints.directory} is past "
               f"train.stop_step = {end}; resume with train.stop_step >= {start} (0 runs to "
               f"train.num_steps = {num_steps})")
  if refusal:             # before anything in workdir changes: its config.json and logs stay
    checkpoints.close()
    raise ckpt_lib.CheckpointError(refusal)
  if is_main:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  logger = logs.RunLogger(workdir, resume_step=start, is_writer=is_main,
                          tensorboard=config.train.tensorboard)
  evaluator = eval_lib.Evaluator(run, config, data, tokenizer, keys["eval"], workdir, mesh=mesh)
  if is_main and evaluator.samples_path:
    logs.truncate_samples(evaluator.samples_path, start)

  global_rows = config.data.global_batch_size
  # This process builds only the rows its devices hold: slot k of the global batch's P equal slices.
  lo, hi = sharding.process_rows(batch_sharding, global_rows)
  sampler = data_lib.MixtureSampler(
      data, seq_len=config.data.seq_len, global_batch_size=global_rows, seed=config.seed,
      process_index=lo // (hi - lo), process_count=global_rows // (hi - lo))
  feed = feed_lib.ScheduleFeed(curriculum.schedule(state.curriculum), start,
                               run.curriculum_spec.decision_lag)
  batches = data_lib.Prefetcher(    # the host-to-device copy happens in the prefetch thread too
      lambda t: sharding.global_batch(sampler.batch(t, feed.weights(t)), batch_sharding,
                                      global_rows),
      start_step=start, end_step=end, depth=max(2, config.data.prefetch))

  tokens_per_step = config.data.global_batch_size * config.data.seq_len
  flops = flops_per_token(run.model_config, config.data.seq_len)
  peak = runconfig.peak_flops()              # this process's devices; tokens_per_step is global
  peak = peak * jax.process_count() if peak else None
  bar = None
  if is_main and config.train.progress_bar:
    from tqdm.auto import tqdm
    bar = tqdm(total=end, initial=start, unit="step", dynamic_ncols=True)

  saved = set(checkpoints.all_steps())

  pending = None                      # (step, metrics) dispatched but not yet read

  def flush_pending():
    nonlocal pending
    if pending is not None:
      _log_step(run, logger, feed, *pending, bar=bar)
      pending = None

  def checkpoint(at: int):
    # Every record of a step < at is in metrics.jsonl before checkpoint `at` exists: a run resumed
    # from it keeps exactly those (logs.truncate_jsonl) and writes the rest again.
    flush_pending()
    _raise_if_halted(run, state.halted_at)   # a halted run saves nothing past its last good state
    if at not in saved:
      checkpoints.save(at, state, {"step": at, "config": config.to_dict(), "data": data_digest})
      saved.add(at)

  def evaluate(at: int):
    flush_pending()   # the records of steps < at come first, as in a run resumed at step `at`
    logger.write(evaluator.run(state.params, at))

  def eval_due(at: int) -> bool:   # the last evaluation, at `end`, is made after the loop
    return bool(config.eval.every) and at % config.eval.every == 0 and 0 < at < end

  last_log = (time.perf_counter(), start)
  summary: dict[str, Any] = {"start_step": start}
  t = start
  try:
    with signals or _Signals() as signals:
      if eval_due(start):
        # The interrupted run may have written it before checkpoint `start`, but its logs were cut
        # back to the steps before `start`: an evaluation belongs to the segment that begins there.
        evaluate(start)
      for t in range(start, end):
        batch = next(batches)
        state, metrics = step_fn(state, batch)
        feed.record(t, metrics["schedule"])
        flush_pending()               # read the previous log step now that step t is queued
        if (t + 1) % config.train.log_every == 0 or t + 1 == num_steps:
          pending = (t, metrics)
          now = time.perf_counter()
          tps = tokens_per_step * (t + 1 - last_log[1]) / max(now - last_log[0], 1e-9)
          last_log = (now, t + 1)
          perf = {"step": t, "tokens_per_s": tps}
          if peak:
            perf["mfu"] = tps * flops / peak
          logger.write(perf, deterministic=False)
          if bar is not None:
            bar.set_postfix(tok_s=f"{tps:,.0f}", **({"mfu": f"{perf['mfu']:.1%}"} if peak else {}))
        if bar is not None:
          bar.update(1)
        if eval_due(t + 1):
          evaluate(t + 1)
        if config.train.checkpoint_every and (t + 1) % config.train.checkpoint_every == 0:
          checkpoint(t + 1)
        if signals.stop(t):
          print(f"\nsignal {signals.received} at step {t + 1}: checkpointing and exiting")
          checkpoint(t + 1)
          summary["interrupted_at"] = t + 1
          break
      flush_pending()
      _raise_if_halted(run, state.halted_at)   # also when the streak ended between log steps
      if "interrupted_at" not in summary:
        # At a stop_step as at num_steps; a run resumed from checkpoint `end` drops this record
        # and makes the evaluation at `end` only if eval.every asks for it, as an uninterrupted run.
        final = evaluator.run(state.params, end)
        logger.write(final)
        summary["final_eval"] = final
        checkpoint(end)
  finally:
    feed.close()
    batches.close()
    checkpoints.close()
    logger.close()
    if bar is not None:
      bar.close()
  summary["end_step"] = summary.get("interrupted_at", end)
  if end < num_steps and "interrupted_at" not in summary:
    summary["stopped_at"] = end
  if is_main and config.train.plot and "interrupted_at" not in summary:
    regimes = list(zip(run.curriculum_spec.starts.tolist(), run.curriculum_spec.geometry_names))
    summary["plot"] = plots.summary_plot(workdir, run.sources, regimes)
  if "interrupted_at" not in summary:
    written = {"metrics.jsonl": True, "samples.txt": "samples" in summary["final_eval"],
               "summary.png": "plot" in summary, "tensorboard/": bool(config.train.tensorboard),
               "checkpoints/": True}
    summary["outputs"] = [name for name, wrote in written.items() if wrote]
  return summary


def _raise_if_halted(run, halted_at) -> None:
  """``TrainingHalted`` when a streak of non-finite steps reached the limit (``halted_at >= 0``)."""
  first = int(jax.device_get(halted_at))
  if first >= 0:
    raise TrainingHalted(
        f"{run.step_config.max_nonfinite_steps} consecutive steps with a non-finite loss, gradient "
        f"or update "
        f"(steps {first}..{first + run.step_config.max_nonfinite_steps - 1}); they were skipped and "
        "the weights are unchanged. Lower optim.peak_lr, raise optim.warmup_steps or check the data.")


def _log_step(run, logger, feed, t, metrics, bar=None):
  m = jax.device_get(metrics)
  _raise_if_halted(run, m["halted_at"])
  weights = feed.used(t)
  rec = _step_record(run, m, weights)
  logger.write(rec)
  if bar is not None:
    bar.set_description(f"loss {rec['loss']:.3f}")
  if "cliff/source" in rec:
    print("\n" + cliff_message(rec, t, run.curriculum_spec.geometry_names, run.cliff_cfg.respond))


def cliff_message(rec: dict, t: int, geometry_names: Sequence[str], respond: bool) -> str:
  """The console line of a zombie cliff flagged at step ``t`` (``rec``: the step's log record):
  the source named, and excluded (``respond``) or the exclusion offered.

  Example: ``"zombie cliff at step 150: loss 0.412 far below its recent values; source
  'repo-docs'; to exclude it, add it to curriculum.geometries.v2_firehose.exclude and resume, ..."``
  """
  source = rec.get("cliff/source")
  head = f"zombie cliff at step {t}: loss {rec['loss']:.3f} far below its recent values; "
  if source is None:
    return head + "no source named"
  if respond:
    return head + f"source {source!r} excluded from the next phase on"
  where = geometry_names[min(int(rec.get("curriculum/geometry", 0)), len(geometry_names) - 1)]
  return (head + f"source {source!r}; to exclude it, add it to curriculum.geometries.{where}"
          ".exclude and resume, or train with --config.cliff.respond=True, which excludes what "
          "the detector flags")


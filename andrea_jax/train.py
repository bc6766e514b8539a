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

import contextlib
import dataclasses
import functools
import hashlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
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
from andrea_jax import sources as sources_lib
from andrea_jax import step as step_lib
from andrea_jax import storage
from andrea_jax import target_gain as gain_lib
from andrea_jax import workdir as workdir_lib
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
  SHA-256 (the manifest's; a loss mask's too), per source the run uses. Saved with each
  checkpoint; a resume on other data warns."""
  h = hashlib.sha256(data.fingerprint.encode())
  for source in data.required:
    entry = data.manifest.get("sources", {}).get(source, {})
    for split in sorted(entry.get("shards", {})):
      for shard in entry["shards"][split]:
        h.update(f"{source}/{split}/{shard.get('sha256')}".encode())
    for split in sorted(entry.get("masks", {})):   # a loss mask changes what the run trains on
      for mask in entry["masks"][split]:
        h.update(f"{source}/{split}/mask/{mask.get('sha256')}".encode())
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
    if k == "phase_label":
      rec["curriculum/phase_label"] = run.curriculum_spec.labels[int(v)]
    elif v.ndim == 0:
      rec[f"curriculum/{k}"] = v.item()
  for i, name in enumerate(run.sources):   # measured at this step (every target_gain.every)
    if "target_gain" in m and np.isfinite(m["target_gain"][i]):
      rec[f"target_gain/{name}"] = float(m["target_gain"][i])
  ev = m["cliff"]
  if bool(ev.flag):
    rec["cliff/source"] = run.sources[int(ev.source)] if int(ev.source) >= 0 else None
    rec["cliff/score"] = float(ev.score)
  return rec


@dataclasses.dataclass
class _Opened:
  """What a run opens before its first step (and closes after its last)."""
  tokenizer: data_lib.Tokenizer
  data: data_lib.PreparedData
  data_digest: str
  keys: dict[str, jax.Array]
  mesh: jax.sharding.Mesh
  batch_sharding: jax.sharding.NamedSharding
  step_fn: Callable[[step_lib.TrainState, step_lib.Batch], tuple[step_lib.TrainState, dict]]
  checkpoints: ckpt_lib.Checkpoints
  state: step_lib.TrainState      # a fresh state, in its shards; :func:`resume` may replace it


def _open(run: runconfig.Run, config: ml_collections.ConfigDict, workdir: str) -> _Opened:
  """The data, the device mesh, a fresh sharded state, the jitted step and the checkpoints."""
  tokenizer = data_lib.load_tokenizer(config.data.tokenizer)
  data = data_lib.open_training_data(config.data, tokenizer, sources=run.sources,
                                     required=run.used_sources)
  keys = run_keys(config.seed)
  mesh_cfg = runconfig.mesh_config(config)
  mesh = sharding.make_mesh(mesh_cfg)
  state, state_shardings = sharding.init_sharded(
      lambda: init_state(run, keys),
      lambda s: sharding.state_shardings(s, mesh, mesh_cfg.fsdp_min_size))
  batch_sharding = sharding.batch_sharding(mesh)
  return _Opened(
      tokenizer=tokenizer, data=data, data_digest=training_data_digest(data), keys=keys,
      mesh=mesh, batch_sharding=batch_sharding,
      step_fn=step_lib.jit_step(run.step_config, state_shardings, batch_sharding),
      checkpoints=ckpt_lib.Checkpoints(os.path.join(workdir, "checkpoints"),
                                       keep=config.train.keep_checkpoints,
                                       keep_period=config.train.keep_period),
      state=state)


def check_sources(directory: str, sources: Sequence[str]) -> None:
  """A ``CheckpointError`` naming both lists when the newest checkpoint was saved over other
  sources, or the same in another order: every weight vector, the detector's window and the
  logs would mean other sources. Reads only the checkpoint's metadata (before anything
  compiles)."""
  newest = ckpt_lib.newest_meta(directory)
  if newest is None:
    return
  step, meta = newest
  config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
  # Saved before runs declared their sources: ANDREA's sixteen, the only ones there were.
  saved = tuple(meta.get("sources") or config.get("sources") or sources_lib.SOURCES)
  if saved != tuple(sources):
    raise ckpt_lib.CheckpointError(
        f"the checkpoint at step {step} in {directory} was saved over the sources "
        f"{list(saved)}, and this run's are {list(sources)}: resume with the same list in the "
        "same order, or use another workdir")


def resume(checkpoints: ckpt_lib.Checkpoints, state: step_lib.TrainState,
           config: ml_collections.ConfigDict, data_digest: str
           ) -> tuple[int, step_lib.TrainState]:
  """The resume policy: ``(start step, state)`` from the newest trustworthy checkpoint, else
  ``(0, state)``.

  A checkpoint saved under another config (outside :data:`RESUME_FREE`) or on other data is
  resumed with a warning that names what changed: the run goes on, but it is not the
  uninterrupted run of either. One saved during a streak of non-finite steps and resumed under
  changed values (the halt's advice taken) starts a fresh count; resumed unchanged, the streak
  goes on, so it halts where the uninterrupted run does.
  """
  is_main = jax.process_index() == 0
  restored = checkpoints.restore_latest(jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state))
  if restored is None:
    if is_main:
      print(f"starting from step 0 (no checkpoint in {checkpoints.directory})")
    return 0, state
  start, state, meta = restored
  print(f"resuming from step {start} ({checkpoints.directory}/{start})")
  meta = meta if isinstance(meta, dict) else {}
  changed = config_changes(meta.get("config"), config.to_dict())
  saved_data = meta.get("data")
  if saved_data is not None and saved_data != data_digest and is_main:
    # The same config on other tokens: a retrained tokenizer at the same path, new files.
    print(f"warning: the checkpoint at step {start} was saved on other data (the tokenizer or "
          "the prepared shards differ); the run goes on with this data, it is not the "
          "uninterrupted run", file=sys.stderr)
  streak = int(jax.device_get(state.nonfinite_streak))
  if int(jax.device_get(state.halted_at)) >= 0 or (streak and changed):
    # A halt (saved by an older version) or a streak resumed under changed values: the weights
    # are the last good ones (skipped steps never reach them).
    print(f"the checkpoint at step {start} was saved during a streak of non-finite steps; "
          "resumed under other values, the run starts a fresh count", file=sys.stderr)
    state = state.replace(
        nonfinite_streak=jax.device_put(jnp.int32(0), state.nonfinite_streak.sharding),
        halted_at=jax.device_put(jnp.int32(-1), state.halted_at.sharding))
  if changed and is_main:
    print(f"warning: the checkpoint at step {start} was saved under another configuration: "
          f"{'; '.join(changed)}. The run goes on with the new values; it is not the "
          "uninterrupted run of either config", file=sys.stderr)
  return start, state


def end_step(config: ml_collections.ConfigDict, start: int, directory: str) -> int:
  """This call's last step: ``train.stop_step`` (a run's first part, the schedules still laid out
  over ``train.num_steps``), else ``train.num_steps``. A ``CheckpointError`` when the checkpoint
  resumed from is already past it."""
  num_steps = config.train.num_steps
  end = config.train.stop_step or num_steps
  if start > num_steps:   # the weights are past the run's end: nothing here could be right
    raise ckpt_lib.CheckpointError(
        f"the checkpoint at step {start} in {directory} is past train.num_steps = {num_steps}; "
        f"resume with train.num_steps >= {start}, or use another workdir")
  if start > end:
    raise ckpt_lib.CheckpointError(
        f"the checkpoint at step {start} in {directory} is past train.stop_step = {end}; resume "
        f"with train.stop_step >= {start} (0 runs to train.num_steps = {num_steps})")
  return end


class _Loop:
  """The steps from ``start`` to ``end`` and what runs between them: logging, evaluations,
  checkpoints. Metrics are read one log step late, after the next step is dispatched (or before
  an evaluation or a checkpoint, which wait for the step anyway): the host never makes the device
  wait."""

  def __init__(self, run: runconfig.Run, config: ml_collections.ConfigDict, workdir: str,
               opened: _Opened, start: int, end: int):
    self.run, self.config, self.opened = run, config, opened
    self.state, self.start, self.end = opened.state, start, end
    self.is_main = jax.process_index() == 0
    self.logger = logs.RunLogger(workdir, resume_step=start, is_writer=self.is_main,
                                 tensorboard=config.train.tensorboard)
    self.evaluator = eval_lib.Evaluator(
        run, config, opened.data, opened.tokenizer, opened.keys["eval"], workdir,
        mesh=opened.mesh, vocabulary=data_lib.corpus_vocabulary(config.data))
    if self.is_main and self.evaluator.samples_path:
      logs.truncate_samples(self.evaluator.samples_path, start)
    self.feed = feed_lib.ScheduleFeed(curriculum.schedule(self.state.curriculum), start,
                                      run.curriculum_spec.decision_lag)
    self.batches = self._prefetcher()
    self.bar = None
    if self.is_main and config.train.progress_bar:
      from tqdm.auto import tqdm
      self.bar = tqdm(total=end, initial=start, unit="step", dynamic_ncols=True)
    self.saved = set(opened.checkpoints.all_steps())
    self.pending: tuple[int, dict] | None = None   # a log step dispatched but not yet read
    self.last_log = (time.perf_counter(), start)
    self.tokens_per_step = config.data.global_batch_size * config.data.seq_len   # global
    self.flops_per_token = flops_per_token(run.model_config, config.data.seq_len)
    peak = runconfig.peak_flops()   # this process's devices
    self.peak = peak * jax.process_count() if peak else None

  def _prefetcher(self) -> data_lib.Prefetcher:
    """Batches built ahead in a thread (the host-to-device copy too); this process builds only the
    rows its devices hold, slot k of the global batch's P equal slices."""
    rows, sharded = self.config.data.global_batch_size, self.opened.batch_sharding
    lo, hi = sharding.process_rows(sharded, rows)
    slot = dict(process_index=lo // (hi - lo), process_count=rows // (hi - lo))
    make = functools.partial(data_lib.MixtureSampler, self.opened.data,
                             seq_len=self.config.data.seq_len)
    sampler = make(global_batch_size=rows, seed=self.config.seed, **slot)
    gain = self.run.step_config.target_gain
    probes = None if gain is None else gain_lib.ProbeBatches(
        gain, np.asarray(self.run.target), make, self.config.seed, **slot)

    def build(t):
      batch = sharding.global_batch(sampler.batch(t, self.feed.weights(t)), sharded, rows)
      if probes is not None:   # the target gain's rows, at a measurement step
        extra = probes.rows(t)
        for prefix, n in ((gain_lib.PROBE, gain.probe_rows), (gain_lib.TARGET, gain.target_rows)):
          batch.update(sharding.global_batch(
              {k: v for k, v in extra.items() if k.startswith(prefix)}, sharded, n))
      return batch

    return data_lib.Prefetcher(build, start_step=self.start, end_step=self.end,
                               depth=max(2, self.config.data.prefetch))

  def flush(self) -> None:
    """Reads and logs the pending log step."""
    if self.pending is not None:
      _log_step(self.run, self.logger, self.feed, *self.pending, bar=self.bar)
      self.pending = None

  def checkpoint(self, at: int) -> None:
    # Every record of a step < at is in metrics.jsonl before checkpoint `at` exists: a run resumed
    # from it keeps exactly those (logs.truncate_jsonl) and writes the rest again.
    self.flush()
    # A halted run saves nothing past its last good state.
    _raise_if_halted(self.run, self.state.halted_at)
    if at not in self.saved:
      self.opened.checkpoints.save(at, self.state, {
          "step": at, "config": self.config.to_dict(), "data": self.opened.data_digest,
          "sources": list(self.run.sources)})
      self.saved.add(at)

  def evaluate(self, at: int) -> dict:
    self.flush()   # the records of steps < at come first, as in a run resumed at step `at`
    record = self.evaluator.run(self.state.params, at)
    self.logger.write(record)
    return record

  def _eval_due(self, at: int) -> bool:   # the last evaluation, at `end`, is made after the loop
    every = self.config.eval.every
    return bool(every) and at % every == 0 and 0 < at < self.end

  def _throughput(self, t: int) -> None:
    now = time.perf_counter()
    tps = self.tokens_per_step * (t + 1 - self.last_log[1]) / max(now - self.last_log[0], 1e-9)
    self.last_log = (now, t + 1)
    perf = {"step": t, "tokens_per_s": tps}
    if self.peak:
      perf["mfu"] = tps * self.flops_per_token / self.peak
    self.logger.write(perf, deterministic=False)
    if self.bar is not None:
      self.bar.set_postfix(tok_s=f"{tps:,.0f}",
                           **({"mfu": f"{perf['mfu']:.1%}"} if "mfu" in perf else {}))

  def train(self, signals: _Signals, lock=None) -> dict:
    """Runs the steps; returns the summary (``interrupted_at`` when a signal stopped it). Stops
    with :class:`andrea_jax.workdir.WorkdirBusy` if another run took the workdir's ``lock``."""
    summary: dict[str, Any] = {"start_step": self.start}
    log_every, num_steps = self.config.train.log_every, self.config.train.num_steps
    every_ckpt = self.config.train.checkpoint_every
    if self._eval_due(self.start):
      # The interrupted run may have written it before checkpoint `start`, but its logs were cut
      # back to the steps before `start`: an evaluation belongs to the segment that begins there.
      self.evaluate(self.start)
    for t in range(self.start, self.end):
      if lock is not None:
        lock.raise_if_lost()
      self.state, metrics = self.opened.step_fn(self.state, next(self.batches))
      self.feed.record(t, metrics["schedule"])
      self.flush()               # read the previous log step now that step t is queued
      if (t + 1) % log_every == 0 or t + 1 == num_steps:
        self.pending = (t, metrics)
        self._throughput(t)
      if self.bar is not None:
        self.bar.update(1)
      if self._eval_due(t + 1):
        self.evaluate(t + 1)
      if every_ckpt and (t + 1) % every_ckpt == 0:
        self.checkpoint(t + 1)
      if signals.stop(t):
        print(f"\nsignal {signals.received} at step {t + 1}: checkpointing and exiting")
        self.checkpoint(t + 1)
        summary["interrupted_at"] = t + 1
        return summary
    self.flush()
    _raise_if_halted(self.run, self.state.halted_at)   # also when the streak ended between log steps
    # At a stop_step as at num_steps; a run resumed from checkpoint `end` drops this record and
    # makes the evaluation at `end` only if eval.every asks for it, as an uninterrupted run.
    summary["final_eval"] = self.evaluate(self.end)
    self.checkpoint(self.end)
    return summary

  def close(self) -> None:
    """Closes everything, each even if another failed (a full disk fails several); raises the
    first failure."""
    closers = [self.feed.close, self.batches.close, self.opened.checkpoints.close,
               self.logger.close] + ([self.bar.close] if self.bar is not None else [])
    failure = None
    for close in closers:
      try:
        close()
      except Exception as e:
        failure = failure or e
    if failure is not None:
      raise failure


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       early_signals: Sequence[int] = ()) -> dict:
  """Train (or resume) the run described by ``config`` in ``workdir``; returns a summary dict.

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
  SIGTERM and SIGINT during the call stop the run at the next step boundary with a checkpoint;
  ``early_signals`` (the signals a caller recorded before calling, see :mod:`andrea_jax.launch`)
  act the same way. The handlers are held for the whole call, so a signal during start-up stops
  the run at its first step boundary, and one during the final evaluation or checkpoint lets them
  finish.
  """
  with _Signals() as signals:
    # Read only now that the handlers are installed, so that a signal recorded by the caller while
    # they were not (andrea_jax.launch) is seen here, whenever it came.
    if early_signals:
      signals.deliver(early_signals[0])
    run = runconfig.build(config)            # validates everything; raises before any compilation
    make_workdir(workdir)
    # One run per workdir: a second one is refused here, before it writes anything.
    with workdir_lib.hold(workdir) as lock:
      return _train_locked(run, config, workdir, signals, lock)


def _train_locked(run: runconfig.Run, config: ml_collections.ConfigDict, workdir: str,
                  signals: _Signals, lock) -> dict:
  """:func:`train_and_evaluate` once it holds the workdir's lock."""
  check_sources(os.path.join(workdir, "checkpoints"), run.sources)   # before anything compiles
  opened = _open(run, config, workdir)
  try:
    start, opened.state = resume(opened.checkpoints, opened.state, config, opened.data_digest)
    end = end_step(config, start, opened.checkpoints.directory)
  except BaseException:   # before anything in workdir changes: its config.json and logs stay
    opened.checkpoints.close()
    raise
  if jax.process_index() == 0:
    storage.atomic_write(os.path.join(workdir, "config.json"),
                         config.to_json_best_effort(indent=2, sort_keys=True).encode(),
                         "Nothing else was written: free some space and run again")
  loop = _Loop(run, config, workdir, opened, start, end)
  try:
    summary = loop.train(signals, lock)
  except BaseException:
    with contextlib.suppress(Exception):   # the first failure is the one to report
      loop.close()
    raise
  loop.close()
  return _finish(run, config, workdir, summary, end)


def _finish(run: runconfig.Run, config: ml_collections.ConfigDict, workdir: str, summary: dict,
            end: int) -> dict:
  """The summary's last fields, and ``summary.png`` (process 0, a completed call only)."""
  interrupted = "interrupted_at" in summary
  summary["end_step"] = summary.get("interrupted_at", end)
  if end < config.train.num_steps and not interrupted:
    summary["stopped_at"] = end
  if interrupted:
    return summary
  if jax.process_index() == 0 and config.train.plot:
    regimes = list(zip(run.curriculum_spec.starts.tolist(), run.curriculum_spec.geometry_names))
    summary["plot"] = plots.summary_plot(workdir, run.sources, regimes)
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


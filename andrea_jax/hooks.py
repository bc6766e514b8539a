"""Periodic work after a training step, as hooks: the loop's own and a caller's.

A hook is ``Hook(every, fn)`` (levanter's ``add_hook(fn, every=N)``, nanodo's periodic actions):
after the step that brings the steps done to a multiple of ``every``, the training loop calls
``fn(info)`` with a :class:`StepInfo` (the steps done, the state after them, that step's metrics,
the run and its workdir). When ``fn`` returns a mapping, it is written as a record of that step to
``metrics.jsonl`` and TensorBoard, after every record of the earlier steps: a metric of one's own
is one function::

  def weight_norm(info):
    return {"weights/norm": float(optax.tree_utils.tree_norm(info.state.params))}

  train.train_and_evaluate(config, "runs/mine", hooks=[Hook(every=100, fn=weight_norm)])

The loop's own periodic work is hooks too, in this order after each step: the step's log record
(every ``train.log_every`` steps and at the run's end: :class:`StepLog`), the evaluation (every
``eval.every`` steps: held-out losses and samples, :mod:`andrea_jax.evaluate`), the caller's
hooks, then the checkpoint (every ``train.checkpoint_every`` steps), so that a checkpoint at step
``k`` follows every record of steps up to ``k``.

**Resuming.** A run resumed from the checkpoint at step ``k`` keeps the records of the steps
before ``k`` and writes the others again (:mod:`andrea_jax.logs`); so the hooks due at ``k``
(whose records the earlier run wrote just before that checkpoint) run again at the resumed run's
start, with ``info.metrics`` None (no step has run yet). A record that is a function of the state
and the step is then written exactly as an uninterrupted run writes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax

from andrea_jax import logs


class TrainingHalted(RuntimeError):
  """Too many consecutive non-finite steps: the run stopped (its last checkpoint is intact)."""


class StepInfo(NamedTuple):
  """What a hook sees after a step.

  Attributes:
    step: the steps done (``t + 1`` after step ``t``).
    state: the :class:`andrea_jax.step.TrainState` after them (device arrays: reading one waits
      for the step to finish).
    metrics: that step's metrics (device arrays), ``None`` at a resumed run's start.
    run: the :class:`andrea_jax.runconfig.Run`.
    workdir: the run's directory.
  """
  step: int
  state: Any
  metrics: Mapping[str, Any] | None
  run: Any
  workdir: str


class Hook(NamedTuple):
  """``fn(info) -> record or None`` after the steps that bring the steps done to a multiple of
  ``every`` (0: never); ``due`` replaces that rule (the loop's own hooks' cadences)."""
  every: int
  fn: Callable[[StepInfo], Mapping[str, Any] | None]
  due: Callable[[int], bool] | None = None

  def is_due(self, done: int) -> bool:
    """Whether the hook runs after the step that brings the steps done to ``done``."""
    if self.due is not None:
      return bool(self.due(done))
    return bool(self.every) and done % self.every == 0


def raise_if_halted(run, halted_at) -> None:
  """:class:`TrainingHalted` when a streak of non-finite steps reached the limit
  (``halted_at >= 0``, the state's)."""
  first = int(jax.device_get(halted_at))
  if first >= 0:
    limit = run.step.max_nonfinite_steps
    raise TrainingHalted(
        f"{limit} consecutive steps with a non-finite loss, gradient or update (steps "
        f"{first}..{first + limit - 1}); they were skipped and the weights are unchanged. Lower "
        "optim.peak_lr, raise optim.warmup_steps or check the data.")


class StepLog:
  """The log hook: a step's metrics kept to be read one log step late (:meth:`flush`, once the
  next step is dispatched, so the host never makes the device wait), its throughput written at
  once (``throughput.jsonl``, with the MFU on a device of known peak).

  ``used(t)`` gives the mixture step ``t``'s batch was drawn from; ``epochs_per_row`` each
  source's training tokens per row (:func:`andrea_jax.logs.step_record`); ``bar`` a tqdm bar or
  ``None``.
  """

  def __init__(self, run, logger: logs.RunLogger, used: Callable[[int], Any],
               epochs_per_row, start: int, flops_per_token: float, bar=None):
    self.run, self.logger, self.used, self.bar = run, logger, used, bar
    self.epochs_per_row = epochs_per_row
    self.pending: list[tuple[int, dict]] = []
    self.tokens_per_step = run.data.global_batch_size * run.data.seq_len   # global
    peak = logs.peak_flops()   # this process's devices
    self.peak = peak * jax.process_count() if peak else None
    self.flops = flops_per_token
    self.last = (time.perf_counter(), start)   # the time and step of the last throughput record

  def hook(self) -> Hook:
    """Every ``train.log_every`` steps and after the run's last step."""
    every, last = self.run.train.log_every, self.run.train.num_steps
    return Hook(every, self.log, due=lambda done: done % every == 0 or done == last)

  def log(self, info: StepInfo) -> None:
    done = info.step
    self.pending.append((done - 1, info.metrics))
    now = time.perf_counter()
    tps = self.tokens_per_step * (done - self.last[1]) / max(now - self.last[0], 1e-9)
    self.last = (now, done)
    perf = {"step": done - 1, "tokens_per_s": tps}
    if self.peak:
      perf["mfu"] = tps * self.flops / self.peak
    self.logger.write(perf, deterministic=False)
    if self.bar is not None:
      self.bar.set_postfix(tok_s=f"{tps:,.0f}",
                           **({"mfu": f"{perf['mfu']:.1%}"} if "mfu" in perf else {}))

  def flush(self) -> None:
    """Reads the pending steps' metrics and writes their records."""
    run = self.run
    while self.pending:
      t, metrics = self.pending.pop(0)
      m = jax.device_get(metrics)
      raise_if_halted(run, m["halted_at"])
      rec = logs.step_record(run.sources, run.curriculum.labels, m, self.used(t),
                             self.epochs_per_row)
      self.logger.write(rec)
      if self.bar is not None:
        self.bar.set_description(f"loss {rec['loss']:.3f}")
      if "cliff/source" in rec:
        print("\n" + logs.cliff_message(rec, t, run.curriculum.geometry_names,
                                        run.cliff.respond))


def recorded(hook: Hook, logger: logs.RunLogger, flush: Callable[[], None]) -> Hook:
  """``hook`` whose returned mapping is written as a record of its step, after ``flush`` has
  written the records of the earlier steps."""
  def fn(info: StepInfo):
    record = hook.fn(info)
    if record is not None:
      if not isinstance(record, Mapping):
        raise TypeError(f"a hook returns a mapping of numbers to log or None, got "
                        f"{type(record).__name__} from {getattr(hook.fn, '__name__', hook.fn)}")
      flush()
      logger.write({**record, "step": info.step})
    return record
  return hook._replace(fn=fn)

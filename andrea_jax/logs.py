"""Run logs: ``metrics.jsonl`` (deterministic numbers only), TensorBoard event files, ``throughput.jsonl``;
and what goes into them: :func:`step_record` (a training step's record), :func:`cliff_message`.

``metrics.jsonl`` holds one JSON object per logged step (and one per evaluation) with only quantities
that a resumed run reproduces exactly (losses, weights, learning rate...), so that a run interrupted and
resumed writes the same file as an uninterrupted one. Wall-clock quantities (tokens/s, MFU) go to
``throughput.jsonl`` and TensorBoard.

Rewinding on resume has one rule for every log: a run resumed from the checkpoint at step ``k``
keeps the records with ``step < k`` and writes all those with ``step >= k`` itself. The trainer
makes this true by writing every record with ``step < k`` before it saves checkpoint ``k``, and by
making the evaluation at step ``k`` again after a resume (the interrupted run may or may not have
written it: the last step's checkpoint can precede the final evaluation). ``metrics.jsonl``,
``throughput.jsonl`` and ``samples.txt`` are cut by :func:`truncate_jsonl` and
:func:`truncate_samples`; TensorBoard hides the events with ``step >= k`` of the earlier event files
(the new file opens with a ``SessionLog.START`` at step ``k``).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from andrea_jax import checks
from andrea_jax import storage

# Dense bf16 peak FLOP/s by device kind, for MFU. CPU has no meaningful peak: MFU is not reported.
PEAK_FLOPS = {   # first match wins: the PCIe and NVL parts before the SXM "H100"
    "H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "H800": 989e12,
    "A100": 312e12, "A10G": 125e12, "L4": 121e12, "TPU v4": 275e12, "TPU v5 lite": 197e12,
    "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
}


def peak_flops(device: jax.Device | None = None) -> float | None:
  """Peak dense bf16 FLOP/s of one device, summed over local devices; ``None`` when unknown."""
  devices = jax.local_devices() if device is None else [device]
  kind = devices[0].device_kind
  for name, flops in PEAK_FLOPS.items():
    if name.lower() in kind.lower():
      return flops * len(devices)
  return None


def _py(v: Any) -> Any:
  if isinstance(v, (np.floating, float)):
    f = float(v)
    return f if math.isfinite(f) else str(f)   # JSON has no NaN/inf
  if isinstance(v, (np.integer,)):
    return int(v)
  if isinstance(v, np.bool_):
    return bool(v)
  if isinstance(v, np.ndarray):
    return [_py(x) for x in v.tolist()] if v.ndim else _py(v.item())
  if isinstance(v, (list, tuple)):
    return [_py(x) for x in v]
  if isinstance(v, Mapping):
    return {k: _py(x) for k, x in v.items()}
  return v


def truncate_jsonl(path: str, last_step: int) -> None:
  """Keep the records of ``path`` with ``step < last_step``, all written before that checkpoint.

  A run resumed from the checkpoint at step ``k = last_step`` writes every record with
  ``step >= k`` again (training steps ``k, k+1, ...`` and the evaluations at steps ``k, k+1, ...``,
  the one at ``k`` included), so those are dropped and the file equals an uninterrupted run's. A
  line cut by a kill ends the kept part (neither it nor anything after it was committed); a missing
  file is left missing.

  Example: records at steps ``4, 9, 10 (evaluation), 14`` and ``last_step=10`` keep ``4`` and ``9``.
  """
  if not os.path.exists(path):
    return
  keep = []
  with open(path) as f:
    for line in f:
      if not line.endswith("\n"):
        break   # cut by a kill mid-write
      try:
        rec = json.loads(line)
      except json.JSONDecodeError:
        break
      if rec.get("step", -1) < last_step:
        keep.append(line)
  _replace(path, keep)


_SAMPLES_HEADER = re.compile(r"=== step (\d+) ===\n")


def truncate_samples(path: str, last_step: int) -> None:
  """Keep the blocks of ``samples.txt`` whose header ``=== step s ===`` has ``s < last_step``.

  The same rule as :func:`truncate_jsonl`: a run resumed from the checkpoint at ``last_step`` writes
  the blocks of its evaluations at steps ``>= last_step`` (that at ``last_step`` included) again.
  Lines before the first header are kept; a line cut by a kill ends the kept part.

  Example: blocks for steps ``10`` and ``20`` and ``last_step=10`` keep nothing; ``last_step=11``
  keeps the block of step ``10``.
  """
  if not os.path.exists(path):
    return
  keep, keeping = [], True
  with open(path) as f:
    for line in f:
      if not line.endswith("\n"):
        break
      header = _SAMPLES_HEADER.fullmatch(line)
      if header:
        keeping = int(header.group(1)) < last_step
      if keeping:
        keep.append(line)
  _replace(path, keep)


def _replace(path: str, lines: list[str]) -> None:
  # Atomic: a kill or a full disk leaves the old file or the new one, never half of it.
  storage.atomic_write(path, "".join(lines).encode(), f"{path} is unchanged. {_AGAIN}")


# What to do after a log write failed: the records of the steps before the newest checkpoint are
# all in the logs (written before it was saved), and a resumed run writes the others again.
_AGAIN = ("Free some space, then run the same command again: it resumes from the newest "
          "checkpoint and writes the log records after it again")


class _EventFile:
  """A TensorBoard event file written in the calling thread (tensorboardX's ``EventsWriter``), so
  that a failed write raises there. ``SummaryWriter`` writes from a thread of its own: when a full
  disk ended that thread, its bounded queue filled and the run blocked on the next scalar.

  It opens, as ``SummaryWriter(purge_step=resume_step)`` does, with a ``SessionLog.START`` at
  ``resume_step``: TensorBoard then drops the earlier files' events with ``step >= resume_step``,
  which this run writes again.
  """

  FLUSH_S = 30.0   # as SummaryWriter: a flush (with an fsync) at most this often, and at close

  def __init__(self, logdir: str, resume_step: int, suffix: str):
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    os.makedirs(logdir, exist_ok=True)
    self.path = os.path.join(logdir, "events")
    self._event = Event
    self._flushed = time.monotonic()
    self._writer = EventsWriter(self.path, suffix)
    self.path = getattr(self._writer, "_file_name", self.path)   # named in errors
    self._writer.write_event(Event(step=resume_step, file_version="brain.Event:2"))
    self._writer.write_event(Event(step=resume_step,
                                   session_log=SessionLog(status=SessionLog.START)))

  def write(self, record: Mapping[str, Any]) -> None:
    """The record's numbers as scalars, its ``sample*`` strings as text, at its step."""
    from tensorboardX.summary import scalar, text
    step, now = record["step"], time.time()
    for k, v in record.items():
      summary = None
      if k != "step" and checks.is_number(v):   # a bool is not a scalar to plot
        summary = scalar(k, v)
      elif isinstance(v, str) and k.startswith("sample"):
        summary = text(k, v)
      if summary is not None:
        self._writer.write_event(self._event(summary=summary, step=step, wall_time=now))
    if time.monotonic() - self._flushed > self.FLUSH_S:
      self._writer.flush()
      self._flushed = time.monotonic()

  def close(self) -> None:
    self._writer.close()


class RunLogger:
  """Appends records to ``metrics.jsonl`` / ``throughput.jsonl`` and scalars to TensorBoard.

  Only process 0 writes. ``resume_step`` (the step of the checkpoint the run starts from, 0 for a
  fresh run) rewinds the logs an earlier run left: records with ``step >= resume_step`` are dropped
  from the ``.jsonl`` files and hidden from TensorBoard (see the module docstring). A write that
  fails for want of room or permission raises :class:`andrea_jax.storage.WriteError` naming the
  file: what was written before stays, and a part of a record is dropped on resume.
  """

  def __init__(self, workdir: str, resume_step: int = 0, *, tensorboard: bool = True,
               is_writer: bool = True):
    self.workdir = workdir
    self.is_writer = is_writer
    self.metrics_path = os.path.join(workdir, "metrics.jsonl")
    self.throughput_path = os.path.join(workdir, "throughput.jsonl")
    self._tb = None
    self._failed = False
    if not is_writer:
      return
    os.makedirs(workdir, exist_ok=True)
    for p in (self.metrics_path, self.throughput_path):
      truncate_jsonl(p, resume_step)
    with storage.writing(workdir, _AGAIN):
      self._metrics = open(self.metrics_path, "a")
      self._throughput = open(self.throughput_path, "a")
    if tensorboard:
      # Each run opens a new event file, named by the second: a nanosecond suffix keeps a run
      # resumed within the same second from overwriting the last one's file (opened "wb"), and
      # sorts it after that file.
      logdir = os.path.join(workdir, "tensorboard")
      with storage.writing(logdir, _AGAIN):
        self._tb = _EventFile(logdir, resume_step, f".{time.time_ns()}")

  def write(self, record: Mapping[str, Any], *, deterministic: bool = True) -> None:
    """Write one record (must hold ``step``); numeric leaves also go to TensorBoard."""
    if not self.is_writer:
      return
    rec = _py(dict(record))
    f = self._metrics if deterministic else self._throughput
    try:
      with storage.writing(f.name, _AGAIN):
        f.write(json.dumps(rec, sort_keys=True) + "\n")
        f.flush()
      if self._tb is not None:
        with storage.writing(self._tb.path, _AGAIN):
          self._tb.write(rec)
    except storage.WriteError:
      self._failed = True
      raise

  def close(self) -> None:
    """Closes the files; after a failed write, what they could not take is dropped quietly."""
    if not self.is_writer:
      return
    failure = None
    for f in (self._metrics, self._throughput, self._tb):
      try:
        if f is not None:
          with storage.writing(getattr(f, "name", None) or f.path, _AGAIN):
            f.close()
      except storage.WriteError as e:
        failure = failure or e
    if failure is not None and not self._failed:
      raise failure


def read_jsonl(path: str) -> list[dict]:
  """All records of a ``.jsonl`` log."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def step_record(sources: Sequence[str], labels: Sequence[str], m: Mapping[str, Any],
                weights: np.ndarray, epochs_per_row: Sequence[float] | None = None) -> dict:
  """The deterministic record of one step, from its fetched metrics ``m`` (the step's, on the
  host) and the mixture its batch was drawn from: loss, gradient norm, learning rate, per source
  its weight, realised share and loss (where it had tokens), each probe's signal where it measured
  (``<probe>/<source>``, e.g. ``target_gain/docstrings``), the curriculum's scalars (the phase's
  label by name: ``labels`` is the spec's) and a flagged cliff.

  ``epochs_per_row``: per source, the share of its training tokens one row holds
  (``seq_len / training tokens``; 0 for a source the run never trains on): the record then holds
  ``data/epochs/<source>``, the passes over the source's training split so far (rows trained on,
  skipped non-finite steps not counted, times that share).

  Example: a source of 1,280 training tokens, 40 rows of 128 tokens trained on:
  ``data/epochs/<source> = 40 * 128 / 1280 = 4.0``.
  """
  rec: dict[str, Any] = {"step": int(m["step"]), "loss": float(m["loss"]),
                         "grad_norm": float(m["grad_norm"]), "lr": float(m["lr"]),
                         "finite": bool(m["finite"])}
  tokens = np.asarray(m["source_tokens"], np.float64)
  share = tokens / max(tokens.sum(), 1.0)
  for i, name in enumerate(sources):
    rec[f"weight/{name}"] = float(weights[i])
    rec[f"share/{name}"] = float(share[i])
    if tokens[i] > 0:
      rec[f"loss/{name}"] = float(m["source_loss"][i])
  for k, v in m["curriculum"].items():
    v = np.asarray(v)
    if k == "phase_label":
      rec["curriculum/phase_label"] = labels[int(v)]
    elif v.ndim == 0:
      rec[f"curriculum/{k}"] = v.item()
  for signal, values in m.get("signals", {}).items():   # measured at this step (its cadence)
    for i, name in enumerate(sources):
      if np.isfinite(values[i]):
        rec[f"{signal}/{name}"] = float(values[i])
  if epochs_per_row is not None:
    rows = np.asarray(m["rows_seen"], np.float64)
    for i, name in enumerate(sources):
      if epochs_per_row[i] > 0:
        rec[f"data/epochs/{name}"] = float(rows[i] * epochs_per_row[i])
  ev = m["cliff"]
  if bool(ev.flag):
    rec["cliff/source"] = sources[int(ev.source)] if int(ev.source) >= 0 else None
    rec["cliff/score"] = float(ev.score)
  return rec


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

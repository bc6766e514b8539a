"""Run logs: ``metrics.jsonl`` (deterministic numbers only), TensorBoard event files, ``throughput.jsonl``.

``metrics.jsonl`` holds one JSON object per logged step (and one per evaluation) with only quantities
that a resumed run reproduces exactly (losses, weights, learning rate...), so that a run interrupted and
resumed writes the same file as an uninterrupted one. Wall-clock quantities (tokens/s, MFU) go to
``throughput.jsonl`` and TensorBoard.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np


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
  """Drop lines whose ``step`` is >= ``last_step`` (written after the checkpoint a run resumes from)."""
  if not os.path.exists(path):
    return
  keep = []
  with open(path) as f:
    for line in f:
      try:
        rec = json.loads(line)
      except json.JSONDecodeError:
        break   # a line cut by a kill: it and everything after it were not committed
      if rec.get("step", -1) < last_step:
        keep.append(line if line.endswith("\n") else line + "\n")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(keep)
  os.replace(tmp, path)


class RunLogger:
  """Appends records to ``metrics.jsonl`` / ``throughput.jsonl`` and scalars to TensorBoard.

  Only process 0 writes. ``resume_step`` truncates records a killed run wrote after its last checkpoint.
  """

  def __init__(self, workdir: str, resume_step: int = 0, *, tensorboard: bool = True,
               is_writer: bool = True):
    self.workdir = workdir
    self.is_writer = is_writer
    self.metrics_path = os.path.join(workdir, "metrics.jsonl")
    self.throughput_path = os.path.join(workdir, "throughput.jsonl")
    self._tb = None
    if not is_writer:
      return
    os.makedirs(workdir, exist_ok=True)
    for p in (self.metrics_path, self.throughput_path):
      truncate_jsonl(p, resume_step)
    self._metrics = open(self.metrics_path, "a")
    self._throughput = open(self.throughput_path, "a")
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"), flush_secs=30)

  def write(self, record: Mapping[str, Any], *, deterministic: bool = True) -> None:
    """Write one record (must hold ``step``); numeric leaves also go to TensorBoard."""
    if not self.is_writer:
      return
    rec = _py(dict(record))
    f = self._metrics if deterministic else self._throughput
    f.write(json.dumps(rec, sort_keys=True) + "\n")
    f.flush()
    if self._tb is not None:
      step = rec["step"]
      for k, v in rec.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(k, v, step)
        elif isinstance(v, str) and k.startswith("sample"):
          self._tb.add_text(k, v, step)

  def close(self) -> None:
    if not self.is_writer:
      return
    self._metrics.close()
    self._throughput.close()
    if self._tb is not None:
      self._tb.close()


def read_jsonl(path: str) -> list[dict]:
  """All records of a ``.jsonl`` log."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]

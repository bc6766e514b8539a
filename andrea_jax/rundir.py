"""A run's directory, opened: its lock, its checkpoints, ``config.json`` and its logs, in one object.

The trainer receives a :class:`RunDir` from :func:`open_run_dir` and never handles the files
itself. Opening takes the workdir's lock (:mod:`andrea_jax.lock`: a second run on it is refused
before anything is written) and refuses a checkpoint saved over other sources; the checkpoints
open when first asked for (after the data, which may still refuse the run); nothing in the workdir
changes yet. Once the run knows its start step (the checkpoint
it resumes from), :meth:`RunDir.begin` writes ``config.json`` (whole or not at all) and rewinds the
logs an earlier run left to that step (:mod:`andrea_jax.logs`). Closing closes everything, each
part even if another failed, and releases the lock.

Layout::

  <workdir>/run.lock            the lock (JSON naming its holder)
  <workdir>/config.json         the configuration as it ran
  <workdir>/checkpoints/<step>/ orbax checkpoints, sealed with SHA-256 checksums
  <workdir>/metrics.jsonl       deterministic records; throughput.jsonl, tensorboard/ beside it
  <workdir>/samples.txt         text samples at each evaluation
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator

import jax

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import logs
from andrea_jax import resume as resume_lib
from andrea_jax import storage
from andrea_jax import lock as lock_lib


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


@dataclasses.dataclass
class RunDir:
  """An opened run directory (see the module docstring).

  Attributes:
    path: the workdir.
    lock: the lock this run holds (``raise_if_lost()`` stops a run whose lock was taken over).
    checkpoints: the run's :class:`andrea_jax.checkpoint.Checkpoints` (opened when first read).
    logger: the run's :class:`andrea_jax.logs.RunLogger` once :meth:`begin` was called.
    samples_path: ``samples.txt``.
  """
  path: str
  lock: lock_lib.WorkdirLock | lock_lib._Joined
  keep: int = 3
  keep_period: int = 0
  logger: logs.RunLogger | None = None
  _checkpoints: ckpt_lib.Checkpoints | None = None

  @property
  def checkpoints(self) -> ckpt_lib.Checkpoints:
    if self._checkpoints is None:
      self._checkpoints = ckpt_lib.Checkpoints(os.path.join(self.path, "checkpoints"),
                                               keep=self.keep, keep_period=self.keep_period)
    return self._checkpoints

  @property
  def samples_path(self) -> str:
    return os.path.join(self.path, "samples.txt")

  def begin(self, start: int, config_json: str, *, tensorboard: bool) -> None:
    """The run starts at step ``start``: ``config.json`` written, the logs rewound to ``start``."""
    is_main = jax.process_index() == 0
    if is_main:
      storage.atomic_write(os.path.join(self.path, "config.json"), config_json,
                           "Nothing else was written: free some space and run again")
      logs.truncate_samples(self.samples_path, start)
    self.logger = logs.RunLogger(self.path, resume_step=start, is_writer=is_main,
                                 tensorboard=tensorboard)

  def close(self) -> None:
    """Closes the checkpoints (waiting for a save in flight) and the logs, each even if the other
    failed; raises the first failure. A second call does nothing."""
    failure = None
    closers = (([self._checkpoints.close] if self._checkpoints else [])
               + ([self.logger.close] if self.logger else []))
    self._checkpoints, self.logger = None, None
    for close in closers:
      try:
        close()
      except Exception as e:
        failure = failure or e
    if failure is not None:
      raise failure


@contextlib.contextmanager
def open_run_dir(workdir: str, sources: tuple[str, ...], *, keep: int = 3,
                 keep_period: int = 0) -> Iterator[RunDir]:
  """The run directory of ``workdir`` for the block, opened (lock, source check, checkpoints) and
  closed at its exit however it ends (an exception inside is the one raised; a failure to close
  after it is not).

  Example:
    >>> with open_run_dir("runs/tiny", run.sources) as rd:
    ...   start, state = resume(rd.checkpoints, state, run.record, digest)
    ...   rd.begin(start, run.config_json, tensorboard=True)
    ...   rd.logger.write({"step": start, "loss": 2.3})
  """
  make_workdir(workdir)
  with lock_lib.hold(workdir) as lock:   # a second run is refused here, before any write
    resume_lib.check_sources(os.path.join(workdir, "checkpoints"), sources)   # before compiling
    rd = RunDir(path=workdir, lock=lock, keep=keep, keep_period=keep_period)
    try:
      yield rd
    except BaseException:
      with contextlib.suppress(Exception):   # the first failure is the one to report
        rd.close()
      raise
    rd.close()

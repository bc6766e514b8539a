"""Checkpoints: orbax ``CheckpointManager`` (asynchronous, keep N) plus a checksum seal per step.

Orbax writes each step into a temporary directory and renames it into place when complete, so a
directory named after a step is a finished write. Orbax does not verify data on restore, so after each
write lands a background thread *seals* it: it records the size and SHA-256 of every file in
``andrea_checksums.json`` (written atomically). On restore the newest checkpoint that passes
verification wins; a damaged one (flipped byte, truncated or missing file, missing commit marker, a link
pointing outside the directory) is skipped with a warning naming the file, and the one before it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import warnings
from typing import Any

import jax
import orbax.checkpoint as ocp

SEAL = "andrea_checksums.json"
_COMMIT = "commit_success.txt"


class CheckpointError(RuntimeError):
  """No usable checkpoint, or one that does not fit the run."""


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _files(step_dir: str) -> list[str]:
  out = []
  for root, dirs, files in os.walk(step_dir):
    dirs.sort()
    for name in sorted(files):
      rel = os.path.relpath(os.path.join(root, name), step_dir)
      if rel != SEAL:
        out.append(rel)
  return out


def seal(step_dir: str) -> None:
  """Write the checksum manifest of a finished checkpoint directory (atomically)."""
  manifest = {rel: {"size": os.path.getsize(os.path.join(step_dir, rel)),
                    "sha256": _sha256(os.path.join(step_dir, rel))} for rel in _files(step_dir)}
  tmp = os.path.join(step_dir, SEAL + ".tmp")
  with open(tmp, "w") as f:
    json.dump({"version": 1, "files": manifest}, f, indent=0, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, os.path.join(step_dir, SEAL))


def verify(step_dir: str) -> str | None:
  """Why ``step_dir`` cannot be trusted, or ``None`` if it can.

  Checks, before any array is read: no link inside points outside the directory; orbax's commit
  markers are present; and, when sealed, every file has its recorded size and SHA-256 and none is
  missing. An unsealed checkpoint (a kill between the write and the seal) passes on its commit markers.
  """
  root = os.path.realpath(step_dir)
  for dirpath, dirnames, filenames in os.walk(step_dir):
    for name in dirnames + filenames:
      p = os.path.join(dirpath, name)
      if os.path.islink(p):
        target = os.path.realpath(p)
        if not (target == root or target.startswith(root + os.sep)):
          return f"{p} is a link to {target}, outside the checkpoint"
  for marker_dir in (step_dir, os.path.join(step_dir, "state"), os.path.join(step_dir, "meta")):
    if not os.path.exists(os.path.join(marker_dir, _COMMIT)):
      return f"{os.path.join(marker_dir, _COMMIT)} (commit marker) is missing"
  seal_path = os.path.join(step_dir, SEAL)
  if not os.path.exists(seal_path):
    return None
  try:
    with open(seal_path) as f:
      manifest = json.load(f)["files"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    return f"{seal_path} is unreadable ({e})"
  for rel, want in sorted(manifest.items()):
    p = os.path.join(step_dir, rel)
    if not os.path.exists(p):
      return f"{p} is missing"
    size = os.path.getsize(p)
    if size != want["size"]:
      return f"{p} has {size} bytes, {want['size']} were written"
    if _sha256(p) != want["sha256"]:
      return f"{p} does not match its SHA-256"
  extra = sorted(set(_files(step_dir)) - set(manifest))
  if extra:
    return f"{os.path.join(step_dir, extra[0])} was not part of the checkpoint"
  return None


class Checkpoints:
  """Asynchronous checkpoints of a pytree ``state`` and a JSON ``meta`` dict under ``directory``."""

  def __init__(self, directory: str, *, keep: int = 3):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=True, cleanup_tmp_directories=True, create=True)
    self._mngr = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()})
    self._sealers: list[threading.Thread] = []
    self._primary = jax.process_index() == 0

  def all_steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Start an asynchronous save of ``state`` at ``step``; returns once the arrays are copied."""
    self._mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
    if self._primary:
      t = threading.Thread(target=self._seal_when_done, args=(step,), daemon=True)
      t.start()
      self._sealers.append(t)

  def _seal_when_done(self, step: int) -> None:
    step_dir = os.path.join(self.directory, str(step))
    # The final directory name appears only once orbax has committed the whole step.
    while not os.path.exists(os.path.join(step_dir, _COMMIT)):
      time.sleep(0.02)
      if not self._mngr.is_saving_in_progress() and not os.path.exists(step_dir):
        return   # deleted (keep N) or never written
    try:
      seal(step_dir)
    except FileNotFoundError:
      pass   # removed by the keep-N policy while we hashed it

  def wait(self) -> None:
    """Block until every started save is written and sealed."""
    self._mngr.wait_until_finished()
    for t in self._sealers:
      t.join()
    self._sealers.clear()

  def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict] | None:
    """``(step, state, meta)`` of the newest trustworthy checkpoint, or ``None`` if there is none.

    ``abstract_state`` (``jax.ShapeDtypeStruct`` leaves, with shardings) fixes the structure, shapes
    and placement; a checkpoint whose arrays do not match it raises :class:`CheckpointError`.
    """
    for step in reversed(self.all_steps()):
      step_dir = os.path.join(self.directory, str(step))
      problem = verify(step_dir)
      if problem is not None:
        warnings.warn(f"skipping damaged checkpoint {step_dir}: {problem}", stacklevel=2)
        continue
      _check_shapes(self._mngr, step, abstract_state, step_dir)
      restored = self._mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
      return step, restored.state, restored.meta
    return None

  def close(self) -> None:
    self.wait()
    self._mngr.close()


def _check_shapes(mngr, step: int, abstract_state: Any, step_dir: str) -> None:
  """Compare the stored array metadata with the run's state before reading any array."""
  try:
    stored = mngr.item_metadata(step)["state"]
  except Exception as e:  # orbax raises several types for unreadable metadata
    raise CheckpointError(f"cannot read the metadata of {step_dir}/state: {e}") from e
  if stored is None:
    raise CheckpointError(f"{step_dir}/state has no array metadata")
  is_meta = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")
  have = {_dotted(p): leaf for p, leaf in
          jax.tree_util.tree_flatten_with_path(stored, is_leaf=is_meta)[0]}
  for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_state)[0]:
    name = _dotted(path)
    got = have.get(name)
    if got is None:
      raise CheckpointError(f"{step_dir}: the checkpoint has no entry {name!r}; it was written by a "
                            "different configuration")
    if tuple(got.shape) != tuple(leaf.shape):
      raise CheckpointError(f"{step_dir}: {name!r} has shape {tuple(got.shape)} in the checkpoint but "
                            f"{tuple(leaf.shape)} in this run's configuration")


def _dotted(path) -> str:
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
  return ".".join(parts)

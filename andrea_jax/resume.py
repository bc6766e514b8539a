"""The resume policy: what a run started on a workdir with checkpoints does, and says.

* :func:`check_sources`: a checkpoint saved over other sources (or the same in another order) is
  refused before anything compiles: every weight vector would mean other sources.
* :func:`resume`: the newest trustworthy checkpoint's step and state (a fresh state without one).
  Saved under another config (outside :data:`RESUME_FREE`) or on other data, it is resumed with a
  warning naming what changed; a streak of non-finite steps resumed under changed values starts a
  fresh count.
* :func:`end_step`: this call's last step, and the refusal of a checkpoint already past it.
* :func:`training_data_digest`: what the data check compares, saved with every checkpoint.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import sources as sources_lib
from andrea_jax import step as step_lib

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


def resume(checkpoints: ckpt_lib.Checkpoints, state: step_lib.TrainState, record: dict,
           data_digest: str) -> tuple[int, step_lib.TrainState]:
  """``(start step, state)`` from the newest trustworthy checkpoint, else ``(0, state)``.

  ``record`` is the resuming run's config (``Run.record``). A checkpoint saved under another
  config (outside :data:`RESUME_FREE`) or on other data is resumed with a warning that names what
  changed: the run goes on, but it is not the uninterrupted run of either. One saved during a
  streak of non-finite steps and resumed under changed values (the halt's advice taken) starts a
  fresh count; resumed unchanged, the streak goes on, so it halts where the uninterrupted run does.
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
  changed = config_changes(meta.get("config"), record)
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


def end_step(num_steps: int, stop_step: int, start: int, directory: str) -> int:
  """This call's last step: ``stop_step`` (a run's first part, the schedules still laid out over
  ``num_steps``), else ``num_steps``. A ``CheckpointError`` when the checkpoint resumed from is
  already past it."""
  end = stop_step or num_steps
  if start > num_steps:   # the weights are past the run's end: nothing here could be right
    raise ckpt_lib.CheckpointError(
        f"the checkpoint at step {start} in {directory} is past train.num_steps = {num_steps}; "
        f"resume with train.num_steps >= {start}, or use another workdir")
  if start > end:
    raise ckpt_lib.CheckpointError(
        f"the checkpoint at step {start} in {directory} is past train.stop_step = {end}; resume "
        f"with train.stop_step >= {start} (0 runs to train.num_steps = {num_steps})")
  return end

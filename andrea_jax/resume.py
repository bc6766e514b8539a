"""The resume policy: what a run started on a workdir with checkpoints does, and says.

* :func:`check_sources`: a checkpoint saved over other sources (or the same in another order) is
  refused before anything compiles: every weight vector would mean other sources.
* :func:`resume`: the newest trustworthy checkpoint's step and state (a fresh state without one).
  Saved under another config (outside :data:`RESUME_FREE`) or on other data, it is resumed with a
  warning naming what changed; a streak of non-finite steps resumed under changed values starts a
  fresh count.
* :func:`end_step`: this call's last step, and the refusal of a checkpoint already past it.
* :func:`training_data_digest`: what the data check compares, saved with every checkpoint.
* :func:`init_source`, :func:`start_from`: a run that names pretrained weights (``init``,
  :mod:`andrea_jax.pretrained`) starts from them only when its workdir has no checkpoint: its own
  checkpoint wins, so a restarted fine-tune resumes from itself, never from the source again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import data as data_lib
from andrea_jax import pretrained
from andrea_jax import runconfig
from andrea_jax import sources as sources_lib
from andrea_jax import step as step_lib

# Fields a resumed run may change without changing what it computes: when and how it stops,
# logs, evaluates and checkpoints, where its data and devices come from, and how its checkpoints
# are read afterwards (terrain: the basin report's memory budget).
RESUME_FREE = ("train.stop_step", "train.log_every", "train.progress_bar", "train.plot",
               "train.tensorboard", "train.checkpoint_every", "train.keep_checkpoints",
               "train.keep_period", "train.hooks", "eval.",
               "data.workers", "data.cache_dir", "data.prefetch", "data.verify", "mesh.",
               "distributed.", "terrain.", "init.")
# (init.: a resumed run reads its own checkpoint, never its init source again; train.hooks read the
# state and write records of their own.)


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
  # A checkpoint from before the epochs were counted restores with a fresh count.
  restored = checkpoints.restore_latest(jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state),
      fill={"rows_seen": state.rows_seen})
  if restored is None:
    if is_main:
      print(f"starting from step 0 (no checkpoint in {checkpoints.directory})")
    return 0, state
  start, state, meta = restored
  print(f"resuming from step {start} ({checkpoints.directory}/{start})")
  meta = meta if isinstance(meta, dict) else {}
  changed = config_changes(_today(meta.get("config")), record)
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


def _today(saved):
  """A saved config in today's shape (:func:`andrea_jax.checkpoint.saved_config`: an older
  version's sections moved, the fields added since at their defaults), so that only what the
  user changed is listed; the config as saved when it cannot be read so."""
  if not isinstance(saved, dict):
    return saved
  try:
    return ckpt_lib.saved_config(saved).to_dict()
  except Exception:   # a config no version wrote: compared as it is
    return saved


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


def init_source(run: runconfig.Run, directory: str
                ) -> tuple[runconfig.Run, pretrained.Source | None]:
  """``(run, source)``: the weights a run naming ``init`` starts from, read and checked before
  anything compiles, and the run with their provenance (``path``, ``sha256``, ``step``) in its
  recorded config's ``init`` section.

  The run's own checkpoint wins: when ``directory`` holds a trustworthy checkpoint the source is
  not read (``source`` is ``None``; the provenance its start recorded is kept) and one line says
  so. ``(run, None)`` for a run with no ``init``. Raises :class:`andrea_jax.pretrained.InitError`
  naming every mismatch between the source and the run.
  """
  spec = run.init
  if spec is None:
    return run, None
  newest = ckpt_lib.newest_meta(directory)
  if newest is not None:
    step, meta = newest
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    if jax.process_index() == 0:
      print(f"resume: step {step} from {directory}; {spec.source} is not read again (the run's "
            "own checkpoint wins)")
    return _with_init_record(run, config.get("init") or {}), None
  tokenizer = data_lib.load_tokenizer(run.data.tokenizer)
  mcfg = run.model
  if spec.from_hf:
    source = pretrained.from_hf(spec.from_hf, mcfg, tokenizer)
  else:
    try:
      saved = ckpt_lib.load_checkpoint(spec.from_run, spec.run_step)
    except (FileNotFoundError, ckpt_lib.CheckpointError) as e:
      raise pretrained.InitError(f"{spec.source}: {e}") from e
    except (ValueError, TypeError, data_lib.DataError) as e:   # its config, rebuilt here
      raise pretrained.InitError(f"{spec.source}: the source run's saved config does not build "
                                 f"here: {e}") from e
    source = pretrained.from_params(
        saved.params, saved.run.model, data_lib.load_tokenizer(saved.run.data.tokenizer),
        saved.step, mcfg, tokenizer, spec.source, spec.from_run)
  if jax.process_index() == 0:
    for note in source.notes:
      print(note)
    step = source.record["step"]
    print(f"init: params from {spec.source} (sha256 {source.record['sha256'][:16]}..."
          f"{f', step {step}' if step is not None else ''}); optimizer fresh, step 0")
  return _with_init_record(run, source.record), source


def _with_init_record(run: runconfig.Run, provenance: dict) -> runconfig.Run:
  keep = {k: provenance[k] for k in ("path", "sha256", "step") if k in provenance}
  record = {**run.record, "init": {**run.record.get("init", {}), **keep}}
  return dataclasses.replace(run, record=record)


def start_from(source: pretrained.Source | None, state: step_lib.TrainState,
               run: runconfig.Run) -> step_lib.TrainState:
  """``state`` (a fresh one, step 0) with the parameters of ``source`` (:func:`init_source`) in
  its shards and a fresh optimizer state for them (``tx.init(params)``: zero moments); the rest
  (step, curriculum, detector) as it was. ``state`` itself when ``source`` is ``None``."""
  if source is None:
    return state
  params = jax.tree.map(
      lambda new, old: jax.make_array_from_callback(
          old.shape, old.sharding, lambda index, new=new: np.asarray(new, old.dtype)[index]),
      source.params, state.params)
  opt_shardings = jax.tree.map(lambda x: x.sharding, state.opt_state)
  opt_state = jax.jit(run.step.tx.init, out_shardings=opt_shardings)(params)
  return state.replace(params=params, opt_state=opt_state)

"""Checkpoints: orbax ``CheckpointManager`` (asynchronous, keep N) plus a checksum seal per step.

Orbax writes each step into a temporary directory and renames it into place when complete, so a
directory named after a step is a finished write; temporary directories left by a killed process
are removed when the next :class:`Checkpoints` opens. Steps past the newest ``keep`` are renamed
into ``deleting/`` before they are removed, so a kill never leaves a half-deleted step either. Orbax does not verify data on restore, so
after each write lands a background thread *seals* it: it records the size and SHA-256 of every
file in ``andrea_checksums.json`` (written atomically).

On restore every candidate is checked before any array is read (:func:`verify`, then the stored
shapes and dtypes against the run's state): no link or special file, the commit markers, the seal,
well-formed JSON metadata. The newest checkpoint that passes wins; a damaged one (flipped byte,
truncated or missing file, missing commit marker, a link pointing outside the directory, malformed
metadata) is skipped with a warning naming the file and moved to ``damaged/``, so that the resumed
run writes that step again. A checkpoint whose arrays do not fit the run (another configuration,
absurd shapes, a dtype that is not the run's) is refused with :class:`CheckpointError`, and so is a
directory whose checkpoints are all damaged: the run never silently restarts from scratch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import threading
import time
import warnings
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from andrea_jax import checks
from andrea_jax import runconfig
from andrea_jax import storage
from andrea_jax.data import hashing
from andrea_jax.model import init_params

SEAL = "andrea_checksums.json"
DAMAGED = "damaged"   # where damaged checkpoints newer than the restored one are moved
# Orbax renames a step past keep-N here (atomic), and we empty it: a kill while deleting then never
# leaves a half-deleted checkpoint under its step name.
_DELETING = "deleting"
_COMMIT = "commit_success.txt"
_SEAL_TMP = SEAL + ".tmp"
# Orbax's JSON metadata, parsed by us (with a size cap) before orbax or tensorstore reads any of it.
_REQUIRED_JSON = ("state/_METADATA", "meta/metadata")
_OPTIONAL_JSON = ("_CHECKPOINT_METADATA", "state/_sharding")
_MAX_JSON_BYTES = 64 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(RuntimeError):
  """No usable checkpoint, or one that does not fit the run."""


_sha256 = hashing.sha256_file


def _files(step_dir: str) -> list[str]:
  out = []
  for root, dirs, files in os.walk(step_dir):
    dirs.sort()
    for name in sorted(files):
      rel = os.path.relpath(os.path.join(root, name), step_dir)
      if rel not in (SEAL, _SEAL_TMP):
        out.append(rel)
  return out


def seal(step_dir: str) -> None:
  """Write the checksum manifest of a finished checkpoint directory (atomically).

  ``andrea_checksums.json`` = ``{"version": 1, "files": {relative path: {"size", "sha256"}}}``.
  """
  manifest = {rel: {"size": os.path.getsize(os.path.join(step_dir, rel)),
                    "sha256": _sha256(os.path.join(step_dir, rel))} for rel in _files(step_dir)}
  text = json.dumps({"version": 1, "files": manifest}, indent=0, sort_keys=True)
  # Removed after a failure (a full disk): the checkpoint stays trusted on its commit markers.
  out = storage.AtomicFile(os.path.join(step_dir, SEAL), f"{step_dir} is complete but not sealed",
                           "w", tmp=os.path.join(step_dir, _SEAL_TMP))
  out.write(text)
  out.commit()


def _read_json(path: str) -> tuple[Any, str | None]:
  """``(value, None)``, or ``(None, why)`` for a missing, huge or malformed JSON file."""
  try:
    size = os.path.getsize(path)
    if size > _MAX_JSON_BYTES:
      return None, f"{path} holds {size} bytes of metadata (more than {_MAX_JSON_BYTES})"
    with open(path, "rb") as f:
      return json.loads(f.read()), None
  except FileNotFoundError:
    return None, f"{path} is missing"
  except (OSError, ValueError, RecursionError) as e:   # bad JSON or UTF-8 (ValueErrors); too deep
    return None, f"{path} is not valid JSON ({type(e).__name__}: {e})"


def _seal_problem(step_dir: str, seal_path: str) -> str | None:
  """Why the seal is unusable or a file disagrees with it; ``None`` if every file matches."""
  manifest, why = _read_json(seal_path)
  if why:
    return why
  files = manifest.get("files") if isinstance(manifest, dict) else None
  if not isinstance(files, dict):
    return f"{seal_path} is malformed (no 'files' object)"
  for rel, want in files.items():
    # A hostile seal must not make us open anything outside the checkpoint.
    parts = rel.replace("\\", "/").split("/")
    if os.path.isabs(rel) or ".." in parts or "" in parts or rel in (SEAL, _SEAL_TMP):
      return f"{seal_path} lists {rel!r}, a path outside the checkpoint"
    if (not isinstance(want, dict) or not checks.is_integer(want.get("size")) or want["size"] < 0
        or not isinstance(want.get("sha256"), str) or not _SHA256.fullmatch(want["sha256"])):
      return f"{seal_path} has a malformed entry for {rel!r}: {want!r}"
  for rel, want in sorted(files.items()):
    p = os.path.join(step_dir, rel)
    if not os.path.isfile(p):
      return f"{p} is missing"
    size = os.path.getsize(p)
    if size != want["size"]:
      return f"{p} has {size} bytes, {want['size']} were written"
    if _sha256(p) != want["sha256"]:
      return f"{p} does not match its SHA-256"
  extra = sorted(set(_files(step_dir)) - set(files))
  if extra:
    return f"{os.path.join(step_dir, extra[0])} was not part of the checkpoint"
  return None


def verify(step_dir: str) -> str | None:
  """Why ``step_dir`` cannot be trusted, or ``None`` if it can.

  Checks, in this order and before any array is read: the directory is not itself a link; nothing
  inside is a link pointing outside it or a special file (FIFO, device, socket); orbax's commit
  markers are present; when sealed, the seal is well formed, names only files inside the directory,
  and every file has its recorded size and SHA-256, none missing and none added; orbax's JSON
  metadata (``state/_METADATA``, ``meta/metadata``, ``_CHECKPOINT_METADATA``, ``state/_sharding``,
  ``state/array_metadatas/*``) parses. An unsealed checkpoint (a kill between the write and the
  seal) is trusted on its commit markers and metadata.

  Example:
    >>> verify("runs/tiny/checkpoints/250") is None
    True
  """
  if os.path.islink(step_dir):
    return f"{step_dir} is a link to {os.path.realpath(step_dir)}, not a checkpoint directory"
  if not os.path.isdir(step_dir):
    return f"{step_dir} is not a directory"
  root = os.path.realpath(step_dir)
  for dirpath, dirnames, filenames in os.walk(step_dir):
    for name in dirnames + filenames:
      p = os.path.join(dirpath, name)
      mode = os.lstat(p).st_mode
      if stat.S_ISLNK(mode):
        target = os.path.realpath(p)
        if not (target == root or target.startswith(root + os.sep)):
          return f"{p} is a link to {target}, outside the checkpoint"
      elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return f"{p} is not a regular file"
  for marker_dir in (step_dir, os.path.join(step_dir, "state"), os.path.join(step_dir, "meta")):
    if not os.path.isfile(os.path.join(marker_dir, _COMMIT)):
      return f"{os.path.join(marker_dir, _COMMIT)} (commit marker) is missing"
  seal_path = os.path.join(step_dir, SEAL)
  if os.path.exists(seal_path):
    problem = _seal_problem(step_dir, seal_path)
    if problem:
      return problem
  array_dir = os.path.join(step_dir, "state", "array_metadatas")
  optional = list(_OPTIONAL_JSON)
  if os.path.isdir(array_dir):
    optional += [f"state/array_metadatas/{n}" for n in sorted(os.listdir(array_dir))]
  for rel in _REQUIRED_JSON + tuple(optional):
    p = os.path.join(step_dir, rel)
    if rel in optional and not os.path.exists(p):
      continue
    value, why = _read_json(p)
    if why:
      return why
    if not isinstance(value, dict):
      return f"{p} holds a JSON {type(value).__name__}, not an object"
  return None


def reader(directory: str) -> ocp.CheckpointManager:
  """A manager that reads the checkpoints of ``directory`` and writes nothing (``create=False``,
  no custom root metadata); the items of :class:`Checkpoints`, ``state`` through the PyTree handler
  (the format StandardCheckpointHandler writes), which can restore a part of the tree."""
  return ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(create=False,
                                                      enable_async_checkpointing=False),
      item_handlers={"state": ocp.PyTreeCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()})


def saved_steps(directory: str) -> list[int]:
  """Steps of the checkpoint ``directory`` that pass :func:`verify`, ascending (``[]`` when the
  directory does not exist)."""
  if not os.path.isdir(directory):
    return []
  steps = sorted(int(n) for n in os.listdir(directory) if n.isdigit())
  return [s for s in steps if verify(os.path.join(directory, str(s))) is None]


def newest_meta(directory: str) -> tuple[int, dict] | None:
  """``(step, meta)`` of the newest checkpoint of ``directory`` that verifies, its arrays left
  unread and nothing written (what a run checks before it builds anything); ``None`` when there
  is none."""
  steps = saved_steps(directory)
  if not steps:
    return None
  mngr = reader(directory)
  try:
    meta = mngr.restore(steps[-1], args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
  finally:
    mngr.close()
  return steps[-1], meta if isinstance(meta, dict) else {}


class Checkpoints:
  """Asynchronous checkpoints of a pytree ``state`` and a JSON ``meta`` dict under ``directory``.

  ``keep`` newest checkpoints are kept, and with ``keep_period`` also every one at a multiple of it.

  Example:
    >>> ckpts = Checkpoints("runs/tiny/checkpoints", keep=3)
    >>> ckpts.save(250, state, {"step": 250})          # returns once the arrays are copied
    >>> step, state, meta = ckpts.restore_latest(abstract_state)
    >>> ckpts.close()
  """

  def __init__(self, directory: str, *, keep: int = 3, keep_period: int = 0):
    self.directory = os.path.abspath(directory)
    self._primary = jax.process_index() == 0
    if self._primary and os.path.isdir(self.directory):
      # A kill while sealing leaves the seal's temporary file; orbax removes its own temporaries.
      for name in os.listdir(self.directory):
        leftover = os.path.join(self.directory, name, _SEAL_TMP)
        if name.isdigit() and os.path.isfile(leftover) and not os.path.islink(leftover):
          os.remove(leftover)
      self._empty_deleting(remove=True)   # no manager yet: nothing can be renaming into it
    # keep_period: a checkpoint at a multiple of it is kept beyond the newest ``keep`` (a basin to
    # measure later, e.g. ANDREA-120M's step 112,000 next to the v3 pivot).
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, keep_period=keep_period or None,
                                           enable_async_checkpointing=True,
                                           cleanup_tmp_directories=True, create=True,
                                           todelete_subdir=_DELETING)
    with storage.writing(self.directory, "No checkpoint was written: free some space and run "
                         "the same command again"):
      self._mngr = ocp.CheckpointManager(
          self.directory, options=options,
          item_handlers={"state": ocp.StandardCheckpointHandler(),
                         "meta": ocp.JsonCheckpointHandler()})
    self._sealers: list[threading.Thread] = []
    self._seal_failures: list[tuple[int, BaseException]] = []
    self._pending: int | None = None   # the step of the save in flight

  def all_steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def _empty_deleting(self, *, remove: bool = False) -> None:
    """Removes the steps orbax renamed into ``deleting/``; the directory itself only if ``remove``.

    While the manager is open the directory must stay: orbax creates it, then renames a step into
    it, from its own thread; removing it in between made that rename, and the run, fail.
    """
    root = os.path.join(self.directory, _DELETING)
    if remove:
      shutil.rmtree(root, ignore_errors=True)
      return
    try:
      names = os.listdir(root)
    except FileNotFoundError:
      return
    for name in names:
      path = os.path.join(root, name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        try:
          os.remove(path)
        except FileNotFoundError:
          pass

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Start an asynchronous save of ``state`` at ``step``; returns once the arrays are copied.

    Raises :class:`andrea_jax.storage.WriteError` when this save, or the previous one (which
    finished in the background), could not be written for want of room or permission: the step
    was not saved (orbax renames a step into place only once all of it is written) and the
    checkpoints before it are intact.
    """
    self._finish_pending()   # orbax's save would wait for it: its failure is its own step's
    self._pending = step
    with self._writing(step):
      self._mngr.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
    if self._primary:
      t = threading.Thread(target=self._seal_when_done, args=(step,), daemon=True)
      t.start()
      self._sealers.append(t)

  def _writing(self, step: int):
    """Turns a failed write of ``step`` into a ``WriteError`` that says what is intact."""
    return storage.writing(os.path.join(self.directory, str(step)),
                           lambda: self._after_failure(step))

  def _after_failure(self, step: int) -> str:
    complete = [s for s in _final_steps(self.directory) if s != step]
    again = "free some space, then run the same command again"
    if step in _final_steps(self.directory):
      return (f"The checkpoint at step {step} was written whole but not sealed (it is trusted "
              f"on orbax's commit markers): {again} to resume from it")
    if not complete:
      return f"No checkpoint was saved before it: {again} (it starts from step 0)"
    return (f"The checkpoint at step {step} was not saved; the newest complete one, step "
            f"{complete[-1]} in {self.directory}, is intact: {again} to resume from it")

  def _finish_pending(self) -> None:
    """Waits for the save in flight; a failed write raises, for its own step."""
    if self._pending is not None:
      with self._writing(self._pending):
        self._mngr.wait_until_finished()
      self._pending = None
    for t in self._sealers:
      t.join()
    self._sealers.clear()
    if self._seal_failures:
      step, e = self._seal_failures.pop(0)
      self._seal_failures.clear()
      err = storage.write_error(e, os.path.join(self.directory, str(step)),
                                self._after_failure(step))
      if err is None:
        raise e
      raise err from e

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
    except BaseException as e:   # a full disk: raised by the next save() or wait()
      self._seal_failures.append((step, e))
      return
    self._empty_deleting()   # the steps this save pushed past keep-N

  def wait(self) -> None:
    """Block until every started save is written and sealed; raises ``WriteError`` as
    :meth:`save` does."""
    self._finish_pending()
    if self._primary:
      self._empty_deleting()

  def restore_latest(self, abstract_state: Any, fill: dict[str, Any] | None = None
                     ) -> tuple[int, Any, dict] | None:
    """``(step, state, meta)`` of the newest trustworthy checkpoint, or ``None`` if there is none.

    ``abstract_state`` (``jax.ShapeDtypeStruct`` leaves, with shardings) fixes the structure,
    shapes, dtypes and placement. Damaged checkpoints newer than the one restored are skipped with
    a warning and moved to ``damaged/``. Raises :class:`CheckpointError`, before reading any array,
    when the newest intact checkpoint does not match ``abstract_state``, or when there are
    checkpoints but every one is damaged.

    ``fill``: arrays a checkpoint written by an older version lacks (by dotted name, e.g.
    ``"rows_seen"``) and the values they take then, with a warning; every other array must match.
    """
    damaged = []
    for step in reversed(self.all_steps()):
      step_dir = os.path.join(self.directory, str(step))
      problem = verify(step_dir)
      if problem is not None:
        warnings.warn(f"skipping damaged checkpoint {step_dir}: {problem}", stacklevel=2)
        damaged.append((step, problem))
        continue
      missing = _check_arrays(self._mngr, step, abstract_state, step_dir, tuple(fill or ()))
      if missing:
        state, meta = self._restore_without(step, abstract_state, {n: fill[n] for n in missing})
        warnings.warn(f"{step_dir} was written by an older andrea_jax, without "
                      f"{', '.join(missing)}: restored without them, those start afresh "
                      f"(the logs' data/epochs count from step {step})", stacklevel=2)
      else:
        restored = self._mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        state, meta = restored.state, restored.meta
      if self._primary:
        with storage.writing(step_dir, "Nothing was written: free some space and run the same "
                             "command again"):
          self._set_aside([s for s, _ in damaged])
          if not os.path.exists(os.path.join(step_dir, SEAL)):
            seal(step_dir)   # killed before its seal: seal it now, so later damage is detected
      return step, state, meta
    if damaged:
      listing = "; ".join(f"step {s}: {p}" for s, p in damaged)
      raise CheckpointError(
          f"every checkpoint in {self.directory} is damaged ({listing}). Move the directory away "
          "to start the run from scratch.")
    return None

  def _restore_without(self, step: int, abstract_state: Any, fill: dict[str, Any]
                       ) -> tuple[Any, dict]:
    """The checkpoint's arrays, restored in the layout it was saved in (every one of them is a
    leaf of ``abstract_state`` by name: :func:`_check_arrays`), then put into ``abstract_state``'s
    structure with ``fill``'s values for the arrays it lacks."""
    mngr = reader(self.directory)   # the PyTree handler, which restores into a given layout
    try:
      is_meta = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")
      stored = mngr.item_metadata(step)["state"].tree
      wanted = {_dotted(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(
          abstract_state)[0]}
      template = jax.tree_util.tree_map_with_path(lambda p, _: wanted[_dotted(p)], stored,
                                                  is_leaf=is_meta)
      restored = mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item=template, restore_args=ocp.checkpoint_utils.construct_restore_args(template)),
          meta=ocp.args.JsonRestore()))
    finally:
      mngr.close()
    values = {_dotted(p): v for p, v in jax.tree_util.tree_flatten_with_path(restored.state)[0]}
    values.update(fill)
    paths, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
    return treedef.unflatten([values[_dotted(p)] for p, _ in paths]), restored.meta

  def _set_aside(self, steps: list[int]) -> None:
    """Move damaged steps to ``damaged/<step>.<time>``: the run writes them again as it goes."""
    if not steps:
      return
    aside = os.path.join(self.directory, DAMAGED)
    os.makedirs(aside, exist_ok=True)
    for step in steps:
      shutil.move(os.path.join(self.directory, str(step)),
                  os.path.join(aside, f"{step}.{time.time_ns()}"))
    self._mngr.reload()

  def close(self) -> None:
    """Waits for the saves in flight (raising as :meth:`wait` does) and closes the manager."""
    try:
      self.wait()
    finally:
      self._mngr.close()   # a failure already raised is not raised again
      if self._primary:
        self._empty_deleting(remove=True)   # the manager's threads are done


def _final_steps(directory: str) -> list[int]:
  """Steps with a directory under their final name (orbax renames a step there once all of it is
  written), ascending."""
  try:
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit())
  except FileNotFoundError:
    return []


def _check_arrays(mngr, step: int, abstract_state: Any, step_dir: str,
                  may_lack: tuple[str, ...] = ()) -> list[str]:
  """Compare the stored array metadata (shapes, dtypes) with the run's state before reading any;
  returns the arrays of ``may_lack`` the checkpoint does not have (an older version's)."""
  try:
    stored = mngr.item_metadata(step)["state"]
  except Exception as e:  # orbax and tensorstore raise several types for unreadable metadata
    why = str(e).split(" [tensorstore_spec=")[0]   # drop tensorstore's long spec dump
    raise CheckpointError(f"cannot read the array metadata of {step_dir}/state: {why}") from e
  if stored is None:
    raise CheckpointError(f"{step_dir}/state has no array metadata")
  is_meta = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")
  have = {_dotted(p): leaf for p, leaf in
          jax.tree_util.tree_flatten_with_path(stored, is_leaf=is_meta)[0]}
  want = jax.tree_util.tree_flatten_with_path(abstract_state)[0]
  extra = sorted(set(have) - {_dotted(p) for p, _ in want})
  if extra:   # e.g. a layer a smaller model lacks: orbax would refuse the restore with a dump
    raise CheckpointError(f"{step_dir}: the checkpoint has array(s) this run's configuration lacks "
                          f"({', '.join(repr(n) for n in extra[:5])}"
                          f"{f' and {len(extra) - 5} more' if len(extra) > 5 else ''}); it was "
                          "written by a different configuration (or another version of andrea_jax)")
  lacking = []
  for path, leaf in want:
    name = _dotted(path)
    got = have.get(name)
    if got is None and name in may_lack:
      lacking.append(name)
      continue
    if got is None or not is_meta(got):
      raise CheckpointError(f"{step_dir}: the checkpoint has no array {name!r}; it was written "
                            "by a different configuration (or an older version of andrea_jax)")
    if tuple(got.shape) != tuple(leaf.shape):
      raise CheckpointError(f"{step_dir}: {name!r} has shape {tuple(got.shape)} in the checkpoint "
                            f"but {tuple(leaf.shape)} in this run's configuration")
    if not _same_dtype(got.dtype, leaf.dtype):
      raise CheckpointError(f"{step_dir}: {name!r} has dtype {got.dtype} in the checkpoint but "
                            f"{leaf.dtype} in this run's configuration")
  return lacking


def _same_dtype(a, b) -> bool:
  try:
    return np.dtype(a) == np.dtype(b)
  except TypeError:   # extended dtypes (typed PRNG keys) have no numpy dtype
    return str(a) == str(b)


def _dotted(path) -> str:
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
  return ".".join(parts)


@dataclasses.dataclass(frozen=True)
class SavedRun:
  """One checkpoint of a run: its config (as trained), the validated run, the step, the weights."""
  config: ml_collections.ConfigDict
  run: runconfig.Run
  step: int
  params: Any       # the model's parameter pytree


def _upgraded(config: dict) -> dict:
  """A config an older version saved, in today's shape: the target gain's section (``target_gain``)
  moved under ``probes``, ``random_only``'s unused ``eta`` dropped, and each source's flat
  ``data.files`` section (every format's fields) cut to its format's own fields."""
  from andrea_jax import probes as probes_lib
  from andrea_jax.data import formats
  config = dict(config)
  if isinstance(config.get("target_gain"), dict):
    probes = dict(config.get("probes") or {})
    probes.setdefault("target_gain", {**probes_lib.probe_config("target_gain").to_dict(),
                                      **config.pop("target_gain")})
    config["probes"] = probes
  mixer = (config.get("curriculum") or {}).get("mixer")
  if isinstance(mixer, dict) and mixer.get("name") == "random_only" and "eta" in mixer:
    config["curriculum"] = {**config["curriculum"],
                            "mixer": {k: v for k, v in mixer.items() if k != "eta"}}
  files = (config.get("data") or {}).get("files")
  if isinstance(files, dict):
    upgraded = {}
    for key, section in files.items():
      if isinstance(section, dict) and section.get("format") in formats.BUILTIN:
        keep = {n for n, _, _ in formats.arguments(formats.factory(section["format"]))}
        section = {k: v for k, v in section.items()
                   if k in keep or k in formats.COMMON or k == "format"}
      upgraded[key] = section
    config["data"] = {**config["data"], "files": upgraded}
  return config


def saved_config(config: dict) -> ml_collections.ConfigDict:
  """A config as a checkpoint saved it, in today's shape (:func:`_upgraded`), with each field a
  newer version added taken at its default (a config saved before runs declared their sources
  ran over ANDREA's sixteen)."""
  from andrea_jax.config import base_config
  from andrea_jax.sources import SOURCES
  config = _upgraded(config)
  defaults = base_config(sources=config.get("sources") or SOURCES).to_dict()
  merged = dict(config)
  for section, value in defaults.items():
    if section not in merged:
      merged[section] = value
    elif isinstance(value, dict) and isinstance(merged[section], dict):
      merged[section] = {**{k: v for k, v in value.items() if k not in merged[section]},
                         **merged[section]}
  return ml_collections.ConfigDict(merged)


def load_checkpoint(workdir: str, step: int | None = None) -> SavedRun:
  """The config and parameters of checkpoint ``step`` of the run in ``workdir`` (default: newest
  that verifies), for sampling, evaluation or the terrain; reads only, so it works while a run
  trains there.

  The config is the one stored with the checkpoint (:func:`saved_config`), so the model and data
  are rebuilt as trained; the parameters (only them) are restored onto one local device. Raises
  ``FileNotFoundError`` naming the steps available when ``step`` has no trustworthy checkpoint.

  Example:
    >>> saved = load_checkpoint("runs/tiny", 500)
    >>> saved.step, saved.run.model.d_model
    (500, 128)
  """
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  steps = saved_steps(directory)
  if not steps:
    raise FileNotFoundError(f"no usable checkpoint under {directory}")
  if step is None:
    step = steps[-1]
  if step not in steps:
    problem = verify(os.path.join(directory, str(step))) if os.path.isdir(
        os.path.join(directory, str(step))) else "not saved"
    raise FileNotFoundError(f"no usable checkpoint for step {step} under {directory} ({problem}); "
                            f"saved steps: {steps}")
  mngr = reader(directory)
  try:
    meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    config = saved_config(meta["config"])
    run = runconfig.build(config)
    # Only the parameters: the rest of the state (optimizer, curriculum, detector) is not needed,
    # and its layout may differ between versions of the trainer.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = {"params": jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
        jax.eval_shape(init_params, run.model, jax.random.PRNGKey(0)))}
    params = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
        partial_restore=True))).state["params"]
  finally:
    mngr.close()
  return SavedRun(config=config, run=run, step=int(meta.get("step", step)), params=params)

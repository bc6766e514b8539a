"""A full disk at each write site: a clear error naming the file, the previous checkpoint, manifest
or log left whole, nothing half-written under a final name, and the run resumed afterwards equal
to the uninterrupted one. The disk is not filled: tests/faults/enospc.py injects ``ENOSPC``."""

import errno
import json
import os
import re
import warnings

import numpy as np
import pytest

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import logs
from andrea_jax import storage
from andrea_jax.data import SourceSpec, cache, load_tokenizer, prepare
from andrea_jax.data import manifest as mf
from tests.faults import corrupt, enospc, harness

FULL = "No space left on device (ENOSPC)"


@pytest.fixture
def inject():
  """``inject(site, at)`` (tests/faults/enospc.py); returns the undo, which runs at the end
  anyway."""
  pending = []

  def do(site, at):
    undo = enospc.inject(site, at)

    def once():
      if undo in pending:
        pending.remove(undo)
        undo()
    pending.append(undo)
    return once

  yield do
  for undo in reversed(pending):
    undo()


def _tree(d) -> dict[str, bytes]:
  return {n: (d / n).read_bytes() for n in sorted(os.listdir(d))}


# --- checkpoints -------------------------------------------------------------------------------


# orbax's failed background commit leaves an asyncio callback on a closed loop (its own noise).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("site", ["checkpoint", "commit"])
def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(site, inject, tmp_path):
  directory = tmp_path / "checkpoints"
  ckpts = ckpt_lib.Checkpoints(str(directory), keep=5)
  for step in (1, 2):
    ckpts.save(step, corrupt.tiny_state(step), {"step": step})
  undo = inject(site, "3")
  ckpts.save(3, corrupt.tiny_state(3), {"step": 3})   # returns: the write goes on in the background
  with pytest.raises(storage.WriteError) as e:
    # The failure surfaces at the next save (or wait): it names its own step, 3.
    ckpts.save(4, corrupt.tiny_state(4), {"step": 4})
  assert str(e.value).startswith(f"cannot write {directory}/3: {FULL[:-1]}, writing "
                                 f"{directory}/3.orbax-checkpoint-tmp/")
  assert str(e.value).endswith(
      f"The checkpoint at step 3 was not saved; the newest complete one, step 2 in {directory}, is "
      "intact: free some space, then run the same command again to resume from it")
  assert e.value.errno == errno.ENOSPC
  ckpts.close()   # does not raise the same failure again
  undo()
  assert harness.final_steps(directory) == [1, 2]   # step 3 never renamed into place
  assert any(harness.TMP_MARK in n for n in os.listdir(directory))
  # The resumed run: step 2 restored whole; it saves step 3 again, and orbax has removed the
  # partial write (before that first save).
  ckpts = ckpt_lib.Checkpoints(str(directory), keep=5)
  step, state, _ = ckpts.restore_latest(corrupt.abstract(corrupt.tiny_state(0)))
  want = corrupt.tiny_state(2)["params"]["w"]
  assert step == 2 and np.asarray(state["params"]["w"]).tobytes() == np.asarray(want).tobytes()
  ckpts.save(3, corrupt.tiny_state(3), {"step": 3})
  ckpts.close()
  assert not harness.leftovers(directory) and harness.final_steps(directory) == [1, 2, 3]
  assert ckpt_lib.verify(str(directory / "3")) is None


def test_a_full_disk_while_sealing_leaves_a_whole_checkpoint_that_is_resumed(inject, tmp_path):
  directory = tmp_path / "checkpoints"
  ckpts = ckpt_lib.Checkpoints(str(directory), keep=5)
  ckpts.save(1, corrupt.tiny_state(1), {"step": 1})
  undo = inject("seal", "2")
  ckpts.save(2, corrupt.tiny_state(2), {"step": 2})
  with pytest.raises(storage.WriteError) as e:
    ckpts.wait()
  undo()
  assert str(e.value) == (
      f"cannot write {directory}/2: {FULL[:-1]}, writing {directory}/2/andrea_checksums.json.tmp). "
      "The checkpoint at step 2 was written whole but not sealed (it is trusted on orbax's commit "
      "markers): free some space, then run the same command again to resume from it")
  ckpts.close()
  assert not (directory / "2" / ckpt_lib.SEAL).exists() and not harness.leftovers(directory)
  ckpts = ckpt_lib.Checkpoints(str(directory), keep=5)
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # not taken for damaged
    step, _, _ = ckpts.restore_latest(corrupt.abstract(corrupt.tiny_state(0)))
  ckpts.close()
  assert step == 2 and (directory / "2" / ckpt_lib.SEAL).exists()   # sealed on resume
  assert ckpt_lib.verify(str(directory / "2")) is None


# --- logs --------------------------------------------------------------------------------------


def test_a_full_disk_during_a_log_write_names_the_file_and_the_resume_drops_the_part(inject,
                                                                                  tmp_path):
  inject("log", "3")
  logger = logs.RunLogger(str(tmp_path), 0, tensorboard=False)
  for step in range(3):
    logger.write({"step": step, "loss": 3.0 - step})
  with pytest.raises(storage.WriteError) as e:
    logger.write({"step": 3, "loss": 0.5})
  metrics = tmp_path / "metrics.jsonl"
  assert str(e.value) == (
      f"cannot write {metrics}: {FULL}. Free some space, then run the same command again: it "
      "resumes from the newest checkpoint and writes the log records after it again")
  logger.close()
  kept = "".join(json.dumps({"loss": 3.0 - s, "step": s}, sort_keys=True) + "\n" for s in range(3))
  assert metrics.read_text().startswith(kept) and not metrics.read_text().endswith("\n")
  logs.truncate_jsonl(str(metrics), 3)   # a run resumed from the checkpoint at step 3
  assert metrics.read_text() == kept


def test_a_full_disk_during_a_tensorboard_write_raises_instead_of_hanging(tmp_path):
  """tensorboardX's SummaryWriter wrote from a thread: a full disk ended the thread, its queue
  (10 events) filled, and the run blocked forever on its next scalar. The events are now written
  in the caller's thread, so the failure is raised there."""
  record_writer = pytest.importorskip("tensorboardX.record_writer")
  undo = enospc._patch_open(record_writer, lambda path: (lambda data: b"w17" in data))
  try:
    logger = logs.RunLogger(str(tmp_path), 0, tensorboard=True)
    logger.write({"step": 0, "loss": 3.0})
    with pytest.raises(storage.WriteError, match=rf"^cannot write {re.escape(str(tmp_path))}/"
                                                 r"tensorboard/events\.out\.tfevents\.\S+: No "
                                                 r"space left on device \(ENOSPC\)"):
      logger.write({"step": 1, **{f"w{i}": float(i) for i in range(20)}})
    logger.close()
  finally:
    undo()


# --- data preparation --------------------------------------------------------------------------


def _sources(tmp_path) -> dict[str, SourceSpec]:
  rng = np.random.default_rng(0)
  specs = {}
  for name in ("chat", "gutenberg"):
    path = tmp_path / "in" / f"{name}.jsonl"
    path.parent.mkdir(exist_ok=True)
    docs = [" ".join(rng.choice(["alpha", "beta", name], 40)) for _ in range(60)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    specs[name] = SourceSpec(paths=(str(path),), format="jsonl", text_field="text")
  return specs


def test_a_full_disk_while_preparing_lists_nothing_partial_and_is_redone_byte_for_byte(tmp_path):
  specs, tok = _sources(tmp_path), load_tokenizer("bytes")
  clean = tmp_path / "clean"
  prepare(specs, tok, str(clean), shard_tokens=2000, progress=False)
  for site, at in (("shard", "gutenberg"), ("manifest", "3")):
    out = tmp_path / f"out-{site}"
    undo = enospc.inject(site, at)
    try:
      with pytest.raises(storage.WriteError) as e:
        prepare(specs, tok, str(out), shard_tokens=2000, progress=False)
    finally:
      undo()
    again = "free some space, then run again (it prepares the sources not listed in it)"
    # A shard is written in the staging folder beside the output folder (andrea_jax.data.commit).
    assert re.fullmatch({
        "shard": re.escape(f"cannot write {out.parent}/.{out.name}.staging-") + r"\d+"
                 + re.escape(f"/gutenberg.train.00000.bin: {FULL}. Nothing of source 'gutenberg' "
                             "changed in the prepared folder: free some space, then run again "
                             "(it prepares this source again)"),
        "manifest": re.escape(f"cannot write {out}/manifest.json: {FULL}. {out}/manifest.json is "
                              f"as it was before: {again}")}[site], str(e.value)), str(e.value)
    # The manifest on disk is a whole one (its third write never replaced the second), and lists
    # nothing of the source that failed (shard) or was being listed (manifest).
    assert list(mf.read_manifest(str(out))["sources"]) == ["chat"], site
    assert not [n for n in os.listdir(out) if ".tmp" in n], site
    result = prepare(specs, tok, str(out), shard_tokens=2000, progress=False)
    assert result.prepared == ("gutenberg",) and result.skipped == ("chat",)
    assert _tree(out) == _tree(clean), site


def test_a_full_disk_while_building_a_cached_directory_leaves_nothing(tmp_path):
  path = tmp_path / "raw"

  def write(d):
    os.makedirs(d)
    (open(os.path.join(d, "a.jsonl"), "w")).close()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(d, "b.jsonl"))

  with pytest.raises(storage.WriteError, match=rf"^cannot write {tmp_path}/raw\.tmp\d+: No space "
                                               rf"left on device \(ENOSPC, writing .*b\.jsonl\)\. "
                                               rf"The partial copy was removed and {path} was "
                                               "not made"):
    cache.build_once(str(path), write, "v1")
  assert os.listdir(tmp_path) == []


# --- whole runs --------------------------------------------------------------------------------

FAULTS = ["checkpoint@6", "commit@10", "log@13", "seal@16", "shard@chat", "manifest@3"]


@pytest.mark.slow
def test_a_full_disk_at_each_write_site_then_resume_reproduces_the_uninterrupted_run(
    reference, xla_cache, tmp_path):
  """The command run again after each failure resumes from the newest complete checkpoint (before
  the data faults the prepared data is removed, so that the run prepares it again), and the
  stitched run equals the uninterrupted one bit for bit."""
  config = harness.fault_config()
  config.data.cache_dir = str(tmp_path / "cache")   # its own prepared data (not in the numbers)
  workdir = tmp_path / "run"
  faults, segments = enospc.campaign(config, workdir, FAULTS, env=harness.environment(xla_cache))
  logs_ = "\n".join(f"--- {f} rc={s.returncode} resumed={s.resumed_from} newest "
                     f"{s.newest_before}->{s.newest_after}\n{s.output[-1500:]}"
                     for f, s in zip(faults + ["none"], segments))
  assert faults == FAULTS
  outcomes = enospc.check(segments, faults, workdir, config.data.cache_dir)
  assert [(o["fault"], o["named"], o["lost"]) for o in outcomes] == [
      (f, True, []) for f in FAULTS], logs_
  # Where each one stopped: the failed checkpoint's predecessor, the checkpoint before the log
  # record, the unsealed checkpoint itself; the data faults before any step.
  assert [s.newest_after for s in segments[:-1]] == [4, 8, 12, 16, 16, 16], logs_
  assert segments[-1].returncode == 0 and segments[-1].resumed_from == 16, logs_
  assert not harness.leftovers(workdir / "checkpoints")
  assert (workdir / "metrics.jsonl").read_text() == (reference / "metrics.jsonl").read_text()
  final = f"checkpoints/{config.train.num_steps}"
  assert harness.differences(harness.read_state(workdir / final),
                             harness.read_state(reference / final)) == []

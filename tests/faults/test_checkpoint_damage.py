"""A damaged latest checkpoint is detected by its seal, named in a warning, and the previous one is
used; the resumed run writes the damaged step again."""

import os
import re
import shutil
import warnings

import numpy as np
import pytest

from andrea_jax import checkpoint as ckpt_lib
from tests.faults import corrupt, harness


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
  """Sealed checkpoints of ``tiny_state(s)`` at steps 1, 2, 3."""
  directory = tmp_path_factory.mktemp("three") / "checkpoints"
  corrupt.write_checkpoints(directory, (1, 2, 3))
  return directory


def _restore(directory):
  ckpts = ckpt_lib.Checkpoints(str(directory))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = ckpts.restore_latest(corrupt.abstract(corrupt.tiny_state(0)))
  return ckpts, out, [str(w.message) for w in caught]


def _assert_state(restored, seed):
  want = corrupt.tiny_state(seed)
  for k in ("w", "b"):
    assert restored["params"][k].tobytes() == np.asarray(want["params"][k]).tobytes()
  assert int(restored["count"]) == seed


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", corrupt.DAMAGE)
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous(kind, seed, three_steps, tmp_path):
  directory = tmp_path / "checkpoints"
  shutil.copytree(three_steps, directory)
  damaged = corrupt.damage(directory / "3", kind, np.random.default_rng(seed))
  ckpts, (step, state, meta), messages = _restore(directory)
  assert (step, meta) == (2, {"step": 2})
  _assert_state(state, 2)
  assert len(messages) == 1 and str(damaged) in messages[0], (damaged, messages)
  # Set aside, so that the resumed run saves step 3 again (instead of skipping it as saved).
  assert ckpts.all_steps() == [1, 2]
  assert [n.split(".")[0] for n in os.listdir(directory / ckpt_lib.DAMAGED)] == ["3"]
  ckpts.save(3, corrupt.tiny_state(3), {"step": 3})
  ckpts.close()
  ckpts, (step, state, _), messages = _restore(directory)
  ckpts.close()
  assert step == 3 and messages == []
  _assert_state(state, 3)


def test_two_damaged_checkpoints_fall_back_twice(three_steps, tmp_path):
  directory = tmp_path / "checkpoints"
  shutil.copytree(three_steps, directory)
  rng = np.random.default_rng(2)
  bad = [corrupt.damage(directory / "3", "flip_byte", rng),
         corrupt.damage(directory / "2", "remove_commit_marker", rng)]
  ckpts, (step, state, _), messages = _restore(directory)
  ckpts.close()
  assert step == 1
  _assert_state(state, 1)
  assert [str(b) in m for b, m in zip(bad, messages)] == [True, True]


def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(three_steps, tmp_path):
  directory = tmp_path / "checkpoints"
  shutil.copytree(three_steps, directory)
  rng = np.random.default_rng(3)
  for s in (1, 2, 3):
    corrupt.damage(directory / str(s), "truncate", rng)
  ckpts = ckpt_lib.Checkpoints(str(directory))
  with pytest.warns(UserWarning), pytest.raises(ckpt_lib.CheckpointError,
                                                match="every checkpoint in .* is damaged"):
    ckpts.restore_latest(corrupt.abstract(corrupt.tiny_state(0)))
  ckpts.close()
  assert ckpts.all_steps() == [1, 2, 3]   # nothing moved: the user decides


def test_a_checkpoint_killed_before_its_seal_is_used_and_sealed(three_steps, tmp_path):
  directory = tmp_path / "checkpoints"
  shutil.copytree(three_steps, directory)
  seal = directory / "3" / ckpt_lib.SEAL
  os.replace(seal, str(seal) + ".tmp")   # as a kill while sealing leaves it
  ckpts, (step, state, _), messages = _restore(directory)
  ckpts.close()
  assert step == 3 and messages == []
  _assert_state(state, 3)
  assert seal.exists() and not os.path.exists(str(seal) + ".tmp")
  assert ckpt_lib.verify(str(directory / "3")) is None


@pytest.mark.slow
def test_a_training_run_resumes_past_a_damaged_checkpoint_bit_for_bit(reference, xla_cache,
                                                                      tmp_path):
  """The whole job: the last checkpoint of a finished run is damaged; re-running the command warns,
  resumes from the one before, writes the last step again, and ends where the reference ended."""
  config = harness.fault_config()
  steps = config.train.num_steps
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  damaged = corrupt.damage(workdir / "checkpoints" / str(steps), "flip_byte",
                           np.random.default_rng(4))
  seg = harness.run_segment(config, workdir, "none", env=harness.environment(xla_cache),
                            rng=np.random.default_rng(0), log=tmp_path / "run.log", num_steps=steps)
  assert seg.returncode == 0, seg.output[-3000:]
  assert re.search(rf"skipping damaged checkpoint .*{re.escape(str(damaged))}", seg.output)
  assert seg.resumed_from == steps - config.train.checkpoint_every
  assert ckpt_lib.verify(str(workdir / "checkpoints" / str(steps))) is None
  assert (workdir / "metrics.jsonl").read_text() == (reference / "metrics.jsonl").read_text()
  assert harness.differences(harness.read_state(workdir / "checkpoints" / str(steps)),
                             harness.read_state(reference / "checkpoints" / str(steps))) == []


def test_steps_past_keep_go_through_a_rename_and_leftovers_are_emptied(tmp_path):
  """Keep-N deletes a step by renaming it into deleting/ first (a kill in the middle of removing the
  files then leaves nothing under a step name); what a kill leaves in deleting/ is emptied."""
  directory = tmp_path / "checkpoints"
  ckpts = ckpt_lib.Checkpoints(str(directory), keep=2)
  for step in range(1, 5):
    ckpts.save(step, corrupt.tiny_state(step), {"step": step})
  ckpts.close()
  assert sorted(os.listdir(directory)) == ["3", "4"]
  half_deleted = directory / "deleting" / "2" / "state"
  half_deleted.mkdir(parents=True)
  (half_deleted / "_METADATA").write_text("{")
  ckpts, (step, state, _), messages = _restore(directory)
  ckpts.close()
  assert step == 4 and messages == [] and sorted(os.listdir(directory)) == ["3", "4"]


def test_keep_period_keeps_every_multiple_beyond_the_newest(tmp_path):
  """keep=1 newest, plus every step at a multiple of 4: of 2, 4, ..., 14 the steps 4, 8, 12 and
  the newest, 14, remain, each sealed and restorable."""
  directory = tmp_path / "checkpoints"
  ckpts = ckpt_lib.Checkpoints(str(directory), keep=1, keep_period=4)
  for step in range(2, 15, 2):
    ckpts.save(step, corrupt.tiny_state(step), {"step": step})
  ckpts.close()
  assert sorted(int(n) for n in os.listdir(directory) if n.isdigit()) == [4, 8, 12, 14]
  assert all(ckpt_lib.verify(str(directory / str(s))) is None for s in (4, 8, 12, 14))


def test_emptying_deleting_never_races_orbaxs_rename(tmp_path):
  """Orbax moves a step past keep-N with ``mkdir(deleting)`` then ``rename(step, deleting/step)``,
  from its own thread; our sealer thread empties ``deleting/`` meanwhile. The interleaving that
  crashed a training run under load: the directory removed between the two. Emptying must keep it,
  and remove only what orbax already moved there."""
  directory = tmp_path / "checkpoints"
  ckpts = ckpt_lib.Checkpoints(str(directory), keep=2)
  moved = directory / "deleting" / "1"
  moved.mkdir(parents=True)                       # a step orbax already renamed
  (moved / "x").write_text("old")
  (directory / "deleting" / "stray").write_text("a file")
  step = directory / "7"
  step.mkdir()
  ckpts._empty_deleting()                         # between orbax's mkdir and its rename
  assert os.listdir(directory / "deleting") == []
  os.replace(step, directory / "deleting" / "7")  # orbax's rename still finds its directory
  ckpts.close()
  assert not (directory / "deleting").exists()    # gone once the manager is closed

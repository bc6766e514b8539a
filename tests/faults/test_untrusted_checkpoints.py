"""A checkpoint directory from an untrusted source: refused before any array is read, clearly."""

import re
import shutil

import numpy as np
import pytest

from andrea_jax import checkpoint as ckpt_lib
from tests.faults import corrupt


@pytest.fixture(scope="module")
def plain_checkpoint(tmp_path_factory):
  """A sealed checkpoint of ``tiny_state(1)`` at step 1, without OCDBT (JSON array metadata)."""
  directory = tmp_path_factory.mktemp("plain") / "checkpoints"
  corrupt.write_plain_checkpoint(directory, 1, corrupt.tiny_state(1))
  return directory


def _no_array_reads(ckpts):
  def read(*args, **kwargs):
    raise AssertionError("an array was read from an untrusted checkpoint")
  ckpts._mngr.restore = read


def test_the_intact_plain_checkpoint_restores(plain_checkpoint, tmp_path):
  """The forgeries below start from a checkpoint that is itself accepted, bit for bit."""
  directory = tmp_path / "checkpoints"
  shutil.copytree(plain_checkpoint, directory)
  ckpts = ckpt_lib.Checkpoints(str(directory))
  state = corrupt.tiny_state(1)
  step, restored, meta = ckpts.restore_latest(corrupt.abstract(state))
  ckpts.close()
  assert (step, meta) == (1, {"step": 1})
  np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])


@pytest.mark.filterwarnings("ignore:skipping damaged checkpoint")
@pytest.mark.parametrize("case", sorted(corrupt.UNTRUSTED))
def test_an_untrusted_checkpoint_is_refused_before_reading_arrays(case, plain_checkpoint, tmp_path):
  root = tmp_path / "run"
  directory = root / "checkpoints"
  shutil.copytree(plain_checkpoint, directory, symlinks=True)
  expect = corrupt.UNTRUSTED[case](directory / "1")
  ckpts = ckpt_lib.Checkpoints(str(directory))
  _no_array_reads(ckpts)
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    ckpts.restore_latest(corrupt.abstract(corrupt.tiny_state(1)))
  ckpts.close()
  assert re.search(expect, str(e.value)), str(e.value)
  assert (directory / "1").exists()   # refused, not moved away: nothing was restored


def test_a_checkpoint_with_arrays_the_run_lacks_names_them(plain_checkpoint, tmp_path):
  """A smaller model than the one saved (a layer fewer): refused naming the extra array, before
  any array is read; not orbax's tree-mismatch dump."""
  directory = tmp_path / "checkpoints"
  shutil.copytree(plain_checkpoint, directory)
  ckpts = ckpt_lib.Checkpoints(str(directory))
  _no_array_reads(ckpts)
  state = corrupt.tiny_state(1)
  del state["params"]["b"]
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"has array\(s\) this run's configuration lacks \('params.b'\)"):
    ckpts.restore_latest(corrupt.abstract(state))
  ckpts.close()

"""Hostile prepared data through the whole job: ``train_and_evaluate`` stops with a ``DataError``
naming the file (and the position), before a checkpoint or a training step."""

import re
import shutil

import numpy as np
import pytest

from andrea_jax import data as data_lib
from andrea_jax import train
from tests.faults import corrupt, harness


@pytest.mark.parametrize("case", sorted(corrupt.HOSTILE_DATA))
def test_hostile_data_stops_the_run_with_a_clear_error(case, prepared, tmp_path):
  copy = tmp_path / "prepared"
  shutil.copytree(prepared, copy)
  expect = corrupt.HOSTILE_DATA[case](copy, np.random.default_rng(0))
  config = harness.fault_config()
  config.data.prepared_dir = str(copy)
  workdir = tmp_path / "run"
  with harness.count_compiles() as compiles:
    with pytest.raises(data_lib.DataError) as e:
      train.train_and_evaluate(config, str(workdir))
  assert re.search(expect, str(e.value)), str(e.value)
  metrics = workdir / "metrics.jsonl"
  assert not metrics.exists() or metrics.stat().st_size == 0   # no training step ran
  if case != "held-out split shorter than a window":   # the evaluator finds it, after compiling
    assert not (workdir / "checkpoints").exists()
    assert compiles.count == 0

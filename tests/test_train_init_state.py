"""``train.init_state`` called as the README shows it (un-jitted), then the donated ``jit_step``."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import runconfig
from andrea_jax import step as step_lib
from andrea_jax import train
from tests.util import small_run_config


def _shared_buffers(state):
  """Groups of leaf paths that point at one device buffer (XLA cannot donate such a buffer)."""
  by_pointer = {}
  for path, x in jax.tree_util.tree_leaves_with_path(state):
    by_pointer.setdefault(x.unsafe_buffer_pointer(), []).append(jax.tree_util.keystr(path))
  return [paths for paths in by_pointer.values() if len(paths) > 1]


@pytest.mark.parametrize("strategy", ["andrea", "bandit_only", "random_only", "static", "exp3",
                                      "elastic"])
@pytest.mark.parametrize("baseline", ["mixture", "total"])
def test_every_leaf_of_a_fresh_state_owns_its_buffer(strategy, baseline):
  c = small_run_config(cliff__baseline=baseline, cliff__respond=True)
  c.curriculum.strategy = strategy
  state = train.init_state(runconfig.build(c), train.run_keys(0))
  assert _shared_buffers(state) == []


def test_the_readme_sequence_runs_one_donated_step():
  c = small_run_config()
  run = runconfig.build(c)
  keys = train.run_keys(0)
  state = train.init_state(run, keys)
  T, B = c.data.seq_len, c.data.global_batch_size
  tokens = np.random.default_rng(0).integers(0, run.model_config.vocab_size, (B, T + 1), np.int32)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "segment_ids": np.ones((B, T), np.int32),
           "positions": np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
           "source_ids": np.arange(B, dtype=np.int32) % len(run.sources)}
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  new_state, metrics = step_lib.jit_step(run.step_config)(state, batch)
  assert int(new_state.step) == 1 and bool(metrics["finite"])
  # Freshly initialised logits are near 0, so the loss on uniform random tokens is about ln(V).
  assert float(metrics["loss"]) == pytest.approx(math.log(run.model_config.vocab_size), abs=0.1)
  # Every source got B / S rows of T tokens.
  np.testing.assert_array_equal(np.asarray(metrics["source_tokens"]), B // len(run.sources) * T)
  # The caller's keys were not donated with the state: a second state can still be built from them.
  again = train.init_state(run, keys)
  np.testing.assert_array_equal(np.asarray(again.curriculum.key), np.asarray(keys["curriculum"]))

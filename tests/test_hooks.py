"""A caller's hooks: called at their cadence with the state after the step, their records in
metrics.jsonl in step order, written again exactly by a resumed run."""

import json

import jax
import numpy as np
import optax
import pytest

from andrea_jax import checkpoint, hooks, train
from tests.util import small_run_config


def test_a_hook_is_due_at_multiples_of_every_or_by_its_own_rule():
  h = hooks.Hook(every=4, fn=lambda info: None)
  assert [d for d in range(1, 13) if h.is_due(d)] == [4, 8, 12]
  assert not any(hooks.Hook(0, h.fn).is_due(d) for d in range(1, 13))
  odd = hooks.Hook(4, h.fn, due=lambda done: done % 2 == 1)
  assert [d for d in range(1, 8) if odd.is_due(d)] == [1, 3, 5, 7]


def test_a_hook_that_returns_no_mapping_is_refused_naming_it():
  def bad(info):
    return [1.0]
  wrapped = hooks.recorded(hooks.Hook(1, bad), logger=None, flush=lambda: None)
  with pytest.raises(TypeError, match="a hook returns a mapping .* got list from bad"):
    wrapped.fn(hooks.StepInfo(1, None, None, None, "w"))


def _norm(info):
  return {"weights/norm": float(optax.tree_utils.tree_norm(info.state.params)),
          "weights/step": int(jax.device_get(info.state.step))}


@pytest.mark.slow
def test_hook_records_follow_the_steps_and_a_resumed_run_writes_them_again(tmp_path, data_cache):
  """20 steps, a hook every 5: its records at steps 5, 10, 15, 20, each holding the state after
  that many steps (its step counter, and at the checkpoint of step 10 the norm of the checkpoint's
  weights); in one go, as 7 + 13 and as 10 + 10 (resumed where the hook is due: it runs again at
  the start, with no step's metrics), the same metrics.jsonl."""
  c = small_run_config(num_steps=20)
  c.train.checkpoint_every = 10
  calls = []

  def norm_and_note(info):
    calls.append((info.step, info.metrics is None))
    return _norm(info)

  norm = hooks.Hook(every=5, fn=norm_and_note)
  train.train_and_evaluate(c, str(tmp_path / "whole"), hooks=[norm])
  for stop, name in ((7, "parts"), (10, "tens")):
    c.train.stop_step = stop
    train.train_and_evaluate(c, str(tmp_path / name), hooks=[norm])
    c.train.stop_step = 0
    calls.clear()
    train.train_and_evaluate(c, str(tmp_path / name), hooks=[norm])
  assert calls[0] == (10, True) and calls[1:] == [(15, False), (20, False)]
  read = lambda run: [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").open()]
  whole = read("whole")
  assert read("parts") == whole and read("tens") == whole
  mine = [r for r in whole if "weights/norm" in r]
  assert [(r["step"], r["weights/step"]) for r in mine] == [(5, 5), (10, 10), (15, 15), (20, 20)]
  steps = [r["step"] for r in whole]
  assert steps == sorted(steps)   # a hook's record comes after the records of earlier steps
  saved = checkpoint.load_checkpoint(str(tmp_path / "whole"), step=10)
  want = float(np.sqrt(sum(float(np.sum(np.square(np.asarray(x, np.float64))))
                           for x in jax.tree.leaves(saved.params))))
  np.testing.assert_allclose(mine[1]["weights/norm"], want, rtol=1e-5)


@pytest.mark.slow
def test_epochs_are_the_rows_the_sampler_allocated_over_the_training_tokens(tmp_path, data_cache):
  """``data/epochs/<source>`` after each step equals, computed apart on the host, the rows the
  sampler allocates each step to the source for the logged mixture (``MixtureSampler.counts``,
  summed over the steps so far) times ``seq_len`` over the source's training tokens."""
  from andrea_jax import data as data_lib, runconfig
  c = small_run_config(num_steps=12)
  c.train.log_every = 1
  train.train_and_evaluate(c, str(tmp_path / "run"))
  run = runconfig.build(c)
  data = data_lib.open_training_data(run.data, required=run.evaluated, progress=False)
  sampler = data_lib.MixtureSampler(data, seq_len=c.data.seq_len,
                                    global_batch_size=c.data.global_batch_size, seed=c.seed)
  records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()
             if "loss" in json.loads(line)]
  rows = np.zeros(len(run.sources))
  for rec in records:
    w = np.array([rec[f"weight/{s}"] for s in run.sources])
    rows += sampler.counts(w / w.sum(), rec["step"])
    for i, s in enumerate(run.sources):
      want = rows[i] * c.data.seq_len / data.num_tokens(s, "train")
      assert rec[f"data/epochs/{s}"] == pytest.approx(want, rel=1e-12), (rec["step"], s)

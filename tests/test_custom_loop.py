"""The README's "your own training loop" (``runconfig.build``, ``data.MixtureSampler``,
``train.init_state``, ``step.jit_step``) is the same run as ``train.train_and_evaluate``: the same
losses and the same mixture at every logged step, worked out by the two loops independently (one
reads the curriculum's schedule after every step; the other through the prefetching feed, a
decision lag ahead)."""

import numpy as np

from andrea_jax import curriculum, data, logs, runconfig, step, train
from conftest import small_run_config


def readme_loop(cfg):
  """The README's loop, as printed there (less the print)."""
  run = runconfig.build(cfg)                         # every field checked before anything compiles
  tokenizer = data.load_tokenizer(cfg.data.tokenizer)
  corpus = data.open_training_data(cfg.data, tokenizer, required=run.used_sources)
  sampler = data.MixtureSampler(corpus, seq_len=cfg.data.seq_len,
                                global_batch_size=cfg.data.global_batch_size, seed=cfg.seed)
  state = train.init_state(run, train.run_keys(cfg.seed))
  train_step = step.jit_step(run.step_config)        # donates `state`: always rebind it
  history = []
  for t in range(cfg.train.num_steps):
    # The mixture of step t: the curriculum (on device, inside the step) fixed it by now.
    w_S = np.asarray(curriculum.weights_at(curriculum.schedule(state.curriculum), t), np.float64)
    state, metrics = train_step(state, sampler.batch(t, w_S))
    history.append((float(metrics["loss"]), w_S))
  return state, history


def test_the_readme_loop_is_the_same_run_as_train_and_evaluate(tmp_path, data_cache):
  cfg = small_run_config(num_steps=30)
  _, history = readme_loop(cfg)
  train.train_and_evaluate(cfg, str(tmp_path))
  records = [r for r in logs.read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r
             and "eval/mean" not in r]
  assert [r["step"] for r in records] == [4, 9, 14, 19, 24, 29]
  for r in records:
    loss, w_S = history[r["step"]]
    np.testing.assert_allclose(loss, r["loss"], rtol=1e-5, err_msg=f"step {r['step']}")
    run_w = [r[f"weight/{s}"] for s in runconfig.build(cfg).sources]
    np.testing.assert_allclose(w_S, run_w, atol=1e-6, err_msg=f"step {r['step']}")
  # The run crosses all three regimes, so the loop followed a schedule that moved.
  assert np.abs(history[-1][1] - history[0][1]).sum() > 0.5

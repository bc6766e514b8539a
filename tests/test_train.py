"""The training system: a one-step golden test against PyTorch, the loop end to end, resume, halting."""

import os
import shutil
import signal
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import convert
from andrea_jax import logs
from andrea_jax import runconfig
from andrea_jax import step as step_lib
from andrea_jax import train
from andrea_jax.model import init_params
from tests.util import REPO, small_run_config, tensorboard_scalars
from tests.faults import harness


def _fixed_batch(rng, B, T, vocab, num_sources):
  """One document per row (no end-of-document inside), as the Hugging Face model sees text."""
  tokens = rng.integers(0, vocab - 1, size=(B, T + 1)).astype(np.int32)
  return {
      "inputs": tokens[:, :-1], "targets": tokens[:, 1:],
      "segment_ids": np.ones((B, T), np.int32),
      "positions": np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
      "source_ids": rng.integers(0, num_sources, size=(B,)).astype(np.int32),
  }


def test_one_step_golden_against_pytorch():
  """One AdamW step of ours equals one step of transformers' GPT-2 + torch.optim.AdamW."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  c = small_run_config()
  c.optim.update(warmup_steps=0, schedule="constant", peak_lr=1e-3, weight_decay=0.1, grad_clip=1.0)
  run = runconfig.build(c)
  mcfg = run.model_config
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  batch = _fixed_batch(np.random.default_rng(0), 4, 32, mcfg.vocab_size, 16)

  # The reference: the same weights in PyTorch, cross-entropy, clip_grad_norm_, AdamW.
  hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**convert.hf_gpt2_config(mcfg)))
  sd = convert.to_hf_state_dict(state.params, mcfg)
  hf.load_state_dict({k: torch.tensor(np.array(v)) for k, v in sd.items()}, strict=False)
  hf.float().train()
  for m in hf.modules():   # no dropout in ours
    if isinstance(m, torch.nn.Dropout):
      m.p = 0.0
  decay = [p for p in hf.parameters() if p.dim() >= 2]
  no_decay = [p for p in hf.parameters() if p.dim() < 2]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
  logits = hf(torch.tensor(batch["inputs"], dtype=torch.long)).logits
  ref_loss = torch.nn.functional.cross_entropy(
      logits.reshape(-1, logits.shape[-1]), torch.tensor(batch["targets"], dtype=torch.long).reshape(-1))
  ref_loss.backward()
  ref_norm = torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
  opt.step()

  step_fn = step_lib.jit_step(run.step_config)
  new_state, metrics = step_fn(state, {k: jnp.asarray(v) for k, v in batch.items()})
  assert float(metrics["loss"]) == pytest.approx(ref_loss.item(), rel=1e-5)
  assert float(metrics["grad_norm"]) == pytest.approx(float(ref_norm), rel=1e-4)
  ours = convert.to_hf_state_dict(new_state.params, mcfg)
  ref = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  for name, value in ours.items():
    if name in ref:
      np.testing.assert_allclose(value, ref[name], atol=2e-6, rtol=1e-4, err_msg=name)
  assert int(new_state.step) == 1


def test_per_source_losses_are_segment_means():
  loss = jnp.array([[1.0, 3.0], [2.0, 2.0], [5.0, 7.0]])
  mask = jnp.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
  loss_S, tokens_S = step_lib.per_source_sums(loss * mask, mask, jnp.array([2, 0, 2]), 3)
  np.testing.assert_allclose(loss_S, [2.0, 0.0, 16.0])
  np.testing.assert_allclose(tokens_S, [1.0, 0.0, 4.0])


def test_gradient_accumulation_equals_the_full_batch():
  c = small_run_config()
  run1 = runconfig.build(c)
  c.optim.grad_accum_steps = 4
  run4 = runconfig.build(c)
  params = init_params(run1.model_config, jax.random.PRNGKey(1))
  batch = {k: jnp.asarray(v) for k, v in _fixed_batch(np.random.default_rng(1), 8, 32, 257, 16).items()}
  l1, g1, s1, t1 = step_lib.loss_and_grads(run1.step_config, params, batch)
  l4, g4, s4, t4 = step_lib.loss_and_grads(run4.step_config, params, batch)
  np.testing.assert_allclose(l1, l4, rtol=1e-6)
  np.testing.assert_allclose(s1, s4, rtol=1e-5)
  np.testing.assert_array_equal(t1, t4)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_non_finite_steps_change_nothing_and_halt_after_the_limit():
  c = small_run_config()
  c.train.max_nonfinite_steps = 3
  run = runconfig.build(c)
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  # An infinite LayerNorm scale makes the loss NaN: the step must leave params and moments alone.
  params = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.full_like(x, jnp.inf) if "ln_f" in jax.tree_util.keystr(p) else x,
      state.params)
  state = state.replace(params=params)
  batch = {k: jnp.asarray(v) for k, v in _fixed_batch(np.random.default_rng(2), 4, 32, 257, 16).items()}
  step_fn = jax.jit(lambda s, b: step_lib.train_step(run.step_config, s, b))
  before = jax.device_get(state)
  halted = []
  for _ in range(4):
    state, m = step_fn(state, batch)
    assert not bool(m["finite"])
    halted.append(int(m["halted_at"]))
  after = jax.device_get(state)
  for a, b in zip(jax.tree.leaves(before.params) + jax.tree.leaves(before.opt_state),
                  jax.tree.leaves(after.params) + jax.tree.leaves(after.opt_state)):
    np.testing.assert_array_equal(a, b)
  assert int(after.step) == 4
  assert halted == [-1, -1, 0, 0]   # the third bad step in a row reaches the limit; the streak began at 0


def test_a_halt_between_log_steps_saves_nothing_past_it_and_ends_in_the_error(tmp_path):
  # A huge learning rate makes steps non-finite from step 2 on; the limit (3) is reached at step
  # 4, between log steps (every 10) and before the stop at 7: neither the checkpoint at 5 nor the
  # end may save the halted state or report success.
  from andrea_jax import logs
  c = small_run_config(num_steps=20)
  c.train.update(log_every=10, checkpoint_every=5, max_nonfinite_steps=3, stop_step=7)
  c.optim.update(peak_lr=1e9, warmup_steps=1)
  with pytest.raises(train.TrainingHalted, match=r"3 consecutive steps .* \(steps 2..4\)"):
    train.train_and_evaluate(c, str(tmp_path / "run"))
  assert os.listdir(tmp_path / "run" / "checkpoints") == []
  assert not [r for r in logs.read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
              if "eval/mean_loss" in r]   # no final evaluation of a halted run


def test_a_streak_under_the_limit_is_resumed_as_saved(tmp_path):
  # Steps are non-finite from step 2 on (as above); the first part stops at step 4 with a streak
  # of 2 (steps 2, 3), under the limit of 3. Resumed, the run halts where the uninterrupted run
  # does, at the third bad step (steps 2..4): re-running must not undo a halt.
  c = small_run_config(num_steps=20)
  c.train.update(log_every=10, checkpoint_every=5, max_nonfinite_steps=3, stop_step=4)
  c.optim.update(peak_lr=1e9, warmup_steps=1)
  summary = train.train_and_evaluate(c, str(tmp_path / "run"))
  assert summary["stopped_at"] == 4
  c.train.stop_step = 0
  for _ in range(2):   # and again: the checkpoint at 4 still holds the streak
    with pytest.raises(train.TrainingHalted, match=r"3 consecutive steps .* \(steps 2..4\)"):
      train.train_and_evaluate(c, str(tmp_path / "run"))
  # Changed as the halt suggests (a rate still too high here): the new values start a fresh
  # count, so the halt comes two steps later, at steps 4..6.
  c.optim.peak_lr = 1e8
  with pytest.raises(train.TrainingHalted, match=r"3 consecutive steps .* \(steps 4..6\)"):
    train.train_and_evaluate(c, str(tmp_path / "run"))


def test_a_non_finite_update_from_a_finite_gradient_changes_nothing():
  # An optimizer whose update overflows (a rate of inf): loss and gradient are finite, the new
  # weights are not. The step is skipped like any non-finite one.
  import dataclasses

  import optax
  c = small_run_config()
  run = runconfig.build(c)
  cfg = dataclasses.replace(run.step_config, tx=optax.scale(float("inf")))
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  state = state.replace(opt_state=cfg.tx.init(state.params))
  batch = {k: jnp.asarray(v) for k, v in _fixed_batch(np.random.default_rng(2), 4, 32, 257, 16).items()}
  new, m = jax.jit(lambda s, b: step_lib.train_step(cfg, s, b))(state, batch)
  assert np.isfinite(float(m["loss"])) and np.isfinite(float(m["grad_norm"]))
  assert not bool(m["finite"]) and int(new.nonfinite_streak) == 1
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(new.params)):
    np.testing.assert_array_equal(a, b)
  assert bool(step_lib.all_finite({"a": jnp.ones(3), "b": jnp.zeros((2, 2))}))
  assert not bool(step_lib.all_finite({"a": jnp.ones(3), "b": jnp.array([0.0, jnp.nan])}))


def test_a_workdir_that_cannot_be_one_is_refused_before_training(tmp_path):
  afile = tmp_path / "afile"
  afile.write_text("x")
  for bad, match in ((afile, "is a file, not a directory"), ("", "must be a directory path"),
                     (afile / "sub", "cannot create the workdir")):
    with pytest.raises(ValueError, match=match):
      train.train_and_evaluate(small_run_config(), str(bad))
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "checkpoints").write_text("x")
  with pytest.raises(ValueError, match=r"run/checkpoints is a file, not a directory"):
    train.make_workdir(str(tmp_path / "run"))


def test_processes_holding_unequal_numbers_of_devices_are_refused(monkeypatch):
  # Three processes holding 1, 2 and 3 devices: the batch slices would not line up. Every process
  # sees the same list, the middle one (2, the mean) included, so all of them refuse.
  import types
  fake = [types.SimpleNamespace(process_index=p) for p in (0, 1, 1, 2, 2, 2)]
  monkeypatch.setattr(jax, "devices", lambda: fake)
  with pytest.raises(ValueError, match=r"unequal numbers of devices \(process 0: 1, process 1: 2, "
                                       r"process 2: 3\)"):
    runconfig.build(small_run_config())


def test_a_resume_on_other_data_says_so(tmp_path, capsys):
  # The built-in corpus at another scale: other documents, other shards (and a changed config).
  c = small_run_config(num_steps=6)
  c.train.update(stop_step=3, checkpoint_every=3)
  c.eval.sample_tokens = 0
  train.train_and_evaluate(c, str(tmp_path / "run"))
  c.train.stop_step = 6
  train.train_and_evaluate(c, str(tmp_path / "run"))     # the same data: no warning
  assert "saved on other data" not in capsys.readouterr().err
  c.train.update(num_steps=9, stop_step=9)
  c.data.builtin_scale = 0.3
  train.train_and_evaluate(c, str(tmp_path / "run"))
  assert "warning: the checkpoint at step 6 was saved on other data" in capsys.readouterr().err


def test_a_geometry_that_never_starts_is_warned_about():
  # train.num_steps overridden without the geometries' start steps: the polish never comes.
  c = small_run_config(num_steps=30)
  polish = c.curriculum.geometries.v3_polish.start_step
  c.train.num_steps = polish
  with pytest.warns(UserWarning, match=rf"geometries v3_polish \({polish}\) start at or after "
                                       rf"train.num_steps = {polish}: they never come into force"):
    runconfig.build(c)


def test_no_prompts_means_no_samples_not_an_error():
  c = small_run_config()
  c.eval.prompts = ()
  assert runconfig.build(c).model_config.max_len == c.model.max_len
  # An invalid top_k is still refused when nothing is sampled (the fault campaign's base config).
  c.eval.top_k, c.eval.sample_tokens = 258, 0
  with pytest.raises(ValueError, match=r"eval.top_k = 258 exceeds the vocabulary \(257 ids"):
    runconfig.build(c)


def test_invalid_config_is_rejected_before_anything_runs(tmp_path):
  c = small_run_config()
  c.curriculum.geometries.v3_polish.floors.hermes3_general = 0.8
  c.curriculum.geometries.v3_polish.floors.chat = 0.3
  with pytest.raises(ValueError, match="floors sum to 1.1"):
    train.train_and_evaluate(c, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
  c = small_run_config()
  c.data.seq_len = 128
  with pytest.raises(ValueError, match="data.seq_len = 128 exceeds model.max_len = 64"):
    runconfig.build(c)


@pytest.mark.slow
def test_training_lowers_the_loss_and_writes_its_outputs(tmp_path, data_cache):
  c = small_run_config(num_steps=60)
  c.eval.every = 30
  c.train.plot = True
  c.train.tensorboard = True
  summary = train.train_and_evaluate(c, str(tmp_path))
  records = logs.read_jsonl(str(tmp_path / "metrics.jsonl"))
  train_losses = [r["loss"] for r in records if "loss" in r]
  evals = [r for r in records if "eval/mean_loss" in r]
  assert train_losses[0] > 4.5                    # near ln(257) = 5.55 at the start
  assert train_losses[-1] < train_losses[0] - 1.5  # and clearly lower after 60 steps
  assert [e["step"] for e in evals] == [30, 60]
  assert evals[-1]["eval/mean_loss"] < evals[0]["eval/mean_loss"]
  # Every step's weights respect its regime: only warmup sources before the firehose, polish after.
  for r in records:
    if "loss" not in r:
      continue
    w = {k[len("weight/"):]: v for k, v in r.items() if k.startswith("weight/")}
    assert abs(sum(w.values()) - 1) < 1e-5
    if r["step"] < c.curriculum.geometries.v2_firehose.start_step:
      assert w["dictionary"] == 0 and w["repo-docs"] == 0 and w["extra-01"] == 0
    if r["step"] >= c.curriculum.geometries.v3_polish.start_step:
      assert w["repo-docs"] == 0 and w["repo-docstrings"] == 0
      assert w["hermes3-general"] >= 0.7 - 1e-6 and w["dictionary"] <= 0.25 + 1e-6
  for name in ("summary.png", "samples.txt", "config.json", "throughput.jsonl"):
    assert (tmp_path / name).exists(), name
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "tensorboard"))
  assert summary["end_step"] == 60
  assert sorted(os.listdir(tmp_path / "checkpoints"))[-1] == "60"


@pytest.mark.slow
def test_sigterm_then_resume_reproduces_the_uninterrupted_run(tmp_path, data_cache):
  c = small_run_config(num_steps=40)
  reference = tmp_path / "reference"
  train.train_and_evaluate(c, str(reference))

  workdir = tmp_path / "interrupted"
  cmd = harness.command(c, workdir)
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.time() + 300
  # Wait until the first checkpoint (step 10) is committed, then send a real SIGTERM mid-run.
  while not (workdir / "checkpoints" / "10" / ckpt_lib.SEAL).exists():
    assert proc.poll() is None, proc.stdout.read().decode()
    assert time.time() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  out = proc.communicate(timeout=300)[0].decode()
  assert proc.returncode == 0, out
  assert "checkpointing and exiting" in out, out
  stopped_at = max(int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit())
  assert 10 <= stopped_at < 40, out

  out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout + out.stderr
  assert f"resuming from step {stopped_at}" in out.stdout
  assert (workdir / "metrics.jsonl").read_text() == (reference / "metrics.jsonl").read_text()


@pytest.mark.slow
def test_resuming_where_an_evaluation_was_made_rewrites_the_uninterrupted_logs(
    tmp_path, data_cache, monkeypatch):
  """Checkpoint 10 is saved right after the evaluation at step 10, and the killed run wrote on to
  step 20: the resumed run's metrics.jsonl, samples.txt and TensorBoard scalars are the
  reference's."""
  c = small_run_config(num_steps=20)
  c.eval.every = 10               # == train.checkpoint_every; log_every = 5
  c.train.tensorboard = True
  reference = tmp_path / "reference"
  # What metrics.jsonl holds when each checkpoint is saved.
  at_save = {}
  save = ckpt_lib.Checkpoints.save
  monkeypatch.setattr(ckpt_lib.Checkpoints, "save", lambda self, step, *a, **k: (
      at_save.__setitem__(step, logs.read_jsonl(str(reference / "metrics.jsonl"))),
      save(self, step, *a, **k))[1])
  summary = train.train_and_evaluate(c, str(reference))
  monkeypatch.undo()
  records = logs.read_jsonl(str(reference / "metrics.jsonl"))
  kinds = [(r["step"], "eval/mean_loss" in r) for r in records]
  assert kinds == [(4, False), (9, False), (10, True), (14, False), (19, False), (20, True)]
  # Every record of a step before k was on disk before checkpoint k was saved: a kill right after
  # it loses none of them.
  for k in (10, 20):
    assert [r for r in at_save[k] if r["step"] < k] == [r for r in records if r["step"] < k], k
  assert (reference / "samples.txt").read_text().count("=== step ") == 2
  assert summary["outputs"] == ["metrics.jsonl", "samples.txt", "tensorboard/", "checkpoints/"]

  resumed = tmp_path / "resumed"
  shutil.copytree(reference, resumed)
  # As if killed after writing the logs of step 20, before saving its checkpoint.
  shutil.rmtree(resumed / "checkpoints" / "20")
  summary = train.train_and_evaluate(c, str(resumed))
  assert summary["start_step"] == 10
  for name in ("metrics.jsonl", "samples.txt"):
    assert (resumed / name).read_text() == (reference / name).read_text(), name
  ours = tensorboard_scalars(resumed / "tensorboard")
  assert len(os.listdir(resumed / "tensorboard")) == 2
  assert ours == tensorboard_scalars(reference / "tensorboard")
  assert ("eval/mean_loss", 10, pytest.approx(records[2]["eval/mean_loss"])) in ours


def test_resuming_with_misaligned_cadences_rewrites_the_uninterrupted_logs(tmp_path, data_cache):
  """Evaluations every 6 steps, logs every 4, checkpoints every 10: none coincide at 10. The run
  resumed from checkpoint 10 writes the reference's metrics.jsonl and samples.txt; the records
  before step 10 (logs at 3, 7; evaluation at 6) are the only ones it keeps."""
  c = small_run_config(num_steps=20)
  c.train.log_every = 4
  c.eval.every = 6
  reference, resumed = tmp_path / "reference", tmp_path / "resumed"
  train.train_and_evaluate(c, str(reference))
  shutil.copytree(reference, resumed)
  shutil.rmtree(resumed / "checkpoints" / "20")
  logs.truncate_jsonl(str(resumed / "metrics.jsonl"), 10)   # what the resumed run keeps
  assert [r["step"] for r in logs.read_jsonl(str(resumed / "metrics.jsonl"))] == [3, 6, 7]
  assert train.train_and_evaluate(c, str(resumed))["start_step"] == 10
  for name in ("metrics.jsonl", "samples.txt"):
    assert (resumed / name).read_text() == (reference / name).read_text(), name


def test_a_run_stopped_at_stop_step_goes_on_as_the_uninterrupted_run(tmp_path, data_cache):
  """train.stop_step = 13 ends the call after step 13 with an evaluation and a checkpoint, its
  learning rate and mixture those of the 20-step run (the records before 13 are the reference's);
  the run resumed with stop_step = 0 writes the reference's metrics.jsonl and samples.txt."""
  c = small_run_config(num_steps=20)
  c.train.log_every = 4
  c.eval.every = 6
  reference, stopped = tmp_path / "reference", tmp_path / "stopped"
  train.train_and_evaluate(c, str(reference))
  ref = logs.read_jsonl(str(reference / "metrics.jsonl"))

  c.train.stop_step = 13
  summary = train.train_and_evaluate(c, str(stopped))
  assert (summary["stopped_at"], summary["end_step"]) == (13, 13)
  assert "interrupted_at" not in summary and summary["final_eval"]["step"] == 13
  assert {10, 13} <= set(ckpt_lib.Checkpoints(str(stopped / "checkpoints")).all_steps())
  records = logs.read_jsonl(str(stopped / "metrics.jsonl"))
  assert records[:-1] == [r for r in ref if r["step"] < 13]   # logs at 3, 7, 11; evaluations 6, 12
  assert records[-1]["step"] == 13 and "eval/mean_loss" in records[-1]

  # Going back before the checkpoint is refused; going on rewrites the uninterrupted logs.
  c.train.stop_step = 8
  before = {n: (stopped / n).read_text() for n in ("config.json", "metrics.jsonl", "samples.txt")}
  with pytest.raises(ckpt_lib.CheckpointError, match="past train.stop_step = 8"):
    train.train_and_evaluate(c, str(stopped))
  assert {n: (stopped / n).read_text() for n in before} == before   # nothing in workdir changed
  c.train.stop_step = 0
  summary = train.train_and_evaluate(c, str(stopped))
  assert (summary["start_step"], summary["end_step"], "stopped_at" in summary) == (13, 20, False)
  for name in ("metrics.jsonl", "samples.txt"):
    assert (stopped / name).read_text() == (reference / name).read_text(), name


@pytest.mark.parametrize("value, error, message", [
    (21, ValueError, "train.stop_step = 21 is past train.num_steps = 20"),
    (-1, ValueError, "train.stop_step must be >= 0, got -1"),
])
def test_a_bad_stop_step_is_refused_before_anything_runs(value, error, message):
  # (A float is refused by the ConfigDict itself: the field is typed int.)
  c = small_run_config(num_steps=20)
  c.train.stop_step = value
  with pytest.raises(error, match=message):
    runconfig.build(c)


def test_a_checkpoint_from_another_configuration_is_refused(tmp_path, data_cache):
  c = small_run_config(num_steps=10)
  c.eval.sample_tokens = 0
  train.train_and_evaluate(c, str(tmp_path))
  # Resumed with a run shorter than the checkpoint's step: refused, nothing written or saved.
  metrics = (tmp_path / "metrics.jsonl").read_text()
  shorter = small_run_config(num_steps=5)
  shorter.eval.sample_tokens = 0
  with pytest.raises(ckpt_lib.CheckpointError, match=r"the checkpoint at step 10 in .* is past "
                     r"train.num_steps = 5; resume with train.num_steps >= 10"):
    train.train_and_evaluate(shorter, str(tmp_path))
  assert (tmp_path / "metrics.jsonl").read_text() == metrics
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["10"]
  c.model.d_model = 64
  with pytest.raises(ckpt_lib.CheckpointError, match=r"has shape .* in the checkpoint but"):
    train.train_and_evaluate(c, str(tmp_path))

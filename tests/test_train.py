"""The trainer: its signature, the loop end to end, resume and its messages, halting, the state
it starts from (the step itself: tests/test_step.py)."""

import inspect
import math
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
from andrea_jax import config as config_lib
from andrea_jax import curriculum
from andrea_jax import logs
from andrea_jax import plots
from andrea_jax import resume
from andrea_jax import rundir
from andrea_jax import runconfig
from andrea_jax import step as step_lib
from andrea_jax import train
from andrea_jax import lock as lock_lib
from tests.util import REPO, small_run_config, tensorboard_scalars
from tests.faults import harness


@pytest.mark.slow
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


@pytest.mark.slow
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
    rundir.make_workdir(str(tmp_path / "run"))


def test_processes_holding_unequal_numbers_of_devices_are_refused(monkeypatch):
  # Three processes holding 1, 2 and 3 devices: the batch slices would not line up. Every process
  # sees the same list, the middle one (2, the mean) included, so all of them refuse.
  import types
  fake = [types.SimpleNamespace(process_index=p) for p in (0, 1, 1, 2, 2, 2)]
  monkeypatch.setattr(jax, "devices", lambda: fake)
  with pytest.raises(ValueError, match=r"unequal numbers of devices \(process 0: 1, process 1: 2, "
                                       r"process 2: 3\)"):
    runconfig.build(small_run_config())


@pytest.mark.slow
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
  assert runconfig.build(c).model.max_len == c.model.max_len
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
def test_training_lowers_the_loss_and_writes_its_outputs(tmp_path, data_cache, monkeypatch):
  c = small_run_config(num_steps=60)
  c.eval.every = 30
  c.train.plot = True
  c.train.tensorboard = True
  # The figure is drawn from the whole log while the run still holds its workdir (a run started
  # on it meanwhile cannot rewind the log under the plot).
  drawn = []
  draw = plots.summary_plot

  def plot_while_held(workdir, *args, **kwargs):
    holder = lock_lib.holder(workdir)
    drawn.append((holder and holder.pid, logs.read_jsonl(os.path.join(workdir, "metrics.jsonl"))))
    return draw(workdir, *args, **kwargs)
  monkeypatch.setattr(plots, "summary_plot", plot_while_held)
  summary = train.train_and_evaluate(c, str(tmp_path))
  assert len(drawn) == 1 and drawn[0][0] == os.getpid()
  assert drawn[0][1] == logs.read_jsonl(str(tmp_path / "metrics.jsonl"))
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_signature_is_the_one_callers_use():
  sig = inspect.signature(train.train_and_evaluate)
  P = inspect.Parameter
  assert [(p.name, p.kind) for p in sig.parameters.values()] == [
      ("config", P.POSITIONAL_OR_KEYWORD), ("workdir", P.POSITIONAL_OR_KEYWORD),
      ("hooks", P.KEYWORD_ONLY)]
  sig.bind(small_run_config(), "runs/x")
  # A third positional argument: the signature refuses it, and so does the function itself,
  # before it reads the config.
  with pytest.raises(TypeError):
    sig.bind(small_run_config(), "runs/x", None)
  with pytest.raises(TypeError, match="positional argument"):
    train.train_and_evaluate(small_run_config(), "runs/x", None)


def test_annotations_and_metadata_are_the_wrappers():
  f = train.train_and_evaluate
  assert f.__annotations__ == {"config": "ml_collections.ConfigDict | runconfig.Run",
                               "workdir": "str", "hooks": "Sequence[hooks_lib.Hook]",
                               "return": "dict"}
  assert not hasattr(f, "__wrapped__")
  assert f.__name__ == f.__qualname__ == "train_and_evaluate" and f.__module__ == "andrea_jax.train"
  assert f.__doc__.startswith("Train (or resume) the run ``config`` describes")


def test_changes_are_listed_by_field_and_free_fields_are_not():
  saved = {"seed": 0, "optim": {"peak_lr": 1e-3, "warmup_steps": 10},
           "train": {"num_steps": 100, "stop_step": 50, "log_every": 10},
           "eval": {"every": 25}, "mesh": {"data": 1}, "curriculum": {"prompts": ["a", "b"]}}
  current = {"seed": 7, "optim": {"peak_lr": 0.5, "warmup_steps": 10},
             "train": {"num_steps": 100, "stop_step": 0, "log_every": 1},
             "eval": {"every": 5}, "mesh": {"data": 2}, "curriculum": {"prompts": ("a", "b")},
             "cliff": {"window": 3}}
  assert resume.config_changes(saved, current) == [
      "cliff.window: (absent) -> 3", "optim.peak_lr: 0.001 -> 0.5", "seed: 0 -> 7"]


def test_the_same_config_through_json_has_no_change():
  import json
  c = config_lib.base_config()
  saved = json.loads(json.dumps(c.to_dict()))   # what the checkpoint's meta holds
  assert resume.config_changes(saved, c.to_dict()) == []
  assert resume.config_changes(None, c.to_dict()) == []
  c.curriculum.mixer.eta = 0.25
  assert resume.config_changes(saved, c.to_dict()) == [
      f"curriculum.mixer.eta: {saved['curriculum']['mixer']['eta']!r} -> 0.25"]


def test_a_cliff_names_its_source_and_offers_the_exclusion():
  rec = {"loss": 0.4123, "cliff/source": "repo-docs", "curriculum/geometry": 1}
  names = ("v2_warmup", "v2_firehose", "v3_polish")
  assert logs.cliff_message(rec, 150, names, respond=False) == (
      "zombie cliff at step 150: loss 0.412 far below its recent values; source 'repo-docs'; to "
      "exclude it, add it to curriculum.geometries.v2_firehose.exclude and resume, or train with "
      "--config.cliff.respond=True, which excludes what the detector flags")
  assert logs.cliff_message(rec, 150, names, respond=True).endswith(
      "source 'repo-docs' excluded from the next phase on")
  assert logs.cliff_message({**rec, "cliff/source": None}, 150, names, False).endswith(
      "no source named")


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
  curriculum.set_mixer(c, strategy)
  state = train.init_state(runconfig.build(c), train.run_keys(0))
  assert _shared_buffers(state) == []


@pytest.mark.slow
def test_the_readme_sequence_runs_one_donated_step():
  c = small_run_config()
  run = runconfig.build(c)
  keys = train.run_keys(0)
  state = train.init_state(run, keys)
  T, B = c.data.seq_len, c.data.global_batch_size
  tokens = np.random.default_rng(0).integers(0, run.model.vocab_size, (B, T + 1), np.int32)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "segment_ids": np.ones((B, T), np.int32),
           "positions": np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
           "source_ids": np.arange(B, dtype=np.int32) % len(run.sources)}
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  new_state, metrics = step_lib.jit_step(run.step)(state, batch)
  assert int(new_state.step) == 1 and bool(metrics["finite"])
  # Freshly initialised logits are near 0, so the loss on uniform random tokens is about ln(V).
  assert float(metrics["loss"]) == pytest.approx(math.log(run.model.vocab_size), abs=0.1)
  # Every source got B / S rows of T tokens.
  np.testing.assert_array_equal(np.asarray(metrics["source_tokens"]), B // len(run.sources) * T)
  # The caller's keys were not donated with the state: a second state can still be built from them.
  again = train.init_state(run, keys)
  np.testing.assert_array_equal(np.asarray(again.curriculum.key), np.asarray(keys["curriculum"]))


def test_a_checkpoint_from_before_the_epoch_count_resumes_with_a_fresh_count(tmp_path):
  """A state saved by an older version, without ``rows_seen``: restored whole but that array,
  which takes the value given for it, with a warning; without one, refused naming the array."""
  import flax.serialization
  from andrea_jax import checkpoint as ckpt_lib
  run = runconfig.build(small_run_config())
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  old = flax.serialization.to_state_dict(state)
  del old["rows_seen"]
  checkpoints = ckpt_lib.Checkpoints(str(tmp_path / "checkpoints"))
  try:
    checkpoints.save(5, old, {"step": 5})
    checkpoints.wait()
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    with pytest.raises(ckpt_lib.CheckpointError, match=r"no array 'rows_seen'.* older version"):
      checkpoints.restore_latest(abstract)
    sevens = jnp.full((len(run.sources),), 7, jnp.int32)
    with pytest.warns(UserWarning, match=r"older andrea_jax, without rows_seen.* from step 5"):
      step, got, _ = checkpoints.restore_latest(abstract, fill={"rows_seen": sevens})
  finally:
    checkpoints.close()
  assert step == 5 and got.rows_seen.tolist() == [7] * len(run.sources)
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, b)
  assert int(got.step) == 0 and got.curriculum.weights.shape == state.curriculum.weights.shape


def test_a_config_an_older_version_saved_builds_as_today():
  """The shape a checkpoint's config had before the probes and the data formats: the target
  gain's top-level section, random_only's eta, flat data.files sections with every format's
  fields. Read back (checkpoint.saved_config), it builds the run today's shape builds."""
  c = small_run_config()
  c.eval.target.chat = 1.0
  c.probes.target_gain.update(every=4, rows_per_source=1)
  curriculum.set_mixer(c, "andrea", reward="target_gain")
  today = c.to_dict()
  old = dict(today)
  old["target_gain"] = {k: v for k, v in today["probes"]["target_gain"].items()
                        if k not in ("name", "target_split")}
  del old["probes"], old["train"]["hooks"], old["eval"]["metrics"], old["eval"]["untrained"]
  flat = {"paths": "", "format": "jsonl", "text_field": "text", "separator": "<|endoftext|>",
          "dataset": "", "split": "train", "layout": "text", "loss_on": "all", "max_tokens": 0,
          "eval_fraction": None, "streaming": False}
  old["data"] = {**today["data"], "files": {k: dict(flat) for k in today["data"]["files"]}}
  run = runconfig.build(ckpt_lib.saved_config(old))
  (probe,) = run.step.probes
  assert (probe.name, probe.every, probe.rows["probe"]) == ("target_gain", 4, len(run.trainable))
  import dataclasses
  without = lambda d: dataclasses.replace(d, tokenizer=None)   # a tokenizer is itself alone
  assert without(run.data) == without(runconfig.build(c).data)
  assert resume.config_changes(resume._today(old), today) == []
  old["curriculum"]["mixer"] = {"name": "random_only", "eta": 0.3}
  assert runconfig.build(ckpt_lib.saved_config(old)).curriculum.mixer_name == "random_only"

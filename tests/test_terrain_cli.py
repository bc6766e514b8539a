"""``python -m andrea_jax.terrain`` on a short real run: the right checkpoint, config and batch."""

import json

import pytest

from andrea_jax import logs
from andrea_jax import train
from andrea_jax.terrain import __main__ as cli
from andrea_jax.terrain import run as terrain_run
from tests.util import small_run_config


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, data_cache):
  """10 steps of the small run, checkpoints at 5 and 10, held-out evaluations at both."""
  path = tmp_path_factory.mktemp("terrain_run")
  c = small_run_config(num_steps=10)
  c.train.checkpoint_every = 5
  c.eval.update(every=5, sample_tokens=0)
  train.train_and_evaluate(c, str(path))
  return path


def _eval_mean(workdir, step):
  recs = [r for r in logs.read_jsonl(str(workdir / "metrics.jsonl")) if "eval/mean_loss" in r]
  return {r["step"]: r["eval/mean_loss"] for r in recs}[step]


def test_basin_report_of_an_earlier_step(workdir, tmp_path, capsys):
  """Step 5 of 10: the report's loss is the trainer's own held-out loss at step 5 (every source
  has the same number of held-out tokens, so the token mean is the mean over sources)."""
  out = tmp_path / "basin5"
  report = cli.main(["--workdir", str(workdir), "--step", "5", "--out", str(out),
                     "--sigmas", "0.05,0.2", "--num_samples", "2", "--hessian_k", "1",
                     "--hessian_iters", "2", "--trace_samples", "0", "--slice_points", "3"])
  assert report["step"] == 5
  assert report["loss"] == pytest.approx(_eval_mean(workdir, 5), rel=1e-5)
  assert report["loss"] != pytest.approx(_eval_mean(workdir, 10), rel=1e-3)
  on_disk = json.loads((out / "basin.json").read_text())
  assert on_disk["loss"] == report["loss"]
  assert len(on_disk["slice_2d"]["losses"]) == 3 and len(on_disk["sharpness"]["sigmas"]) == 2
  assert len(on_disk["hessian"]["top_eigenvalues"]) == 1 and "trace" not in on_disk["hessian"]
  # The middle of the 1-D slice (alpha = 0) is the unperturbed loss.
  assert on_disk["slice_1d"]["losses"][1] == pytest.approx(report["loss"], rel=1e-5)
  for name in ("slice_1d.png", "slice_2d.png", "sharpness.png"):
    assert (out / name).stat().st_size > 0, name
  assert "step 5: held-out loss" in capsys.readouterr().out


def test_the_newest_checkpoint_by_default_and_its_config(workdir):
  saved = terrain_run.load_checkpoint(str(workdir))
  assert saved.step == 10
  assert saved.run.model_config.d_model == 32 and saved.config.data.seq_len == 32
  batch = terrain_run.heldout_batch(saved.config, saved.run)
  assert batch["inputs"].shape == (2 * len(saved.run.used_sources), 32)
  loss = terrain_run.heldout_loss_fn(saved.run.model_config, batch)(saved.params)
  assert float(loss) == pytest.approx(_eval_mean(workdir, 10), rel=1e-5)
  assert cli.parser().parse_args(["--workdir", str(workdir)]).step is None


def test_a_step_without_checkpoint_names_the_saved_steps(workdir, tmp_path):
  with pytest.raises(FileNotFoundError, match=r"step 7 .*saved steps: \[5, 10\]"):
    terrain_run.load_checkpoint(str(workdir), 7)
  with pytest.raises(FileNotFoundError, match="no usable checkpoint"):
    terrain_run.load_checkpoint(str(tmp_path))
  with pytest.raises(SystemExit):
    cli.parser().parse_args(["--workdir", str(workdir), "--sigmas", "a,b"])


def test_non_finite_numbers_print_as_na(monkeypatch, capsys):
  # The report writes NaN and inf as None (JSON has no NaN); the summary lines must still print.
  report = {"step": 5, "loss": None, "num_params": 10, "out": "/tmp/x",
            "heldout": {"sequences": 2, "seq_len": 4},
            "hessian": {"top_eigenvalues": [1.5, None], "trace": None, "trace_stderr": None},
            "sharpness": {"sigmas": [0.1], "mean_increase": [None]}}
  monkeypatch.setattr(cli, "run", lambda args: report)
  cli.main(["--workdir", "/nonexistent"])
  out = capsys.readouterr().out
  assert "held-out loss n/a on 2 windows" in out
  assert "top Hessian eigenvalues: 1.5, n/a" in out
  assert "Hessian trace n/a +- n/a" in out and "sigma 0.1: mean loss increase n/a" in out

"""``python -m andrea_jax.terrain`` on short real runs: the right checkpoint, config and batch; the
same numbers in chunks as at once; the demo's sizes within a memory cap."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import logs, train
from andrea_jax.config import load_config_file
from andrea_jax.terrain import __main__ as cli
from andrea_jax.terrain import budget as budget_lib
from andrea_jax.terrain import run as terrain_run
from tests.util import REPO, small_run_config


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_newest_checkpoint_by_default_and_its_config(workdir):
  saved = ckpt_lib.load_checkpoint(str(workdir))
  assert saved.step == 10
  assert saved.run.model.d_model == 32 and saved.config.data.seq_len == 32
  batch = terrain_run.heldout_batch(saved.config, saved.run)
  assert batch["inputs"].shape == (2 * len(saved.run.evaluated), 32)
  loss = terrain_run.heldout_loss_fn(saved.run.model, batch)(saved.params)
  assert float(loss) == pytest.approx(_eval_mean(workdir, 10), rel=1e-5)
  assert cli.parser().parse_args(["--workdir", str(workdir)]).step is None


@pytest.mark.slow
def test_a_step_without_checkpoint_names_the_saved_steps(workdir, tmp_path):
  with pytest.raises(FileNotFoundError, match=r"step 7 .*saved steps: \[5, 10\]"):
    ckpt_lib.load_checkpoint(str(workdir), 7)
  with pytest.raises(FileNotFoundError, match="no usable checkpoint"):
    ckpt_lib.load_checkpoint(str(tmp_path))
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


def _numbers(report):
  return {k: report[k] for k in ("loss", "sharpness", "slice_1d", "slice_2d", "hessian")}


@pytest.mark.slow
def test_chunked_and_unchunked_runs_agree(workdir, tmp_path):
  """One window and one perturbation at a time against all windows and perturbations at once: the
  same numbers to float32 precision (losses ~5.5; a few ulps absolute on their differences). The
  flags reach the chunking; the Hessian's chunks are the library's (tests/test_terrain_memory.py),
  so none is asked for here."""
  common = ["--workdir", str(workdir), "--sigmas", "0.2", "--num_samples", "2",
            "--hessian_k", "0", "--trace_samples", "0", "--slice_points", "2",
            "--no-progress_bar"]
  chunked = cli.main(common + ["--out", str(tmp_path / "a"), "--window_batch", "1",
                               "--batch_size", "1"])
  at_once = cli.main(common + ["--out", str(tmp_path / "b"), "--window_batch", "1000",
                               "--batch_size", "1000"])
  assert chunked["heldout"]["windows_per_chunk"] == 1
  assert at_once["heldout"]["windows_per_chunk"] == chunked["heldout"]["sequences"]
  a, b = _numbers(chunked), _numbers(at_once)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  np.testing.assert_allclose(np.asarray(jax.tree.leaves(a), np.float64),
                             np.asarray(jax.tree.leaves(b), np.float64), rtol=2e-5, atol=1e-5)
  # The budget's default comes from the run's config (0 = automatic: 2 GiB on a CPU).
  assert chunked["chunks"]["memory_budget_bytes"] is None
  args = cli.parser().parse_args(["--workdir", str(workdir)])
  saved = ckpt_lib.load_checkpoint(str(workdir))
  assert cli.memory_budget(args, saved.config) == 2 * 2 ** 30
  saved.config.terrain.memory_budget_gib = 0.5
  assert cli.memory_budget(args, saved.config) == 2 ** 29
  del saved.config["terrain"]   # a run trained before the field existed
  assert cli.memory_budget(args, saved.config) == 2 * 2 ** 30
  with pytest.raises(ValueError, match=r"--memory_budget_gib must be >= 0, got -1.0 \(a number of "
                                       r"GiB; 0 = automatic\)"):
    cli.main(common + ["--memory_budget_gib", "-1"])


# The demo (experiments/tiny.py) at its own model and evaluation sizes: 0.9M parameters, 6 sources
# x 8 held-out windows of 128 tokens. Two steps of training are enough: the terrain's cost does not
# depend on the run's length.
DEMO_CAP = 5 * 2 ** 30        # address space of the terrain's process (RLIMIT_AS)
DEMO_BUDGET_GIB = 0.0625      # 64 MiB: several chunks of windows and of points


@pytest.fixture(scope="module")
def demo_workdir(tmp_path_factory, data_cache):
  path = tmp_path_factory.mktemp("terrain_demo")
  c = load_config_file(REPO / "experiments" / "tiny.py")
  c.train.update(stop_step=2, progress_bar=False, plot=False, tensorboard=False)
  c.eval.update(sample_tokens=0)
  train.train_and_evaluate(c, str(path))
  return path


@pytest.mark.slow
def test_the_demos_terrain_runs_within_a_memory_cap(demo_workdir, tmp_path):
  """The command the README shows, at the demo's sizes, in a process whose address space is capped
  at 5 GiB, with a 64 MiB budget. Its 2-D slice alone, evaluated at once, would ask XLA for more
  than the cap (checked by compiling it, not by running it)."""
  saved = ckpt_lib.load_checkpoint(str(demo_workdir))
  batch = terrain_run.heldout_batch(saved.config, saved.run)
  rows = len(saved.run.sources) * saved.config.eval.sequences_per_source
  assert rows == 6 * 8 and batch["inputs"].shape == (rows, 128)   # the demo's evaluation
  whole = terrain_run.heldout_loss_fn(saved.run.model, batch)
  side = 9   # a 9 x 9 slice: 81 points of 48 windows each
  points = side * side
  assert points * budget_lib.point_bytes(whole, saved.params) > DEMO_CAP

  out = tmp_path / "basin"
  cmd = [sys.executable, "-m", "andrea_jax.terrain", "--workdir", str(demo_workdir), "--out",
         str(out), "--memory_budget_gib", str(DEMO_BUDGET_GIB), "--sigmas", "0.1",
         "--num_samples", "2", "--hessian_k", "1", "--hessian_iters", "2", "--trace_samples", "1",
         "--slice_points", str(side), "--no-progress_bar"]
  # The cap is set by the shell that execs the command (ulimit -v: RLIMIT_AS in KiB), not by a
  # preexec_fn forked from this multithreaded process. The programs run hundreds of forward
  # passes at the demo's size: fully optimised, unlike the suite's few-step programs.
  env = {k: v for k, v in os.environ.items() if k != "JAX_DISABLE_MOST_OPTIMIZATIONS"}
  proc = subprocess.run(["bash", "-c", f'ulimit -v {DEMO_CAP // 1024} && exec "$@"', "cap", *cmd],
                        check=False, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=1800)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads((out / "basin.json").read_text())
  assert report["complete"] and report["step"] == 2
  assert report["heldout"]["sequences"] == rows and report["heldout"]["seq_len"] == 128
  assert 1 <= report["heldout"]["windows_per_chunk"] < rows
  assert report["chunks"]["memory_budget_bytes"] == 2 ** 26
  assert report["chunks"]["points"] < points
  assert len(report["slice_2d"]["losses"]) == side
  assert None not in report["slice_2d"]["losses"][side // 2]
  # Its loss is the trainer's own held-out loss at step 2 (each source has as many tokens).
  recs = [r for r in logs.read_jsonl(str(demo_workdir / "metrics.jsonl")) if "eval/mean_loss" in r]
  assert report["loss"] == pytest.approx(recs[-1]["eval/mean_loss"], rel=1e-5)
  for name in ("sharpness.png", "slice_1d.png", "slice_2d.png"):
    assert (out / name).stat().st_size > 0

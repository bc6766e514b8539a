"""The study's protocol: every arm is a valid run that differs from the demo in its mixture only,
the batches hold the runs the README says, and the scoreboard scores fake runs as worked out here."""

import json

import numpy as np
import pytest

from andrea_jax import runconfig
from andrea_jax.config import load_config_file
from study.target_reward import arms, run

SOURCES = ("python-code", "docstrings", "reference", "notes", "licenses", "noisy-docstrings")


def _fake_run(root, args, target, mean=2.0):
  d = root / run.run_name(args)
  d.mkdir(parents=True)
  steps = int(args.get("steps", arms.STEPS))
  (d / "metrics.jsonl").write_text(
      json.dumps({"step": steps // 2, "eval/target_loss": 9.0}) + "\n"
      + json.dumps({"step": steps, "eval/target_loss": target, "eval/mean_loss": mean}) + "\n")


def test_grid_mixtures_are_worked_out_by_hand():
  m = arms.grid_mixture("t75_rest")
  assert m == pytest.approx({"docstrings": 0.25, "reference": 0.25, "notes": 0.25,
                             "python-code": 1 / 12, "licenses": 1 / 12, "noisy-docstrings": 1 / 12})
  assert arms.grid_mixture("t60_code") == pytest.approx(
      {"docstrings": 0.2, "reference": 0.2, "notes": 0.2, "python-code": 0.4})


@pytest.mark.parametrize("arm", [a for a in arms.ARMS if a != "best_static"])
def test_every_arm_is_the_demo_with_another_mixture(arm, data_cache):
  demo = load_config_file(arms.DEMO)
  c = arms.get_config(f"arm={arm},seed=1")
  r = runconfig.build(c)
  assert c.seed == 1 and c.train.num_steps == 1000 and c.eval.sequences_per_source == 32
  for section in ("model", "optim", "data"):
    assert c[section].to_dict() == demo[section].to_dict(), section
  if arm in ("andrea", "andrea_gain"):
    assert c.curriculum.geometries.to_dict() == demo.curriculum.geometries.to_dict()
    assert (c.curriculum.mixer.reward == "target_gain") == (arm == "andrea_gain")
    assert bool(r.step.probes) == (arm == "andrea_gain")
  if arm == "target_only":
    spec = r.curriculum
    assert [s for s, u in zip(SOURCES, spec.uppers[0]) if u > 0] == list(arms.TARGET)
  if arm == "proportional":
    w = arms.mixture_of(c)
    assert w is not None and np.all(np.diff(w[[0, 1, 5]]) != 0)   # the sizes differ
    assert w[0] == w.max()                                           # the code is the bulk


def test_longer_runs_keep_the_geometries_fractions_and_width_two_doubles_the_model():
  c = arms.get_config("arm=andrea,steps=2000,width=2")
  starts = sorted(g.start_step for g in c.curriculum.geometries.values())
  assert starts == [0, 200, 1126] and c.train.num_steps == 2000 and c.eval.every == 2000
  assert (c.model.d_model, c.model.d_mlp, c.model.num_heads) == (256, 1024, 4)


def test_batches_and_bad_arguments():
  assert len(run.plan("grid")) == len(arms.GRID)
  assert len(run.plan("scored")) == 3 * len(arms.ARMS)
  assert sorted({a["steps"] for a in run.plan("baselines")}) == [1250, 1500, 2000]
  with pytest.raises(ValueError, match="takes arm="):
    arms.get_config("arm=andrea,grid=t75_rest")
  with pytest.raises(ValueError, match="unknown arm 'nope'"):
    arms.get_config("arm=nope")


def test_the_scoreboard_scores_fake_runs(tmp_path, monkeypatch):
  """uniform's own-schedule curve (2.0, 1.9, 1.8, 1.7 at 1x-2x) and target_only's (1.95, 1.85,
  1.75, 1.65): what an arm ending at 1.85 and costing 10% more per step is worth, worked out per
  bracket below."""
  monkeypatch.setattr(run, "gain_overhead", lambda: 0.1)
  for f, lu, lt in zip(arms.LENGTHS, (2.0, 1.9, 1.8, 1.7), (1.95, 1.85, 1.75, 1.65)):
    for s in arms.SEEDS:
      extra = {} if f == 1 else {"steps": round(f * 1000)}
      _fake_run(tmp_path, {"arm": "uniform", "seed": s, **extra}, lu + 0.01 * (s - 1))
      _fake_run(tmp_path, {"arm": "target_only", "seed": s, **extra}, lt)
  for s in arms.SEEDS:
    _fake_run(tmp_path, {"arm": "andrea_gain", "seed": s}, 1.85)
  rows = {r["arm"]: r for r in run.scoreboard(str(tmp_path))}
  assert rows["uniform"]["target"] == pytest.approx(2.0) and rows["uniform"]["sd"] == (
      pytest.approx(0.01))
  g = rows["andrea_gain"]
  # uniform: 1.85 lies half way between 1250 (1.9) and 1500 (1.8); the arm costs 1.1 steps a step.
  assert g["worth_uniform"][1] == "=" and g["worth_uniform"][0] == pytest.approx(
      1250 * 1.2 ** 0.5 / 1100)
  # target_only: exactly its 1250-step run's loss.
  assert g["worth_target_only"][0] == pytest.approx(1250 / 1100)
  # uniform itself, against its own curve: 1x of its own steps.
  assert rows["uniform"]["worth_uniform"] == (pytest.approx(1.0), "=")
  assert run.larger_arms(str(tmp_path)) == ["andrea_gain", "target_only"]
  assert "andrea_gain" in run.report(str(tmp_path))
  # Seed 2's 2000-step uniform run missing: uniform's curve over seeds 0 and 1 (2.0 - 0.005 at
  # 1x, ...), said in the report; target_only's keeps its three.
  (tmp_path / run.run_name({"arm": "uniform", "seed": 2, "steps": 2000}) / "metrics.jsonl").unlink()
  rows = {r["arm"]: r for r in run.scoreboard(str(tmp_path))}
  assert rows["andrea_gain"]["curve_seeds_uniform"] == [0, 1]
  assert rows["andrea_gain"]["curve_seeds_target_only"] == [0, 1, 2]
  # 1.85 lies 0.045 / 0.1 = 0.45 of the way from 1250 (1.895) to 1500 (1.795), in log-steps.
  assert rows["andrea_gain"]["worth_uniform"][0] == pytest.approx(1250 * 1.2 ** 0.45 / 1100)
  assert "worth in uniform's steps (its curve: seeds [0, 1])" in run.report(str(tmp_path))


def test_the_grid_point_is_picked_at_the_selection_seed(tmp_path):
  with pytest.raises(ValueError, match="the grid has not run at seed 100"):
    run.selected_grid_point(str(tmp_path))
  for g, loss in zip(arms.GRID, (1.8, 1.7, 1.75, 1.9)):
    _fake_run(tmp_path, {"grid": g, "seed": arms.SELECTION_SEED}, loss)
  assert run.selected_grid_point(str(tmp_path)) == "t90_rest"

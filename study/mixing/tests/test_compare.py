"""python -m study.mixing.compare's machinery on a trivially small setting: a fake trainer writes known
curves, the comparison must find the crossing steps, paired differences and tuning picks worked out
by hand, and write its table, JSON and figure. (Real training runs are the benchmark's job.)"""

import json
import math
import os

import ml_collections
import numpy as np
import pytest

from andrea_jax.sources import SOURCES

from study.mixing import compare as bench


def test_steps_to_reach():
  assert bench.steps_to_reach([50, 100, 150], [3.0, 2.0, 1.5], 2.5) == 75.0
  assert bench.steps_to_reach([50, 100, 150], [3.0, 2.0, 1.5], 1.5) == 150.0
  assert bench.steps_to_reach([50, 100, 150], [3.0, 2.0, 1.5], 3.5) == 50.0   # already there
  assert math.isnan(bench.steps_to_reach([50, 100, 150], [3.0, 2.0, 1.5], 1.4))
  # The first crossing counts, not a later one after a bump.
  assert bench.steps_to_reach([10, 20, 30, 40], [4.0, 2.0, 3.0, 1.0], 3.0) == 15.0


def test_validation_signal():
  losses = {"a": [(5, 9.0), (95, 2.0)], "b": [(50, 3.0)], "c": []}
  # a: its one late value 2; b: none late, its last one 3; c: never logged, left out.
  assert bench.validation_signal(losses, 100) == pytest.approx(2.5)
  assert bench.validation_signal({"a": [(90, 1.0), (99, 3.0)]}, 100) == pytest.approx(2.0)


# The fake trainer: every source's held-out loss falls linearly from 3 at step 0 by `rate` per run,
# plus 0.01 per seed; the arm is recognised by its mixer and its number of geometries.
RATES = {("static", 1): 1.0, ("static", 3): 0.5, ("exp3", 3): 2.5}


def fake_runner(config, workdir, rate=None):
  os.makedirs(workdir, exist_ok=True)
  n = config.train.num_steps
  every = config.eval.every
  if rate is None:
    rate = RATES[(config.curriculum.mixer.name, len(config.curriculum.geometries))]
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step in range(0, n, 8):
      rec = {"step": step, "loss": 3.0}
      rec.update({f"weight/{s}": 1 / 16 for s in SOURCES})
      rec.update({f"share/{s}": 1 / 16 for s in SOURCES})
      rec.update({f"loss/{s}": 3.0 - rate * step / n for s in SOURCES})
      f.write(json.dumps(rec) + "\n")
    for step in range(every, n + 1, every):
      loss = 3.0 - rate * step / n + 0.01 * config.seed
      rec = {"step": step, "eval/mean_loss": loss}
      rec.update({f"eval/loss/{s}": loss for s in SOURCES})
      f.write(json.dumps(rec) + "\n")


def test_the_whole_comparison_on_fake_runs(tmp_path, capsys):
  out = tmp_path / "cmp"
  figure = tmp_path / "fig" / "compare_mixers.png"
  assert bench.main(["--out", str(out), "--arms", "static,exp3", "--seeds", "0,1", "--quick",
                     "--no-overhead", "--figure", str(figure)], runner=fake_runner) == 0
  with open(out / "compare_mixers.json") as f:
    result = json.load(f)
  s = result["summary"]
  assert list(s) == ["uniform", "static", "exp3"]            # the baseline is always run, first
  # 80 steps, evaluations at 20, 40, 60, 80. uniform ends at 2.0 (+0.01 per seed); exp3 reaches it
  # where 3 - 2.5 t / 80 = 2, t = 32, interpolated between the evaluations at 20 (2.375) and 40
  # (1.75).
  assert s["uniform"]["final_mean"] == pytest.approx(2.005)
  assert s["exp3"]["steps_to_uniform_final"] == pytest.approx([32.0, 32.0])
  assert s["exp3"]["fewer_steps"] == pytest.approx(1 - 32 / 80)
  assert s["exp3"]["delta_vs_uniform"] == pytest.approx((3 - 2.5) - 2.0)
  assert s["static"]["reached"] == 0 and s["static"]["fewer_steps"] is None   # NaN -> null
  assert s["uniform"]["steps_to_uniform_final"] == pytest.approx([80.0, 80.0])
  # The other way round: uniform reaches static's final 2.5 (+0.01 per seed) at step 40, and never
  # exp3's 0.5.
  assert s["static"]["uniform_steps_to_arm_final"] == pytest.approx([40.0, 40.0])
  assert s["exp3"]["uniform_steps_to_arm_final"] == [None, None]
  # Mid-run: uniform's loss at steps 20, 40, 60 is 2.75, 2.5, 2.25 (+0.01 per seed). exp3 is below
  # 2.75 and 2.5 already at its first evaluation (step 20: 1 - 20/20, 1 - 20/40) and reaches 2.25
  # at step 24 (1 - 24/60); static (rate 0.5) needs 40 and 80 steps and never reaches 2.25.
  assert s["exp3"]["mid_run_fewer_steps"] == pytest.approx({"0.25": 0.0, "0.5": 0.5, "0.75": 0.6})
  assert s["static"]["mid_run_fewer_steps"] == pytest.approx({"0.25": -1.0, "0.5": -1.0,
                                                              "0.75": None})
  assert s["uniform"]["mid_run_fewer_steps"] == pytest.approx({"0.25": 0.0, "0.5": 0.0,
                                                               "0.75": 0.0})
  assert s["static"]["weights"]["extra-06"] == pytest.approx(1 / 16)
  assert s["static"]["late_shares"]["extra-06"] == pytest.approx(1 / 16)
  md = (out / "compare_mixers.md").read_text()
  assert "> 80 (0/2 seeds reach it)" in md and "+60.0%" in md and "never in 2/2 seeds" in md
  assert figure.exists() and figure.stat().st_size > 10_000
  assert "steps to uniform's final" in capsys.readouterr().out
  # Finished runs are reused: a runner that fails proves nothing is retrained.
  def refuse(config, workdir):
    raise AssertionError(f"retrained {workdir}")
  assert bench.main(["--out", str(out), "--arms", "static,exp3", "--seeds", "0,1", "--quick",
                     "--no-overhead", "--figure", str(figure)], runner=refuse) == 0


def test_tuning_picks_on_the_training_signal(tmp_path):
  out = tmp_path / "tune"
  def runner(config, workdir):
    if config.curriculum.mixer.name != "exp3":
      return _flat_runner(config, workdir)
    # A larger lr_scale trains faster here.
    return fake_runner(config, workdir, rate=1.25 * (1 + config.curriculum.mixer.lr_scale))

  assert bench.main(["--out", str(out), "--tune", "--quick"], runner=runner) == 0
  with open(out / "tuning.json") as f:
    tuning = json.load(f)
  assert tuning["seed"] == 100
  # exp3's training loss falls faster with a larger lr_scale: the default (1.0) wins over 0.1, 0.01.
  assert tuning["picks"]["exp3"] == {}
  rows = [r for r in tuning["rows"][1:] if r[0] == "exp3"]
  # Last 10% of 80 steps: the logged step 72 only; its loss is 3 - 1.25 (1 + c) 72 / 80.
  for (_, setting, score, _), c in zip(rows, (1.0, 0.1, 0.01)):
    assert float(score) == pytest.approx(3 - 1.25 * (1 + c) * 72 / 80, abs=1e-4)
  assert os.path.exists(out / "tuning.md")


def test_tuning_a_recipe_picks_one_of_its_arms(tmp_path):
  """``--tune influence``: the recipe's three arms (TUNING_ARMS) alone, at the tuning seed."""
  exp = bench.load_experiment()
  out = tmp_path / "tune"
  ran = []
  def runner(config, workdir):
    assert config.seed == 100 and config.curriculum.mixer.name == "static"
    ran.append(os.path.basename(workdir))
    first = next(iter(config.curriculum.geometries.values()))
    w = np.array([first.mixture[s.replace("-", "_")] for s in SOURCES])
    # The flatter the first half's mixture, the faster the training loss falls here.
    return fake_runner(config, workdir, rate=1 / (16 * float(np.sum(w ** 2))))

  assert bench.main(["--out", str(out), "--tune", "influence", "--quick"], runner=runner) == 0
  arms = exp.TUNING_ARMS["influence"]
  assert ran == list(arms)                     # only the recipe's arms, in order
  with open(out / "tuning_influence.json") as f:
    tuning = json.load(f)
  # Each arm's mixture worked out here from its elasticities: max(b, 0.02) ** power, normalised.
  def mixture(b, power):
    w = np.maximum(np.asarray(b), 0.02) ** power
    return w / w.sum()
  mixtures = [mixture(exp.INFLUENCE_CG10_GN32_ELASTICITY, 1.5),
              mixture(exp.INFLUENCE_CG10_ELASTICITY, 1.5),
              mixture(exp.INFLUENCE_CG10_GN32_ELASTICITY, 1.0)]
  rates = [1 / (16 * np.sum(w ** 2)) for w in mixtures]
  for (_, arm, score, picked), rate, expected_arm in zip(tuning["rows"][1:], rates, arms):
    assert arm == expected_arm
    assert float(score) == pytest.approx(3 - rate * 72 / 80, abs=1e-4)   # logged step 72 only
  assert tuning["arm_picks"] == {"influence": arms[int(np.argmax(rates))]}
  assert tuning["arm_picks"]["influence"] == "influence_cg10_gn32_early"  # power 1: the flattest
  assert tuning["picks"] == {}
  assert not (out / "tuning.json").exists()     # a subset leaves the whole budget's record alone
  # Named twice, run once: the finished runs are reused, so nothing is retrained.
  def refuse(config, workdir):
    raise AssertionError(f"retrained {workdir}")
  assert bench.main(["--out", str(out), "--tune", "influence,influence", "--quick"],
                    runner=refuse) == 0
  assert len(json.loads((out / "tuning_influence.json").read_text())["rows"]) == 1 + len(arms)


@pytest.mark.parametrize("argv", [["--tune", "influence,doremi"], ["--tune", ","],
                                  ["--tune", "influence", "--layers", "4"]])
def test_bad_tune_arguments_are_refused_before_anything_runs(tmp_path, capsys, argv):
  def refuse(config, workdir):
    raise AssertionError(f"ran {workdir}")
  with pytest.raises(SystemExit) as e:
    bench.main(["--out", str(tmp_path), "--quick", *argv], runner=refuse)
  assert e.value.code == 2
  assert "--tune" in capsys.readouterr().err
  assert list(tmp_path.iterdir()) == []


def _flat_runner(config, workdir):
  """Every setting equal: the first (the package default) is picked."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    rec = {"step": 75, "loss": 2.0, **{f"weight/{s}": 1 / 16 for s in SOURCES},
           **{f"loss/{s}": 2.0 for s in SOURCES}}
    f.write(json.dumps(rec) + "\n")
    f.write(json.dumps({"step": 80, "eval/mean_loss": 2.0}) + "\n")


def test_unknown_arm_and_tuning_seed_are_refused(tmp_path):
  with pytest.raises(SystemExit):
    bench.main(["--out", str(tmp_path), "--arms", "doremi"], runner=fake_runner)
  with pytest.raises(SystemExit):
    bench.main(["--out", str(tmp_path), "--seeds", "0,100"], runner=fake_runner)
  assert np.isfinite(bench.steps_to_reach([1], [1.0], 1.0))


def test_progress_snr_and_recency():
  # A loss falling 0.001 a step with a +-0.1 zigzag: one 24-step window's progress 0.024 against
  # 0.1 sqrt(2 / 24) = 0.0289 of noise.
  t = np.arange(0, 400, 10)
  points = list(zip(t.tolist(), (3 - 0.001 * t + 0.1 * (-1.0) ** np.arange(len(t))).tolist()))
  snr = bench.progress_snr({"a": points, "b": points[:2]}, 0, 400, 24)
  assert set(snr) == {"a"}                                    # two points cannot be fitted
  assert snr["a"]["slope"] == pytest.approx(0.001, rel=0.05)   # the zigzag tilts the fit a little
  assert snr["a"]["sd"] == pytest.approx(0.1, rel=0.03)
  assert snr["a"]["snr"] == pytest.approx(0.024 / (0.1 * math.sqrt(2 / 24)), rel=0.05)
  # Recency: sources with late shares (1/32, 1/16, 1/8) end (+0.2, 0, -0.2) from uniform: a rank
  # correlation of -1; the noise source is left out whatever it does.
  srcs = ["s1", "s2", "s3", "extra-06"]
  def run(losses, shares, late):
    return {"eval_source": {s: np.array([l]) for s, l in zip(srcs, losses)},
            "late_shares": np.array(late), "shares": np.array(shares)}
  runs = {"uniform": {0: run([2.0, 2.0, 2.0, 4.0], [0.25] * 4, [0.25] * 4)},
          "mixer": {0: run([2.2, 2.0, 1.8, 9.0], [0.3, 0.2, 0.25, 0.25],
                           [1 / 32, 1 / 16, 1 / 8, 0.78])}}
  rec = bench.recency(runs, srcs)
  assert rec["late_shares"] == {"spearman": pytest.approx(-1.0), "points": 3}
  # Over the whole run the shares rank (0.3, 0.2, 0.25) against (+0.2, 0, -0.2): ranks (3, 1, 2)
  # and (3, 2, 1), Spearman 1 - 6 * (0 + 1 + 1) / (3 * 8) = 0.5.
  assert rec["shares"]["spearman"] == pytest.approx(0.5)


@pytest.mark.slow
def test_every_arm_is_a_valid_run_config():
  """Each arm of study/mixing/arms.py validates; the fitted probes' mixtures are a half
  (a quarter, three quarters) the normalised fitted elasticities and the rest uniform, to 0.001
  (worked out from the listed numbers)."""
  import jax
  from andrea_jax import curriculum, runconfig
  exp = bench.load_experiment()
  for arm in exp.ARMS:
    run = runconfig.build(exp.arm_config(arm))
    assert run.curriculum.mixer_name == exp.arm_settings(arm).get("strategy", exp.ARMS[arm][0])
  b = np.array(exp.FITTED_ELASTICITY)
  for arm, lam in (("static_fitted", 0.5), ("static_fitted_25", 0.25), ("static_fitted_75", 0.75)):
    spec = runconfig.build(exp.arm_config(arm)).curriculum
    w = curriculum.weights_at(curriculum.schedule(curriculum.init(spec, jax.random.key(0))), 0)
    m = lam * b / b.sum() + (1 - lam) / 16
    # The region is {w >= 0.999 m}: the 0.001 left over goes where the projection of uniform puts
    # it.
    assert np.all(w >= 0.999 * m - 1e-7) and np.abs(w - m).sum() <= 2e-3, arm
  assert exp.arm_settings("andrea_floor_log_rate")["strategy"] == (
      "study.mixing.mixers:andrea_log_rate")
  # The timing probes: the lambda = 0.5 mixture for one half of the 800 steps, uniform (the
  # projection of uniform onto the full simplex) for the other; a phase may run past the switch
  # by the decision lag at most, so the steps next to it are left out.
  from andrea_jax.curriculum import simulate
  for arm, lam, fitted_half in (("static_fitted_early", 0.5, slice(0, 390)),
                                ("static_fitted_late", 0.5, slice(410, 800)),
                                ("static_fitted_full_early", 1.0, slice(0, 390)),
                                ("static_fitted_75_early", 0.75, slice(0, 390))):
    m = lam * b / b.sum() + (1 - lam) / 16
    spec = runconfig.build(exp.arm_config(arm)).curriculum
    w_NxS = simulate.simulate(spec, jax.random.key(0), 800).weights
    other = slice(410, 800) if fitted_half.start == 0 else slice(0, 390)
    assert np.abs(w_NxS[fitted_half] - m).sum(axis=1).max() <= 2e-3, arm
    assert np.abs(w_NxS[other] - 1 / 16).max() <= 1e-6, arm
  # The schedules: lambda by stretches of the run (the listed numbers), uniform where it is 0; and
  # the elastic mixer's last quarter held (nearly) uniform. Steps within the decision lag of a
  # boundary are left out.
  # (On 200-step runs: the geometries scale with the run.)
  for arm, parts in (("static_fitted_75_quarter", ((0, 50, 0.75), (50, 200, 0))),
                     ("static_fitted_75_3q", ((0, 150, 0.75), (150, 200, 0))),
                     ("static_fitted_decay", ((0, 50, 1), (50, 100, 0.75), (100, 150, 0.5),
                                              (150, 200, 0.25)))):
    spec = runconfig.build(exp.arm_config(arm, num_steps=200)).curriculum
    w_NxS = simulate.simulate(spec, jax.random.key(0), 200).weights
    for lo, hi, lam in parts:
      m = lam * b / b.sum() + (1 - lam) / 16
      assert np.abs(w_NxS[lo + 3:hi - 3] - m).sum(axis=1).max() <= 2e-3, (arm, lo)
  for arm, start in (("elastic_cooldown", 150), ("elastic_strong_early", 100)):
    spec = runconfig.build(exp.arm_config(arm, num_steps=200)).curriculum
    w_NxS = simulate.simulate(spec, jax.random.key(0), 200).weights
    assert np.abs(w_NxS[start + 3:] - 1 / 16).max() <= 1e-3, arm
  # A fitted point made of floors at 0.999 of it (as the arms do) holds what the static strategy's
  # per-geometry mixture holds, to 2e-3.
  from andrea_jax.curriculum import geometry
  c = exp.arm_config("static_fitted_75_early", num_steps=200)
  c.curriculum.geometries = ml_collections.ConfigDict({
      "fitted_75": geometry("fitted_75", 0, mixture=dict(zip(SOURCES, exp.fitted_mixture(
          "fitted_75")))),
      "full": geometry("full", 100)})
  by_mixture = simulate.simulate(runconfig.build(c).curriculum, jax.random.key(0), 200)
  spec = runconfig.build(exp.arm_config("static_fitted_75_early", num_steps=200)).curriculum
  by_floors = simulate.simulate(spec, jax.random.key(0), 200)
  assert np.abs(by_mixture.weights - by_floors.weights).sum(axis=1).max() <= 2e-3
  # The designed probes hold their mixture exactly: each source 2 or 1/2 before normalising, in
  # the pattern of a Hadamard matrix's columns (checked here as the probe's own mixture, and row 0
  # is uniform).
  assert len(exp.PROBE_ARMS) == 20
  for k in (0, 7, 19):
    spec = runconfig.build(exp.arm_config(exp.PROBE_ARMS[k], num_steps=200)).curriculum
    w = curriculum.weights_at(curriculum.schedule(curriculum.init(spec, jax.random.key(0))), 0)
    np.testing.assert_allclose(w, exp.PROBE_MIXTURES[k], atol=1e-6)
    assert set(np.round(w / w.min(), 4).tolist()) <= {1.0, 4.0}
  np.testing.assert_allclose(exp.PROBE_MIXTURES[0], 1 / 16)
  # proxy_early: max(b, 0.02) normalised (worked out from the listed numbers) for the first half
  # of the run, then uniform.
  for arm, fitted in (("proxy_early", exp.PROXY_ELASTICITY),
                      ("proxy_half_early", exp.PROXY_HALF_ELASTICITY),
                      ("proxy_quarter_early", exp.PROXY_QUARTER_ELASTICITY),
                      ("proxy_schedule_early", exp.PROXY_SCHEDULE_ELASTICITY),
                      ("proxy_schedule_short_early", exp.PROXY_SCHEDULE_SHORT_ELASTICITY),
                      ("proxy_half_4x128_early", exp.PROXY_HALF_4X128_ELASTICITY)):
    b = np.maximum(np.array(fitted), 0.02)
    spec = runconfig.build(exp.arm_config(arm, num_steps=200)).curriculum
    w_NxS = simulate.simulate(spec, jax.random.key(0), 200).weights
    np.testing.assert_allclose(w_NxS[:100], np.broadcast_to(b / b.sum(), (100, 16)), atol=1e-6,
                               err_msg=arm)
    np.testing.assert_allclose(w_NxS[100:], 1 / 16, atol=1e-6, err_msg=arm)
  b = np.maximum(np.array(exp.PROXY_ELASTICITY), 0.02)
  # proxy_then_elastic: the same first half, then the elastic mixer's own phases.
  spec = runconfig.build(exp.arm_config("proxy_then_elastic", num_steps=200)).curriculum
  run = simulate.simulate(spec, jax.random.key(0), 200)
  np.testing.assert_allclose(run.weights[:100], np.broadcast_to(b / b.sum(), (100, 16)), atol=1e-6)
  assert {spec.labels[i] for i in run.labels[100:].tolist()} == {"elastic"}


def test_fit_elasticity_recovers_a_power_law():
  """Late training losses ``c_s - b_s ln(16 share_s)`` (and uniform's ``c_s``) exactly: the fit
  returns ``b_s``, and the mixture is ``max(b, 0.02)`` normalised (worked out here)."""
  srcs = ["a", "b", "c"]
  b = np.array([0.3, 0.1, -0.05])               # the last one would get less than the floor
  c = np.array([2.0, 1.5, 4.0])
  rng = np.random.default_rng(1)

  def run(shares):
    loss = c - b * np.log(3 * np.asarray(shares))
    return {"shares": np.asarray(shares),
            "train_loss": {s: [(10, 9.0), (95, float(l)), (99, float(l))]
                           for s, l in zip(srcs, loss)}}
  runs = {"uniform": {0: run([1 / 3] * 3), 1: run([1 / 3] * 3)}}
  for k in range(4):
    runs[f"arm{k}"] = {seed: run(rng.dirichlet([2.0] * 3)) for seed in (0, 1)}
  fit = bench.fit_elasticity(runs, srcs, num_steps=100)
  assert fit["points"] == {s: 8 for s in srcs}
  np.testing.assert_allclose([fit["b"][s] for s in srcs], b, atol=1e-9)
  np.testing.assert_allclose([fit["r2"][s] for s in srcs], 1.0, atol=1e-9)
  np.testing.assert_allclose(fit["mixture"], np.array([0.3, 0.1, 0.02]) / 0.42)


def test_within_run_elasticity_recovers_b_from_share_variation():
  """Losses ``c - 0.1 ln(t + 1) - b ln(S r_t)``, with ``r_t`` the recent share worked out here by a
  plain per-step loop (time constant 100 steps), give back ``b``; a source whose share never moved
  gives NaN (nothing identifies it), and the agreement with a pooled fit is a Pearson r."""
  srcs = ["a", "b", "c", "d"]
  b = np.array([0.3, 0.05, 0.15, 0.2])
  c = np.array([2.0, 1.5, 3.0, 2.5])
  steps = np.arange(9, 800, 10)
  rng = np.random.default_rng(0)
  series = np.full((len(steps), 4), 0.25)
  for k in range(0, len(steps), 5):                  # a new random mixture every 50 steps
    w = rng.dirichlet([3.0] * 3)
    series[k:k + 5, :3] = 0.75 * w                   # source d stays at 0.25 throughout
  recent, r, last = [], np.full(4, 0.25), 0
  for step, share in zip(steps, series):             # step by step: r += (1 - e^-1/100)(x - r)
    for _ in range(step - last):
      r = r + (1 - np.exp(-1 / 100)) * (share - r)
    last = step
    recent.append(r.copy())
  recent = np.array(recent)
  loss = c - 0.1 * np.log(steps[:, None] + 1.0) - b * np.log(4 * recent)
  run = {"share_steps": steps, "share_series": series,
         "train_loss": {s: [(int(t), float(l)) for t, l in zip(steps, loss[:, i])]
                        for i, s in enumerate(srcs)}}
  est = bench.within_run_elasticity(run, srcs, start=150, memory=100.0)
  np.testing.assert_allclose(est[:3], b[:3], atol=1e-6)
  assert np.isnan(est[3])
  runs = {"uniform": {0: run}, "arm": {0: run, 1: run}}
  agree, negated = bench.within_run_agreement(
      runs, srcs, pooled=[[0.3, 0.05, 0.15, 9.0], [-0.3, -0.05, -0.15, 0.0]])
  assert list(agree) == ["arm"]
  np.testing.assert_allclose(agree["arm"], [1.0, 1.0], atol=1e-9)
  np.testing.assert_allclose(negated["arm"], [-1.0, -1.0], atol=1e-9)


def test_the_baseline_alone_gets_its_table_and_figure(tmp_path):
  """--arms uniform (more seeds of the baseline only): the report is written, the figure without
  the per-source comparison."""
  figure = tmp_path / "uniform.png"
  assert bench.main(["--out", str(tmp_path), "--quick", "--arms", "uniform", "--no-overhead",
                     "--figure", str(figure)], runner=fake_runner) == 0
  assert figure.stat().st_size > 10_000 and (tmp_path / "compare_mixers.md").exists()


def test_an_interrupted_run_is_not_scored_and_resumes(tmp_path):
  """A run stopped by a signal (the trainer's summary has interrupted_at) is neither marked done
  nor stripped of its checkpoint; the next call runs it again (the trainer resumes it)."""
  exp = bench.load_experiment()
  config = exp.arm_config("uniform", num_steps=16)
  workdir = tmp_path / "uniform" / "seed1"
  calls = []

  def interrupted(config, workdir):
    calls.append(workdir)
    os.makedirs(os.path.join(workdir, "checkpoints", "7"))
    return {"start_step": 0, "interrupted_at": 7, "end_step": 7}
  with pytest.raises(bench.RunInterrupted, match=r"seed1 was interrupted at step 7 \(checkpoint "
                                                 r"kept\): run the same command again"):
    bench.run_arm(config, str(workdir), interrupted)
  assert not (workdir / "done.json").exists() and (workdir / "checkpoints" / "7").is_dir()

  def finished(config, workdir):
    calls.append(workdir)
    fake_runner(config, workdir, rate=1.0)
    return {"start_step": 7, "end_step": 16}
  bench.run_arm(config, str(workdir), finished)
  assert len(calls) == 2 and (workdir / "done.json").exists()


def test_a_finished_run_is_reused_only_under_the_same_config(tmp_path):
  """The trainer's config.json is compared with the arm's config: the same config reuses the run
  (the runner is not called again); a changed field raises and names it."""
  exp = bench.load_experiment()
  calls = []

  def runner(config, workdir):
    calls.append(workdir)
    fake_runner(config, workdir, rate=1.0)
    with open(os.path.join(workdir, "config.json"), "w") as f:   # what train_and_evaluate writes
      f.write(config.to_json_best_effort(indent=2, sort_keys=True))

  config = exp.arm_config("uniform", num_steps=16)
  workdir = str(tmp_path / "uniform" / "seed0")
  bench.run_arm(config, workdir, runner)
  bench.run_arm(exp.arm_config("uniform", num_steps=16), workdir, runner)
  assert calls == [workdir]
  changed = exp.arm_config("uniform", num_steps=16)
  changed.optim.peak_lr = 1e-3
  with pytest.raises(ValueError, match=r"optim\.peak_lr"):
    bench.run_arm(changed, workdir, runner)
  # A field the old run did not have yet is not a difference.
  assert bench.config_diff({"a": {"b": 1, "c": 2.0}, "e": [1]},
                           {"a": {"b": 1, "c": 2.5, "d": 0}, "e": [2]}) == ["a.c", "e"]
  # Geometries are compared by name and field: renamed, or given a mixture, the run differs.
  old = {"curriculum": {"geometries": {"fitted": {"start_step": 0}}}}
  assert bench.config_diff(old, {"curriculum": {"geometries": {"part0": {"start_step": 0}}}}) == [
      "curriculum.geometries.fitted", "curriculum.geometries.part0"]
  assert bench.config_diff(old, {"curriculum": {"geometries": {"fitted": {
      "start_step": 0, "mixture": {"chat": 3.0}}}}}) == ["curriculum.geometries.fitted.mixture"]
  # A float moved in its last bits by an equal computation is the same; one moved by 1e-9 is not.
  assert 0.1 + 0.2 != 0.3
  assert bench.config_diff({"w": 0.1 + 0.2, "n": 1}, {"w": 0.3, "n": 1}) == []
  assert bench.config_diff({"w": 0.3}, {"w": 0.3 + 1e-9}) == ["w"]


def test_fit_elasticity_command_prints_the_fit_and_the_within_run_agreement(tmp_path, capsys):
  """``--fit-elasticity`` on finished runs: the fitted mixture, then one row per arm of the
  within-run agreement and an "all N runs" row; a run too short to be estimated (all NaN) prints
  "—", not a warning."""
  import warnings

  def runner(config, workdir):
    fake_runner(config, workdir, rate=1.0)
    if config.curriculum.mixer.name == "static" and len(config.curriculum.geometries) == 1:
      return                                       # uniform keeps 1/16 everywhere
    rng = np.random.default_rng(config.seed)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      lines = f.read().splitlines()
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      for line in lines:
        rec = json.loads(line)
        if "weight/chat" in rec:                   # a new random mixture at every logged step
          w = rng.dirichlet([4.0] * 16)
          rec.update({f"share/{s}": float(x) for s, x in zip(SOURCES, w)})
          rec.update({f"loss/{s}": float(2.0 + rng.normal(0, 0.1)) for s in SOURCES})
        f.write(json.dumps(rec) + "\n")

  args = ["--out", str(tmp_path / "cmp"), "--arms", "exp3", "--seeds", "0,1", "--quick",
          "--fit-elasticity"]
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert bench.main(args + ["--steps", "400"], runner=runner) == 0
  out = capsys.readouterr().out
  assert "FITTED_ELASTICITY = (" in out
  agreement = out.split("One run's own estimate")[1]
  assert "exp3" in agreement and "all 2 runs" in agreement
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert bench.main(["--out", str(tmp_path / "short"), "--arms", "exp3", "--seeds", "0",
                       "--quick", "--fit-elasticity"], runner=runner) == 0   # 80 steps < 150
  short = capsys.readouterr().out.split("One run's own estimate")[1]
  assert "—" in short and "nan" not in short


def test_the_scaled_proxy_reads_both_fits_at_the_target_models_size(tmp_path):
  """proxy_scaled_early at the 2 x 64 and 4 x 128 models is exactly the fit made at that size
  (their parameter counts counted by hand); at 6 x 192 it is each source's line in ln N through
  the two fits (worked out here from the listed numbers), and the bench's --layers/--d-model
  reach it."""
  import jax
  from andrea_jax import runconfig
  from andrea_jax.curriculum import simulate
  exp = bench.load_experiment()
  # Embedding 384 x d (257 byte ids padded to 128s) + position 64 x d + per block 12 d^2 + 13 d
  # + the final norm's 2 d.
  def by_hand(layers, d):
    return 384 * d + 64 * d + layers * (12 * d * d + 13 * d) + 2 * d
  assert [n for n, _ in exp.SCALED_FITS["proxy_scaled_early"]] == [by_hand(2, 64),
                                                                   by_hand(4, 128)]
  def first_half(c):
    w_NxS = simulate.simulate(runconfig.build(c).curriculum, jax.random.key(0), 200).weights
    np.testing.assert_allclose(w_NxS[100:], 1 / 16, atol=1e-6)
    return w_NxS[0]
  def mixture(b, power=1.0):
    w = np.maximum(np.array(b), 0.02) ** power
    return w / w.sum()
  c = exp.arm_config("proxy_scaled_early", num_steps=200)
  assert exp.model_params(c) == by_hand(2, 64)
  np.testing.assert_allclose(first_half(c), mixture(exp.PROXY_HALF_ELASTICITY), atol=1e-6)
  c.model.update(num_layers=4, num_heads=4, d_model=128, d_mlp=512)
  np.testing.assert_allclose(first_half(exp.fit_to_model(c, "proxy_scaled_early")),
                             mixture(exp.PROXY_HALF_4X128_ELASTICITY), atol=1e-6)
  small, large = np.array(exp.PROXY_HALF_ELASTICITY), np.array(exp.PROXY_HALF_4X128_ELASTICITY)
  t = np.log(by_hand(6, 192) / by_hand(2, 64)) / np.log(by_hand(4, 128) / by_hand(2, 64))
  configs = []
  def runner(config, workdir):
    configs.append(config)
    return fake_runner(config, workdir, rate=1.0)
  assert bench.main(["--out", str(tmp_path), "--arms", "proxy_scaled_early", "--seeds", "0",
                     "--steps", "200", "--no-overhead", "--layers", "6", "--d-model", "192"],
                    runner=runner) == 0
  (scaled,) = [c for c in configs if c.curriculum.geometries.get("proxy")]
  np.testing.assert_allclose(first_half(scaled), mixture(small + t * (large - small)), atol=1e-6)
  with pytest.raises(ValueError, match="num_params"):
    exp.geometries("proxy_scaled_early", 200)
  # The sharpened arms: the same fits, the mixture proportional to max(b, 0.02) ** 1.5 and ** 2.
  for arm, power in (("proxy_scaled_p15_early", 1.5), ("proxy_scaled_p2_early", 2.0)):
    c = exp.arm_config(arm, num_steps=200)
    np.testing.assert_allclose(first_half(c), mixture(small, power), atol=1e-6)
    c.model.update(num_layers=4, num_heads=4, d_model=128, d_mlp=512)
    np.testing.assert_allclose(first_half(exp.fit_to_model(c, arm)),
                               mixture(large, power), atol=1e-6)
  # The single-size fit sharpened: the 0.13M half-length fit at power 1.5 at every target size.
  c = exp.arm_config("proxy_half_p15_early", num_steps=200)
  np.testing.assert_allclose(first_half(c), mixture(small, 1.5), atol=1e-6)
  c.model.update(num_layers=6, num_heads=6, d_model=192, d_mlp=768)
  np.testing.assert_allclose(first_half(exp.fit_to_model(c, "proxy_half_p15_early")),
                             mixture(small, 1.5), atol=1e-6)


def test_model_size_flags_reach_every_run(tmp_path):
  from andrea_jax import runconfig
  configs = []
  def runner(config, workdir):
    configs.append(config)
    return fake_runner(config, workdir, rate=1.0)
  assert bench.main(["--out", str(tmp_path), "--arms", "elastic", "--seeds", "0", "--quick",
                     "--no-overhead", "--layers", "3", "--d-model", "96"], runner=runner) == 0
  assert len(configs) == 2                                   # uniform and elastic, one seed
  for c in configs:
    # 96 wide: three 32-wide heads and a 384-wide MLP, over --quick's one layer of 32.
    assert (c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.d_mlp) == (3, 96, 3, 384)
    runconfig.build(c)                                       # still a valid run
  for bad in (["--d-model", "100"], ["--d-model", "0"], ["--layers", "0"]):
    with pytest.raises(SystemExit):
      bench.main(["--out", str(tmp_path), "--quick", *bad], runner=runner)


def test_fit_proxy_runs_the_probes_and_recovers_their_elasticities(tmp_path, capsys):
  """``--fit-proxy`` on a fake trainer whose per-source training loss is exactly ``c - b ln(16 w)``
  under the probe's mixture ``w`` (read from the run's own curriculum): it runs the 20 probes at
  the tuning seed and prints the chosen ``b``."""
  import jax
  from andrea_jax import curriculum, runconfig
  b = np.round(np.linspace(0.02, 0.62, 16), 3)
  seeds = []

  def runner(config, workdir):
    seeds.append(config.seed)
    spec = runconfig.build(config).curriculum
    w = curriculum.weights_at(curriculum.schedule(curriculum.init(spec, jax.random.key(0))), 0)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      for step in range(0, config.train.num_steps, 8):
        rec = {"step": step, "loss": 2.0, **{f"weight/{s}": float(x) for s, x in zip(SOURCES, w)},
               **{f"share/{s}": float(x) for s, x in zip(SOURCES, w)},
               **{f"loss/{s}": float(2.0 - bs * math.log(16 * x))
                  for s, bs, x in zip(SOURCES, b, w)}}
        f.write(json.dumps(rec) + "\n")

  assert bench.main(["--out", str(tmp_path), "--quick", "--fit-proxy"], runner=runner) == 0
  assert seeds == [100] * 20
  out = capsys.readouterr().out
  assert "PROXY_ELASTICITY = (" + ", ".join(f"{x:.3f}" for x in b) + ")" in out
  with open(tmp_path / "proxy_fit.json") as f:
    fit = json.load(f)
  np.testing.assert_allclose(fit["b"], b, atol=2e-6)   # the weights pass through float32
  w = np.maximum(b, 0.02)
  np.testing.assert_allclose(fit["mixture"], w / w.sum(), atol=1e-6)


def test_summarize_with_seeds_that_differ_by_hand():
  """Three seeds of an arm against uniform, evaluated at 0, 400 and 800 of an 800-step run. The
  answers are worked out here by linear interpolation on paper:
  seed 0: uniform ends at 2.0, the arm passes 2.0 halfway between 3.0 (step 400) and 1.0 (800):
  step 600; seed 1: uniform ends at 2.2, the arm goes 3.0 -> 2.0 over 400-800: 2.2 at step 720;
  seed 2: uniform ends at 1.5, the arm ends at 1.8: never."""
  srcs = ["a"]

  def run(curve):
    return {"eval_steps": np.array([0, 400, 800]), "eval_mean": np.array(curve, np.float64),
            "eval_source": {"a": np.array(curve[-1:])}, "wall_s": 1.0,
            "weights": [1.0], "late_weights": [1.0], "shares": [1.0], "late_shares": [1.0]}

  runs = {"uniform": {0: run([5.0, 3.0, 2.0]), 1: run([5.0, 3.0, 2.2]), 2: run([5.0, 2.5, 1.5])},
          "arm": {0: run([5.0, 3.0, 1.0]), 1: run([5.0, 3.0, 2.0]), 2: run([5.0, 2.6, 1.8])}}
  s = bench.summarize(runs, 800, srcs)["arm"]
  np.testing.assert_allclose(s["steps_to_uniform_final"][:2], [600.0, 720.0])
  assert math.isnan(s["steps_to_uniform_final"][2]) and s["reached"] == 2
  assert math.isnan(s["mean_steps"]) and math.isnan(s["fewer_steps"])   # one seed never gets there
  # Paired: -1.0, -0.2, +0.3: mean -0.3, sample sd sqrt(((-0.7)^2 + 0.1^2 + 0.6^2) / 2).
  assert s["delta_vs_uniform"] == pytest.approx(-0.3)
  assert s["delta_sd"] == pytest.approx(math.sqrt((0.49 + 0.01 + 0.36) / 2))
  # Without seed 2 both reach it: (600 + 720) / 2 = 660 steps, 1 - 660 / 800 = 17.5% fewer.
  two = bench.summarize({k: {i: v[i] for i in (0, 1)} for k, v in runs.items()}, 800, srcs)["arm"]
  assert two["mean_steps"] == pytest.approx(660.0) and two["fewer_steps"] == pytest.approx(0.175)

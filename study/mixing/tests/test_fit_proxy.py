"""``python -m study.mixing.fit_proxy`` and ``study/mixing/proxy_config.py``: probes, fit, the target run."""

import importlib
import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from andrea_jax import curriculum, runconfig
from study.mixing import fit_proxy
from andrea_jax.curriculum import simulate
from andrea_jax.sources import SOURCES

ROOT = pathlib.Path(__file__).resolve().parents[3]
B = np.round(np.linspace(0.03, 0.6, 16), 3)


def _experiment(name):
  return importlib.import_module({"proxy": "study.mixing.proxy_config",
                                  "compare_mixers": "study.mixing.arms"}.get(name, f"experiments.{name}"))


def _power_law_runner(calls, stops=None):
  """A fake trainer: each source's logged training loss is exactly ``2 - B ln(16 w)`` under the
  mixture the run's own curriculum holds (every 10 steps up to its stop, noise-free)."""
  def runner(config, workdir):
    calls.append(workdir)
    if stops is not None:
      stops.append(config.train.stop_step)
    spec = runconfig.build(config).curriculum
    w = curriculum.weights_at(curriculum.schedule(curriculum.init(spec, jax.random.key(0))), 0)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      for step in range(0, (config.train.stop_step or config.train.num_steps) + 1, 10):
        rec = {"step": step, "loss": 2.0}
        rec.update({f"loss/{s}": float(2.0 - b * math.log(16 * x))
                    for s, b, x in zip(SOURCES, B, w)})
        f.write(json.dumps(rec) + "\n")
  return runner


def test_fit_recovers_the_elasticities_and_reuses_finished_probes(tmp_path):
  config = _experiment("synthetic").get_config()
  calls, stops = [], []
  out = fit_proxy.fit(config, str(tmp_path), config_file="experiments/synthetic.py",
                      runner=_power_law_runner(calls, stops))
  assert len(calls) == 20 and calls[0].endswith("probe_00")
  half = config.train.num_steps // 2     # the default: each probe runs the first half
  assert stops == [half] * 20 and (out["probe_steps"], out["stop"], out["late"]) == (half, 0.5, 0.25)
  np.testing.assert_allclose(out["b"], B, atol=2e-6)   # the mixture passes through float32
  w = np.maximum(B, 0.02)
  # The default power is 1.5: the mixture proportional to max(b, 0.02) ** 1.5.
  np.testing.assert_allclose(out["mixture"], w ** 1.5 / (w ** 1.5).sum(), atol=1e-6)
  assert out["hold"] == 0.5 and out["sources"] == list(SOURCES)
  # The probes' model by hand: 384 padded byte rows and 128 positions of d = 128, 4 layers of
  # 12 d^2 + 13 d (attention, MLP of 4 d, two layer norms, biases), the final layer norm.
  assert out["num_params"] == 384 * 128 + 128 * 128 + 4 * (12 * 128 ** 2 + 13 * 128) + 2 * 128
  with open(tmp_path / "proxy_fit.json") as f:
    assert json.load(f)["config_file"] == "experiments/synthetic.py"

  def refuse(config, workdir):
    raise AssertionError(f"retrained {workdir}")
  again = fit_proxy.fit(config, str(tmp_path), lam=0.5, config_file="experiments/synthetic.py",
                        runner=refuse)
  np.testing.assert_allclose(again["mixture"], 0.5 * w ** 1.5 / (w ** 1.5).sum() + 0.5 / 16,
                             atol=1e-6)
  sharp = fit_proxy.fit(config, str(tmp_path), power=2.0, config_file="experiments/synthetic.py",
                        runner=refuse)
  np.testing.assert_allclose(sharp["mixture"], w ** 2 / (w ** 2).sum(), atol=1e-6)
  plain = fit_proxy.fit(config, str(tmp_path), power=1.0, config_file="experiments/synthetic.py",
                        runner=refuse)
  np.testing.assert_allclose(plain["mixture"], w / w.sum(), atol=1e-6)
  assert (sharp["power"], out["power"], plain["power"]) == (2.0, 1.5, 1.0)


def test_the_probes_cost_is_counted_in_target_runs(tmp_path, capsys):
  # A 2 x 64 proxy (d_mlp 256) of tiny.py's 4 x 128 model. By hand: 384 padded byte rows and 128
  # positions of d = 64, two layers of 12 d^2 + 13 d, the final layer norm: 132,864 parameters;
  # the target has 858,880. 20 probes of half the steps at the same batch: 10 * 132864 / 858880.
  target = _experiment("synthetic").get_config()
  config = _experiment("synthetic").get_config()
  config.model.update(num_layers=2, d_model=64, d_mlp=256)
  proxy_params = 384 * 64 + 128 * 64 + 2 * (12 * 64 ** 2 + 13 * 64) + 2 * 64
  assert proxy_params == 132_864
  out = fit_proxy.fit(config, str(tmp_path / "a"), target=target, runner=_power_law_runner([]))
  assert (out["num_params"], out["target_params"]) == (proxy_params, 858_880)
  assert out["probe_cost"] == pytest.approx(10 * 132_864 / 858_880, rel=1e-12)
  assert f"20 probes of {target.train.num_steps // 2} steps at 132,864 parameters: 1.55 runs of " \
      "the target (858,880 parameters" in capsys.readouterr().out
  with open(tmp_path / "a" / "proxy_fit.json") as f:
    assert json.load(f)["probe_cost"] == pytest.approx(out["probe_cost"], rel=1e-12)
  # Half the rows per step and a quarter of the steps (stop 0.25): an eighth of the tokens.
  config.data.global_batch_size = target.data.global_batch_size // 2
  small = fit_proxy.fit(config, str(tmp_path / "b"), target=target, stop=0.25,
                        runner=_power_law_runner([]))
  assert small["probe_cost"] == pytest.approx(out["probe_cost"] / 4, rel=1e-12)
  # Without a target nothing is claimed.
  assert "probe_cost" not in fit_proxy.fit(config, str(tmp_path / "b"),
                                           runner=_power_law_runner([]), stop=0.25)
  assert fit_proxy.probe_cost(target, target, 1, target.train.num_steps) == 1.0


def test_a_probe_holds_its_mixture_on_the_full_simplex_with_the_static_strategy():
  config = _experiment("synthetic").get_config()
  mixture = np.linspace(1.0, 2.0, 16) / np.linspace(1.0, 2.0, 16).sum()
  c = fit_proxy.probe_config(config, mixture, SOURCES)
  assert config.curriculum.mixer.name == "andrea"         # the caller's config is left alone
  spec = runconfig.build(c).curriculum
  w_NxS = simulate.simulate(spec, jax.random.key(0), 50).weights
  np.testing.assert_allclose(w_NxS, np.broadcast_to(mixture, (50, 16)), atol=1e-6)
  assert c.train.checkpoint_every == 0 and not c.train.plot


def test_the_target_run_trains_the_recorded_config_under_the_schedule(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  mixture = np.maximum(B, 0.02) / np.maximum(B, 0.02).sum()
  with open(tmp_path / "proxy_fit.json", "w") as f:
    json.dump({"sources": list(SOURCES), "mixture": mixture.tolist(), "hold": 0.25,
               "config_file": "experiments/synthetic.py:v2_firehose"}, f)
  c = _experiment("proxy").get_config(str(tmp_path))
  tiny = _experiment("synthetic").get_config("v2_firehose")
  assert c.model.to_dict() == tiny.model.to_dict()        # the target's own model
  assert c.train.num_steps == 1000
  spec = runconfig.build(c).curriculum
  assert spec.geometry_names == ("proxy", "uniform") and spec.starts.tolist() == [0, 250]
  w_NxS = simulate.simulate(spec, jax.random.key(0), 400).weights
  np.testing.assert_allclose(w_NxS[:250], np.broadcast_to(mixture, (250, 16)), atol=1e-6)
  np.testing.assert_allclose(w_NxS[250:], 1 / 16, atol=1e-6)


def _write_fit(fit_dir, **fields):
  fit_dir.mkdir(parents=True, exist_ok=True)
  record = {"sources": list(SOURCES), "mixture": [1 / 16] * 16, "hold": 0.5, "lam": 1.0,
            "power": 1.5, "num_steps": 1000, "config_file": "experiments/synthetic.py:v2_firehose",
            "probes": "static", "stop": 0.5, "late": 0.25, "ratio": 4.0}
  record.update(fields)
  with open(fit_dir / "proxy_fit.json", "w") as f:
    json.dump(record, f)
  return str(fit_dir)


def test_fits_at_two_sizes_are_read_at_the_targets_size(tmp_path, monkeypatch):
  """Two fits of the same config at 1e5 and 1e6 parameters: the target run's first part holds
  their elasticities interpolated in ln(parameters) at the config file's model (858,880
  parameters, counted by hand in the test above), then ``max(b, 0.02) ** 1.5`` normalised."""
  monkeypatch.chdir(ROOT)
  b_small, b_large = np.linspace(0.01, 0.3, 16), np.linspace(0.4, 0.1, 16)
  small = _write_fit(tmp_path / "small", b=b_small.tolist(), num_params=100_000)
  large = _write_fit(tmp_path / "large", b=b_large.tolist(), num_params=1_000_000)
  target = 384 * 128 + 128 * 128 + 4 * (12 * 128 ** 2 + 13 * 128) + 2 * 128
  t = math.log10(target / 100_000)                   # the fraction of the way from 1e5 to 1e6
  w = np.maximum(b_small + t * (b_large - b_small), 0.02) ** 1.5
  for dirs in (f"{small},{large}", f"{large},{small}"):
    c = _experiment("proxy").get_config(dirs)
    w_NxS = simulate.simulate(runconfig.build(c).curriculum, jax.random.key(0), 600).weights
    np.testing.assert_allclose(w_NxS[:500], np.broadcast_to(w / w.sum(), (500, 16)), atol=1e-6)
    np.testing.assert_allclose(w_NxS[500:], 1 / 16, atol=1e-6)
  # What cannot be read together is refused, naming the field, both values and a file.
  old = _write_fit(tmp_path / "old", b=b_large.tolist())
  with pytest.raises(ValueError, match=r"old/proxy_fit.json records no num_params"):
    _experiment("proxy").get_config(f"{small},{old}")
  for field, value in (("power", 1.0), ("lam", 0.5), ("hold", 0.25), ("num_steps", 400),
                       ("config_file", "experiments/synthetic.py"), ("probes", "schedule"),
                       ("stop", 1.0), ("late", 0.1), ("ratio", 2.0)):
    other = _write_fit(tmp_path / field, b=b_large.tolist(), num_params=1_000_000,
                       **{field: value})
    with pytest.raises(ValueError, match=rf"the fits disagree on {field}: .* in .*small.*, "
                                         rf"{value!r} in .*{field}/proxy_fit.json"):
      _experiment("proxy").get_config(f"{small},{other}")
  same = _write_fit(tmp_path / "same", b=b_large.tolist(), num_params=100_000)
  with pytest.raises(ValueError, match=r"small/proxy_fit.json and .*same/proxy_fit.json are fits "
                                       r"of the same size \(num_params 100000\)"):
    _experiment("proxy").get_config(f"{small},{same}")
  with pytest.raises(ValueError, match="an empty fit directory"):
    _experiment("proxy").get_config(f"{small},{large},")
  # lam is the fits' own: half the sharpened mixture, half uniform.
  half = [_write_fit(tmp_path / f"half_{n}", b=b.tolist(), num_params=n, lam=0.5)
          for b, n in ((b_small, 100_000), (b_large, 1_000_000))]
  c = _experiment("proxy").get_config(",".join(half))
  w_NxS = simulate.simulate(runconfig.build(c).curriculum, jax.random.key(0), 10).weights
  np.testing.assert_allclose(w_NxS[0], 0.5 * w / w.sum() + 0.5 / 16, atol=1e-6)


def test_the_target_run_names_what_is_missing(tmp_path):
  proxy_exp = _experiment("proxy")
  with pytest.raises(ValueError, match="needs the fit's directory"):
    proxy_exp.get_config()
  with pytest.raises(ValueError, match=r"proxy_fit.json does not exist: run python -m "):
    proxy_exp.get_config(str(tmp_path))
  with open(tmp_path / "proxy_fit.json", "w") as f:
    json.dump({"sources": list(SOURCES), "mixture": [1 / 16] * 16, "hold": 0.5,
               "config_file": "experiments/nowhere.py"}, f)
  with pytest.raises(ValueError, match="config file 'experiments/nowhere.py'"):
    proxy_exp.get_config(str(tmp_path))


@pytest.mark.parametrize("kwargs,message", [
    ({"lam": 1.5}, r"lam must be in \[0, 1\], got 1.5"),
    ({"hold": 0.0}, r"hold must be in \(0, 1\], got 0.0"),
    ({"late": float("nan")}, r"late must be in \(0, 1\], got nan"),
    ({"stop": 1.5}, r"stop must be in \(0, 1\], got 1.5"),
    ({"stop": 1e-9}, r"stop = 1e-09 of train.num_steps = \d+ leaves no step to run"),
    ({"ratio": 1.0}, "ratio must be a finite number > 1"),
    ({"power": 0.0}, "power must be a finite number > 0, got 0.0"),
    ({"power": float("nan")}, "power must be a finite number > 0, got nan"),
    ({"probes": "dynamic"}, "probes must be 'static' or 'schedule', got 'dynamic'"),
    # The window (the last quarter of the first half) lies before the switch to uniform at 1/2.
    ({"probes": "schedule"}, r"probes='schedule' fits the losses after the switch to uniform at "
                             r"step \d+ \(hold = 0.5\), but the last late = 0.25 of the \d+ steps "
                             r"run \(stop = 0.5\) starts at step \d+: raise stop"),
    ({"probes": "schedule", "stop": 1.0, "hold": 0.8}, r"starts at step \d+: late <= 0.2 fits"),
    ({"probes": "schedule", "stop": 1.0, "hold": 1.0}, r"needs a switch to uniform inside the run, "
                                                       r"but hold = 1.0 of train.num_steps = \d+ "
                                                       r"puts it at step \d+"),
    ({"probes": "schedule", "stop": 1.0, "hold": 1e-9}, r"puts it at step 0"),
    # 5 of tiny.py's 1000 steps: shorter than a phase (7 steps), found before the probes run.
    ({"hold": 0.005}, r"hold = 0.005 gives the target run an invalid schedule: .*lasts 5 steps"),
])
def test_bad_settings_are_refused_before_any_probe_runs(tmp_path, kwargs, message):
  def refuse(config, workdir):
    raise AssertionError("a probe ran")
  with pytest.raises(ValueError, match=message):
    fit_proxy.fit(_experiment("synthetic").get_config(), str(tmp_path), runner=refuse, **kwargs)


def test_whole_probes_run_to_the_end_and_the_window_is_of_the_steps_run(tmp_path):
  """--stop 1: no stop_step; the late window is the last 10% of all steps. With --stop 0.5 and
  --late 0.5 on a trainer whose losses change at the half, only the first half's count."""
  config = _experiment("synthetic").get_config()
  stops = []
  out = fit_proxy.fit(config, str(tmp_path / "whole"), stop=1.0, late=0.1,
                      runner=_power_law_runner([], stops))
  assert stops == [0] * 20 and out["probe_steps"] == config.train.num_steps
  np.testing.assert_allclose(out["b"], B, atol=2e-6)

  n = config.train.num_steps
  def steps_then_garbage(config, workdir):   # losses past the stop would give b = 0
    _power_law_runner([])(config, workdir)
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
      for step in range(n // 2, n, 10):
        f.write(json.dumps({"step": step, **{f"loss/{s}": 9.0 for s in SOURCES}}) + "\n")
  out = fit_proxy.fit(config, str(tmp_path / "half"), stop=0.5, late=0.5, runner=steps_then_garbage)
  np.testing.assert_allclose(out["b"], B, atol=2e-6)


@pytest.mark.slow
def test_schedule_probes_switch_to_uniform_and_fit_after_the_switch(tmp_path):
  """probes="schedule": each probe's mixture for the first half, then 1/16 on every source (even
  if the config file's static mixture is skewed); the fit reads the steps after the switch only.
  The fake trainer's losses before the switch are garbage, after it they follow the early share."""
  config = _experiment("synthetic").get_config()
  curriculum.set_mixer(config, "static")
  config.curriculum.mixer.mixture.chat = 5.0
  n = config.train.num_steps
  switch = n // 2
  seen = []

  def runner(config, workdir):
    spec = runconfig.build(config).curriculum
    w_NxS = simulate.simulate(spec, jax.random.key(0), n).weights
    seen.append(w_NxS)
    early = w_NxS[0]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      for step in range(0, n + 1, 10):
        loss = ({f"loss/{s}": 9.0 for s in SOURCES} if step < switch else
                {f"loss/{s}": float(2.0 - b * math.log(16 * x))
                 for s, b, x in zip(SOURCES, B, early)})
        f.write(json.dumps({"step": step, **loss}) + "\n")
  out = fit_proxy.fit(config, str(tmp_path), probes="schedule", stop=1.0, late=0.25, hold=0.5,
                      runner=runner)
  mixtures = np.array(out["probe_mixtures"])
  for w_NxS, mixture in zip(seen, mixtures):
    np.testing.assert_allclose(w_NxS[:switch], np.broadcast_to(mixture, (switch, 16)), atol=1e-6)
    np.testing.assert_allclose(w_NxS[switch:], 1 / 16, atol=1e-6)
  assert len(mixtures) == 20 and out["probes"] == "schedule"
  np.testing.assert_allclose(out["b"], B, atol=2e-6)
  # The window may start at the switch itself (the first step under uniform batches), and the
  # probes may stop short of the end when the window still lies after the switch.
  for stop, late in ((1.0, 0.5), (0.75, 1 / 3)):
    out = fit_proxy.fit(config, str(tmp_path / f"stop{stop}"), probes="schedule", stop=stop,
                        late=late, hold=0.5, runner=runner)
    assert out["probe_steps"] - round(late * out["probe_steps"]) == switch   # by hand: n/2
    np.testing.assert_allclose(out["b"], B, atol=2e-6)
  # Static probes are not schedule probes: their directory is refused, naming the field.
  fit_proxy.fit(config, str(tmp_path / "static"), stop=1.0, runner=_power_law_runner([]))
  with pytest.raises(ValueError, match=r"is a finished probe of another config "
                                       r"\(curriculum.geometries.uniform"):
    fit_proxy.fit(config, str(tmp_path / "static"), probes="schedule", stop=1.0, runner=runner)


def test_probes_run_to_another_stop_are_reused_or_go_on(tmp_path):
  """Whole probes serve a half-length fit (their first half is its log); half-length probes go on
  when whole ones are asked for; probes from before train.stop_step count as stop_step 0."""
  config = _experiment("synthetic").get_config()
  calls = []
  fit_proxy.fit(config, str(tmp_path), stop=1.0, runner=_power_law_runner(calls))
  for k in range(20):     # as written before the field existed
    path = tmp_path / f"probe_{k:02d}" / "done.json"
    stored = json.loads(path.read_text())
    del stored["train"]["stop_step"]
    path.write_text(json.dumps(stored))
  out = fit_proxy.fit(config, str(tmp_path), stop=0.5, runner=_power_law_runner(calls))
  assert len(calls) == 20 and out["probe_steps"] == config.train.num_steps // 2
  np.testing.assert_allclose(out["b"], B, atol=2e-6)

  calls, stops = [], []
  fit_proxy.fit(config, str(tmp_path / "half"), runner=_power_law_runner(calls))
  out = fit_proxy.fit(config, str(tmp_path / "half"), stop=1.0,
                      runner=_power_law_runner(calls, stops))
  assert len(calls) == 40 and stops == [0] * 20
  np.testing.assert_allclose(out["b"], B, atol=2e-6)


def test_a_probe_interrupted_past_the_asked_stop_is_reused(tmp_path):
  """Probes made with --stop 0.75, killed after their checkpoint at 3/4 of the run: a half-length
  fit finds its steps in their logs (resuming them would be refused, past the stop); one killed
  before the half goes on."""
  config = _experiment("synthetic").get_config()
  n = config.train.num_steps
  fit_proxy.fit(config, str(tmp_path), stop=1.0, runner=_power_law_runner([]))
  for k in range(20):    # as an interrupted probe leaves its folder: config.json, no done.json
    probe = tmp_path / f"probe_{k:02d}"
    stored = json.loads((probe / "done.json").read_text())
    stored["train"]["stop_step"] = 3 * n // 4
    (probe / "config.json").write_text(json.dumps(stored))
    (probe / "done.json").unlink()
    (probe / "checkpoints" / str(k and 3 * n // 4 or n // 4)).mkdir(parents=True)
  calls = []
  out = fit_proxy.fit(config, str(tmp_path), stop=0.5, runner=_power_law_runner(calls))
  assert calls == [str(tmp_path / "probe_00")]   # only the one checkpointed before the half
  np.testing.assert_allclose(out["b"], B, atol=2e-6)
  # A later fit at 0.6: the probes marked done at the half hold 3/4 of the run in their logs
  # (their checkpoint says so) and are reused, not resumed past their checkpoint; probe 0, run
  # to the half only, goes on.
  calls = []
  out = fit_proxy.fit(config, str(tmp_path), stop=0.6, runner=_power_law_runner(calls))
  assert calls == [str(tmp_path / "probe_00")]
  np.testing.assert_allclose(out["b"], B, atol=2e-6)


def test_late_losses_name_the_file_and_the_silent_source(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text(json.dumps({"step": 95, "loss/chat": 1.0, "loss/oasst": 3.0}) + "\n"
                  + json.dumps({"step": 99, "loss/chat": 2.0}) + "\n"
                  + json.dumps({"step": 10, "loss/dictionary": 5.0}) + "\n")
  np.testing.assert_allclose(fit_proxy.late_losses(str(path), ["chat", "oasst"], 100, 0.1),
                             [1.5, 3.0])
  with pytest.raises(ValueError, match=r"metrics.jsonl: no training loss logged for dictionary "
                                       r"in the last 10% of the 100 steps"):
    fit_proxy.late_losses(str(path), ["chat", "dictionary"], 100, 0.1)


def test_late_losses_leave_out_skipped_steps_and_non_finite_losses(tmp_path):
  # A skipped step is logged with finite false and its losses as strings (logs writes NaN so).
  path = tmp_path / "metrics.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in (
      {"step": 95, "finite": True, "loss/chat": 1.0},
      {"step": 96, "finite": False, "loss/chat": "nan"},
      {"step": 97, "finite": True, "loss/chat": "inf"},
      {"step": 99, "finite": True, "loss/chat": 2.0})) + "\n")
  np.testing.assert_allclose(fit_proxy.late_losses(str(path), ["chat"], 100, 0.1), [1.5])


@pytest.mark.slow
def test_the_command_line_refuses_a_bad_setting_with_one_line(tmp_path):
  r = subprocess.run([sys.executable, "-m", "study.mixing.fit_proxy",
                      "--config=experiments/synthetic.py", f"--workdir={tmp_path}", "--hold=2"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 1
  assert r.stderr.strip().splitlines()[-1] == "error: hold must be in (0, 1], got 2.0"
  assert not list(tmp_path.iterdir())


def test_probes_of_another_config_are_not_reused(tmp_path):
  """A finished probe made with other settings is refused, naming the fields, not fitted."""
  config = _experiment("synthetic").get_config()
  fit_proxy.fit(config, str(tmp_path), runner=_power_law_runner([]))
  config.train.num_steps = 500
  config.optim.peak_lr = 1e-3
  with pytest.raises(ValueError, match=r"probe_00 is a finished probe of another config "
                                       r"\(optim.peak_lr, train.num_steps, train.stop_step "
                                       r"differ\)"):
    fit_proxy.fit(config, str(tmp_path), runner=_power_law_runner([]))


def test_an_interrupted_probe_stops_the_fit_and_is_resumed_next_time(tmp_path):
  config = _experiment("synthetic").get_config()
  calls = []
  good = _power_law_runner(calls)

  def interrupted(config, workdir):
    if workdir.endswith("probe_02"):
      os.makedirs(workdir, exist_ok=True)
      return {"interrupted_at": 123}
    return good(config, workdir)
  with pytest.raises(ValueError, match=r"probe_02 was interrupted at step 123 \(checkpoint saved\)"):
    fit_proxy.fit(config, str(tmp_path), runner=interrupted)
  assert len(calls) == 2 and not (tmp_path / "proxy_fit.json").exists()
  out = fit_proxy.fit(config, str(tmp_path), runner=good)       # probes 00 and 01 are reused
  assert len(calls) == 2 + 18
  np.testing.assert_allclose(out["b"], B, atol=2e-6)


def test_then_uniform_is_uniform_whatever_the_config_files_static_mixture(tmp_path, monkeypatch):
  """The recorded config file sets a non-uniform static mixture: the target run's second part is
  still 1/16 on every source."""
  monkeypatch.chdir(ROOT)
  base = tmp_path / "skewed.py"
  base.write_text("from andrea_jax.config import load_config_file\n"
                  "def get_config():\n"
                  f"  c = load_config_file({str(ROOT / 'experiments' / 'synthetic.py')!r})\n"
                  "  from andrea_jax.curriculum import set_mixer\n"
                  "  set_mixer(c, 'static')\n"
                  "  c.curriculum.mixer.mixture.chat = 5.0\n"
                  "  return c\n")
  fit_dir = tmp_path / "fit"
  fit_dir.mkdir()
  with open(fit_dir / "proxy_fit.json", "w") as f:
    json.dump({"sources": list(SOURCES), "mixture": [1 / 16] * 16, "hold": 0.5,
               "config_file": str(base)}, f)
  c = _experiment("proxy").get_config(str(fit_dir))
  w_NxS = simulate.simulate(runconfig.build(c).curriculum, jax.random.key(0), 600).weights
  np.testing.assert_allclose(w_NxS[500:], 1 / 16, atol=1e-6)


def test_probe_configs_compare_floats_to_their_last_bits_only():
  assert fit_proxy._changed({"a": {"w": 0.1 + 0.2}}, {"a": {"w": 0.3}}) == []
  assert fit_proxy._changed({"a": {"w": 0.3}}, {"a": {"w": 0.3 + 1e-9}}) == ["a.w"]
  assert fit_proxy._changed({"a": 1}, {"a": 1, "b": 2}) == ["b"]


def test_an_interrupted_probe_of_another_config_is_not_resumed(tmp_path):
  config = _experiment("synthetic").get_config()
  (tmp_path / "probe_00").mkdir()
  other = fit_proxy.probe_config(config, np.full(16, 1 / 16), SOURCES,   # probe 0 is uniform
                                 stop_step=config.train.num_steps // 2)
  other.train.num_steps = 7
  (tmp_path / "probe_00" / "config.json").write_text(other.to_json_best_effort(sort_keys=True))
  def refuse(config, workdir):
    raise AssertionError("resumed")
  with pytest.raises(ValueError, match=r"probe_00 holds an interrupted probe of another config "
                                       r"\(train.num_steps differ\)"):
    fit_proxy.fit(config, str(tmp_path), runner=refuse)


def test_specs_that_differ_only_in_a_held_geometry_differ():
  """A full-simplex geometry whose own mixture is uniform (held) and one without (the mixer's):
  the same mixtures, different runs under a mixer."""
  import ml_collections
  from andrea_jax.curriculum import geometry
  specs = []
  for mixture in ({}, None):
    c = curriculum.curriculum_config(mixer="elastic")
    c.geometries = ml_collections.ConfigDict({"all": geometry("all", 0, mixture=mixture)})
    specs.append(curriculum.spec_from_config(c))
  assert specs[0].geometry_mixers.tolist() == [1] and specs[1].geometry_mixers.tolist() == [0]
  assert specs[0] != specs[1] and hash(specs[0]) != hash(specs[1])

"""``study.mixing.influence``'s pilot and ``fit_proxy --method influence``: the measured
state, the sources solved at once, the Gauss-Newton rows, the cost, the fit file and bad input."""

import functools
import json
import pathlib
import subprocess
import sys

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from andrea_jax import curriculum, data, runconfig, step, train
from study.mixing import fit_proxy
from study.mixing import influence as inf
from study.mixing import proxy
from andrea_jax.sources import SOURCES
from tests.util import small_run_config
from study.mixing.tests.test_gradient_probe import _dense_gauss_newton

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _four_rows():
  from andrea_jax import step as step_lib
  from andrea_jax.model import ModelConfig, Transformer, init_params
  cfg = ModelConfig(vocab_size=7, d_model=4, num_heads=1, num_layers=1, d_mlp=4, max_len=4,
                    vocab_multiple=1)
  model = Transformer(cfg)
  rng = np.random.default_rng(8)
  batch = {"inputs": rng.integers(0, 7, (4, 4)).astype(np.int32),
           "targets": rng.integers(0, 7, (4, 4)).astype(np.int32),
           "segment_ids": np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 2, 2], [1, 1, 1, 1]],
                                   np.int32),
           "positions": np.array([[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 0, 1], [0, 1, 2, 3]],
                                 np.int32),
           "source_ids": np.array([0, 1, 0, 1], np.int32)}
  params = init_params(cfg, jax.random.key(9))
  tx = optax.adam(1e-2, b1=0.9, b2=0.95, eps=1e-8)
  state = tx.init(params)
  loss = lambda p: step_lib.token_losses(model, p, batch, True)[0].sum()
  for _ in range(3):
    upd, state = tx.update(jax.grad(loss)(params), state, params)
  return model, params, state, batch


def _dense_expectation(model, params, state, batch, lam, gn_rows):
  """b_s by dense algebra: each row's gradient by jax.grad of its own mean loss, G formed from the
  Jacobian on the first gn_rows rows, the shares counted from the masks."""
  from andrea_jax import step as step_lib
  gn_batch = {k: jnp.asarray(v[:gn_rows]) for k, v in batch.items()}
  dense, flat, unravel = _dense_gauss_newton(model, params, gn_batch)

  def row_grad(r):
    one = jax.tree.map(lambda x: jnp.asarray(x[r:r + 1]), batch)
    f = lambda x: (lambda l, m: l.sum() / m.sum())(*step_lib.token_losses(model, unravel(x), one,
                                                                          True))
    return np.asarray(jax.grad(f)(flat), np.float64)
  nu = np.asarray(jax.flatten_util.ravel_pytree(state[0].nu)[0], np.float64)
  d = np.sqrt(nu / (1 - 0.95 ** 3)) + 1e-8
  tokens = (batch["segment_ids"] > 0).sum(1)
  share = np.array([tokens[[0, 2]].sum(), tokens[[1, 3]].sum()]) / tokens.sum()
  # source 0: rows 0 (A) and 2 (B); source 1: rows 1 (A) and 3 (B)
  return np.array([share[s] * row_grad(a) @ np.linalg.solve(dense + lam * np.diag(d), row_grad(b))
                   for s, (a, b) in enumerate(((0, 2), (1, 3)))])


@pytest.mark.slow
@functools.lru_cache
def _four_rows_expectation(gn_rows: int) -> np.ndarray:
  """:func:`_dense_expectation` of :func:`_four_rows` at lam 0.3 (worked out once per module)."""
  return _dense_expectation(*_four_rows(), 0.3, gn_rows)


@pytest.mark.parametrize("gn_rows, source_batch", [(None, None), (2, None), (None, 2)])
def test_sources_solved_at_once_against_dense_solves(gn_rows, source_batch):
  model, params, state, batch = _four_rows()
  expect = _four_rows_expectation(4 if gn_rows is None else gn_rows)
  b, _ = inf.influence(model, True, params, state, batch, 3, 0.3, 1e-8, 0.95, iters=3000,
                       tol=1e-8, gn_rows=gn_rows, source_batch=source_batch)
  np.testing.assert_allclose(b, [*expect, 0.0], rtol=3e-3, atol=1e-9)   # source 2 has no rows
  if gn_rows is not None:   # the matrix of two rows is not the matrix of four
    full = _four_rows_expectation(4)
    assert np.abs(full - expect).max() > 1e-3 * np.abs(full).max()


def test_a_measurement_refuses_a_state_before_any_update_and_a_bad_horizon():
  model, params, _, batch = _four_rows()
  fresh = optax.adam(1e-2).init(params)
  with pytest.raises(ValueError, match="no update yet"):
    inf.influence(model, True, params, fresh, batch, 2, 0.3, 1e-8, 0.95, iters=2)
  _, _, state, _ = _four_rows()
  with pytest.raises(ValueError, match="lam must be a finite number > 0, got nan"):
    inf.influence(model, True, params, state, batch, 2, float("nan"), 1e-8, 0.95, iters=2)


def test_measurement_tokens_by_hand():
  # 128 rows of 64 tokens: the row gradients, then 16 sources x (10 + 1) products on 32 rows
  assert inf.measurement_tokens(16, 128, 64, 10, 32) == (128 + 16 * 11 * 32) * 64
  assert inf.measurement_tokens(16, 128, 64, 10) == (128 + 16 * 11 * 128) * 64


@pytest.mark.slow
def test_the_pilot_measures_the_state_before_each_step_on_that_steps_batches(data_cache):
  # A hand-driven run of the same config (the README's own loop): the state before step t, the
  # batches of steps t .. t + batches - 1 and 1 / (the learning rates summed over steps < t).
  config = small_run_config(num_steps=20)
  config = fit_proxy.probe_config(config, np.full(16, 1 / 16), SOURCES)
  steps, batches = [6, 8], 3          # overlapping windows: steps 6-8 and 8-10
  got = inf.pilot(config, steps, batches=batches, iters=3)
  assert got["steps_run"] == 11 and [m["step"] for m in got["measurements"]] == steps

  run = runconfig.build(config)
  corpus = data.open_training_data(run.data, required=run.evaluated, progress=False)
  sampler = data.MixtureSampler(corpus, seq_len=config.data.seq_len,
                                global_batch_size=config.data.global_batch_size, seed=config.seed)
  state = train.init_state(run, train.run_keys(config.seed))
  train_step = step.jit_step(run.step)
  sc = run.step
  kept, all_batches = {}, []
  for t in range(11):
    w = curriculum.weights_at(curriculum.schedule(state.curriculum), t)
    all_batches.append(jax.tree.map(np.asarray, sampler.batch(t, np.asarray(w))))
    if t in steps:
      kept[t] = (jax.device_get(state.params), jax.device_get(state.opt_state))
    state, _ = train_step(state, all_batches[-1])
  for m, t in zip(got["measurements"], steps):
    lr_sum = sum(float(sc.schedule(i)) for i in range(t))
    assert m["lambda"] == pytest.approx(1 / lr_sum, rel=1e-6)
    big = {k: np.concatenate([b[k] for b in all_batches[t:t + batches]]) for k in all_batches[0]}
    b, first = inf.influence(sc.model, sc.document_mask, *kept[t], big, 16, 1 / lr_sum,
                             float(config.optim.eps), float(config.optim.b2), iters=3)
    np.testing.assert_allclose(m["b"], b, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(m["first_order"], first, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(got["b"], np.mean([m["b"] for m in got["measurements"]], 0))
  assert np.isfinite(got["b"]).all() and got["measure_s"] > 0 and got["train_s"] > 0


def _fake_pilot(calls, b=np.linspace(-0.05, 0.5, 16)):
  def fn(config, steps, batches, iters, gn_rows, source_batch, log):
    calls.append((list(steps), batches, iters, gn_rows, config.curriculum.mixer.name))
    return {"b": list(b), "sources": list(SOURCES), "steps_run": steps[-1] + batches,
            "measurements": [{"step": t, "lambda": 1.0, "b": list(b), "first_order": list(b)}
                             for t in steps], "train_s": 1.0, "measure_s": 2.0}
  return fn


@pytest.mark.slow
def test_the_fit_file_is_the_probes_format_and_the_pilot_is_reused(tmp_path, monkeypatch):
  tiny = fit_proxy.load_config_file(str(ROOT / "experiments" / "synthetic.py"))
  config = fit_proxy.load_config_file(str(ROOT / "experiments" / "synthetic.py"))
  config.model.update(num_layers=2, d_model=64, d_mlp=256)
  calls = []
  out = fit_proxy.fit_influence(config, str(tmp_path), target=tiny, pilot_fn=_fake_pilot(calls),
                                config_file="experiments/synthetic.py")
  n = tiny.train.num_steps                            # 1000: steps 375, 406, 438, 469
  assert calls == [([375, 406, 438, 469], 4, 10, 32, "static")]   # G on one batch
  b = np.linspace(-0.05, 0.5, 16)
  np.testing.assert_allclose(out["mixture"], proxy.elasticity_mixture(b, power=1.5))
  # the cost by hand: 473 steps of 32 x 64 tokens, four measurements of 128 rows' gradients and
  # 16 x 11 products on 32 rows each, at 132,864 parameters; the target runs 1000 steps at 858,880
  tokens = 473 * 32 * 64 + 4 * (128 + 16 * 11 * 32) * 64
  assert out["probe_cost"] == pytest.approx(tokens * 132_864 / (n * 32 * 64 * 858_880))
  with open(tmp_path / "proxy_fit.json") as f:
    assert json.load(f)["method"] == "influence"
  again = fit_proxy.fit_influence(config, str(tmp_path), target=tiny, pilot_fn=_fake_pilot(calls),
                                  config_file="experiments/synthetic.py", power=1.0)
  assert len(calls) == 1                               # the pilot is not run again
  np.testing.assert_allclose(again["mixture"], proxy.elasticity_mixture(b, power=1.0))
  with pytest.raises(ValueError, match="pilot.json holds a pilot of another config "
                                       r"\(config.model.d_mlp, config.model.d_model"):
    fit_proxy.fit_influence(tiny, str(tmp_path), pilot_fn=_fake_pilot(calls))
  with pytest.raises(ValueError, match=r"another config \(iters"):
    fit_proxy.fit_influence(config, str(tmp_path), iters=20, pilot_fn=_fake_pilot(calls))
  # the target run reads the last fit written (power 1) as it reads the probes' fit
  monkeypatch.chdir(ROOT)
  c = fit_proxy.load_config_file(f"study/mixing/proxy_config.py:{tmp_path}")
  assert c.model.to_dict() == tiny.model.to_dict()
  w = simulate_weights(c, 10)
  np.testing.assert_allclose(w, np.broadcast_to(again["mixture"], (10, 16)), atol=1e-6)


def simulate_weights(config, n):
  from andrea_jax.curriculum import simulate
  spec = runconfig.build(config).curriculum
  return simulate.simulate(spec, jax.random.key(0), n).weights


@pytest.mark.slow
def test_gn_rows_zero_reads_the_matrix_on_every_row(tmp_path):
  calls = []
  out = fit_proxy.fit_influence(fit_proxy.load_config_file(str(ROOT / "experiments" / "synthetic.py")),
                                str(tmp_path), gn_rows=0, pilot_fn=_fake_pilot(calls))
  assert calls[0][3] is None and out["gn_rows"] == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"at": [0.5, 1.0]}, r"at must be fractions of train.num_steps in \(0, 1\), got \[0.5, 1.0\]"),
    ({"at": [float("nan")]}, r"got \[nan\]"),
    ({"at": []}, r"got \[\]"),
    ({"at": [0.0001]}, r"at = 0.0001 of train.num_steps = 1000 is step 0"),
    ({"at": [0.4, 0.4004]}, r"two measurements on one step .*\[400, 400\]"),
    ({"at": [0.998]}, r"at = 0.998 puts the last measurement at step 998, whose 4 batches run "
                      r"past train.num_steps = 1000"),
    ({"iters": 0}, r"iters must be an integer >= 1, got 0"),
    ({"source_batch": 0}, r"source_batch must be an integer >= 1, got 0"),
    ({"batches": 1.5}, r"batches must be an integer >= 1, got 1.5"),
    ({"gn_rows": 129}, r"gn_rows = 129 is more than the 128 rows a measurement reads \(4 batches "
                       r"of data.global_batch_size = 32\)"),
    ({"power": float("nan")}, r"power must be a finite number > 0, got nan"),
    ({"hold": 0.005}, r"hold = 0.005 gives the target run an invalid schedule"),
])
def test_bad_settings_are_refused_before_the_pilot_runs(tmp_path, kwargs, message):
  def refuse(*a, **k):
    raise AssertionError("the pilot ran")
  with pytest.raises(ValueError, match=message):
    fit_proxy.fit_influence(fit_proxy.load_config_file(str(ROOT / "experiments" / "synthetic.py")),
                            str(tmp_path), pilot_fn=refuse, **kwargs)
  assert not list(tmp_path.iterdir())


def test_a_damaged_pilot_record_is_named(tmp_path):
  config = fit_proxy.load_config_file(str(ROOT / "experiments" / "synthetic.py"))
  message = r"pilot.json: the pilot's elasticities are not 16 finite numbers"
  with pytest.raises(ValueError, match=message):
    fit_proxy.fit_influence(config, str(tmp_path),
                            pilot_fn=_fake_pilot([], b=[0.1] * 15 + [np.nan]))
  with pytest.raises(ValueError, match=message):     # kept, and refused again when read back
    fit_proxy.fit_influence(config, str(tmp_path), pilot_fn=_fake_pilot([]))
  record = tmp_path / "pilot.json"
  record.write_text(record.read_text()[:50])          # cut short
  with pytest.raises(ValueError, match=r"pilot.json is damaged \(.*\): delete it"):
    fit_proxy.fit_influence(config, str(tmp_path), pilot_fn=_fake_pilot([]))


@pytest.mark.slow
def test_the_command_line_refuses_a_bad_fraction_with_one_line(tmp_path):
  r = subprocess.run([sys.executable, "-m", "study.mixing.fit_proxy", "--method=influence",
                      "--config=experiments/synthetic.py", f"--workdir={tmp_path}", "--at=0.3,2"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 1
  assert r.stderr.strip().splitlines()[-1] == ("error: at must be fractions of train.num_steps in "
                                               "(0, 1), got [0.3, 2.0]")
  assert not list(tmp_path.iterdir())

"""The target gain: the measurement against closed forms and a slower exact method, the bandit's
target-gain reward on hand-worked numbers, the walk it drives, and a whole run that uses it."""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from andrea_jax import curriculum, optim, probes, runconfig, step as step_lib, train
from andrea_jax.curriculum import bandit
from andrea_jax.probes import target_gain
from tests.util import small_run_config


def _quadratic_problem(seed=0, dim=5, rows=2, sources=3):
  """Per-row loss ``0.5 (x . w - y)^2``: the probe holds ``rows`` rows of each source (source 1
  with no tokens that count), the target 4 rows."""
  rng = np.random.default_rng(seed)
  probe = {"x": rng.normal(size=(rows * sources, dim)), "y": rng.normal(size=rows * sources),
           "n": np.ones(rows * sources), "source_ids": np.repeat(np.arange(sources), rows)}
  probe["n"][rows:2 * rows] = 0.0
  target = {"x": rng.normal(size=(4, dim)), "y": rng.normal(size=4), "n": np.ones(4),
            "source_ids": np.zeros(4, int)}
  w = rng.normal(size=dim)
  return w, probe, target


def _mean_grad(w, b):
  """``grad (1 / n) sum_r n_r 0.5 (x_r . w - y_r)^2`` by hand, float64."""
  r = b["x"] @ w - b["y"]
  return (b["n"] * r) @ b["x"] / max(b["n"].sum(), 1.0)


@pytest.mark.parametrize("precondition", [False, True])
def test_gains_are_the_preconditioned_gradient_alignment(precondition):
  """``a_s = <P grad L_T, grad L_s>`` with the gradients of the quadratics worked out by hand; a
  source with no tokens, and one the probe does not hold, are NaN."""
  w, probe, target = _quadratic_problem()
  p_D = np.linspace(0.5, 2.0, w.size)
  f32 = lambda t: {k: jnp.asarray(v, jnp.int32 if k == "source_ids" else jnp.float32)
                   for k, v in t.items()}
  pr, tg = f32(probe), f32(target)

  def source_losses(params):
    r = pr["x"] @ params["w"] - pr["y"]
    loss_S = jax.ops.segment_sum(0.5 * r * r * pr["n"], pr["source_ids"], num_segments=4)
    tokens_S = jax.ops.segment_sum(pr["n"], pr["source_ids"], num_segments=4)
    return loss_S / jnp.maximum(tokens_S, 1.0), tokens_S

  def target_loss(params):
    r = tg["x"] @ params["w"] - tg["y"]
    return jnp.mean(0.5 * r * r)

  got = target_gain.gains(source_losses, target_loss, {"w": jnp.asarray(w, jnp.float32)},
                          precondition={"w": jnp.asarray(p_D, jnp.float32)} if precondition
                          else None)
  g_T = _mean_grad(w, target) * (p_D if precondition else 1.0)
  want = [g_T @ _mean_grad(w, {k: v[2 * s:2 * s + 2] for k, v in probe.items()}) for s in (0, 2)]
  np.testing.assert_allclose(np.asarray(got)[[0, 2]], want, rtol=1e-5)
  assert np.isnan(got[1]) and np.isnan(got[3])


def test_the_preconditioner_is_adams_bias_corrected_denominator():
  """``1 / (sqrt(nu / (1 - b2^2)) + eps)`` with ``nu = (1 - b2) (b2 g_0^2 + g_1^2)`` after two
  updates; NaN before the first (no second moments yet)."""
  params = {"w": jnp.zeros(3)}
  tx = optax.chain(optax.clip_by_global_norm(1e9), optax.adamw(1e-3, b2=0.9, eps=1e-3))
  state = tx.init(params)
  assert np.isnan(target_gain.preconditioner(state, params, 1e-3, 0.9)["w"]).all()
  grads = [np.array([1.0, -2.0, 0.5]), np.array([0.0, 1.0, 3.0])]
  for g in grads:
    _, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state, params)
  nu_hat = 0.1 * (0.9 * grads[0] ** 2 + grads[1] ** 2) / (1 - 0.81)
  np.testing.assert_allclose(target_gain.preconditioner(state, params, 1e-3, 0.9)["w"],
                             1 / (np.sqrt(nu_hat) + 1e-3), rtol=1e-6)
  np.testing.assert_array_equal(target_gain.preconditioner((), params, 1e-3, 0.9)["w"], 1.0)


def _env(sources=("a", "b"), trainable=(True, False), target=(1.0, 0.0), devices=1):
  return probes.ProbeEnv(name="target_gain", sources=sources, trainable=trainable,
                         evaluated=(True,) * len(sources), target=target,
                         optim=optim.OptimSpec.from_config(
                             ml_collections.ConfigDict(_optim_section()), 10_000), devices=devices)


def _optim_section():
  from andrea_jax.config import optim_section
  return optim_section().to_dict()


def test_gains_are_measured_after_every_minus_one_updates_and_reach_the_log_steps():
  """every = 4: steps 3, 7, 11, 15 (t + 1 a multiple of 4, so never step 0, before any update);
  a log every 8 steps (steps 7, 15) always finds a measurement. The host sends rows exactly then,
  and zero rows of the same shapes at the other steps."""
  assert [t for t in range(16) if probes.is_due(t, 4)] == [3, 7, 11, 15]
  probe = target_gain.probe(_env(), every=4, rows_per_source=1, target_rows=2)._replace(
      name="target_gain")
  assert dict(probe.rows) == {"probe": 1, "target": 2}   # one trainable source

  class Sampler:
    def __init__(self, global_batch_size, salt, split="train"):
      self.rows, self.split = global_batch_size, split

    def batch(self, step, weights):
      return {"inputs": np.full((self.rows, 3), step + 1, np.int32)}

  host = probes.HostRows((probe,), Sampler)
  key = lambda group: probes.rows_key("target_gain", group, "inputs")
  sent = [t for t in range(16) if host.rows(t)[key("probe")][1].any()]
  assert sent == [3, 7, 11, 15]
  assert all(host.rows(t)[key("target")] [1].shape == (2, 3) for t in range(16))
  assert {7, 15} <= set(sent)


def test_the_target_rows_come_from_the_split_the_probe_names():
  """``target_split = "eval"`` asks the sampler for held-out rows; the probe rows stay training
  rows. A split that is neither is refused naming the field."""
  asked = []

  def make(global_batch_size, salt, split="train"):
    asked.append((global_batch_size, split))

    class S:
      def batch(self, step, weights):
        return {"inputs": np.zeros((global_batch_size, 3), np.int32)}
    return S()

  target_gain.probe(_env(), every=2, target_split="eval").draw(make)
  assert asked == [(2, "train"), (8, "eval")]
  with pytest.raises(ValueError, match=r"probes.target_gain.target_split must be one of "
                                       r"\('train', 'eval'\), got 'test'"):
    target_gain.probe(_env(), every=2, target_split="test")


def test_only_the_trainable_sources_are_probed():
  """A source no geometry samples (e.g. one in eval.untrained) gets no probe rows: its gain is
  NaN, and the probe rows are spread over the trainable sources only."""
  env = _env(sources=("a", "b", "c"), trainable=(True, False, True), target=(0, 1.0, 0))
  probe = target_gain.probe(env, every=1, rows_per_source=3)
  assert probe.rows["probe"] == 6
  weights = []

  def make(global_batch_size, salt, split="train"):
    class S:
      def batch(self, step, w):
        weights.append(np.asarray(w))
        return {"inputs": np.zeros((global_batch_size, 3), np.int32)}
    return S()

  probe.draw(make)(0)
  np.testing.assert_allclose(weights[0], [0.5, 0.0, 0.5])   # the probe rows: trainable only
  np.testing.assert_allclose(weights[1], [0.0, 1.0, 0.0])   # the target rows: the target


def test_close_gain_window_keeps_a_discounted_mean_gain():
  """Window 1: gains (2, -1) then (4, NaN); window 2 (three steps): (1, 3). With gamma = 0.5:
  N = 0.5^3 (2, 1) + (1, 1), P = 0.5^3 (6, -1) + (1, 3), hat p = P / N (worked by hand)."""
  p = bandit.BanditParams(discount=0.5)
  s = bandit.observe_signal(bandit.init(2), jnp.array([2.0, -1.0]))
  s = bandit.close_signal_window(p, bandit.observe_signal(s, jnp.array([4.0, jnp.nan])))
  np.testing.assert_allclose(s.counts, [2.0, 1.0])
  np.testing.assert_allclose(s.progress, [6.0, -1.0])
  for gain in ([jnp.nan, jnp.nan], [1.0, 3.0], [jnp.nan, jnp.nan]):
    s = bandit.observe_signal(s, jnp.array(gain))
  s = bandit.close_signal_window(p, s)
  n = 0.125 * np.array([2.0, 1.0]) + 1
  np.testing.assert_allclose(s.counts, n, rtol=1e-6)
  np.testing.assert_allclose(bandit.estimates(s), (0.125 * np.array([6.0, -1.0]) + [1, 3]) / n,
                             rtol=1e-6)


def test_the_walk_rewarded_by_gain_steps_toward_the_best_source():
  """Constant gains (1, 3, 2) 1e-3, no random phase: every bandit phase moves eta = 0.3 toward b
  (equal counts, so equal bonuses: the highest gain has the highest index), so b's weight after k
  decisions is ``1 - (2/3) 0.7^k`` from the uniform start. The losses say the opposite (a's
  falls fastest) and are not looked at."""
  sources = ("a", "b", "c")
  c = curriculum.curriculum_config(
      ml_collections.ConfigDict({"all": curriculum.geometry("all", 0, sources=sources)}),
      sources=sources, mixer="bandit_only", reward="target_gain")
  spec = curriculum.spec_from_config(c, sources=sources)
  state = curriculum.init(spec, jax.random.key(0))
  update = jax.jit(lambda s, t, g: curriculum.update(
      spec, s, t, jnp.array([5.0 - 0.01 * t, 5.0, 5.0]), jnp.full(3, 10.0), {"target_gain": g}))
  used, snaps = [], {-1: curriculum.schedule(state)}
  for t in range(300):
    used.append(curriculum.weights_at(snaps[max(t - 1 - spec.decision_lag, -1)], t))
    gain = jnp.array([1.0, 3.0, 2.0]) * 1e-3 if t % 4 == 0 else jnp.full(3, jnp.nan)
    state = update(state, jnp.int32(t), gain)
    snaps[t] = curriculum.schedule(state)
  used = np.array(used)
  starts = np.flatnonzero(np.r_[True, np.any(np.diff(used, axis=0) != 0, axis=1)])
  k = np.arange(len(starts))
  np.testing.assert_allclose(used[starts, 1], 1 - (2 / 3) * 0.7 ** k, atol=1e-5)
  np.testing.assert_allclose(curriculum.metrics(spec, state)["progress"], [1e-3, 3e-3, 2e-3],
                             rtol=1e-5)


def _gain_config(num_steps=20, every=2):
  c = small_run_config(num_steps=num_steps)
  c.eval.target.chat = 1.0
  c.eval.target.gutenberg = 1.0
  c.probes.target_gain.update(every=every, rows_per_source=1, target_rows=4)
  curriculum.set_mixer(c, "andrea", reward="target_gain")
  return c


def test_the_step_measures_what_the_gradients_say(data_cache):
  """The jitted step's gains on the real model against a slower exact method: each source's and
  the target's gradient by ``jax.grad`` of the mean loss over their rows, dotted in float64 with
  Adam's preconditioner."""
  from andrea_jax import data as data_lib
  c = _gain_config()
  run = runconfig.build(c)
  data = data_lib.open_training_data(run.data, required=run.evaluated)
  state = train.init_state(run, train.run_keys(0))
  (gain,) = run.step.probes
  make = lambda salt, split="train", **kw: data_lib.MixtureSampler(
      data, seq_len=c.data.seq_len, seed=c.seed ^ salt, split=split, **kw)
  host = probes.HostRows(run.step.probes, make)
  sampler = data_lib.MixtureSampler(data, seq_len=c.data.seq_len, global_batch_size=16, seed=0)
  step = jax.jit(lambda s, b: step_lib.train_step(run.step, s, b))
  batch_at = lambda t: {k: jnp.asarray(v) for k, v in {
      **sampler.batch(t, np.full(16, 1 / 16)),
      **{key: rows for key, (_, rows) in host.rows(t).items()}}.items()}
  state, metrics = step(state, batch_at(0))   # every = 2: step 0 updates, measures nothing
  assert np.isnan(np.asarray(metrics["signals"]["target_gain"])).all()
  _, rows = probes.split(batch_at(1))
  _, metrics = step(state, batch_at(1))       # step 1 measures at the weights after one update
  probe, tgt = rows["target_gain"]["probe"], rows["target_gain"]["target"]

  def mean_grad(b):
    def mean(p):
      loss_BxT, mask_BxT = step_lib.token_losses(run.step.model, p, b)
      return loss_BxT.sum() / mask_BxT.sum()
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.grad(mean)(state.params))]
                          ).astype(np.float64)

  p = np.concatenate([np.ravel(x) for x in jax.tree.leaves(target_gain.preconditioner(
      state.opt_state, state.params, c.optim.eps, c.optim.b2))]).astype(np.float64)
  d = p * mean_grad(tgt)
  ids = np.asarray(probe["source_ids"])
  got = np.asarray(metrics["signals"]["target_gain"])
  for s in range(16):
    rows_s = np.flatnonzero(ids == s)
    if run.sources[s] not in run.trainable:
      assert np.isnan(got[s])
      continue
    want = d @ mean_grad({k: v[rows_s] for k, v in probe.items()})
    np.testing.assert_allclose(got[s], want, rtol=2e-3, atol=1e-6 * np.abs(d).max())


def test_a_gain_reward_needs_the_measurement_and_a_target():
  c = small_run_config()
  curriculum.set_mixer(c, "andrea", reward="target_gain")
  with pytest.raises(ValueError, match=r"curriculum.mixer reads the signal 'target_gain', which the "
                                       r"run does not measure: set probes.target_gain.every > 0"):
    runconfig.build(c)
  c.probes.target_gain.every = 4
  with pytest.raises(ValueError, match=r"probes.target_gain.every = 4 measures .* eval.target is "
                                       r"not set"):
    runconfig.build(c)
  c.eval.target.chat = 1.0
  c.probes.target_gain.rows_per_source = 0
  with pytest.raises(ValueError, match=r"probes.target_gain.rows_per_source must be >= 1, got 0"):
    runconfig.build(c)
  c.probes.target_gain.rows_per_source = 1
  with pytest.raises(ValueError, match=r"probes.target_gain.target_rows = 8 rows is not a "
                                       r"multiple of the 3 devices"):
    target_gain.probe(_env(devices=3), every=4, rows_per_source=3)


def test_the_target_may_be_a_source_the_run_only_evaluates():
  """eval.untrained: a source evaluated, weighed by the target, never sampled (a ceiling of 0 in
  every geometry), never probed; a floor on it is refused naming the field."""
  c = _gain_config()
  c.eval.target.chat = 0.0
  c.eval.target.gutenberg = 0.0
  c.eval.target.dictionary = 1.0
  c.eval.untrained = "dictionary"
  run = runconfig.build(c)
  assert "dictionary" in run.evaluated and "dictionary" not in run.trainable
  assert run.curriculum.uppers[:, run.sources.index("dictionary")].max() == 0
  (probe,) = run.step.probes
  assert probe.rows["probe"] == len(run.trainable)
  c.eval.untrained = "dictionary,nope"
  with pytest.raises(ValueError, match=r"unknown source 'nope' in eval.untrained"):
    runconfig.build(c)
  c.eval.untrained = "chat"
  first = sorted(c.curriculum.geometries.keys())[0]
  c.curriculum.geometries[first].floors.chat = 0.2
  with pytest.raises(ValueError, match=rf"curriculum.geometries.{first}.floors.chat = 0.2 on "
                                       r"'chat', which eval.untrained lists"):
    runconfig.build(c)


@pytest.mark.slow
def test_a_run_rewarded_by_target_gain_resumes_bit_identically(tmp_path, data_cache):
  """20 steps, gains every 2: in one go, and 9 + 11 with a checkpoint between, the same logs;
  the gains logged at the measurement steps that are log steps."""
  c = _gain_config(num_steps=20, every=2)
  c.train.log_every = 1
  train.train_and_evaluate(c, str(tmp_path / "whole"))
  c.train.stop_step = 9
  train.train_and_evaluate(c, str(tmp_path / "parts"))
  c.train.stop_step = 0
  train.train_and_evaluate(c, str(tmp_path / "parts"))
  read = lambda run: [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").open()]
  assert read("parts") == read("whole")
  measured = [r["step"] for r in read("whole") if "target_gain/chat" in r]
  assert measured == list(range(1, 20, 2))   # after 1, 3, ... updates


@pytest.mark.parametrize("every, rows, error, message", [
    (0, {"t": 8}, ValueError, "probes.p: the probe's every must be >= 1, got 0"),
    (True, {"t": 8}, TypeError, "probes.p: the probe's every must be an integer, got True"),
    (2, {"t": 0}, ValueError, "probes.p: the rows of row group 't' must be >= 1, got 0 (a group "
     "needs a positive multiple of the 4 devices)"),
    (2, {"t": 8.0}, TypeError, "probes.p: the rows of row group 't' must be an integer, got 8.0 "
     "(a group needs a positive multiple of the 4 devices)"),
    (2, {"t": 6}, ValueError, "probes.p: row group 't' has 6 rows; a group needs a positive "
     "multiple of the 4 devices"),
])
def test_a_factorys_probe_is_checked(every, rows, error, message):
  made = probes.Probe(every=every, rows=rows, draw=lambda make: None, measure=lambda *a: None)
  with pytest.raises(error) as e:
    probes._checked("probes.p", "pkg.mod:factory", made, 4)
  assert str(e.value) == message
  assert probes._checked("probes.p", "x", made._replace(every=2, rows={"t": 8}), 4).every == 2


def test_a_reward_that_names_nothing_says_so():
  """A misspelt reward is neither a built-in reward nor a probe: said so, not 'turn on a probe'."""
  c = small_run_config()
  curriculum.set_mixer(c, "andrea", reward="progres")
  with pytest.raises(ValueError, match=r"curriculum.mixer.reward = 'progres' is neither a "
                                       r"built-in reward \(progress, target_gain\) nor a probe "
                                       r"of this run \(probes: none measure\)"):
    runconfig.build(c)
  c.probes.target_gain.every = 4
  with pytest.raises(ValueError, match=r"^probes.target_gain.every = 4 measures"):
    runconfig.build(c)   # the probe's own error, its field named once

"""Extreme numbers (1e30, denormals, infinities, NaN, all rewards equal) into the projection, the
samplers and the bandit: finite, correct outputs or a clear error; and NaN steps in a real run never
reach the weights."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andrea_jax import simplex
from andrea_jax.curriculum import bandit
from andrea_jax import data as data_lib
from andrea_jax import logs
from andrea_jax.simplex import Region
from andrea_jax.sources import SOURCES, WARMUP_SOURCES
from tests.faults import harness

F32_MAX = float(np.finfo(np.float32).max)
REGIONS = {
    "simplex": Region.from_bounds({}, {}),
    "v2_warmup": Region.from_bounds({}, {}, only=WARMUP_SOURCES),
    "v3_polish": Region.from_bounds({"hermes3-general": 0.7}, {"dictionary": 0.25},
                                    exclude=("repo-docs", "repo-docstrings")),
}
EXTREME = st.one_of(
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1e-45, -1e-45, 1e-40, -3e-39, 1e30, -1e30, F32_MAX, -F32_MAX,
                     math.inf, -math.inf, 0.5, 1.0]))


@pytest.mark.parametrize("method", ["pairwise", "sort"])
@settings(max_examples=120, deadline=None, database=None)
@given(x=st.lists(EXTREME, min_size=16, max_size=16), region=st.sampled_from(sorted(REGIONS)))
def test_projection_of_extreme_points_is_exact(method, x, region):
  r = REGIONS[region]
  lower, upper = jnp.asarray(r.lower, jnp.float32), jnp.asarray(r.upper, jnp.float32)
  w = np.asarray(simplex.project(jnp.asarray(x, jnp.float32), lower, upper, method=method))
  assert np.isfinite(w).all()
  assert (w >= np.asarray(lower)).all() and (w <= np.asarray(upper)).all()
  assert abs(w.astype(np.float64).sum() - 1) < 1e-5
  np.testing.assert_allclose(w, harness.exact_projection(np.float32(x), lower, upper), atol=4e-6)


def test_projection_of_huge_points_by_hand():
  """x = 1e30 e_dictionary on the polish region: dictionary at its ceiling 0.25, hermes3-general at
  its floor 0.7, the other 12 allowed sources share the remaining 0.05 equally."""
  r = REGIONS["v3_polish"]
  x = np.zeros(16, np.float32)
  x[SOURCES.index("dictionary")] = 1e30
  want = np.where(r.upper > 0, 0.05 / 12, 0.0)
  want[SOURCES.index("dictionary")], want[SOURCES.index("hermes3-general")] = 0.25, 0.7
  for method in ("pairwise", "sort"):
    np.testing.assert_allclose(simplex.project(x, r.lower, r.upper, method=method), want,
                               atol=1e-7)
    # A constant shift changes nothing, however large.
    np.testing.assert_allclose(simplex.project(np.full(16, -1e30, np.float32), r.lower, r.upper,
                                               method=method),
                               simplex.project(np.zeros(16, np.float32), r.lower, r.upper),
                               atol=1e-6)


def test_projection_never_hides_a_nan_and_its_gradient_stays_finite():
  r = REGIONS["v3_polish"]
  x = jnp.zeros(16).at[4].set(jnp.nan)
  assert np.isnan(simplex.project(x, r.lower, r.upper)).all()
  batch = jnp.stack([x, jnp.zeros(16)])
  w = simplex.project(batch, r.lower, r.upper)
  assert np.isnan(w[0]).all() and np.isfinite(w[1]).all()   # the other point is untouched
  g = jax.grad(lambda x: simplex.project(x, r.lower, r.upper)[3])(jnp.zeros(16).at[3].set(1e30))
  assert np.isfinite(g).all()


@pytest.mark.parametrize("weights, message", [
    ([math.nan] + [1 / 15] * 15, r"weight of source 'hermes3-general' is nan, not finite"),
    ([math.inf] + [0.0] * 15, r"weight of source 'hermes3-general' is inf, not finite"),
    ([1e30] + [0.0] * 15, r"weights sum to 1e\+30|weights sum to 10000000000"),
    ([0.5, -1e-300, 0.5] + [0.0] * 13, r"weight of source 'hermes3-creative' is -1e-300 < 0"),
    ([1e-310] * 16, r"weights sum to 0\.0+, not 1"),
    ([1 / 16] * 15, r"weights must have shape \(16,\)"),
])
def test_the_sampler_rejects_bad_weights_naming_the_source(weights, message, prepared):
  data = data_lib.PreparedData.open(prepared, verify=False)
  sampler = data_lib.MixtureSampler(data, seq_len=32, global_batch_size=16, seed=0)
  with pytest.raises(ValueError, match=message):
    sampler.batch(3, np.array(weights))


def test_denormal_weights_allocate_whole_rows():
  w = np.array([1e-310, 5e-324] + [1 / 14] * 14)
  counts = data_lib.allocate(w / w.sum(), 32, SOURCES)
  assert counts.sum() == 32 and counts.min() >= 0 and counts[:2].tolist() == [0, 0]


@pytest.mark.parametrize("lower, upper, message", [
    ([math.nan] + [0.0] * 15, [1.0] * 16, r"lower\[0\] = nan must be finite"),
    ([0.0] * 16, [math.inf] + [1.0] * 15, r"upper\[0\] = inf must be finite"),
    ([-1e-30] + [0.0] * 15, [1.0] * 16, r"lower\[0\] = -1[0-9.]*e-30 must be finite and >= 0"),
    ([0.5] + [0.0] * 15, [0.25] + [1.0] * 15, r"upper\[0\] = 0.25 is under lower\[0\] = 0.5"),
    ([0.1] * 16, [1.0] * 16, r"the region is empty: the floors sum to 1.6"),
    ([0.0] * 16, [0.05] * 16, r"the ceilings to 0.8"),
])
def test_sample_uniform_rejects_bad_concrete_bounds(lower, upper, message):
  with pytest.raises(ValueError, match=message):
    simplex.sample_uniform(jax.random.key(0), jnp.asarray(lower), jnp.asarray(upper), 8)


def test_sample_uniform_with_traced_empty_bounds_gives_nan_not_numbers():
  draw = jax.jit(lambda lo, hi: simplex.sample_uniform(jax.random.key(0), lo, hi, 8)[0])
  assert np.isnan(draw(jnp.full(4, 0.3), jnp.ones(4))).all()   # floors sum to 1.2
  assert np.isfinite(draw(jnp.zeros(4), jnp.ones(4))).all()


@pytest.mark.parametrize("method", ["auto", "chain"])
@pytest.mark.parametrize("ceiling", [1.0, 1e30])
@pytest.mark.parametrize("floor", [1e-45, 1e-38, 1 / 16 - 1e-7])
def test_sample_uniform_with_extreme_valid_bounds_stays_in_the_region(floor, ceiling, method):
  lower, upper = jnp.full(16, floor, jnp.float32), jnp.full(16, ceiling, jnp.float32)
  w, _ = simplex.sample_uniform(jax.random.key(1), lower, upper, 32, method=method)
  w = np.asarray(w, np.float64)
  assert np.isfinite(w).all()
  assert (w >= np.float32(floor)).all() and (w <= np.float32(ceiling)).all()
  assert np.abs(w.sum(-1) - 1).max() < 1e-5


@jax.jit
def _window(params, state, losses, tokens):
  return bandit.close_window(params, bandit.observe(state, losses, tokens))


LOSS = st.one_of(st.floats(width=32), st.sampled_from([1e30, -1e30, 1e-45, math.nan, math.inf]))
TOKENS = st.one_of(st.floats(width=32), st.sampled_from([0.0, 1e-45, 1e30, math.inf, math.nan]))


@settings(max_examples=60, deadline=None, database=None)
@given(windows=st.lists(st.tuples(st.lists(LOSS, min_size=16, max_size=16),
                                  st.lists(TOKENS, min_size=16, max_size=16)),
                        min_size=1, max_size=5))
def test_the_bandit_stays_finite_on_any_observation(windows):
  params = bandit.BanditParams()
  state = bandit.init(16)
  for losses, tokens in windows:
    state = _window(params, state, jnp.asarray(losses, jnp.float32),
                    jnp.asarray(tokens, jnp.float32))
  for name in ("counts", "progress", "ref_loss", "ref_tokens", "win_loss", "win_tokens"):
    assert np.isfinite(getattr(state, name)).all(), name
  assert np.isfinite(bandit.ucb_index(params, state)).all()
  r = np.asarray(bandit.rewards(params, state))
  assert ((r >= 0) & (r <= 1)).all()   # (0, 1) in exact arithmetic; float32 may round to an end


def test_the_bandit_with_all_rewards_equal_ranks_every_source_equally():
  params = bandit.BanditParams()
  state = bandit.init(16)
  for loss in (3.0, 2.5, 2.0, 2.0):
    state = _window(params, state, jnp.full(16, loss), jnp.full(16, 64.0))
  index = np.asarray(bandit.ucb_index(params, state))
  assert (index == index[0]).all() and np.isfinite(index).all()
  assert int(bandit.select(params, state, jnp.ones(16, bool))) == 0   # ties go to the lower index


def test_the_bandit_index_is_finite_for_extreme_parameters():
  state = bandit.init(16)
  for params in (bandit.BanditParams(exploration=1e30, min_count=1e-30),
                 bandit.BanditParams(exploration=1e300, min_count=1e-300, prior_count=1e-300),
                 bandit.BanditParams(discount=1e-30, reward_knee=1e30, prior_count=1e30)):
    s = bandit.close_window(params, bandit.observe(state, jnp.full(16, 2.0), jnp.full(16, 1e-40)))
    assert np.isfinite(bandit.ucb_index(params, s)).all(), params


def test_a_nan_discount_is_refused_or_clipped():
  state = bandit.close_window(bandit.BanditParams(),
                              bandit.observe(bandit.init(16), jnp.full(16, 2.0), jnp.full(16, 9.0)))
  with pytest.raises(ValueError, match="discount factor must be in"):
    bandit.discount(state, math.nan)
  traced = jax.jit(bandit.discount)(state, jnp.float32(math.nan))
  assert np.isfinite(traced.counts).all() and np.isfinite(traced.progress).all()


@pytest.mark.slow
def test_nan_steps_in_a_real_run_never_reach_the_weights(reference, xla_cache, tmp_path):
  """Steps 5, 22 and 23 of the run see a token id outside the embedding (NaN loss and gradient):
  each is skipped, the run goes on, and the weights and AdamW moments after steps 22-23 (checkpoint
  24) are bit for bit those before them (checkpoint 22)."""
  nan_steps = [5, 22, 23]
  config = harness.fault_config()
  steps, every = config.train.num_steps, config.train.checkpoint_every
  assert nan_steps[1:] == [steps - every, steps - 1]
  workdir = tmp_path / "run"
  env = harness.environment(xla_cache, ANDREA_FAULTS_NAN_STEPS=",".join(map(str, nan_steps)))
  seg = harness.run_segment(config, workdir, "none", env=env, rng=np.random.default_rng(0),
                            log=tmp_path / "run.log", num_steps=steps, module="faults.nan_driver")
  assert seg.returncode == 0, seg.output[-3000:]
  records = [r for r in logs.read_jsonl(str(workdir / "metrics.jsonl")) if "loss" in r]
  assert [r["step"] for r in records if not r["finite"]] == nan_steps
  assert all(records[s]["loss"] == "nan" for s in nan_steps)
  for r in records:
    weights = [v for k, v in r.items() if k.startswith("weight/")]
    assert all(isinstance(v, float) and math.isfinite(v) for v in weights)
    assert abs(sum(weights) - 1) < 1e-5
    if r["step"] not in nan_steps:
      assert math.isfinite(r["loss"])
  # Before the first poisoned batch the run is the reference run, record for record.
  ref = [r for r in logs.read_jsonl(str(reference / "metrics.jsonl")) if "loss" in r]
  assert records[:nan_steps[0]] == ref[:nan_steps[0]]
  assert records[nan_steps[0] + 1]["loss"] < records[0]["loss"]   # it went on learning
  # A skipped step does not advance the optimizer's schedule (optax's count): from step 6 on the
  # logged rate is the one applied, the reference's of one step earlier.
  assert [r["lr"] for r in records[6:22]] == [r["lr"] for r in ref[5:21]]
  assert records[6]["lr"] != ref[6]["lr"]
  before = harness.read_state(workdir / "checkpoints" / str(steps - every))
  after = harness.read_state(workdir / "checkpoints" / str(steps))
  weights = [k for k in before if k.startswith(("['params']", "['opt_state']"))]
  assert weights and all(before[k].tobytes() == after[k].tobytes() for k in weights)
  assert all(np.isfinite(after[k]).all() for k in weights if after[k].dtype.kind == "f")

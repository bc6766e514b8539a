"""Simulated runs: the 200K-step ANDREA walk, a bandit that concentrates and follows, exact resume,
strategies, and the command line's outputs."""

import json
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from scipy import optimize, stats

from andrea_jax import curriculum
from andrea_jax.curriculum import __main__ as cli
from andrea_jax.curriculum import simulate as sim
from andrea_jax.sources import SOURCES, WARMUP_SOURCES

ROOT = pathlib.Path(__file__).resolve().parents[1]
H, DICT, DOCS, DOCSTRINGS = (SOURCES.index(s) for s in
                             ("hermes3-general", "dictionary", "repo-docs", "repo-docstrings"))


@pytest.fixture(scope="module")
def andrea_200k():
  spec = curriculum.spec_from_config(curriculum.curriculum_config(curriculum.andrea_geometries()))
  return spec, sim.simulate(spec, jax.random.key(0), 200_000)


@pytest.mark.slow
def test_andrea_run_respects_every_regime(andrea_200k):
  _, r = andrea_200k
  w = r.weights
  assert w.shape == (200_000, 16) and w.dtype == np.float32
  warm = np.array([s in WARMUP_SOURCES for s in SOURCES])
  assert np.all(w[:20_000][:, ~warm] == 0)                     # 9 of 16 exactly zero
  assert np.all(w[:20_000][:, warm] > 0)
  assert np.all(w[20_000:112_619].max(axis=0) > 0.1)             # all sixteen are used
  polish = w[112_619:]
  assert np.all(polish[:, [DOCS, DOCSTRINGS]] == 0)
  assert np.all(polish[:, H] >= np.float32(0.7))
  assert np.all(polish[:, DICT] <= np.float32(0.25))
  assert np.all(w >= 0) and np.abs(w.astype(np.float64).sum(axis=1) - 1).max() <= 1e-6
  assert r.lag_consistent.all()


@pytest.mark.slow
def test_phases_are_uniform_in_7_42_and_never_straddle_a_pivot(andrea_200k):
  spec, r = andrea_200k
  phases = r.phases(spec)
  starts = np.array([p["start"] for p in phases])
  lengths = np.array([p["length"] for p in phases])
  assert starts[0] == 0 and np.all(np.isin([20_000, 112_619], starts))
  # Each step's geometry is the one in force at that step, so no phase crosses a boundary.
  regime = np.searchsorted(spec.starts, np.arange(200_000), side="right") - 1
  np.testing.assert_array_equal(r.geometries, regime)
  body = lengths[:-1]                                   # the last one is cut by the run's end
  assert body.min() >= 7 and body.max() <= 42
  # Phases that end at a boundary (or just before one) are cut; the others are the plain draws.
  near = np.zeros(len(body), bool)
  for b in (20_000, 112_619):
    near |= (starts[:-1] + body > b - 42) & (starts[:-1] < b)
  counts = np.bincount(body[~near] - 7, minlength=36)
  assert stats.chisquare(counts).pvalue > 1e-3
  assert len(phases) == pytest.approx(200_000 / 24.5, rel=0.03)
  kinds = [p["label"] for p in phases]
  assert kinds.count("random") / len(kinds) == pytest.approx(0.25, abs=0.02)   # curriculum.mixer.random_share


def _one_region_spec(**fields):
  c = curriculum.curriculum_config()
  g = ml_collections.ConfigDict()
  g.region = curriculum.geometry("region", 0, floors={"hermes3-general": 0.2},
                                 ceilings={"chat": 0.3})
  c.geometries = g
  if "mixer" in fields:
    c.mixer = curriculum.mixer_config(fields.pop("mixer"))
  for k, v in fields.items():
    if k.startswith("mixer_"):
      c.mixer[k[len("mixer_"):]] = v
    else:
      c[k] = v
  return curriculum.spec_from_config(c)


def _linear_model(rates_S, after_S=None, switch=10**9, noise=0.1):
  after_S = rates_S if after_S is None else after_S
  return sim.SyntheticLosses(
      init_loss=jnp.full(16, 5.0), floor_loss=jnp.zeros(16),
      rates=jnp.asarray(np.stack([rates_S, after_S]), jnp.float32), switch_step=jnp.int32(switch),
      noise=jnp.float32(noise), batch_size=32, seq_len=1024, linear=True)


def _best_value(spec, rates_S):
  """max rates . w over the region, by linear programming (independent of the engine)."""
  res = optimize.linprog(-rates_S, A_eq=np.ones((1, 16)), b_eq=[1],
                         bounds=list(zip(spec.lowers[0], spec.uppers[0])))
  return -res.fun, res.x


def test_bandit_concentrates_on_the_best_source_within_the_region():
  # Stationary: each source's loss falls by a constant rate per token. The best mixture puts the
  # hermes3-general floor (0.2), chat at its ceiling (0.3) and the rest on source 9.
  rates = np.full(16, 1.5e-7)
  rates[::2] = 1e-7
  rates[SOURCES.index("chat")], rates[9] = 5e-7, 4e-7
  spec = _one_region_spec(mixer="bandit_only", mixer_discount=1.0)
  r = sim.simulate(spec, jax.random.key(1), 4000, _linear_model(rates))
  best, w_best = _best_value(spec, rates)
  np.testing.assert_allclose(w_best[[H, SOURCES.index("chat"), 9]], [0.2, 0.3, 0.5], atol=1e-9)
  regret = best - r.weights.astype(np.float64) @ rates
  assert regret[2000:].sum() < 0.3 * regret[:2000].sum()       # sublinear: the rate falls
  np.testing.assert_allclose(r.weights[-1000:].mean(axis=0), w_best, atol=0.03)


def test_bandit_follows_an_abrupt_switch():
  rates = np.full(16, 1.5e-7)
  rates[::2] = 1e-7
  rates[9] = 6e-7
  after = rates.copy()
  after[9], after[12] = 1e-7, 6e-7
  spec = _one_region_spec()                                      # "andrea": random + bandit
  r = sim.simulate(spec, jax.random.key(0), 4000, _linear_model(rates, after, 2000, noise=0.02))
  phases = r.phases(spec)
  starts = np.array([p["start"] for p in phases])
  bandit = np.array([p["label"] == "bandit" for p in phases])
  w = r.weights[starts]                                           # one row per phase
  before = bandit & (starts < 2000) & (starts >= 1000)
  assert w[before, 9].mean() > 0.4 > 5 * w[before, 12].mean()
  # Phases after the switch until the new best leads in five bandit phases in a row.
  first = np.searchsorted(starts, 2000)
  lead = w[:, 12] > w[:, 9]
  b = np.flatnonzero(bandit & (np.arange(len(phases)) >= first))
  follow = next(b[i] - first for i in range(len(b) - 5) if lead[b[i:i + 5]].all())
  assert follow <= 15
  after_sel = bandit & (starts >= 2500)
  assert w[after_sel, 12].mean() > 0.4 > 5 * w[after_sel, 9].mean()


def test_resume_gives_the_identical_path():
  spec = curriculum.spec_from_config(curriculum.curriculum_config())   # polish pivot at 1126
  key = jax.random.key(7)
  model = sim.synthetic_losses(16, 2000)
  whole = sim.simulate(spec, key, 2000, model)
  first = sim.simulate(spec, key, 1000, model)
  # A checkpoint round trip: the states become host arrays, then device arrays again.
  restored = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), (first.state, first.model_state))
  first = sim.SimulationResult(**{**first.__dict__, "state": restored[0],
                                  "model_state": restored[1]})
  rest = sim.simulate(spec, key, 1000, resume=first)            # the same model, by default
  assert rest.first_step == 1000
  np.testing.assert_array_equal(np.concatenate([first.weights, rest.weights]), whole.weights)
  np.testing.assert_array_equal(np.concatenate([first.phase_ids, rest.phase_ids]), whole.phase_ids)
  for a, b in zip(jax.tree.leaves(rest.state), jax.tree.leaves(whole.state)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("strategy", ["static", "random_only", "bandit_only"])
def test_strategies(strategy):
  spec = curriculum.spec_from_config(curriculum.curriculum_config(mixer=strategy))
  r = sim.simulate(spec, jax.random.key(0), 2000)
  assert r.phases(spec)[0]["label"] == "start"
  kinds = {p["label"] for p in r.phases(spec)[1:]}
  if strategy == "static":
    assert kinds == {"held"}
    # The projection of the uniform mixture: 1/16 each in the firehose; in the polish
    # hermes3-general sits on its 0.7 floor and the 13 other allowed sources share 0.3 equally.
    np.testing.assert_allclose(r.weights[300:1126], 1 / 16, rtol=1e-6)
    polish = np.full(16, 0.3 / 13)
    polish[[H]], polish[[DOCS, DOCSTRINGS]] = 0.7, 0.0
    np.testing.assert_allclose(r.weights[1126:], np.broadcast_to(polish, (874, 16)), rtol=1e-5)
  else:
    assert kinds == {strategy.split("_")[0]}


@pytest.mark.slow
def test_command_line_writes_the_run(tmp_path):
  from experiments import andrea_curriculum as module
  summary = cli.run(module.get_config(), 2000, str(tmp_path), triangle_steps=400)
  assert summary["lag_consistent"]
  weights = np.load(tmp_path / "weights.npy")
  assert weights.shape == (2000, 16) and weights.dtype == np.float32
  phases = json.loads((tmp_path / "phases.json").read_text())
  assert sum(p["length"] for p in phases) == 2000
  assert {p["geometry"] for p in phases} == {"v2_warmup"}
  assert set(phases[0]) == {"phase", "start", "length", "label", "geometry"}
  assert json.loads((tmp_path / "sources.json").read_text()) == list(SOURCES)
  for png in ("weights.png", "triangle.png"):
    assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_seed_triangle_walk_stays_in_the_quadrilateral():
  spec = sim.seed_triangle_spec()
  np.testing.assert_array_equal(
      np.sort(spec.region(0).vertices(), axis=0),
      np.sort(np.array([[1, 0, 0], [0.5, 0.5, 0], [0.5, 0.25, 0.25], [0.75, 0, 0.25]]), axis=0))
  r = sim.simulate(spec, jax.random.key(2), 400)
  assert np.all(r.weights[:, 0] >= 0.5) and np.all(r.weights[:, 2] <= 0.25)
  assert np.abs(r.weights.sum(axis=1) - 1).max() <= 1e-6


def test_seed_triangle_of_a_static_run_with_its_own_mixture():
  """The CLI draws the seed's triangle from the run's curriculum section: a run whose static mixture
  names its own sources (chat 3) still gets the example, holding uniform (1/3 each) projected onto
  ``H >= 0.5``: (0.5, 0.25, 0.25)."""
  c = curriculum.curriculum_config(mixer="static")
  c.mixer.mixture.chat = 3.0
  spec = sim.seed_triangle_spec(c)
  r = sim.simulate(spec, jax.random.key(0), 50)
  np.testing.assert_allclose(r.weights, np.broadcast_to([0.5, 0.25, 0.25], (50, 3)), atol=1e-6)

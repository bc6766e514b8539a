"""The mixer interface: a mixer written here, outside the package, drives the curriculum and a run.

``greedy`` below is a user's mixer: it remembers each source's last observed loss and steps half
way to the vertex of the highest one. It reaches the package by name
(``curriculum.strategy = "tests.test_curriculum_mixer:greedy"``) or as an object.
"""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from andrea_jax import curriculum, simplex, train
from andrea_jax.curriculum import Decision, Mixer, Observation
from tests.util import small_run_config

SOURCES = ("a", "b", "c")


def greedy(section) -> Mixer:
  """Half way to the vertex of the source whose last observed loss is highest."""
  del section

  def init(num_sources):
    return jnp.zeros((num_sources,), jnp.float32)

  def observe(last_S, obs: Observation):
    return jnp.where(obs.tokens_S > 0, obs.losses_S, last_S)

  def decide(last_S, d: Decision):
    vertex_S = simplex.greedy_vertex(last_S, d.lower_S, d.upper_S)
    return 0.5 * d.current_S + 0.5 * vertex_S, jnp.int32(curriculum.KIND_CUSTOM), last_S

  return Mixer(init=init, observe=observe, decide=decide,
               metrics=lambda last_S: {"last_loss": last_S})


def not_a_mixer(section):
  return section.eta


def _section(strategy="tests.test_curriculum_mixer:greedy"):
  """The curriculum section over three sources, one full-simplex geometry."""
  c = curriculum.curriculum_config(
      ml_collections.ConfigDict({"all": curriculum.geometry("all", 0, sources=SOURCES)}))
  c.static_mixture = ml_collections.ConfigDict({s: 1.0 for s in SOURCES})
  c.strategy = strategy
  return c


def _drive(spec, losses_S, num_steps):
  """The curriculum as the trainer drives it, on constant losses; the weights of every step."""
  state = curriculum.init(spec, jax.random.key(0))
  update = jax.jit(lambda s, t: curriculum.update(spec, s, t, losses_S, jnp.full(3, 10.0)))
  snapshots, used = {-1: curriculum.schedule(state)}, []
  for t in range(num_steps):
    used.append(curriculum.weights_at(snapshots[max(t - 1 - spec.decision_lag, -1)], t))
    state = update(state, jnp.int32(t))
    snapshots[t] = curriculum.schedule(state)
  return np.array(used), state


def test_a_mixer_named_by_its_module_drives_the_phases():
  """Losses (1, 3, 2): every decided phase moves half way to vertex b, so b's weight after k
  decisions is 1 - (2/3) 2^-k from the uniform start."""
  spec = curriculum.spec_from_config(_section(), sources=SOURCES)
  assert spec.strategy == "tests.test_curriculum_mixer:greedy"
  used, state = _drive(spec, jnp.array([1.0, 3.0, 2.0]), 200)
  starts = np.flatnonzero(np.r_[True, np.any(np.diff(used, axis=0) != 0, axis=1)])
  w_b = used[starts, 1]
  k = np.arange(len(w_b))
  np.testing.assert_allclose(w_b, 1 - (2 / 3) * 0.5 ** k, atol=1e-6)
  assert len(starts) >= 5
  np.testing.assert_allclose(curriculum.metrics(spec, state)["last_loss"], [1.0, 3.0, 2.0])
  assert int(state.kinds[1]) == curriculum.KIND_CUSTOM


def test_a_mixer_object_replaces_the_named_strategy():
  by_name = curriculum.spec_from_config(_section(), sources=SOURCES)
  mixer = greedy(None)
  by_object = curriculum.spec_from_config(_section("andrea"), sources=SOURCES, mixer=mixer)
  assert by_object.mixer is mixer
  a, _ = _drive(by_name, jnp.array([1.0, 3.0, 2.0]), 60)
  b, _ = _drive(by_object, jnp.array([1.0, 3.0, 2.0]), 60)
  np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("strategy, message", [
    ("no_such_module:f", "cannot import 'no_such_module'"),
    ("tests.test_curriculum_mixer:nothing", "has no 'nothing'"),
    ("tests.test_curriculum_mixer:not_a_mixer", "returned float, not a Mixer"),
    ("tests.test_curriculum_mixer:SOURCES", "'SOURCES' is neither a Mixer nor callable"),
    ("tests.test_curriculum_mixer:", "a mixer of your own is named 'package.module:factory'"),
    ("greedy", "must be one of .* or 'package.module:factory'"),
])
def test_a_bad_mixer_name_is_refused_naming_the_field(strategy, message):
  with pytest.raises(ValueError, match=f"curriculum.strategy.*{message}"):
    curriculum.spec_from_config(_section(strategy), sources=SOURCES)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(curriculum.STRATEGIES)
                         + ["tests.test_curriculum_mixer:greedy"])
def test_every_strategy_trains_and_resumes_bit_identically(strategy, tmp_path, data_cache):
  """20 steps in one go, and 9 + 11 with a checkpoint between: the same logs and weights."""
  c = small_run_config(num_steps=20)
  c.curriculum.strategy = strategy
  c.train.log_every = 1
  whole = train.train_and_evaluate(c, str(tmp_path / "whole"))
  c.train.stop_step = 9
  train.train_and_evaluate(c, str(tmp_path / "parts"))
  c.train.stop_step = 0
  parts = train.train_and_evaluate(c, str(tmp_path / "parts"))
  assert parts["start_step"] == 9 and whole["end_step"] == parts["end_step"] == 20
  read = lambda run: [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").open()]
  assert read("parts") == read("whole")
  kinds = {r["curriculum/phase_kind"] for r in read("whole") if "curriculum/phase_kind" in r}
  if strategy == "static":   # every phase holds the region's mixture
    assert kinds == {curriculum.KIND_FIXED}
  else:
    assert kinds - {curriculum.KIND_FIXED}, "the mixer decided no phase"

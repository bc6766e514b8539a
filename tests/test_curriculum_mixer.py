"""The mixer interface: a mixer written here, outside the package, drives the curriculum and a run
exactly as a built-in one does.

``greedy`` below is a user's mixer: it remembers each source's last observed loss and steps a
fraction ``step_size`` of the way to the vertex of the highest one. It reaches the package by name
(``curriculum.mixer.name = "tests.test_curriculum_mixer:greedy"``, its ``step_size`` a config
field like a built-in's) or as an object.
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
NAME = "tests.test_curriculum_mixer:greedy"


def greedy(*, step_size: float = 0.5) -> Mixer:
  """``step_size`` of the way to the vertex of the source whose last observed loss is highest."""
  def init(num_sources):
    return jnp.zeros((num_sources,), jnp.float32)

  def observe(last_S, obs: Observation):
    return jnp.where(obs.tokens_S > 0, obs.losses_S, last_S)

  def decide(last_S, d: Decision):
    vertex_S = simplex.greedy_vertex(last_S, d.lower_S, d.upper_S)
    return (1 - step_size) * d.current_S + step_size * vertex_S, "greedy", last_S

  return Mixer(init=init, observe=observe, decide=decide,
               metrics=lambda last_S: {"last_loss": last_S}, labels=("greedy",))


def mislabelled(*, step_size: float = 0.5) -> Mixer:
  m = greedy(step_size=step_size)
  return m._replace(decide=lambda s, d: (d.current_S, "grredy", s))


def not_a_mixer(*, eta: float = 0.3):
  return eta


def no_default(step_size: float) -> Mixer:
  return greedy(step_size=step_size)


def _section(name=NAME, **args):
  """The curriculum section over three sources, one full-simplex geometry."""
  c = curriculum.curriculum_config(
      ml_collections.ConfigDict({"all": curriculum.geometry("all", 0, sources=SOURCES)}),
      sources=SOURCES)
  c.mixer = curriculum.mixer_config(name, SOURCES, **args)
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
  """Losses (1, 3, 2): every decided phase moves ``step_size`` of the way to vertex b, so b's
  weight after k decisions is ``1 - (2/3) (1 - step_size)^k`` from the uniform start."""
  c = _section(step_size=0.25)
  assert dict(c.mixer) == {"name": NAME, "step_size": 0.25}   # its own field, as a built-in's
  spec = curriculum.spec_from_config(c, sources=SOURCES)
  assert spec.mixer_name == NAME and spec.labels == ("start", "greedy")
  used, state = _drive(spec, jnp.array([1.0, 3.0, 2.0]), 200)
  starts = np.flatnonzero(np.r_[True, np.any(np.diff(used, axis=0) != 0, axis=1)])
  w_b = used[starts, 1]
  k = np.arange(len(w_b))
  np.testing.assert_allclose(w_b, 1 - (2 / 3) * 0.75 ** k, atol=1e-6)
  assert len(starts) >= 5
  np.testing.assert_allclose(curriculum.metrics(spec, state)["last_loss"], [1.0, 3.0, 2.0])
  assert spec.labels[int(state.labels[1])] == "greedy"


def test_a_mixer_object_replaces_the_named_one():
  by_name = curriculum.spec_from_config(_section(), sources=SOURCES)
  mixer = greedy()
  by_object = curriculum.spec_from_config(_section("andrea"), sources=SOURCES, mixer=mixer)
  assert by_object.mixer.decide is mixer.decide
  a, _ = _drive(by_name, jnp.array([1.0, 3.0, 2.0]), 60)
  b, _ = _drive(by_object, jnp.array([1.0, 3.0, 2.0]), 60)
  np.testing.assert_array_equal(a, b)


def test_two_builds_with_one_user_factory_are_one_spec():
  a = curriculum.spec_from_config(_section(), sources=SOURCES)
  b = curriculum.spec_from_config(_section(), sources=SOURCES)
  assert a == b and hash(a) == hash(b)
  assert curriculum.spec_from_config(_section(step_size=0.1), sources=SOURCES) != a


@pytest.mark.parametrize("name, message", [
    ("no_such_module:f", "cannot import 'no_such_module'"),
    ("tests.test_curriculum_mixer:nothing", "has no 'nothing'"),
    ("tests.test_curriculum_mixer:SOURCES", "'SOURCES' is neither a Mixer nor callable"),
    ("tests.test_curriculum_mixer:", "a mixer of your own is named 'package.module:factory'"),
    ("greedy", "not a built-in mixer"),
])
def test_a_bad_mixer_name_is_refused_naming_the_field(name, message):
  with pytest.raises(ValueError, match=f"curriculum.mixer.name = '{name}'.*{message}"):
    curriculum.mixer_config(name, SOURCES)


class _FieldError(ValueError):
  """An error whose constructor takes two arguments, as some libraries' do."""

  def __init__(self, field, why):
    super().__init__(f"{field} {why}")


def fussy(eta: float = 0.3):
  raise _FieldError("eta", f"must be under 0.1 for this mixer, got {eta}")


def test_a_factory_s_own_error_keeps_its_message_and_names_the_field():
  c = _section()
  c.mixer = ml_collections.ConfigDict({"name": "tests.test_curriculum_mixer:fussy", "eta": 0.3})
  with pytest.raises(ValueError, match=r"^curriculum.mixer.eta must be under 0.1 for this mixer, "
                                       r"got 0.3$"):
    curriculum.spec_from_config(c, sources=SOURCES)


def test_a_factory_that_is_not_one_is_refused():
  c = _section()
  c.mixer = ml_collections.ConfigDict({"name": "tests.test_curriculum_mixer:not_a_mixer",
                                       "eta": 0.3})
  with pytest.raises(ValueError, match=r"curriculum.mixer.name = '.*not_a_mixer': the factory "
                                       r"returned float, not a Mixer"):
    curriculum.spec_from_config(c, sources=SOURCES)
  with pytest.raises(TypeError, match=r"argument 'step_size' has no default"):
    curriculum.mixer_config("tests.test_curriculum_mixer:no_default", SOURCES)
  c.mixer = ml_collections.ConfigDict({"name": NAME, "step_size": "half"})
  with pytest.raises(TypeError, match=r"curriculum.mixer.step_size must be a number, got 'half'"):
    curriculum.spec_from_config(c, sources=SOURCES)


def test_a_label_the_mixer_does_not_declare_is_refused():
  spec = curriculum.spec_from_config(_section("tests.test_curriculum_mixer:mislabelled"),
                                     sources=SOURCES)
  with pytest.raises(ValueError, match=r"labelled a phase 'grredy', not one of its labels "
                                       r"\('greedy',\)"):
    _drive(spec, jnp.array([1.0, 3.0, 2.0]), 60)
  with pytest.raises(ValueError, match="that label is the engine's"):
    curriculum.spec_from_config(_section("andrea"), sources=SOURCES,
                                mixer=greedy()._replace(labels=("start",)))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(curriculum.MIXERS) + [NAME])
def test_every_mixer_trains_and_resumes_bit_identically(name, tmp_path, data_cache):
  """20 steps in one go, and 9 + 11 with a checkpoint between: the same logs and weights."""
  c = small_run_config(num_steps=20)
  curriculum.set_mixer(c, name)
  c.train.log_every = 1
  whole = train.train_and_evaluate(c, str(tmp_path / "whole"))
  c.train.stop_step = 9
  train.train_and_evaluate(c, str(tmp_path / "parts"))
  c.train.stop_step = 0
  parts = train.train_and_evaluate(c, str(tmp_path / "parts"))
  assert parts["start_step"] == 9 and whole["end_step"] == parts["end_step"] == 20
  read = lambda run: [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").open()]
  assert read("parts") == read("whole")
  labels = {r["curriculum/phase_label"] for r in read("whole") if "curriculum/phase_label" in r}
  assert "start" in labels
  if name == "static":   # every phase holds the region's mixture
    assert labels == {"start", "held"}
  else:
    assert labels - {"start"}, "the mixer decided no phase"

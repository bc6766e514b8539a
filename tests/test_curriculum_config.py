"""The curriculum config section: ANDREA's geometries, overrides, validation messages, the spec."""

import importlib
import pathlib

import jax
import ml_collections
import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from andrea_jax import curriculum
from andrea_jax.sources import SOURCES, WARMUP_SOURCES

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _idx(name):
  return SOURCES.index(name)


def test_andrea_geometries_match_the_source_document():
  spec = curriculum.spec_from_config(curriculum.curriculum_config(curriculum.andrea_geometries()))
  assert spec.geometry_names == ("v2_warmup", "v2_firehose", "v3_polish")
  assert spec.starts.tolist() == [0, 20_000, 112_619]
  warm = np.array([s in WARMUP_SOURCES for s in SOURCES])
  assert warm.sum() == 7
  np.testing.assert_array_equal(spec.uppers[0], warm.astype(float))   # 9 of 16 pinned at zero
  np.testing.assert_array_equal(spec.lowers[:2], 0.0)
  np.testing.assert_array_equal(spec.uppers[1], 1.0)
  lower, upper = spec.lowers[2], spec.uppers[2]
  assert lower[_idx("hermes3-general")] == 0.7 and upper[_idx("dictionary")] == 0.25
  assert upper[_idx("repo-docs")] == 0 and upper[_idx("repo-docstrings")] == 0
  assert np.count_nonzero(lower) == 1 and np.count_nonzero(upper < 1) == 3
  assert spec.region(0).dim == 6 and spec.region(1).dim == 15 and spec.region(2).dim == 13


def test_scaled_geometries_and_defaults():
  assert curriculum.andrea_geometries(2000, 0.01).v3_polish.start_step == 1126
  spec = curriculum.spec_from_config(curriculum.curriculum_config())
  assert spec.starts.tolist() == [0, 200, 1126]
  assert (spec.phase_min_steps, spec.phase_max_steps, spec.decision_lag) == (7, 42, 2)
  # The default mixer, ANDREA's walk with its factory's defaults (the spec knows it by them).
  assert spec.mixer_name == "andrea" and spec.labels == ("start", "random", "bandit")
  assert dict(spec.mixer_set.keys[0][1]) == {
      "eta": 0.3, "random_share": 0.25, "reward": "progress", "discount": 0.995,
      "exploration": 0.05, "min_count": 1.0, "prior_count": 0.01, "reward_knee": 1.0,
      "pivot_discount": 0.25}
  with pytest.raises(ValueError, match="do not fit increasing into 1000 steps"):
    curriculum.andrea_geometries(1000, 0.01)


@pytest.mark.parametrize("name, labels", [
    ("andrea", ("random", "bandit")), ("bandit_only", ("random", "bandit")),
    ("random_only", ("random", "bandit")), ("static", ("held",)), ("exp3", ("exp3",)),
    ("elastic", ("elastic",))])
def test_each_built_in_name_makes_a_section_of_its_own_arguments(name, labels):
  """The section of each built-in holds its name and its factory's arguments, nothing else."""
  import inspect
  from andrea_jax.curriculum import registry
  c = curriculum.curriculum_config(mixer=name)
  params = inspect.signature(registry.BUILTIN[name]).parameters
  assert set(c.mixer.keys()) == {"name"} | set(params)
  spec = curriculum.spec_from_config(c)
  assert spec.mixer_name == name and spec.mixer.labels == labels
  assert spec.labels == ("start",) + labels
  assert set(curriculum.MIXERS) == {"andrea", "bandit_only", "random_only", "static", "exp3",
                                    "elastic"}


def test_a_section_made_for_another_mixer_is_refused_naming_its_fields():
  c = curriculum.curriculum_config()
  c.mixer.name = "exp3"
  with pytest.raises(ValueError, match=r"curriculum.mixer has fields \['discount', .*'eta'.* "
                                       r"that mixer 'exp3' does not take"):
    curriculum.spec_from_config(c)
  c = curriculum.curriculum_config(mixer="exp3", lr_scale=0.1)
  assert curriculum.spec_from_config(c).mixer_set.keys[0] == (
      "exp3", (("lr_scale", 0.1), ("smoothing", 0.9)))


def test_two_builds_of_one_config_are_one_spec():
  """Equal sections give equal specs (one compiled step), whatever built them."""
  a = curriculum.spec_from_config(curriculum.curriculum_config(mixer="exp3"))
  b = curriculum.spec_from_config(curriculum.curriculum_config(mixer="exp3"))
  assert a == b and hash(a) == hash(b) and a.mixer is not b.mixer
  c = curriculum.spec_from_config(curriculum.curriculum_config(mixer="exp3", lr_scale=0.5))
  assert c != a


def test_single_geometry_starts_at_zero():
  g = curriculum.single_geometry(curriculum.andrea_geometries(), "v3_polish")
  assert list(g.keys()) == ["v3_polish"] and g.v3_polish.start_step == 0
  spec = curriculum.spec_from_config(curriculum.curriculum_config(g))
  assert spec.starts.tolist() == [0] and spec.lowers[0, _idx("hermes3-general")] == 0.7
  assert curriculum.used_sources(spec) == tuple(
      s for s in SOURCES if s not in ("repo-docs", "repo-docstrings"))


def test_command_line_overrides(tmp_path):
  cfg_file = tmp_path / "cfg.py"
  cfg_file.write_text(
      "import ml_collections\n"
      "from andrea_jax.curriculum import andrea_geometries, curriculum_config\n"
      "def get_config():\n"
      "  c = ml_collections.ConfigDict()\n"
      "  c.curriculum = curriculum_config(andrea_geometries())\n"
      "  return c\n")
  argv = [
      "prog", f"--config={cfg_file}",
      "--config.curriculum.geometries.v3_polish.floors.hermes3_general=0.6",
      "--config.curriculum.geometries.v3_polish.ceilings.dictionary=0.1",
      "--config.curriculum.geometries.v3_polish.exclude=repo-docs,extra-01",
      "--config.curriculum.geometries.v2_firehose.start_step=30000",
      "--config.curriculum.mixer.exploration=0.2",
  ]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  fv(argv)
  spec = curriculum.spec_from_config(fv.config.curriculum)
  assert spec.starts.tolist() == [0, 30_000, 112_619]
  assert spec.lowers[2, _idx("hermes3-general")] == 0.6
  assert spec.uppers[2, _idx("dictionary")] == 0.1
  assert spec.uppers[2, _idx("extra-01")] == 0 and spec.uppers[2, _idx("repo-docstrings")] == 1
  assert dict(spec.mixer_set.keys[0][1])["exploration"] == 0.2


def _parse(tmp_path, *overrides):
  from andrea_jax.curriculum import registry
  cfg_file = tmp_path / "cfg.py"
  cfg_file.write_text(
      "from andrea_jax.config import base_config\n"
      "def get_config():\n"
      "  c = base_config()\n"
      "  c.curriculum.mixer.eta = 0.5\n"
      "  return c\n")
  argv = ["prog", f"--config={cfg_file}", *overrides]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  fv(argv)
  registry.apply_name_override(fv.config, config_flags.get_override_values(fv["config"]))
  return fv.config


def test_the_command_line_switches_the_mixer_by_its_name(tmp_path):
  """``--config.curriculum.mixer.name=...`` makes the section anew for the named mixer, keeping
  the fields both take; a command-line field the new one does not take is refused."""
  c = _parse(tmp_path, "--config.curriculum.mixer.name=static")
  assert set(c.mixer.keys() if "mixer" in c else c.curriculum.mixer.keys()) == {"name", "mixture"}
  assert curriculum.spec_from_config(c.curriculum).mixer_name == "static"
  c = _parse(tmp_path, "--config.curriculum.mixer.name=bandit_only")
  assert c.curriculum.mixer.eta == 0.5 and "random_share" not in c.curriculum.mixer
  c = _parse(tmp_path, "--config.curriculum.mixer.name=andrea",
             "--config.curriculum.mixer.random_share=0.5")
  assert (c.curriculum.mixer.eta, c.curriculum.mixer.random_share) == (0.5, 0.5)   # unchanged
  with pytest.raises(ValueError, match=r"--config.curriculum.mixer.eta is not an argument of "
                                       r"mixer 'exp3'"):
    _parse(tmp_path, "--config.curriculum.mixer.name=exp3", "--config.curriculum.mixer.eta=0.2")


def _config(**geometry_fields):
  c = curriculum.curriculum_config(curriculum.andrea_geometries())
  for path, value in geometry_fields.items():
    node = c
    *parents, leaf = path.split("__")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


@pytest.mark.parametrize("fields,err,message", [
    ({"geometries__v3_polish__floors__hermes3_general": 1.5}, ValueError,
     "curriculum.geometries.v3_polish.floors.hermes3_general = 1.5 is outside [0, 1]"),
    ({"geometries__v3_polish__ceilings__dictionary": float("nan")}, ValueError,
     "curriculum.geometries.v3_polish.ceilings.dictionary must be finite, got nan"),
    ({"geometries__v3_polish__floors__dictionary": 0.3}, ValueError,
     "curriculum.geometries.v3_polish: ceiling 0.25 of 'dictionary' is under its floor 0.3"),
    ({"geometries__v3_polish__floors__chat": 0.4}, ValueError,
     "curriculum.geometries.v3_polish: floors sum to 1.1 > 1 for region 'v3_polish'"),
    ({"geometries__v3_polish__exclude": "repo-docs,wikipedia"}, ValueError,
     "unknown source 'wikipedia' in curriculum.geometries.v3_polish.exclude"),
    ({"geometries__v2_warmup__only": "chat,hermes3_general"}, ValueError,
     "unknown source 'hermes3_general' in curriculum.geometries.v2_warmup.only"),
    ({"geometries__v2_firehose__start_step": 0}, ValueError,
     "geometries 'v2_firehose' and 'v2_warmup' both start at step 0"),
    ({"geometries__v2_firehose__start_step": 112_615}, ValueError,
     "geometry 'v2_firehose' lasts 4 steps (from 112615 to 'v3_polish' at 112619), shorter than "
     "phase_min_steps = 7"),
    ({"geometries__v2_warmup__start_step": 10}, ValueError,
     "no geometry starts at step 0 (the first, 'v2_warmup', starts at 10)"),
    ({"mixer__name": "doremi"}, ValueError,
     "curriculum.mixer.name = 'doremi': not a built-in mixer"),
    ({"phase_min_steps": 3}, ValueError,
     "curriculum.phase_min_steps = 3 must exceed decision_lag + 1 = 3"),
    ({"phase_max_steps": 10}, ValueError,
     "curriculum.phase_max_steps = 10 must be >= 2 * phase_min_steps - 1 = 13"),
    ({"phase_max_steps": 2**31 - 1}, ValueError,
     "curriculum.phase_max_steps must be < 2**30, got 2147483647"),
    ({"mixer__random_share": 1.5}, ValueError,
     "curriculum.mixer.random_share must be in [0, 1], got 1.5"),
    ({"mixer__eta": 0.0}, ValueError, "curriculum.mixer.eta must be in (0, 1], got 0.0"),
    ({"mixer__discount": 0.0}, ValueError,
     "curriculum.mixer.discount must be in (0, 1], got 0.0"),
    ({"mixer__reward": "no.such_module:reward"}, ValueError,
     "curriculum.mixer.reward = 'no.such_module:reward': cannot import 'no.such_module'"),
])
def test_validation_messages(fields, err, message):
  with pytest.raises(err) as e:
    curriculum.spec_from_config(_config(**fields))
  assert message in str(e.value)


def test_more_sources_than_the_random_phases_sample_are_refused():
  # 21 sources (API users may pass their own names): refused before anything compiles.
  names = tuple(f"s{i}" for i in range(21))
  c = curriculum.curriculum_config(sources=names, mixer="static")
  with pytest.raises(ValueError, match="sources: 21 sources, more than the 20 the curriculum's "
                                       "random phases sample"):
    curriculum.spec_from_config(c, sources=names)


def test_validation_of_types_and_missing_fields():
  c = curriculum.curriculum_config(curriculum.andrea_geometries())
  c.geometries.v2_firehose.start_step = None
  with pytest.raises(ValueError, match=r"curriculum.geometries.v2_firehose.start_step is missing"):
    curriculum.spec_from_config(c)
  c = ml_collections.ConfigDict(curriculum.curriculum_config().to_dict(), type_safe=False)
  c.phase_min_steps = "seven"
  with pytest.raises(TypeError, match=r"curriculum.phase_min_steps must be an integer, got 'seven'"):
    curriculum.spec_from_config(c)
  c.phase_min_steps = 7
  c.geometries.v3_polish.floors.hermes3_general = "0.7"
  with pytest.raises(TypeError, match=r"curriculum.geometries.v3_polish.floors.hermes3_general "
                     r"must be a number, got '0.7'"):
    curriculum.spec_from_config(c)
  c = curriculum.curriculum_config(curriculum.andrea_geometries())
  c.geometries.v3_polish.floors = ml_collections.ConfigDict({"hermes3_generale": 0.7})
  with pytest.raises(ValueError, match=r"unknown source 'hermes3_generale' in "
                     r"curriculum.geometries.v3_polish.floors"):
    curriculum.spec_from_config(c)
  c = curriculum.curriculum_config(ml_collections.ConfigDict())
  with pytest.raises(ValueError, match="curriculum.geometries is empty"):
    curriculum.spec_from_config(c)
  with pytest.raises(ValueError, match="unknown source 'wiki' in floors of geometry 'g'"):
    curriculum.geometry("g", 0, floors={"wiki": 0.1})


def test_spec_is_hashable_by_content_and_a_pytree():
  a = curriculum.spec_from_config(curriculum.curriculum_config())
  b = curriculum.spec_from_config(curriculum.curriculum_config())
  assert a == b and hash(a) == hash(b)
  c = curriculum.curriculum_config()
  c.mixer.eta = 0.5
  other = curriculum.spec_from_config(c)
  assert other != a
  leaves, tree = jax.tree.flatten(a)
  assert jax.tree.unflatten(tree, leaves) == a
  # Another curriculum on the same mixer (only the geometries' tables differ): one tree structure,
  # so one compilation for both; another mixer is another structure.
  c = curriculum.curriculum_config()
  c.geometries.v3_polish.floors.hermes3_general = 0.5
  assert jax.tree.structure(curriculum.spec_from_config(c)) == tree
  assert jax.tree.structure(other) != tree


@pytest.mark.parametrize("name", ["v2_warmup", "v2_firehose", "v3_polish", "andrea_curriculum"])
def test_experiment_configs(name):
  """andrea_curriculum.py, and tiny.py with one region for the whole run (``tiny.py:<region>``):
  that region from step 0, under the main job's training settings (its 20-step warmup, not
  base_config's 2000 steps, which would span the whole run)."""
  file = "andrea_curriculum" if name == "andrea_curriculum" else "tiny"
  module = importlib.import_module(f"experiments.{file}")
  assert "python -m andrea_jax.curriculum --config experiments/" in module.__doc__
  config = module.get_config() if file == "andrea_curriculum" else module.get_config(name)
  spec = curriculum.spec_from_config(config.curriculum, sources=config.sources)
  if name == "andrea_curriculum":
    assert config.train.num_steps == 200_000
    assert spec.geometry_names == ("v2_warmup", "v2_firehose", "v3_polish")
  else:
    assert spec.geometry_names == (name,) and spec.starts.tolist() == [0]
    assert (config.train.num_steps, config.optim.warmup_steps) == (1000, 20)


def test_the_static_mixers_mixture():
  """``curriculum.mixer.mixture`` of the static mixer: relative weights, normalised, held every
  phase (then projected onto the region). chat 3 and the noise source 0, the others 1: 3/17 and
  1/17."""
  from andrea_jax.curriculum import geometry, simulate
  c = curriculum.curriculum_config(ml_collections.ConfigDict({"full": geometry("full", 0)}),
                                   mixer="static")
  c.mixer.mixture.chat = 3.0
  c.mixer.mixture.extra_06 = 0.0
  spec = curriculum.spec_from_config(c)
  want_S = np.array([3.0 if s == "chat" else 0.0 if s == "extra-06" else 1.0 for s in SOURCES])
  want_S /= 17.0
  run = simulate.simulate(spec, jax.random.key(0), 60)
  np.testing.assert_allclose(run.weights, np.broadcast_to(want_S, run.weights.shape), atol=1e-6)
  assert {p["label"] for p in run.phases(spec)} == {"start", "held"}
  # The default is uniform, and a different mixture is a different spec (no stale compilation).
  c.mixer.mixture.chat, c.mixer.mixture.extra_06 = 1.0, 1.0
  uniform = curriculum.spec_from_config(c)
  np.testing.assert_allclose(simulate.simulate(uniform, jax.random.key(0), 20).weights, 1 / 16,
                             atol=1e-6)
  assert uniform != spec


def test_a_mixture_per_geometry_is_a_mixture_schedule():
  """Three geometries: a proxy-style mixture (chat 3, dictionary 2, the rest 1: 3/19, 2/19,
  1/19), then the curriculum's default (uniform) on the full simplex, then a region with a floor
  and a mixture the floor binds: the projection keeps the floor and scales the rest (worked out
  here). Held at every step of a simulated run, the phases cut at the boundaries."""
  from andrea_jax.curriculum import geometry, simulate
  c = curriculum.curriculum_config(mixer="static")
  c.geometries = ml_collections.ConfigDict({
      "proxy": geometry("proxy", 0, mixture={"chat": 3, "dictionary": 2}),
      "plain": geometry("plain", 300),
      # extra-01 >= 0.5; its mixture gives 1/2 to chat and 1/30 to each of the 15 others.
      "floored": geometry("floored", 600, floors={"extra-01": 0.5}, mixture={"chat": 15.0}),
  })
  spec = curriculum.spec_from_config(c)
  # The run's static mixer (uniform) holds "plain"; each own mixture is a static mixer of its own.
  assert spec.geometry_mixers.tolist() == [1, 0, 2] and len(spec.mixers) == 3
  proxy_S = np.array([3.0 if s == "chat" else 2.0 if s == "dictionary" else 1.0
                      for s in SOURCES]) / 19
  # Projection onto {w_extra01 >= 0.5, sum 1}: the mixture (1/2 chat, 1/30 others) minus a
  # common shift tau on the free sources, extra-01 raised to 0.5: 0.5 + (1/2 - tau) +
  # 14 (1/30 - tau) = 1 gives tau = 7/15 / 15 = 7/225, every free weight stays positive.
  tau = 7 / 225
  floored_S = np.array([0.5 - tau if s == "chat" else 0.5 if s == "extra-01" else 1 / 30 - tau
                        for s in SOURCES])
  np.testing.assert_allclose(floored_S.sum(), 1.0)
  w_NxS = simulate.simulate(spec, jax.random.key(0), 900).weights
  np.testing.assert_allclose(w_NxS[:300], np.broadcast_to(proxy_S, (300, 16)), atol=1e-6)
  np.testing.assert_allclose(w_NxS[300:600], 1 / 16, atol=1e-6)
  np.testing.assert_allclose(w_NxS[600:], np.broadcast_to(floored_S, (300, 16)), atol=1e-6)


def test_a_geometry_mixture_keeps_its_ratios_inside_the_region():
  """A region allowing three sources (hermes3-general, hermes3-creative, chat), the mixture 3 : 2
  on the first two and the default 1 on chat: 3/6, 2/6, 1/6 exactly (a Euclidean projection of the
  16-source mixture would shift all three by the same amount instead); with a floor of 0.25 on
  chat the projection lowers the other two equally: 3/6 - 1/24, 2/6 - 1/24, 1/4 (worked out
  here)."""
  from andrea_jax.curriculum import geometry, simulate
  three = ("hermes3-general", "hermes3-creative", "chat")
  c = curriculum.curriculum_config(mixer="static")
  c.geometries = ml_collections.ConfigDict({
      "three": geometry("three", 0, only=three,
                        mixture={"hermes3-general": 3, "hermes3-creative": 2}),
      "floored": geometry("floored", 100, only=three, floors={"chat": 0.25},
                          mixture={"hermes3-general": 3, "hermes3-creative": 2}),
  })
  w_NxS = simulate.simulate(curriculum.spec_from_config(c), jax.random.key(0), 200).weights
  want = np.zeros((2, 16))
  want[0, [_idx(s) for s in three]] = [3 / 6, 2 / 6, 1 / 6]
  want[1, [_idx(s) for s in three]] = [3 / 6 - 1 / 24, 2 / 6 - 1 / 24, 1 / 4]
  np.testing.assert_allclose(w_NxS[:100], np.broadcast_to(want[0], (100, 16)), atol=1e-6)
  np.testing.assert_allclose(w_NxS[100:], np.broadcast_to(want[1], (100, 16)), atol=1e-6)


def test_a_geometry_mixture_is_overridable_on_the_command_line(tmp_path):
  """Stored listing all sources, like floors: a locked config (as ``andrea_jax.main`` parses it)
  accepts ``--config.curriculum.geometries.<name>.mixture.<source>=`` for any source."""
  cfg_file = tmp_path / "cfg.py"
  cfg_file.write_text(
      "import ml_collections\n"
      "from andrea_jax.curriculum import curriculum_config, geometry\n"
      "def get_config():\n"
      "  c = ml_collections.ConfigDict()\n"
      "  c.curriculum = curriculum_config(ml_collections.ConfigDict({\n"
      "      'proxy': geometry('proxy', 0, mixture={'chat': 3}),\n"
      "      'cooldown': geometry('cooldown', 100)}), mixer='static')\n"
      "  return c\n")
  argv = ["prog", f"--config={cfg_file}",
          "--config.curriculum.geometries.proxy.mixture.chat=5",
          "--config.curriculum.geometries.proxy.mixture.extra_06=0"]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  fv(argv)
  spec = curriculum.spec_from_config(fv.config.curriculum)
  want_S = np.array([5.0 if s == "chat" else 0.0 if s == "extra-06" else 1.0 for s in SOURCES])
  from andrea_jax.curriculum import simulate
  w_NxS = simulate.simulate(spec, jax.random.key(0), 120).weights
  np.testing.assert_allclose(w_NxS[:100], np.broadcast_to(want_S / 19, (100, 16)), atol=1e-6)
  np.testing.assert_allclose(w_NxS[100:], 1 / 16, atol=1e-6)


def test_a_mixture_the_region_cannot_hold_is_refused():
  from andrea_jax.curriculum import geometry
  # A weight on a source the region excludes could never be drawn; 0 (or the default 1) is fine.
  with pytest.raises(ValueError, match=r"curriculum.geometries.a.mixture weighs 'repo-docs', "
                     r"which geometry 'a' excludes"):
    geometry("a", 0, exclude=("repo-docs",), mixture={"repo-docs": 100})
  geometry("a", 0, exclude=("repo-docs",), mixture={"repo-docs": 0, "chat": 2})
  with pytest.raises(ValueError, match=r"curriculum.geometries.b.mixture gives no weight to any "
                     r"source geometry 'b' allows \(chat, oasst\)"):
    geometry("b", 0, only=("chat", "oasst"), mixture={"chat": 0, "oasst": 0})
  # The same for the static mixer's mixture, region by region.
  c = curriculum.curriculum_config(curriculum.andrea_geometries(2000, 0.01), mixer="static")
  for key in c.mixer.mixture.keys():
    c.mixer.mixture[key] = 0.0
  c.mixer.mixture.dictionary = 1.0     # not one of v2_warmup's seven sources
  with pytest.raises(ValueError, match=r"curriculum.mixer.mixture gives no weight to any source "
                     r"geometry 'v2_warmup' allows"):
    curriculum.spec_from_config(c)


@pytest.mark.parametrize("strategy", ["andrea", "bandit_only", "random_only", "exp3", "elastic"])
def test_a_geometry_mixture_is_held_under_any_mixer(strategy):
  """A proxy-style mixture (chat 3, the 15 others 1: 3/18 and 1/18) for the first 100 steps, then
  the full simplex: the mixture holds exactly until the boundary, every phase there is the start
  or held, and the mixer's own phases decide everything after it."""
  from andrea_jax.curriculum import geometry, simulate
  c = curriculum.curriculum_config(mixer=strategy)
  c.geometries = ml_collections.ConfigDict({"proxy": geometry("proxy", 0, mixture={"chat": 3}),
                                            "free": geometry("free", 100)})
  spec = curriculum.spec_from_config(c)
  assert spec.geometry_mixers.tolist() == [1, 0]   # a static mixer of chat 3, then the run's
  want_S = np.array([3.0 if s == "chat" else 1.0 for s in SOURCES]) / 18
  run = simulate.simulate(spec, jax.random.key(0), 300)
  np.testing.assert_allclose(run.weights[:100], np.broadcast_to(want_S, (100, 16)), atol=1e-6)
  labels = lambda rows: {spec.labels[i] for i in rows.tolist()}
  assert labels(run.labels[:100]) <= {"start", "held"}
  mixer_labels = {"andrea": {"random", "bandit"}, "bandit_only": {"bandit"},
                  "random_only": {"random"}, "exp3": {"exp3"}, "elastic": {"elastic"}}[strategy]
  assert labels(run.labels[100:]) <= mixer_labels
  assert np.abs(run.weights[100:] - want_S).sum(axis=1).max() > 1e-3   # the mixer moved


def test_a_held_first_geometry_starts_the_run_on_its_mixture():
  """Phase 0 (decided before any step) is the first geometry's own mixture under a mixer too."""
  from andrea_jax.curriculum import geometry
  c = curriculum.curriculum_config(mixer="elastic")
  c.geometries = ml_collections.ConfigDict({"proxy": geometry("proxy", 0, mixture={"chat": 0}),
                                            "free": geometry("free", 100)})
  w_S = curriculum.weights_at(curriculum.schedule(
      curriculum.init(curriculum.spec_from_config(c), jax.random.key(0))), 0)
  np.testing.assert_allclose(w_S, [0.0 if s == "chat" else 1 / 15 for s in SOURCES], atol=1e-7)


@pytest.mark.parametrize("mixture, message", [
    ({"chat": -1.0}, r"curriculum.geometries.proxy.mixture.chat = -1.0 is negative"),
    ({"chat": float("nan")}, r"curriculum.geometries.proxy.mixture.chat must be finite"),
    ({"nonsense": 2.0}, r"unknown source 'nonsense' in curriculum.geometries.proxy.mixture"),
    ({s: 0.0 for s in SOURCES}, r"curriculum.geometries.proxy.mixture: every weight is 0"),
])
def test_a_bad_geometry_mixture_names_the_field(mixture, message):
  from andrea_jax.curriculum import geometry
  with pytest.raises((ValueError, TypeError), match=message):
    geometry("proxy", 0, mixture=mixture)
  # Set in a config file's dict directly, spec_from_config says the same.
  c = curriculum.curriculum_config(mixer="static")
  c.geometries = ml_collections.ConfigDict({"proxy": geometry("proxy", 0)})
  with c.unlocked():
    c.geometries.proxy.mixture = ml_collections.ConfigDict(
        {curriculum.source_key(k) if k in SOURCES else k: v for k, v in mixture.items()})
  with pytest.raises((ValueError, TypeError), match=message):
    curriculum.spec_from_config(c)


@pytest.mark.parametrize("value, message", [
    (-1.0, r"curriculum.mixer.mixture.chat = -1.0 is negative"),
    (float("nan"), r"curriculum.mixer.mixture.chat must be finite"),
])
def test_static_mixture_rejects_bad_weights(value, message):
  c = curriculum.curriculum_config(mixer="static")
  with c.unlocked():
    c.mixer.mixture.chat = value
  with pytest.raises((ValueError, TypeError), match=message):
    curriculum.spec_from_config(c)
  c = curriculum.curriculum_config(mixer="static")
  for key in c.mixer.mixture.keys():
    c.mixer.mixture[key] = 0.0
  with pytest.raises(ValueError, match=r"curriculum.mixer.mixture: every weight is 0"):
    curriculum.spec_from_config(c)
  with c.unlocked():
    c.mixer.mixture.nonsense = 1.0
  with pytest.raises(ValueError, match=r"unknown source 'nonsense' in curriculum.mixer.mixture"):
    curriculum.spec_from_config(c)

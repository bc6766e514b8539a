"""A fitted mixture read from a JSON file (andrea_jax.curriculum.mixture_file)."""

import json

import jax
import numpy as np
import pytest

from andrea_jax import curriculum
from andrea_jax import sources as sources_lib
from andrea_jax.config import load_config_file
from andrea_jax.curriculum import read_mixture_file, write_mixture_file
from andrea_jax.curriculum import simulate
from tests.util import REPO

SOURCES = ("code", "docs", "reference")


def _write(tmp_path, content, name="fit.json"):
  path = tmp_path / name
  path.write_text(json.dumps(content))
  return path


def test_a_schedule_holds_each_mixture_for_its_part(tmp_path):
  """3:1:0 for the first 40% of 100 steps, then the mixer's (static: uniform) mixture."""
  path = tmp_path / "fit.json"
  write_mixture_file(path, [(0.0, {"code": 3, "docs": 1}), (0.4, None)], SOURCES, fitted_on="x")
  assert json.loads(path.read_text())["fitted_on"] == "x"
  c = curriculum.curriculum_config(read_mixture_file(path, num_steps=100, sources=SOURCES),
                                  sources=SOURCES, mixer="static")
  spec = curriculum.spec_from_config(c, sources=SOURCES)
  assert spec.starts.tolist() == [0, 40] and spec.geometry_mixers.tolist() == [1, 0]
  assert spec.mixer_name == "static"
  run = simulate.simulate(spec, jax.random.key(0), 100)
  np.testing.assert_allclose(run.weights[:40], np.broadcast_to([0.75, 0.25, 0.0], (40, 3)),
                             atol=1e-6)
  np.testing.assert_allclose(run.weights[40:], 1 / 3, atol=1e-6)


def test_a_part_without_a_mixture_is_the_mixers(tmp_path):
  path = _write(tmp_path, {"schedule": [{"start_step": 0, "mixture": {"docs": 1}},
                                        {"start_step": 50}]})
  c = curriculum.curriculum_config(read_mixture_file(path, num_steps=100, sources=SOURCES),
                                  sources=SOURCES, mixer="elastic")
  spec = curriculum.spec_from_config(c, sources=SOURCES)
  assert spec.geometry_mixers.tolist() == [1, 0] and spec.mixers[1].labels == ("held",)


def test_weights_per_geometry_keep_the_geometries(tmp_path):
  from experiments import synthetic
  c = synthetic.get_config()
  path = _write(tmp_path, {"geometries": {"v2_firehose": {"chat": 2, "gutenberg": 1}}})
  g = read_mixture_file(path, num_steps=1000, sources=sources_lib.SOURCES,
                        geometries=c.curriculum.geometries)
  assert g.v2_firehose.start_step == c.curriculum.geometries.v2_firehose.start_step
  assert g.v2_firehose.mixture.chat == 2 and g.v2_firehose.mixture.dictionary == 0
  assert "mixture" not in g.v2_warmup and "mixture" not in c.curriculum.geometries.v2_firehose


def test_the_experiment_trains_under_the_file(tmp_path):
  path = _write(tmp_path, {"schedule": [{"start": 0, "mixture": {"reference": 1, "notes": 1}},
                                        {"start": 0.5}]})
  c = load_config_file(f"{REPO / 'experiments' / 'mixture_file.py'}:{path}")
  spec = curriculum.spec_from_config(c.curriculum, sources=c.sources)
  assert c.curriculum.mixer.name == "static" and spec.starts.tolist() == [0, 500]
  want = np.zeros(6)
  want[[spec.sources.index("reference"), spec.sources.index("notes")]] = 0.5
  w_S = curriculum.weights_at(curriculum.schedule(curriculum.init(spec, jax.random.key(0))), 0)
  np.testing.assert_allclose(w_S, want, atol=1e-7)


@pytest.mark.parametrize("content, message", [
    ("not json", "is not JSON"),
    ({"mixture": {}}, "either 'schedule' or 'geometries'"),
    ({"schedule": []}, "non-empty list"),
    ({"schedule": [{"start": 0.2}]}, r"schedule\[0\], the first part, starts at step 20, not 0"),
    ({"schedule": [{"start": 0}, {"start": 0}]}, r"schedule\[1\] starts at step 0, not after"),
    ({"schedule": [{"start": 1.0}]}, r"schedule\[0\].start must be in \[0, 1\), got 1.0 \(a "
     r"fraction of the run; or give start_step\)"),
    ({"schedule": [{"mixture": {"code": 1}}]}, r"schedule\[0\] needs start \(a fraction of the run "
     r"in \[0, 1\)\) or start_step"),
    ({"schedule": [{"start_step": 100}]}, r"schedule\[0\].start_step must be <= 99, got 100 \(a "
     r"step of the run: train.num_steps = 100\)"),
    ({"schedule": [{"start_step": -1}]}, r"schedule\[0\].start_step must be >= 0, got -1"),
    ({"schedule": [{"start": 0, "mixture": {"music": 1}}]}, "names 'music', not a source"),
    ({"schedule": [{"start": 0, "mixture": {"code": -1}}]},
     r"schedule\[0\].mixture.code must be >= 0, got -1.0"),
    ({"schedule": [{"start": 0, "mixture": {"code": float("nan")}}]},
     r"schedule\[0\].mixture.code must be finite, got nan"),
    ({"schedule": [{"start": 0, "mixture": {"code": 0}}]}, "every weight is 0"),
    ({"sources": ["docs", "code", "reference"], "schedule": [{"start": 0}]},
     r"written for the sources \['docs', 'code', 'reference'\]"),
    ({"geometries": {"a": {"code": 1}}}, "pass the config's geometries"),
])
def test_a_bad_file_is_refused_naming_the_file_and_the_entry(tmp_path, content, message):
  path = tmp_path / "fit.json"
  path.write_text(content if isinstance(content, str) else json.dumps(content))
  with pytest.raises(ValueError, match=message) as e:
    read_mixture_file(path, num_steps=100, sources=SOURCES)
  assert str(path) in str(e.value)


@pytest.mark.parametrize("part, message", [
    ({"start": "0"}, r"schedule\[0\].start must be a number, got '0'"),
    ({"start_step": 0.0}, r"schedule\[0\].start_step must be an integer, got 0.0"),
    ({"start": 0, "mixture": {"code": True}}, r"schedule\[0\].mixture.code must be a number, got "
     "True"),
])
def test_a_value_of_the_wrong_type_is_a_type_error_naming_the_file(tmp_path, part, message):
  path = tmp_path / "fit.json"
  path.write_text(json.dumps({"schedule": [part]}))
  with pytest.raises(TypeError, match=message) as e:
    read_mixture_file(path, num_steps=100, sources=SOURCES)
  assert str(e.value).startswith(f"mixture file {path}: ")


def test_a_missing_file_is_named(tmp_path):
  with pytest.raises(ValueError, match=f"mixture file {tmp_path / 'none.json'}: cannot be read"):
    read_mixture_file(tmp_path / "none.json", num_steps=10, sources=SOURCES)

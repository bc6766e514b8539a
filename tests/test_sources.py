"""Sources declared in the config: the naming rule, ANDREA's preset, and every section keyed by
name following the declaration (a run's sources are whatever its config lists)."""

import numpy as np
import pytest

from andrea_jax import curriculum, runconfig, sources
from andrea_jax.config import base_config, load_config_file, with_sources
from andrea_jax.data import set_source
from andrea_jax.simplex import sampling
from tests.util import REPO


def test_sixteen_unique_sources_with_the_seed_names_first():
  assert len(sources.SOURCES) == 16
  assert len(set(sources.SOURCES)) == 16
  assert sources.SOURCES[:10] == (
      "hermes3-general", "hermes3-creative", "hermes3-roleplay", "chat", "smoltalk", "oasst",
      "gutenberg", "dictionary", "repo-docs", "repo-docstrings")


def test_warmup_sources_are_the_seven_of_v2():
  assert sources.WARMUP_SOURCES == (
      "hermes3-general", "hermes3-creative", "hermes3-roleplay", "chat", "smoltalk", "oasst",
      "gutenberg")
  # 9 of 16 coordinates pinned at zero during the curriculum warmup.
  assert len(sources.SOURCES) - len(sources.WARMUP_SOURCES) == 9


def test_unknown_source_is_named_in_the_error():
  with pytest.raises(ValueError, match="'wikipedia'"):
    sources.source_index("wikipedia")
  with pytest.raises(ValueError, match="twice"):
    sources.source_indices(["chat", "chat"])
  assert sources.source_indices(["chat", "hermes3-general"]) == [3, 0]


@pytest.mark.parametrize("names, error, message", [
    ((), ValueError, "sources is empty"),
    (("code", "code"), ValueError, r"lists \['code'\] more than once"),
    (("code", 3), TypeError, "contains 3"),
    (("my code",), ValueError, "'my code' has characters a command-line override cannot spell"),
    (("code.py",), ValueError, "'code.py' has characters"),
    (("1st",), ValueError, "'1st' has characters"),
    (("a-b", "a_b"), ValueError, "'a-b' and 'a_b' are the same key 'a_b'"),
])
def test_bad_declarations_are_refused_naming_the_field(names, error, message):
  c = base_config()
  c.sources = names
  with pytest.raises(error, match=message):
    runconfig.build(c)


def test_a_string_is_not_a_list_of_names():
  with pytest.raises(TypeError, match="a sequence of names, got the string 'code'"):
    sources.check_sources("code")
  c = base_config()
  with pytest.raises(TypeError, match="field 'sources'"):    # the config's own type check
    c.sources = "code"


def test_more_sources_than_the_random_phases_sample_is_refused():
  limit = sampling.MAX_EXACT_SOURCES
  names = [f"s{i}" for i in range(limit + 1)]
  c = with_sources(base_config(), names)
  c.data.corpus = "files"
  for n in names:
    set_source(c, n, "text", paths=str(REPO / "README.md"))
  with pytest.raises(ValueError, match=f"{limit + 1} sources, more than the {limit}"):
    runconfig.build(c)
  c = with_sources(c, names[:limit])      # at the limit: a valid run
  assert len(runconfig.build(c).sources) == limit


def test_a_geometry_or_mixture_naming_an_undeclared_source_is_refused():
  c = load_config_file(f"{REPO / 'experiments' / 'own_data.py'}:code,docs,reference")
  for n in ("code", "docs", "reference"):
    set_source(c, n, "text", paths=str(REPO / "README.md"))
  runconfig.build(c)
  c.curriculum.geometries.all.exclude = "chat"
  with pytest.raises(ValueError, match="unknown source 'chat' in curriculum.geometries.all.exclude"):
    runconfig.build(c)
  c.curriculum.geometries.all.exclude = ""
  curriculum.set_mixer(c, "static")
  with c.curriculum.mixer.mixture.unlocked():
    c.curriculum.mixer.mixture.chat = 2.0
  with pytest.raises(ValueError, match="unknown source 'chat' in curriculum.mixer.mixture"):
    runconfig.build(c)
  del c.curriculum.mixer.mixture["chat"]
  with c.data.files.unlocked():
    c.data.files.chat = c.data.files.code
  with pytest.raises(ValueError, match=r"data.files has unknown sources \['chat'\]"):
    runconfig.build(c)


def test_a_built_in_corpus_must_hold_the_declared_sources():
  c = with_sources(base_config(), ["chat", "gutenberg"])        # two of the synthetic sixteen
  run = runconfig.build(c)
  assert run.sources == ("chat", "gutenberg") and run.evaluated == ("chat", "gutenberg")
  c = with_sources(base_config(), ["chat", "poetry"])
  with pytest.raises(ValueError, match=r"sources \['poetry'\] are not sources of the built-in "
                                       r"corpus 'synthetic'"):
    runconfig.build(c)


def test_andrea_is_a_preset_and_three_regimes_take_any_names():
  """ANDREA's geometries are three_regimes over its preset; over other names the same fractions
  of the run: 10% (20,000 of 200,000 steps) and 56.3% (112,619)."""
  names = ("code", "docs", "noise")
  g = curriculum.three_regimes(2000, sources=names, warmup=("docs",), floors={"docs": 0.6},
                               exclude=("noise",))
  spec = curriculum.spec_from_config(curriculum.curriculum_config(g, sources=names),
                                     sources=names)
  assert spec.starts.tolist() == [0, 200, 1126]
  np.testing.assert_array_equal(spec.uppers, [[0, 1, 0], [1, 1, 1], [1, 1, 0]])
  np.testing.assert_array_equal(spec.lowers[2], [0, 0.6, 0])
  andrea = curriculum.spec_from_config(curriculum.curriculum_config())
  assert andrea.starts.tolist() == [0, 200, 1126] and andrea.sources == sources.SOURCES
  assert andrea.geometry_names == ("v2_warmup", "v2_firehose", "v3_polish")


def test_with_sources_rebuilds_every_keyed_section():
  c = load_config_file(str(REPO / "experiments" / "synthetic.py"))
  c.data.files.chat.paths = "/data/chat/*.jsonl"
  out = with_sources(c, ["chat", "my-code"])
  assert out.sources == ("chat", "my-code")
  assert sorted(out.data.files.keys()) == ["chat", "my_code"]
  assert out.data.files.chat.paths == "/data/chat/*.jsonl" and out.data.files.my_code.paths == ""
  assert dict(out.curriculum.mixer) == dict(c.curriculum.mixer)   # no per-source argument
  curriculum.set_mixer(c, "static", mixture=[3.0 if s == "chat" else 1.0 for s in c.sources])
  out = with_sources(c, ["chat", "my-code"])
  assert dict(out.curriculum.mixer.mixture) == {"chat": 3.0, "my_code": 1.0}
  assert list(out.curriculum.geometries.keys()) == ["all"]
  assert c.sources == sources.SOURCES and "my_code" not in c.data.files     # a copy


def test_own_data_takes_any_names_and_andreas_curriculum_when_asked():
  c = load_config_file(f"{REPO / 'experiments' / 'own_data.py'}:code,docs,reference")
  assert c.sources == ("code", "docs", "reference") and c.data.corpus == "files"
  assert list(c.curriculum.geometries.keys()) == ["all"]
  c = load_config_file(f"{REPO / 'experiments' / 'own_data.py'}:code,docs,reference:andrea")
  g = c.curriculum.geometries
  assert [g[n].start_step for n in ("warmup", "firehose", "polish")] == [0, 100, 563]
  assert g.warmup.only == "code,docs" and g.polish.floors.code == 0.7
  assert g.polish.exclude == "reference"
  with pytest.raises(ValueError, match="needs your sources' names"):
    load_config_file(f"{REPO / 'experiments' / 'own_data.py'}")
  with pytest.raises(ValueError, match="one of .* got 'firehose'"):
    load_config_file(f"{REPO / 'experiments' / 'own_data.py'}:a,b,c:firehose")

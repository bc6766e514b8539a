import pytest

from andrea_jax import sources


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

"""The data config section: defaults, validation naming the field, open_training_data's paths."""

import json
import os

import numpy as np
import pytest

from andrea_jax.data import (DataError, MixtureSampler, data_config, data_spec, default_cache_dir,
                             load_tokenizer, open_training_data, validate_data_config)
from andrea_jax.data.config import source_specs
from andrea_jax.data.pipeline import files_prepared_dir
from andrea_jax.data.readers import patterns
from andrea_jax.sources import SOURCES

BYTES = load_tokenizer("bytes")


def test_defaults_are_valid_and_complete():
  cfg = data_config()
  validate_data_config(cfg)
  for field in ("tokenizer", "corpus", "builtin_scale", "files", "cache_dir", "prepared_dir",
                "eval_fraction", "seq_len", "global_batch_size", "prefetch", "shard_tokens",
                "workers"):
    assert field in cfg, field
  assert (cfg.tokenizer, cfg.corpus) == ("bytes", "synthetic")
  assert sorted(cfg.files.keys()) == sorted(s.replace("-", "_") for s in SOURCES)
  assert source_specs(cfg) == {}


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv("ANDREA_JAX_CACHE", str(tmp_path / "c"))
  assert default_cache_dir() == str(tmp_path / "c")
  assert data_config().cache_dir == str(tmp_path / "c")
  monkeypatch.delenv("ANDREA_JAX_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert default_cache_dir() == os.path.join(str(tmp_path / "xdg"), "andrea_jax")


@pytest.mark.parametrize("field, value, match", [
    ("corpus", "web", r"data\.corpus must be one of"),
    ("tokenizer", "/no/such/tokenizer.json", r"data\.tokenizer: no file"),
    ("builtin_scale", 0.0, r"data\.builtin_scale must be in \(0, 1000\], got 0"),
    ("eval_fraction", 0.7, r"data\.eval_fraction must be in \[0, 0.5\], got 0.7"),
    ("seq_len", 0, r"data\.seq_len must be >= 1, got 0"),
    ("global_batch_size", -4, r"data\.global_batch_size must be >= 1, got -4"),
    ("workers", -1, r"data\.workers must be >= 0"),
    ("prepared_dir", "/no/such/dir", r"data\.prepared_dir: no directory"),
])
def test_validation_names_the_field(field, value, match):
  cfg = data_config()
  cfg[field] = value
  with pytest.raises(ValueError, match=match):
    validate_data_config(cfg)


def test_validation_of_files():
  cfg = data_config()
  cfg.corpus = "files"
  with pytest.raises(ValueError, match="data.corpus is 'files' but no source has data"):
    validate_data_config(cfg)
  cfg.files.chat.paths = "a/*.jsonl, b/*.jsonl"
  cfg.files.chat.format = "csv"
  with pytest.raises(ValueError, match=r"data\.files\.chat\.format = 'csv': not a built-in "
                                       r"format \(jsonl, text, parquet, hf\)"):
    validate_data_config(cfg)
  cfg.files.chat.format = "jsonl"
  validate_data_config(cfg)
  spec = source_specs(cfg)["chat"]
  assert patterns(spec.reader.paths) == ("a/*.jsonl", "b/*.jsonl")
  assert spec.eval_fraction == cfg.eval_fraction
  cfg.files.chat.eval_fraction = 0.25
  assert source_specs(cfg)["chat"].eval_fraction == 0.25


def test_files_beside_a_prepared_dir_are_refused(tmp_path):
  # The prepared directory is opened as is: files given beside it would be ignored without a word.
  cfg = data_config()
  cfg.corpus = "files"
  cfg.prepared_dir = str(tmp_path)
  validate_data_config(cfg)
  cfg.files.chat.paths = "new/*.jsonl"
  with pytest.raises(ValueError, match=r"data.prepared_dir = .* is opened as is, so "
                                       r"data.files.chat would be ignored"):
    validate_data_config(cfg)


def test_open_builtin(tmp_path):
  cfg = data_config()
  cfg.cache_dir = str(tmp_path)
  cfg.builtin_scale = 0.01
  data = open_training_data(data_spec(cfg), progress=False)
  assert all(data.has(s) for s in SOURCES)
  sampler = MixtureSampler(data, seq_len=64, global_batch_size=16, seed=0)
  batch = sampler.batch(0, np.full(16, 1 / 16))
  assert batch["inputs"].shape == (16, 64) and batch["inputs"].max() < 257
  # The same directory is then usable as prepared_dir.
  cfg.prepared_dir = data.path
  assert open_training_data(data_spec(cfg), BYTES, progress=False).path == data.path


def test_open_files_prepares_once_then_reuses(tmp_path):
  src = tmp_path / "chat.jsonl"
  src.write_text("".join(json.dumps({"text": f"document number {i} " * 5}) + "\n"
                         for i in range(50)))
  cfg = data_config()
  cfg.cache_dir = str(tmp_path / "cache")
  cfg.corpus = "files"
  cfg.files.chat.paths = str(src)
  cfg.eval_fraction = 0.1
  cfg.workers = 1
  spec = data_spec(cfg)
  with pytest.raises(DataError, match="required source 'hermes3-general' is missing"):
    open_training_data(spec, progress=False)
  data = open_training_data(spec, required=["chat"], progress=False)
  assert data.path == files_prepared_dir(spec)
  assert data.path.startswith(str(tmp_path / "cache"))
  manifest = os.path.join(data.path, "manifest.json")
  shard = os.path.join(data.path, data.manifest["sources"]["chat"]["shards"]["train"][0]["file"])
  before = os.stat(shard).st_mtime_ns
  again = open_training_data(data_spec(cfg), required=["chat"], progress=False)
  assert os.stat(shard).st_mtime_ns == before and os.path.isfile(manifest)
  assert again.num_tokens("chat") == data.num_tokens("chat") > 0

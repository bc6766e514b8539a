"""A cap of whole documents (``data.files.<source>.max_tokens``) for every source: file formats,
the built-in corpora, datasets. Worked by hand with the byte tokenizer, where a document of ``n``
UTF-8 bytes is ``n + 1`` tokens (its leading end-of-document id included)."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from andrea_jax.data import (PreparedData, SourceSpec, data_config, data_spec, load_tokenizer,
                             open_training_data, prepare, source_files)
from andrea_jax.data import manifest as mf
from andrea_jax.data.corpora.synthetic import BUILTIN_EVAL_FRACTION, builtin_documents
from andrea_jax.data.prepare_lib import eval_mask

BYTES = load_tokenizer("bytes")
DOCS = [f"document {i} " + "x" * (i % 7) for i in range(60)]   # 12 to 18 bytes each


def _lengths(docs):
  return np.array([len(d.encode()) + 1 for d in docs])


def _kept(docs, cap):
  """How many documents a cap keeps, by hand: the longest prefix whose tokens fit."""
  total, k = 0, 0
  for n in _lengths(docs):
    if total + n > cap:
      break
    total, k = total + n, k + 1
  return k


def _write(tmp_path, fmt, docs=DOCS):
  if fmt == "jsonl":
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  elif fmt == "text":
    path = tmp_path / "docs.txt"
    path.write_text("\n<|endoftext|>\n".join(docs))
  else:
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=7)
  return SourceSpec((str(path),), fmt, eval_fraction=0.1)


def _tokens(out, source, split):
  data = PreparedData.open(str(out), sources=(source,))
  return np.concatenate([np.asarray(m) for m in data.shards(source, split)] or [np.zeros(0)])


def _docs(tokens):
  """The documents of a token stream (each ``[256] + bytes``)."""
  starts = np.flatnonzero(tokens == 256).tolist() + [len(tokens)]
  return [bytes(tokens[a + 1:b].astype(np.uint8)).decode() for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize("fmt", ["jsonl", "text", "parquet"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_source_keeps_the_longest_prefix_of_whole_documents(tmp_path, fmt, workers):
  spec = _write(tmp_path, fmt)
  lengths = _lengths(DOCS)
  cap = int(lengths[:25].sum()) + 5            # 25 whole documents and 5 tokens of the 26th
  assert _kept(DOCS, cap) == 25
  out = tmp_path / "capped"
  prepare({"chat": spec._replace(max_tokens=cap)}, BYTES, str(out), workers=workers,
          progress=False)
  held = eval_mask("chat", 0, 25, 0.1)
  train, evals = _docs(_tokens(out, "chat", "train")), _docs(_tokens(out, "chat", "eval"))
  assert train == [d for d, h in zip(DOCS[:25], held) if not h]
  assert evals == [d for d, h in zip(DOCS[:25], held) if h]
  entry = mf.read_manifest(str(out))["sources"]["chat"]
  assert entry["tokens"]["train"] + entry["tokens"]["eval"] == lengths[:25].sum() <= cap
  assert entry["documents"] == {"train": 25 - int(held.sum()), "eval": int(held.sum())}
  assert entry["inputs"]["max_tokens"] == cap
  assert PreparedData.open(str(out), sources=("chat",)).num_tokens("chat", "train") == sum(
      len(d.encode()) + 1 for d in train)


def test_the_held_out_documents_of_a_capped_source_are_the_uncapped_ones_in_its_prefix(tmp_path):
  """A cap never moves a document between the splits: the capped source's training and held-out
  tokens are prefixes of the uncapped source's, and the cap counts the held-out ones too."""
  spec = _write(tmp_path, "jsonl")
  prepare({"chat": spec}, BYTES, str(tmp_path / "all"), progress=False)
  cap = int(_lengths(DOCS)[:40].sum())          # exactly 40 documents
  prepare({"chat": spec._replace(max_tokens=cap)}, BYTES, str(tmp_path / "cap"), progress=False)
  for split in ("train", "eval"):
    whole, capped = _tokens(tmp_path / "all", "chat", split), _tokens(tmp_path / "cap", "chat",
                                                                       split)
    assert 0 < len(capped) < len(whole) and (whole[:len(capped)] == capped).all()
  assert len(_tokens(tmp_path / "cap", "chat", "train")) + len(
      _tokens(tmp_path / "cap", "chat", "eval")) == cap
  # A cap below the first document keeps nothing; one above the source changes nothing.
  prepare({"chat": spec._replace(max_tokens=5)}, BYTES, str(tmp_path / "none"), progress=False)
  assert mf.read_manifest(str(tmp_path / "none"))["sources"]["chat"]["documents"] == {
      "train": 0, "eval": 0}
  prepare({"chat": spec._replace(max_tokens=10**9)}, BYTES, str(tmp_path / "big"),
          progress=False)
  assert (_tokens(tmp_path / "big", "chat", "train") == _tokens(tmp_path / "all", "chat",
                                                                 "train")).all()


def test_a_changed_cap_prepares_that_source_alone_and_no_cap_keeps_the_old_record(tmp_path):
  chat, book = _write(tmp_path, "jsonl"), _write(tmp_path, "text")
  out = str(tmp_path / "out")
  first = prepare({"chat": chat, "gutenberg": book}, BYTES, out, progress=False)
  assert first.prepared == ("chat", "gutenberg")
  assert "max_tokens" not in first.manifest["sources"]["chat"]["inputs"]   # as before caps
  again = prepare({"chat": chat._replace(max_tokens=100), "gutenberg": book}, BYTES, out,
                  progress=False)
  assert again.prepared == ("chat",) and again.skipped == ("gutenberg",)
  assert prepare({"chat": chat._replace(max_tokens=100), "gutenberg": book}, BYTES, out,
                 progress=False).prepared == ()


def test_the_cap_of_a_source_in_the_data_section(tmp_path):
  """``data.files.<source>.max_tokens`` reaches the prepared source (corpus ``"files"``), in a
  prepared folder of its own: runs with other caps never rewrite each other's shards."""
  spec = _write(tmp_path, "jsonl")
  cfg = data_config(("chat",), corpus="files")
  cfg.update(cache_dir=str(tmp_path / "cache"), seq_len=16, workers=1, eval_fraction=0.1)
  cfg.files.chat = source_files("jsonl", paths=spec.paths[0])
  whole = open_training_data(data_spec(cfg, ("chat",)), progress=False)
  cfg.files.chat.max_tokens = cap = int(_lengths(DOCS)[:30].sum()) - 1   # 29 documents
  capped = open_training_data(data_spec(cfg, ("chat",)), progress=False)
  assert capped.path != whole.path
  assert capped.num_tokens("chat", "train") + capped.num_tokens("chat", "eval") == (
      _lengths(DOCS)[:29].sum()) <= cap
  assert open_training_data(data_spec(cfg, ("chat",)), progress=False).path == capped.path


def _state(path, sources):
  """Every source's manifest entry and shard bytes in a prepared folder."""
  m = mf.read_manifest(path)
  return {s: (m["sources"][s], {f["file"]: open(os.path.join(path, f["file"]), "rb").read()
                                for split in mf.SPLITS for f in m["sources"][s]["shards"][split]})
          for s in sources}


def test_a_capped_builtin_source_leaves_the_uncapped_corpus_as_it_is(tmp_path):
  cfg = data_config()
  cfg.update(cache_dir=str(tmp_path), builtin_scale=0.02, seq_len=16)
  plain = open_training_data(data_spec(cfg), progress=False)
  before = _state(plain.path, ("chat", "gutenberg"))
  manifest = open(os.path.join(plain.path, "manifest.json"), "rb").read()
  docs = builtin_documents("chat", 0.02)
  cap = int(_lengths(docs)[:20].sum()) + 3          # 20 whole documents
  cfg.files.chat.max_tokens = cap
  capped = open_training_data(data_spec(cfg), progress=False)
  assert capped.path.startswith(plain.path + "-cap-")
  held = eval_mask("chat", 0, 20, BUILTIN_EVAL_FRACTION)
  assert _docs(np.concatenate(capped.shards("chat", "train"))) == [
      d for d, h in zip(docs[:20], held) if not h]
  assert capped.num_tokens("chat", "train") + capped.num_tokens("chat", "eval") == (
      _lengths(docs)[:20].sum())
  assert capped.num_tokens("gutenberg") == plain.num_tokens("gutenberg")
  # The uncapped folder: the same manifest and shards, byte for byte.
  assert open(os.path.join(plain.path, "manifest.json"), "rb").read() == manifest
  assert _state(plain.path, ("chat", "gutenberg")) == before
  # Another cap: a folder of its own; the first capped folder is left as it is.
  first = _state(capped.path, ("chat", "gutenberg"))
  cfg.files.chat.max_tokens = cap // 2
  again = open_training_data(data_spec(cfg), progress=False)
  assert again.path != capped.path and again.num_tokens("chat") < capped.num_tokens("chat")
  assert _state(again.path, ("gutenberg",)) == {"gutenberg": first["gutenberg"]}
  assert _state(capped.path, ("chat", "gutenberg")) == first


def test_a_builtin_corpus_takes_a_cap_and_nothing_else_per_source(tmp_path):
  cfg = data_config()
  cfg.cache_dir = str(tmp_path)
  cfg.files.chat.eval_fraction = 0.2
  with pytest.raises(ValueError, match=r"data\.files\.chat\.eval_fraction is set, but the "
                                       r"built-in corpus 'synthetic' holds out its own share"):
    data_spec(cfg)
  cfg.files.chat.eval_fraction = None
  cfg.files.chat.max_tokens = -5
  with pytest.raises(ValueError, match=r"data\.files\.chat\.max_tokens must be >= 0, got -5"):
    data_spec(cfg)
  cfg.files.chat.max_tokens = 1000
  assert dict(data_spec(cfg).caps) == {"chat": 1000}
  cfg.prepared_dir = str(tmp_path)
  with pytest.raises(ValueError, match=r"data\.prepared_dir = .* is opened as is, so "
                                       r"data\.files\.chat\.max_tokens would be ignored"):
    data_spec(cfg)


@pytest.mark.slow
def test_a_capped_stdlib_source(tmp_path):
  """The real-text corpus takes caps the same way (a few seconds: it is cut from the library)."""
  from andrea_jax.data.corpora.stdlib import STDLIB_SOURCES
  cfg = data_config(STDLIB_SOURCES, corpus="stdlib")
  cfg.update(cache_dir=str(tmp_path), seq_len=16)
  plain = open_training_data(data_spec(cfg, STDLIB_SOURCES), progress=False)
  cfg.files.python_code.max_tokens = 100_000
  capped = open_training_data(data_spec(cfg, STDLIB_SOURCES), progress=False)
  assert capped.path.startswith(plain.path + "-cap-")
  total = capped.num_tokens("python-code", "train") + capped.num_tokens("python-code", "eval")
  assert 90_000 < total <= 100_000 < plain.num_tokens("python-code")
  assert capped.num_tokens("notes") == plain.num_tokens("notes")

"""The built-in corpus: 16 sources, deterministic, fast, with easy, noise and cliff sources."""

import collections
import hashlib
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from andrea_jax.data import PreparedData, load_tokenizer, train_bpe
from andrea_jax.data.corpora.styles import NOISE_SOURCE
from andrea_jax.data.corpora.synthetic import builtin_documents, ensure_builtin, generate_builtin
from andrea_jax.data.corpora.styles import STYLES
from andrea_jax.sources import EXTRA_SOURCES, SOURCES

_DIGEST = ("import hashlib, sys\n"
           "from andrea_jax.data.corpora.synthetic import builtin_documents\n"
           "from andrea_jax.sources import SOURCES\n"
           "h = hashlib.sha256()\n"
           "for s in SOURCES:\n"
           "  for d in builtin_documents(s, 0.02):\n"
           "    h.update(d.encode()); h.update(b'\\0')\n"
           "print(h.hexdigest())\n")


def _digest(scale):
  h = hashlib.sha256()
  for s in SOURCES:
    for d in builtin_documents(s, scale):
      h.update(d.encode())
      h.update(b"\0")
  return h.hexdigest()


@pytest.fixture(scope="module")
def full_corpus():
  """All sixteen sources at scale 1, with the time the generation took."""
  start = time.perf_counter()
  docs = {s: builtin_documents(s, 1.0) for s in SOURCES}
  return docs, time.perf_counter() - start


def _byte_entropy(docs):
  counts = np.bincount(np.frombuffer("".join(docs).encode(), np.uint8), minlength=256)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log2(p)).sum())


def test_sixteen_sources_in_order():
  assert tuple(STYLES) == SOURCES and len(SOURCES) == 16
  assert NOISE_SOURCE in EXTRA_SOURCES


def test_sizes_and_generation_time(full_corpus):
  docs, seconds = full_corpus
  for s, d in docs.items():
    size = sum(len(x.encode()) for x in d)
    assert 0.5e6 <= size <= 2e6, (s, size)
    assert len(d) >= 100 and all(d), s
  # A loose guard on a shared machine (about one second in the benchmark), not a benchmark.
  assert seconds < 10.0


def test_scale_knob():
  small = sum(len(d) for d in builtin_documents("chat", 0.01))
  big = sum(len(d) for d in builtin_documents("chat", 0.04))
  assert 10_000 <= small < 12_000 and 40_000 <= big < 42_000


@pytest.mark.slow
def test_deterministic_and_independent_of_hash_randomisation():
  here = _digest(0.02)
  assert _digest(0.02) == here
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for seed in ("1", "12345"):
    out = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "PYTHONHASHSEED": seed}, timeout=120, check=True)
    assert out.stdout.strip() == here


def test_noise_source_has_near_maximal_entropy(full_corpus):
  docs, _ = full_corpus
  noise = _byte_entropy(docs[NOISE_SOURCE])
  assert noise > 0.999 * math.log2(95)  # uniform over the 95 printable ASCII characters
  for easy in ("dictionary", "chat", "gutenberg", "repo-docstrings", "extra-01"):
    assert _byte_entropy(docs[easy]) < 5.0  # English-like text: about 4 bits per byte
  # i.i.d.: the next character does not depend on the previous one (mutual information ~ 0).
  text = np.frombuffer("".join(docs[NOISE_SOURCE][:50]).encode(), np.uint8).astype(np.int64) - 32
  joint = np.bincount(text[:-1] * 95 + text[1:], minlength=95 * 95).reshape(95, 95) + 1e-12
  joint /= joint.sum()
  mi = (joint * np.log2(joint / joint.sum(1, keepdims=True) / joint.sum(0, keepdims=True))).sum()
  assert mi < 0.1


def test_repo_docs_repeats_long_passages_verbatim(full_corpus):
  docs, _ = full_corpus
  paragraphs = collections.Counter(p for d in docs["repo-docs"] for p in d.split("\n\n"))
  repeated = [(p, n) for p, n in paragraphs.items() if len(p) >= 500 and n >= 20]
  assert len(repeated) >= 5   # five passages x two paragraphs each
  share = sum(len(p) * n for p, n in repeated) / sum(len(d) for d in docs["repo-docs"])
  assert share > 0.2
  # No other source has long paragraphs repeated that often.
  for s in ("hermes3-general", "gutenberg", "oasst"):
    counts = collections.Counter(p for d in docs[s] for p in d.split("\n\n") if len(p) >= 200)
    assert max(counts.values()) <= 2, s


def test_dictionary_entries_are_templated(full_corpus):
  docs, _ = full_corpus
  entries = [line for d in docs["dictionary"] for line in d.split("\n")]
  assert all(" (" in e and "): " in e and e.endswith(".") for e in entries)
  assert {e.split(" (")[1].split(")")[0] for e in entries} == {"n.", "v.", "adj.", "adv."}
  assert len(entries) / len(set(entries)) > 3  # each entry comes back several times


def test_generate_writes_jsonl_files(tmp_path):
  paths = generate_builtin(str(tmp_path), scale=0.005)
  assert list(paths) == list(SOURCES)
  for s, p in paths.items():
    lines = open(p, encoding="utf-8").read().splitlines()
    assert [json.loads(x)["text"] for x in lines] == builtin_documents(s, 0.005)


def test_ensure_builtin_caches_by_scale_and_tokenizer(tmp_path):
  cache = str(tmp_path / "cache")
  path = ensure_builtin(cache, load_tokenizer("bytes"), 0.01)
  data = PreparedData.open(path, tokenizer=load_tokenizer("bytes"))
  assert all(data.has(s) and data.num_tokens(s, "eval") > 0 for s in SOURCES)
  raw = os.path.join(cache, "builtin", "v1-scale0.01", "raw", "chat.jsonl")
  files = {n: os.stat(os.path.join(path, n)).st_mtime_ns for n in os.listdir(path)}
  raw_mtime = os.stat(raw).st_mtime_ns
  assert ensure_builtin(cache, load_tokenizer("bytes"), 0.01) == path
  assert os.stat(raw).st_mtime_ns == raw_mtime
  assert all(os.stat(os.path.join(path, n)).st_mtime_ns == t for n, t in files.items()
             if n != "manifest.json")
  bpe = train_bpe(builtin_documents("chat", 0.01), 300, tmp_path / "bpe.json")
  other = ensure_builtin(cache, bpe, 0.01)
  assert other != path and os.stat(raw).st_mtime_ns == raw_mtime  # same raw text, new tokens
  assert PreparedData.open(other, tokenizer=bpe).num_tokens("chat") < data.num_tokens("chat")


def test_scales_that_print_alike_get_their_own_cache_folders():
  from andrea_jax.data.corpora import synthetic as corpus
  # :g keeps six digits: 12.34567 and 12.3457 would share a folder (and one the other's text).
  a, b = corpus.builtin_root("/c", 12.34567), corpus.builtin_root("/c", 12.3457)
  assert a != b and a.endswith("scale12.34567") and b.endswith("scale12.3457")
  assert corpus.builtin_root("/c", 1.0).endswith("-scale1")             # the usual names stay
  assert corpus.builtin_root("/c", 0.25).endswith("-scale0.25")
  assert corpus.builtin_root("/c", 1.000001) != corpus.builtin_root("/c", 1.0)

"""The standard-library corpus: kinds of text, held-out documents, sizes, same bytes, the cache."""

import ast
import hashlib
import inspect
import json
import os
import platform
import pydoc_data.topics
import re
import shlex
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from andrea_jax.data import PreparedData, load_tokenizer
from andrea_jax.data.corpora import stdlib as sc
from andrea_jax.data.corpora import stdlib_text as st
from andrea_jax.data.bpb import heldout_tokens_per_byte
from andrea_jax.data.corpora.corrupt import corrupt_text
from andrea_jax.data.errors import DataError
from andrea_jax.data.hashing import hash_key
from andrea_jax.data.corpora.wordshare import words
from tests.test_data_corrupt import edit_distance

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An English text, however short, says one of these.
_ENGLISH = re.compile(r"(?i)\b(the|a|an|of|to|is|are|if|and|or|in|for|this|that|with|be|it|"
                      r"returns?)\b")
_LICENSE_WORDS = re.compile(r"(?i)licen[cs]e|copyright|permission|warrant|rights reserved")


def _read(path):
  with open(path, encoding="utf-8", errors="replace") as f:
    return f.read()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """The corpus generated and prepared (byte tokenizer) once for this module."""
  cache = str(tmp_path_factory.mktemp("stdlib_cache"))
  prepared = sc.ensure_stdlib(cache, load_tokenizer("bytes"))
  raw = os.path.join(os.path.dirname(prepared), "raw")
  docs = {s: [json.loads(line)["text"]   # split on LF only: the text may hold U+2028
              for line in _read(os.path.join(raw, f"{s}.jsonl")).split("\n") if line]
          for s in sc.STDLIB_SOURCES}
  return cache, raw, prepared, docs


def _parses(text):
  try:
    with warnings.catch_warnings():   # prose is full of "invalid decimal literals"
      warnings.simplefilter("ignore", SyntaxWarning)
      ast.parse(text)
    return True
  except (SyntaxError, ValueError):
    return False


def test_sources_and_target():
  assert len(sc.STDLIB_SOURCES) >= 6 and len(set(sc.STDLIB_SOURCES)) == len(sc.STDLIB_SOURCES)
  assert set(sc.STDLIB_TARGET) <= set(sc.STDLIB_SOURCES)
  assert abs(sum(sc.STDLIB_TARGET.values()) - 1.0) < 1e-12
  assert all(w > 0 for w in sc.STDLIB_TARGET.values())
  # The target is clean prose: no code, no boilerplate, no noise.
  assert not {"python-code", "licenses", sc.NOISY_SOURCE} & set(sc.STDLIB_TARGET)


def test_kind_of_and_split_sections():
  assert st.kind_of("json/decoder.py") == "python"
  assert st.kind_of("pydoc_data/topics.py") == "reference"
  assert st.kind_of("LICENSE.txt") == "root-license"
  assert st.kind_of("idlelib/NEWS.txt") == "notes"
  assert st.kind_of("email/architecture.rst") == "notes"
  for skipped in ("test/test_ast.py", "idlelib/idle_test/README.txt", "site-packages/x.py",
                  "_sysconfigdata__linux_x86_64-linux-gnu.py", "lib2to3/Grammar.txt",
                  "config-3.11-x86_64-linux-gnu/python-config.py", "json/__pycache__/a.py"):
    assert st.kind_of(skipped) is None, skipped
  text = ("Intro line\n\nTitle A\n=======\n\nbody a\n\nPart\nTitle B\n-------\nbody b\n\n"
          "Only\n***\n\nC\n~~~\nc")
  assert st.split_sections(text) == [
      "Intro line", "Title A\n=======\n\nbody a", "Part\nTitle B\n-------\nbody b",
      "Only\n***\n\nC\n~~~\nc"]   # a heading with no body joins the next section
  assert st.split_sections("no heading\nat all\n") == ["no heading\nat all"]
  assert st.split_sections("+----+\n| a  |\n+----+\n") == ["+----+\n| a  |\n+----+"]  # a table


_MODULE = b'''#!/usr/bin/env python3
# Copyright 2001 by Someone. All Rights Reserved.
#
# Permission to use, copy, modify, and distribute this software and its
# documentation for any purpose and without fee is hereby granted, provided
# that the above copyright notice appear in all copies and that both that
# copyright notice and this permission notice appear in supporting documentation.
"""Module doc."""

import os

X = 1  # a short comment stays


# A comment about f.
@decorator
def f(a):
    """F doc.

       More.
    """
    return a


class C:
    """C doc \xc3\xa9."""

    def m(self):
        """M doc."""

    def n(self):
        return "\xc3\xa9t\xc3\xa9"
'''


def test_python_documents_cut_a_module_by_hand():
  out = st.python_documents(_MODULE)
  assert out["code"] == [
      "#!/usr/bin/env python3\n\nimport os\n\nX = 1  # a short comment stays",
      "# A comment about f.\n@decorator\ndef f(a):\n    return a",
      ("class C:\n\n    def m(self):\n        pass\n\n"
       "    def n(self):\n        return \"\u00e9t\u00e9\""),
  ]
  assert out["docstrings"] == ["Module doc.", "F doc.\n\nMore.", "C doc \u00e9.\n\nM doc."]
  assert len(out["licenses"]) == 1
  assert out["licenses"][0].startswith("Copyright 2001 by Someone. All Rights Reserved.\n\n"
                                       "Permission to use, copy,")
  assert out["licenses"][0].endswith("supporting documentation.")
  assert all(_parses(c) for c in out["code"])


def test_code_documents_parse_and_hold_no_docstrings(built):
  _, _, _, docs = built
  code = docs["python-code"]
  bad = [d[:200] for d in code if not _parses(d)]
  assert not bad
  # The docstrings were taken out: a long docstring's text is nowhere in the code.
  text = "\n".join(code)
  longest = sorted(docs["docstrings"], key=len)[-20:]
  assert not any(d[:300] in text for d in longest)


def test_docstrings_are_the_modules_docstrings(built):
  _, _, _, docs = built
  text = "\n\n".join(docs["docstrings"])
  for obj in (textwrap, textwrap.dedent, shlex.split, inspect.cleandoc, json.dumps):
    assert inspect.cleandoc(obj.__doc__).strip() in text, obj.__name__


def test_prose_sources_are_prose(built):
  _, _, _, docs = built
  for source in ("docstrings", "reference", "notes", "licenses", sc.NOISY_SOURCE):
    d = docs[source]
    assert sum(_parses(x) for x in d) <= 0.02 * len(d), source   # not code
    assert sum(bool(_ENGLISH.search(x)) for x in d) >= 0.9 * len(d), source


def test_reference_comes_from_pydoc_topics(built):
  _, _, _, docs = built
  topics = "\n".join(pydoc_data.topics.topics.values())
  assert all(d[:200] in topics for d in docs["reference"])
  assert any(d.startswith('The "assert" statement\n****') for d in docs["reference"])


def test_notes_come_from_the_library_text_files(built):
  _, _, _, docs = built
  root = sc.default_stdlib_dir()
  texts = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if d not in ("test", "tests", "idle_test", "site-packages")]
    texts += [_read(os.path.join(folder, f)) for f in files
              if f.startswith("README") or f.endswith((".txt", ".rst"))]
  text = "\n".join(t.replace("\r\n", "\n") for t in texts)
  assert all(d[:200] in text for d in docs["notes"])


def test_licenses_are_license_texts(built):
  _, _, _, docs = built
  assert all(_LICENSE_WORDS.search(d) for d in docs["licenses"])
  firsts = [d.splitlines()[0] for d in docs["licenses"]]
  assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in firsts
  # Near-duplicates: the three logging modules carry the same notice, years aside.
  sajip = [d for d in docs["licenses"] if "Vinay Sajip" in d]
  assert len(sajip) >= 2 and len({re.sub(r"\d", "", d) for d in sajip}) == 1


def test_noisy_source_is_the_docstrings_training_text_at_the_intended_rate(built):
  _, _, _, docs = built
  train, held = sc.split_documents("docstrings", docs["docstrings"])
  noisy = docs[sc.NOISY_SOURCE]
  # Made from the training documents only, in order: none is a copy of a held-out document.
  held = set(held)
  keyed = {corrupt_text(d, sc.NOISE_RATE, hash_key(sc.NOISE_SEED, i)): d
           for i, d in enumerate(docs["docstrings"]) if d not in held}
  assert set(noisy) <= set(keyed)
  assert len(noisy) >= 0.9 * len(train)
  sample = [n for n in noisy[::10] if 50 <= len(keyed[n]) <= 600]
  chars = sum(len(keyed[n]) for n in sample)
  assert chars >= 30_000   # about 1500 edits: the measured rate is within 3% of its mean
  rate = sum(edit_distance(keyed[n], n) for n in sample) / chars
  # Each hit is one edit, less the rare replacement by the same character (1 in 95 of a third).
  assert 0.85 * sc.NOISE_RATE <= rate <= 1.05 * sc.NOISE_RATE, rate


def test_sizes_differ_by_an_order_of_magnitude(built):
  _, _, _, docs = built
  sizes = {s: sum(len(d.encode("utf-8")) for d in docs[s]) for s in sc.STDLIB_SOURCES}
  assert max(sizes.values()) >= 10 * min(sizes.values()), sizes
  assert all(len(docs[s]) >= 20 for s in sc.STDLIB_SOURCES)


def _split_docs(shards, eod):
  """The documents (UTF-8 bytes) of a split: its shards end to end, cut at the end-of-document
  ids (a document may run on from one shard into the next)."""
  ids = np.concatenate([np.asarray(x, np.int64) for x in shards])
  return [bytes(p[p != eod].astype(np.uint8)) for p in np.split(ids, np.flatnonzero(ids == eod))
          if (p != eod).any()]


def test_held_out_documents_never_in_training(built):
  _, raw, prepared, docs = built
  data = PreparedData.open(prepared, tokenizer=load_tokenizer("bytes"), sources=sc.STDLIB_SOURCES)
  train = {s: _split_docs(data.shards(s, "train"), data.eod_id) for s in sc.STDLIB_SOURCES}
  every_train = set().union(*train.values())
  meta = json.loads(_read(os.path.join(raw, sc.CORPUS_FILE)))
  for s in sc.STDLIB_SOURCES:
    held = _split_docs(data.shards(s, "eval"), data.eod_id)
    assert len(held) == meta["sources"][s]["eval_documents"] >= 2, s
    assert len(held) + len(train[s]) == len(docs[s])
    assert not set(held) & every_train, s
    assert data.num_tokens(s, "eval") >= 129   # one window of the tiny model's 128 tokens
    # Byte tokens: one per byte of text.
    assert heldout_tokens_per_byte(data, s, load_tokenizer("bytes")) == 1.0


def test_manifest_records_python_and_digests(built):
  _, raw, _, docs = built
  meta = json.loads(_read(os.path.join(raw, sc.CORPUS_FILE)))
  assert meta["python"]["version"] == platform.python_version()
  assert meta["packages"] is False and meta["target"] == sc.STDLIB_TARGET
  for s in sc.STDLIB_SOURCES:
    with open(os.path.join(raw, f"{s}.jsonl"), "rb") as f:
      assert meta["sources"][s]["jsonl_sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert meta["sources"][s]["documents"] == len(docs[s])
  assert len(meta["content_sha256"]) == 64 and len(meta["inputs"]["sha256"]) == 64


def test_vocabulary_is_the_clean_training_words(built):
  _, raw, _, docs = built
  vocab = sc.read_vocabulary(raw)
  clean = set()
  for s in sc.STDLIB_SOURCES:
    if s != sc.NOISY_SOURCE:
      clean.update(w for d in sc.split_documents(s, docs[s])[0] for w in words(d))
  assert vocab == clean
  assert {"def", "return", "the", "__init__", "License"} <= vocab
  noisy_only = {w for d in docs[sc.NOISY_SOURCE] for w in words(d)} - clean
  assert noisy_only and not noisy_only & vocab


def test_ensure_stdlib_is_cached(built):
  cache, raw, prepared, _ = built
  stamp = {n: os.stat(os.path.join(raw, n)).st_mtime_ns for n in os.listdir(raw)}
  shards = {n: os.stat(os.path.join(prepared, n)).st_mtime_ns for n in os.listdir(prepared)
            if n.endswith(".bin")}
  assert sc.ensure_stdlib(cache, load_tokenizer("bytes")) == prepared
  assert {n: os.stat(os.path.join(raw, n)).st_mtime_ns for n in os.listdir(raw)} == stamp
  assert all(os.stat(os.path.join(prepared, n)).st_mtime_ns == t for n, t in shards.items())


def test_a_library_without_the_files_is_refused(tmp_path):
  (tmp_path / "mod.py").write_text('"""Doc."""\ndef f():\n  return 1\n')
  with pytest.raises(DataError, match=r"source '[a-z-]+' has [01] document\(s\), fewer than 2"):
    sc.stdlib_documents(str(tmp_path))
  with pytest.raises(DataError, match="is not a directory"):
    sc.stdlib_documents(str(tmp_path / "nowhere"))
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "bad.py").write_text("def (:\n")
  with pytest.raises(DataError, match="pkg/bad.py: not Python this interpreter parses"):
    sc.stdlib_documents(str(tmp_path))


def test_packages_join_only_when_asked():
  labels = [label for label, _ in sc.stdlib_inputs(packages=True)]
  package_labels = [x for x in labels if x.startswith("packages/")]
  assert not [x for x in labels[:len(labels) - len(package_labels)] if x.startswith("packages/")]
  assert any(x.startswith("packages/numpy-") and x.endswith("/METADATA") for x in package_labels)
  assert not any(x.startswith("packages/") for x, _ in sc.stdlib_inputs())
  metadata = b"Metadata-Version: 2.1\nName: demo\n\n# Demo\n\nA README.\n"
  docs = sc._package_documents([("packages/demo-1.0/METADATA", metadata),
                                ("packages/demo-1.0/LICENSE", b"MIT License\n\nPermission ...\n")])
  assert docs == {"notes": ["# Demo\n\nA README."], "licenses": ["MIT License\n\nPermission ..."]}


_DUMP = ("import sys\n"
         "from andrea_jax.data.corpora.stdlib import generate_stdlib\n"
         "generate_stdlib(sys.argv[1])\n")


@pytest.mark.slow
def test_builds_twice_to_the_same_bytes(built, tmp_path):
  """A second build, in a process with another hash seed, writes the same bytes."""
  _, raw, _, _ = built
  subprocess.run([sys.executable, "-c", _DUMP, str(tmp_path)], cwd=REPO, check=True,
                 timeout=300, env={**os.environ, "PYTHONHASHSEED": "12345"})
  names = sorted(n for n in os.listdir(raw) if n != "COMPLETE")
  assert sorted(os.listdir(tmp_path)) == names
  for n in names:
    with open(os.path.join(raw, n), "rb") as a, open(os.path.join(tmp_path, n), "rb") as b:
      assert a.read() == b.read(), n

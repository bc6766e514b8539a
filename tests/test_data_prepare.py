"""prepare: deterministic bytes, resumable, JSONL/text/Parquet, whole-document eval split, CLI."""

import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from andrea_jax.data import DataError, SourceSpec, load_tokenizer, prepare, readers
from andrea_jax.data.manifest import token_dtype
from andrea_jax.sources import SOURCES

SEP = "<|endoftext|>"
BYTES = load_tokenizer("bytes")


def _documents(n=120, seed=0):
  rng = np.random.default_rng(seed)
  words = ["alpha", "beta", "gamma", "d\u00e9j\u00e0", "\u05e9\u05dc\u05d5\u05dd", "\U0001F600",
           "x"]
  docs = []
  for i in range(n):
    paras = [" ".join(rng.choice(words, rng.integers(3, 30))) for _ in range(rng.integers(1, 4))]
    docs.append(f"doc {i}: " + "\n\n".join(paras))  # unique, with blank lines inside
  return docs


def _write_jsonl(path, docs, field="text"):
  path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)),
                  encoding="utf-8")


def _write_text(path, docs):
  path.write_text(f"\n{SEP}\n".join(docs), encoding="utf-8")


def _write_parquet(path, docs, column="body"):
  pq.write_table(pa.table({column: docs, "n": list(range(len(docs)))}), str(path),
                 row_group_size=17)


def _tree(d):
  return {name: open(os.path.join(d, name), "rb").read() for name in sorted(os.listdir(d))}


def _split_docs(tokens, eod):
  """Documents of a token stream in which each document starts with ``eod``."""
  cuts = np.flatnonzero(tokens == eod)
  assert cuts.size == 0 or cuts[0] == 0
  return [BYTES.decode(tokens[a:b]) for a, b in zip(cuts, list(cuts[1:]) + [tokens.size])]


def _stream(out, manifest, source, split):
  files = [os.path.join(out, s["file"]) for s in manifest["sources"][source]["shards"][split]]
  dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
  return np.concatenate([np.fromfile(f, dtype) for f in files] or [np.zeros(0, dtype)])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  root = tmp_path_factory.mktemp("inputs")
  docs = {"chat": _documents(120, 1), "gutenberg": _documents(80, 2), "oasst": _documents(90, 3)}
  (root / "chat").mkdir()
  _write_jsonl(root / "chat" / "a.jsonl", docs["chat"][:50])
  _write_jsonl(root / "chat" / "b.jsonl", docs["chat"][50:])
  _write_text(root / "gutenberg.txt", docs["gutenberg"])
  _write_parquet(root / "oasst.parquet", docs["oasst"])
  specs = {"chat": SourceSpec(paths=(str(root / "chat" / "*.jsonl"),), eval_fraction=0.1),
           "gutenberg": SourceSpec(paths=(str(root / "gutenberg.txt"),), format="text",
                                   eval_fraction=0.05),
           "oasst": SourceSpec(paths=(str(root / "oasst.parquet"),), format="parquet",
                               text_field="body", eval_fraction=0.1)}
  return root, docs, specs


def test_manifest_and_shards(inputs, tmp_path):
  _, docs, specs = inputs
  out = str(tmp_path / "p")
  m = prepare(specs, BYTES, out, shard_tokens=2000, progress=False).manifest
  assert m["format_version"] == 1 and m["dtype"] == "uint16"
  assert m["tokenizer"] == {"name": "bytes", "fingerprint": BYTES.fingerprint, "vocab_size": 257,
                            "eod_id": 256}
  assert list(m["sources"]) == ["chat", "oasst", "gutenberg"]  # SOURCES order
  for source, entry in m["sources"].items():
    assert entry["source"] == source and entry["dtype"] == "uint16"
    assert entry["tokenizer"]["fingerprint"] == BYTES.fingerprint
    n_docs = entry["documents"]["train"] + entry["documents"]["eval"]
    assert n_docs == len(docs[source])
    expected_tokens = sum(len(d.encode("utf-8")) + 1 for d in docs[source])  # + leading eod
    assert entry["tokens"]["train"] + entry["tokens"]["eval"] == expected_tokens
    train = entry["shards"]["train"]
    assert [s["tokens"] for s in train[:-1]] == [2000] * (len(train) - 1) and len(train) > 1
    for split in ("train", "eval"):
      for shard in entry["shards"][split]:
        raw = open(os.path.join(out, shard["file"]), "rb").read()
        assert hashlib.sha256(raw).hexdigest() == shard["sha256"]
        assert len(raw) == 2 * shard["tokens"]
        assert shard["file"].startswith(f"{source}.{split}.")


def test_documents_start_with_eod_and_eval_holds_whole_documents(inputs, tmp_path):
  _, docs, specs = inputs
  out = str(tmp_path / "p")
  m = prepare(specs, BYTES, out, progress=False).manifest
  for source, fraction in (("chat", 0.1), ("gutenberg", 0.05), ("oasst", 0.1)):
    train = _split_docs(_stream(out, m, source, "train"), 256)
    held = _split_docs(_stream(out, m, source, "eval"), 256)
    assert len(train) == m["sources"][source]["documents"]["train"]
    # Train and eval partition the documents, each keeping the input order.
    assert sorted(train + held) == sorted(docs[source])
    index = {d: i for i, d in enumerate(docs[source])}
    assert [index[d] for d in train] == sorted(index[d] for d in train)
    # One held-out document among the first two, then one in each full block of k = 1/fraction.
    k, n = round(1 / fraction), len(docs[source])
    block = lambda i: 0 if i < 2 else 1 + (i - 2) // k
    counts = np.bincount([block(index[d]) for d in held], minlength=block(n - 1) + 1)
    full_blocks = 1 + (n - 2) // k
    assert (counts[:full_blocks] == 1).all() and counts.max() == 1


def test_deterministic_bytes_and_independent_of_workers(inputs, tmp_path):
  _, _, specs = inputs
  a, b, c = (str(tmp_path / x) for x in "abc")
  prepare(specs, BYTES, a, shard_tokens=3000, progress=False)
  prepare(specs, BYTES, b, shard_tokens=3000, progress=False)
  prepare(specs, BYTES, c, shard_tokens=3000, workers=2, progress=False)
  assert _tree(a) == _tree(b) == _tree(c)


def test_resume_skips_finished_sources_and_redoes_changed_ones(inputs, tmp_path):
  root, docs, specs = inputs
  specs = dict(specs)
  (tmp_path / "in").mkdir()
  _write_jsonl(tmp_path / "in" / "chat.jsonl", docs["chat"])
  specs["chat"] = SourceSpec(paths=(str(tmp_path / "in" / "chat.jsonl"),))
  out = str(tmp_path / "p")
  first = prepare(specs, BYTES, out, progress=False)
  assert first.prepared == ("chat", "oasst", "gutenberg") and first.skipped == ()
  mtimes = {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in os.listdir(out)}
  second = prepare(specs, BYTES, out, progress=False)
  assert second.prepared == () and second.skipped == ("chat", "oasst", "gutenberg")
  for n, t in mtimes.items():
    if n != "manifest.json":
      assert os.stat(os.path.join(out, n)).st_mtime_ns == t, n
  # Change one input: only that source is redone, and the result equals a fresh preparation.
  _write_jsonl(tmp_path / "in" / "chat.jsonl", docs["chat"][:-1])
  third = prepare(specs, BYTES, out, progress=False)
  assert third.prepared == ("chat",) and third.skipped == ("oasst", "gutenberg")
  fresh = str(tmp_path / "fresh")
  prepare(specs, BYTES, fresh, progress=False)
  assert _tree(out) == _tree(fresh)
  # A deleted shard makes its source unfinished.
  os.remove(os.path.join(out, third.manifest["sources"]["oasst"]["shards"]["train"][0]["file"]))
  assert prepare(specs, BYTES, out, progress=False).prepared == ("oasst",)


def test_a_malformed_or_older_manifest_entry_is_prepared_again(inputs, tmp_path):
  root, docs, specs = inputs
  out = str(tmp_path / "p")
  prepare(specs, BYTES, out, progress=False)
  path = os.path.join(out, "manifest.json")
  m = json.load(open(path))
  del m["sources"]["chat"]["inputs"]["files"][0]["sha256"]              # malformed
  del m["sources"]["oasst"]["inputs"]["reader_version"]                 # from an older reader
  json.dump(m, open(path, "w"))
  again = prepare(specs, BYTES, out, progress=False)
  assert again.prepared == ("chat", "oasst") and again.skipped == ("gutenberg",)
  fresh = str(tmp_path / "fresh")
  prepare(specs, BYTES, fresh, progress=False)
  assert _tree(out) == _tree(fresh)


def test_dictionary_encoded_text_reads_as_its_strings(tmp_path):
  docs = ["first document here", "second one", "first document here"]
  pq.write_table(pa.table({"text": pa.array(docs).dictionary_encode()}),
                 str(tmp_path / "cat.parquet"))
  pq.write_table(pa.table({"text": docs}), str(tmp_path / "plain.parquet"))
  a = prepare({"chat": SourceSpec((str(tmp_path / "cat.parquet"),), "parquet", eval_fraction=0.0)},
              BYTES, str(tmp_path / "a"), progress=False)
  b = prepare({"chat": SourceSpec((str(tmp_path / "plain.parquet"),), "parquet",
                                  eval_fraction=0.0)}, BYTES, str(tmp_path / "b"), progress=False)
  sa, sb = a.manifest["sources"]["chat"]["shards"], b.manifest["sources"]["chat"]["shards"]
  assert [x["sha256"] for x in sa["train"]] == [x["sha256"] for x in sb["train"]]


def test_jsonl_text_and_parquet_give_the_same_tokens(tmp_path):
  docs = _documents(60, 7)
  _write_jsonl(tmp_path / "d.jsonl", docs, field="content")
  _write_text(tmp_path / "d.txt", docs)
  _write_parquet(tmp_path / "d.parquet", docs)
  specs = {"jsonl": SourceSpec((str(tmp_path / "d.jsonl"),), "jsonl", "content"),
           "text": SourceSpec((str(tmp_path / "d.txt"),), "text"),
           "parquet": SourceSpec((str(tmp_path / "d.parquet"),), "parquet", "body")}
  shas = set()
  for name, spec in specs.items():
    m = prepare({"chat": spec}, BYTES, str(tmp_path / name), progress=False).manifest
    shas.add(tuple(s["sha256"] for split in ("train", "eval")
                   for s in m["sources"]["chat"]["shards"][split]))
  assert len(shas) == 1


def test_text_separator_rules(tmp_path):
  f = tmp_path / "t.txt"
  f.write_text(f"first\n{SEP}\nsecond\n\nstill second\n{SEP}\n{SEP}\n<|endoftext|>x\nthird\n")
  unit = readers.work_units(str(f), SourceSpec((str(f),), "text"))[0]
  assert readers.read_unit(unit) == ["first", "second\n\nstill second",
                                     "<|endoftext|>x\nthird\n"]
  g = tmp_path / "one.txt"
  g.write_text("a whole file\nis one document\n")
  assert readers.read_unit(readers.work_units(str(g), SourceSpec((str(g),), "text"))[0]) == [
      "a whole file\nis one document\n"]
  # A Windows file: its separator lines end in \r\n and still separate (they were read as text).
  h = tmp_path / "crlf.txt"
  h.write_bytes(f"first\r\n{SEP}\r\nsecond\r\n{SEP}\r\nthird\r\n".encode())
  units = readers.work_units(str(h), SourceSpec((str(h),), "text"), chunk_bytes=8)
  lf = tmp_path / "lf.txt"
  lf.write_bytes(h.read_bytes().replace(b"\r\n", b"\n"))
  assert len(units) == len(readers.work_units(str(lf), SourceSpec((str(lf),), "text"),
                                              chunk_bytes=8)) > 1   # cut as the LF file is
  assert [d for u in units for d in readers.read_unit(u)] == ["first", "second", "third\r\n"]


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_chunks_never_cut_a_document(tmp_path, fmt):
  docs = _documents(40, 4) + ["", "x", f"{SEP}x", "y\n"]
  f = tmp_path / "big"
  (_write_jsonl if fmt == "jsonl" else _write_text)(f, docs)
  spec = SourceSpec((str(f),), fmt)
  whole = readers.read_unit(readers.work_units(str(f), spec, chunk_bytes=10**9)[0])
  assert whole == [d for d in docs if d]
  for chunk in [1, 2, 3, 7, 50, 333, 1000, 4096]:
    units = readers.work_units(str(f), spec, chunk_bytes=chunk)
    assert len(units) > (1 if chunk < 1000 else 0)
    assert [u.start for u in units[1:]] == [u.stop for u in units[:-1]]
    assert [d for u in units for d in readers.read_unit(u)] == whole, chunk


def test_uint32_when_the_vocabulary_needs_it(tmp_path):
  assert token_dtype(65536) == np.dtype("<u2") and token_dtype(65537) == np.dtype("<u4")

  class Wide:  # ids above 65535, so uint16 would wrap
    name, spec, vocab_size, eod_id, fingerprint = "wide", "wide", 70000, 69999, "0" * 64

    def encode_batch(self, texts):
      return [np.frombuffer(t.encode(), np.uint8).astype(np.int32) + 65000 for t in texts]

  _write_jsonl(tmp_path / "w.jsonl", ["ab", "c"])
  out = str(tmp_path / "p")
  m = prepare({"chat": SourceSpec((str(tmp_path / "w.jsonl"),), eval_fraction=0.0)}, Wide(), out,
              progress=False).manifest
  assert m["dtype"] == "uint32"
  assert _stream(out, m, "chat", "train").tolist() == [69999, 65097, 65098, 69999, 65099]


@pytest.mark.parametrize("content, match", [
    ('{"text": "ok"}\n{"text": "broken\n', r"bad\.jsonl, byte 15: invalid JSON"),
    ('{"text": "ok"}\n\n{"body": "x"}\n', r"bad\.jsonl, byte 16: no field 'text'"),
    ('{"text": 3}\n', r"bad\.jsonl, byte 0: field 'text' is int, not a string"),
    ('{"text": "ok"}\n{"text": "lone \\ud800 surrogate"}\n',
     r"bad\.jsonl, byte 15: field 'text' holds a lone surrogate \('\\ud800' at character 5\)"),
    ("[" * 200_000 + "\n", r"bad\.jsonl, byte 0: invalid JSON line \(RecursionError"),
    ('{"text": "x", "n": ' + "9" * 5000 + "}\n", r"bad\.jsonl, byte 0: invalid JSON line "
                                                 r"\(ValueError"),
])
def test_bad_jsonl_names_file_and_position(tmp_path, content, match):
  (tmp_path / "bad.jsonl").write_text(content)
  with pytest.raises(DataError, match=match):
    prepare({"chat": SourceSpec((str(tmp_path / "bad.jsonl"),))}, BYTES, str(tmp_path / "p"),
            progress=False)


def test_other_bad_inputs(tmp_path):
  out = str(tmp_path / "p")
  with pytest.raises(DataError, match=r"source 'chat': no file matches '.*nothing\*\.jsonl'"):
    prepare({"chat": SourceSpec((str(tmp_path / "nothing*.jsonl"),))}, BYTES, out, progress=False)
  (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\xfe")
  with pytest.raises(DataError, match=r"bad\.txt, byte 5: invalid UTF-8"):
    prepare({"chat": SourceSpec((str(tmp_path / "bad.txt"),), "text")}, BYTES, out, progress=False)
  _write_parquet(tmp_path / "p.parquet", ["a", "b"])
  with pytest.raises(DataError, match=r"p\.parquet: no column 'text' \(columns: \['body', 'n'\]\)"):
    prepare({"chat": SourceSpec((str(tmp_path / "p.parquet"),), "parquet")}, BYTES, out,
            progress=False)
  with pytest.raises(DataError, match=r"column 'n' has type int64"):
    prepare({"chat": SourceSpec((str(tmp_path / "p.parquet"),), "parquet", "n")}, BYTES, out,
            progress=False)
  # A data page damaged after the footer was read (bytes 40-400 of a snappy file inverted).
  pq.write_table(pa.table({"text": [f"document {i} " * 20 for i in range(200)]}),
                 str(tmp_path / "damaged.parquet"), compression="snappy")
  raw = bytearray((tmp_path / "damaged.parquet").read_bytes())
  raw[40:400] = bytes(b ^ 0xFF for b in raw[40:400])
  (tmp_path / "damaged.parquet").write_bytes(bytes(raw))
  with pytest.raises(DataError, match=r"damaged\.parquet, row group 0: unreadable"):
    prepare({"chat": SourceSpec((str(tmp_path / "damaged.parquet"),), "parquet")}, BYTES, out,
            progress=False)
  # Bytes that are not UTF-8 in a string column (written as binary, viewed as string).
  bad = pa.array([b"good doc", b"bad \xff\xfe doc"], pa.binary()).view(pa.string())
  pq.write_table(pa.table({"text": bad}), str(tmp_path / "notutf8.parquet"))
  with pytest.raises(DataError, match=r"notutf8\.parquet, row group 0: column 'text' is not valid "
                                      r"UTF-8"):
    prepare({"chat": SourceSpec((str(tmp_path / "notutf8.parquet"),), "parquet")}, BYTES, out,
            progress=False)
  with pytest.raises(ValueError, match="unknown source 'nope'"):
    prepare({"nope": SourceSpec(("x",))}, BYTES, out, progress=False)
  with pytest.raises(ValueError, match="source 'chat': format must be one of"):
    prepare({"chat": SourceSpec(("x",), "csv")}, BYTES, out, progress=False)


@pytest.mark.slow
def test_command_line(inputs, tmp_path):
  root, _, _ = inputs
  config = tmp_path / "cfg.py"
  config.write_text(
      "from andrea_jax.data.config import data_config\n"
      "import ml_collections\n"
      "def get_config():\n"
      "  c = ml_collections.ConfigDict()\n"
      "  c.data = data_config()\n"
      "  c.data.corpus = 'files'\n"
      f"  c.data.files.chat.paths = {str(root / 'chat' / '*.jsonl')!r}\n"
      "  c.data.workers = 1\n"
      "  return c\n")
  out = tmp_path / "out"
  proc = subprocess.run(
      [sys.executable, "-m", "andrea_jax.data.prepare", f"--config={config}", f"--out={out}",
       "--config.data.files.oasst.format=parquet", "--config.data.files.oasst.text_field=body",
       f"--config.data.files.oasst.paths={root / 'oasst.parquet'}"],
      capture_output=True, text=True, timeout=120,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert proc.returncode == 0, proc.stderr
  m = json.loads((out / "manifest.json").read_text())
  assert list(m["sources"]) == ["chat", "oasst"]
  assert "prepared ['chat', 'oasst']" in proc.stdout
  # Bad data: one error line naming the file and byte, no traceback, exit status 1.
  (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": "broken\n')
  proc = subprocess.run(
      [sys.executable, "-m", "andrea_jax.data.prepare", f"--config={config}",
       f"--out={tmp_path / 'out_bad'}", f"--config.data.files.chat.paths={tmp_path / 'bad.jsonl'}"],
      capture_output=True, text=True, timeout=120,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert proc.returncode == 1
  assert re.search(r"^error: .*bad\.jsonl, byte 15: invalid JSON line", proc.stderr, re.M)
  assert "Traceback" not in proc.stderr
  # Without --out: into the directory a run of the same config opens (under data.cache_dir).
  cache = tmp_path / "cache"
  proc = subprocess.run(
      [sys.executable, "-m", "andrea_jax.data.prepare", f"--config={config}",
       f"--config.data.cache_dir={cache}"],
      capture_output=True, text=True, timeout=120,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert proc.returncode == 0, proc.stderr
  from andrea_jax.config import load_config_file
  from andrea_jax.data.config import data_spec
  from andrea_jax.data.pipeline import files_prepared_dir
  c = load_config_file(str(config))
  c.data.cache_dir = str(cache)
  where = files_prepared_dir(data_spec(c.data, SOURCES))
  assert where.startswith(str(cache)) and proc.stdout.startswith(f"{where}: ")
  assert list(json.loads(open(os.path.join(where, "manifest.json")).read())["sources"]) == ["chat"]


def test_concurrent_preparations_take_turns(inputs, tmp_path):
  import concurrent.futures
  _, _, specs = inputs
  out = str(tmp_path / "shared")
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    runs = list(pool.map(lambda _: prepare(specs, BYTES, out, progress=False), range(2)))
  assert sorted(len(r.prepared) for r in runs) == [0, 3]   # the second found everything finished
  prepare(specs, BYTES, str(tmp_path / "alone"), progress=False)
  assert _tree(out) == _tree(str(tmp_path / "alone"))


def test_a_tokenizer_that_emits_the_end_of_document_id_is_an_error(tmp_path):
  from andrea_jax.data import prepare_lib

  class Leaky(type(BYTES)):
    def encode_batch(self, texts):   # as a tokenizer mapping some text to its eod token would
      return [np.append(self.encode(t), self.eod_id).astype(np.int32) for t in texts]

  _write_jsonl(tmp_path / "a.jsonl", ["one", "two"])
  spec = SourceSpec((str(tmp_path / "a.jsonl"),))
  with pytest.raises(DataError, match=r"a\.jsonl \(bytes 0\.\., document 1 there\): tokenizer "
                                      r"bytes encoded text as the end-of-document id 256"):
    prepare({"chat": spec}, Leaky(), str(tmp_path / "p"), progress=False, workers=1)
  assert prepare_lib.READER_VERSION >= 2

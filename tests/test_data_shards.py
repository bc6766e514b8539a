"""PreparedData.open: every bad input is a DataError naming the source, file and position."""

import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from andrea_jax.data import DataError, PreparedData, SourceSpec, load_tokenizer, prepare, train_bpe
from andrea_jax.sources import SOURCES

BYTES = load_tokenizer("bytes")
SUBSET = ("chat", "oasst", "gutenberg")


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
  root = tmp_path_factory.mktemp("shards")
  specs = {}
  for i, s in enumerate(SUBSET):
    path = root / f"{s}.jsonl"
    path.write_text("".join(json.dumps({"text": f"{s} document {j} " + "abc " * (j % 40)}) + "\n"
                            for j in range(100)))
    specs[s] = SourceSpec(paths=(str(path),), eval_fraction=0.1)
  out = root / "prepared"
  prepare(specs, BYTES, str(out), shard_tokens=4000, progress=False)
  return out


@pytest.fixture
def prepared(clean, tmp_path):
  """A fresh copy of the clean prepared directory, to corrupt."""
  out = tmp_path / "p"
  shutil.copytree(clean, out)
  return out


def _manifest(path):
  return json.loads((path / "manifest.json").read_text())


def _save(path, m):
  (path / "manifest.json").write_text(json.dumps(m))


def test_opens_clean_data_and_memory_maps_it(prepared):
  data = PreparedData.open(prepared, tokenizer=BYTES, required=SUBSET)
  assert data.sources == SOURCES and data.required == SUBSET
  assert data.vocab_size == 257 and data.eod_id == 256 and data.dtype == np.uint16
  m = _manifest(prepared)
  for s in SUBSET:
    shards = data.shards(s)
    assert len(shards) == len(m["sources"][s]["shards"]["train"]) > 1
    assert all(isinstance(x, np.memmap) and not x.flags.writeable for x in shards)
    assert data.num_tokens(s) == m["sources"][s]["tokens"]["train"]
    assert data.num_tokens(s, "eval") == m["sources"][s]["tokens"]["eval"] > 0
    assert shards[0][0] == 256  # documents start with the end-of-document id
  assert not data.has("dictionary") and data.shards("dictionary") == ()


def test_missing_required_source(prepared):
  with pytest.raises(DataError, match=r"required source 'hermes3-general' is missing"):
    PreparedData.open(prepared)  # all sixteen required by default
  data = PreparedData.open(prepared, required=("chat",))
  assert data.has("oasst")


def test_empty_source(prepared, tmp_path):
  (tmp_path / "empty.jsonl").write_text(json.dumps({"text": ""}) + "\n")
  prepare({"smoltalk": SourceSpec((str(tmp_path / "empty.jsonl"),))}, BYTES, str(prepared),
          progress=False)
  with pytest.raises(DataError, match=r"required source 'smoltalk' has 0 training tokens \(its "
                     r"input files hold no text\)"):
    PreparedData.open(prepared, required=SUBSET + ("smoltalk",))
  assert not PreparedData.open(prepared, required=SUBSET).has("smoltalk")


def test_a_single_document_source_says_why_it_has_no_training_tokens(prepared, tmp_path):
  """A text file without a separator line is one document, and a source's first document or
  second is held out (for hermes3-general, the first: prepare_lib.eval_mask): nothing is left to
  train on, and the error says so."""
  (tmp_path / "book.txt").write_text("a whole book\nwith lines\n\nand paragraphs\n")
  prepare({"hermes3-general": SourceSpec((str(tmp_path / "book.txt"),), format="text")}, BYTES,
          str(prepared), progress=False)
  with pytest.raises(DataError, match=r"'hermes3-general' has 0 training tokens \(its 1 document "
                     r"went to the held-out split.*a line that is exactly '<\|endoftext\|>' sep"):
    PreparedData.open(prepared, required=SUBSET + ("hermes3-general",))


def test_unknown_source(prepared):
  # A run over some of the prepared sources: the others are not opened.
  data = PreparedData.open(prepared, sources=("oasst", "chat"), required=("chat",))
  assert data.sources == ("oasst", "chat") and data.has("chat") and data.has("oasst")
  assert data.shards("gutenberg") == () and not data.has("gutenberg")
  with pytest.raises(DataError, match=r"required sources \['repo-docs'\] are not among"):
    PreparedData.open(prepared, sources=SUBSET, required=("repo-docs",))


def test_sha256_mismatch(prepared):
  shard = _manifest(prepared)["sources"]["oasst"]["shards"]["train"][1]["file"]
  raw = bytearray((prepared / shard).read_bytes())
  raw[100] ^= 1  # a different byte, same size
  (prepared / shard).write_bytes(bytes(raw))
  with pytest.raises(DataError, match=rf"shard .*{shard} of source 'oasst': SHA-256 [0-9a-f]+ does "
                                      "not match the manifest"):
    PreparedData.open(prepared, required=SUBSET)
  PreparedData.open(prepared, required=SUBSET, verify=False)  # sizes alone still match


def test_truncated_shard(prepared):
  shard = _manifest(prepared)["sources"]["gutenberg"]["shards"]["eval"][0]["file"]
  raw = (prepared / shard).read_bytes()
  (prepared / shard).write_bytes(raw[:-3])
  with pytest.raises(DataError, match=rf"shard .*{shard} of source 'gutenberg' is truncated or "
                                      rf"padded: {len(raw) - 3} bytes, expected {len(raw)}"):
    PreparedData.open(prepared, required=SUBSET, verify=False)


def test_missing_shard(prepared):
  shard = _manifest(prepared)["sources"]["chat"]["shards"]["train"][0]["file"]
  os.remove(prepared / shard)
  with pytest.raises(DataError, match=rf"shard .*{shard} of source 'chat' is missing"):
    PreparedData.open(prepared, required=SUBSET)


def test_token_id_outside_the_vocabulary(prepared):
  m = _manifest(prepared)
  entry = m["sources"]["chat"]["shards"]["train"][1]
  tokens = np.fromfile(prepared / entry["file"], "<u2")
  tokens[1234] = 300  # >= 257, with a manifest that agrees with the file (sha and size)
  tokens.tofile(prepared / entry["file"])
  entry["sha256"] = hashlib.sha256(tokens.tobytes()).hexdigest()
  _save(prepared, m)
  with pytest.raises(DataError, match=rf"shard .*{entry['file']} of source 'chat': token id 300 at "
                                      r"position 1234 is >= the vocabulary size 257"):
    PreparedData.open(prepared, required=SUBSET)


def test_tokenizer_fingerprint_mismatch(prepared, tmp_path):
  other = train_bpe(["some text to learn from"] * 20, 300, tmp_path / "other.json")
  with pytest.raises(DataError, match=r"prepared with tokenizer 'bytes' .* the run uses "
                                      r"'hf:other.json'"):
    PreparedData.open(prepared, tokenizer=other, required=SUBSET)


def test_broken_manifests(prepared, tmp_path):
  with pytest.raises(DataError, match=r"manifest.json does not exist"):
    PreparedData.open(tmp_path)
  m = _manifest(prepared)
  m["format_version"] = 99
  _save(prepared, m)
  with pytest.raises(DataError, match=r"format_version 99"):
    PreparedData.open(prepared, required=SUBSET)
  (prepared / "manifest.json").write_text("{truncated")
  with pytest.raises(DataError, match=r"manifest.json is not valid JSON"):
    PreparedData.open(prepared, required=SUBSET)


def test_data_error_is_a_value_error():
  assert issubclass(DataError, ValueError)


def test_a_forged_dtype_is_refused(prepared):
  # int16 would let negative ids through (the check is only ids >= vocab), float32 fractional ones.
  for dtype in ("int16", "float32", "uint8"):
    m = _manifest(prepared)
    m["dtype"] = dtype
    for entry in m["sources"].values():
      entry["dtype"] = dtype
    _save(prepared, m)
    with pytest.raises(DataError, match=rf"dtype '{dtype}', token shards are 'uint16' or "
                                        r"'uint32'"):
      PreparedData.open(prepared, required=SUBSET)


def test_an_eod_id_other_than_the_tokenizers_is_refused(prepared):
  m = _manifest(prepared)
  m["tokenizer"]["eod_id"] = 32   # the space: documents would be split at every word
  _save(prepared, m)
  with pytest.raises(DataError, match=r"vocab_size 257 and eod_id 32, the run's tokenizer has 257 "
                                      r"and 256"):
    PreparedData.open(prepared, tokenizer=BYTES, required=SUBSET)
  m["tokenizer"]["eod_id"] = 257  # without a tokenizer to compare with: still inside the vocab
  _save(prepared, m)
  with pytest.raises(DataError, match=r"manifest.json: eod_id must be <= 256, got 257 \(a token id "
                                      r"below the vocabulary size 257\)"):
    PreparedData.open(prepared, required=SUBSET)


def test_a_shard_outside_the_directory_is_refused(prepared, tmp_path):
  m = _manifest(prepared)
  entry = m["sources"]["chat"]["shards"]["train"][0]
  outside = tmp_path / "elsewhere.bin"
  shutil.copy(prepared / entry["file"], outside)
  for name in (str(outside), os.path.join("..", "elsewhere.bin")):
    entry["file"] = name
    _save(prepared, m)
    with pytest.raises(DataError, match=r"shard .* of source 'chat' is not a path inside"):
      PreparedData.open(prepared, required=SUBSET)


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["sources"]["chat"]["shards"].pop("eval"), "malformed manifest"),
    (lambda m: m.update(sources=list(m["sources"])), "malformed manifest"),
    (lambda m: m["tokenizer"].pop("fingerprint"), "malformed manifest"),
    (lambda m: m["sources"]["chat"]["shards"]["train"][0].update(tokens=12.5),
     r"shard 'chat.train.00000.bin' of source 'chat': tokens must be an integer, got 12.5 "
     r"\(a count\)"),
    (lambda m: m["sources"]["chat"]["shards"]["train"][0].update(tokens=-1),
     r"shard 'chat.train.00000.bin' of source 'chat': tokens must be >= 0, got -1 \(a count\)"),
])
def test_a_malformed_manifest_is_a_data_error(prepared, edit, message):
  m = _manifest(prepared)
  edit(m)
  _save(prepared, m)
  with pytest.raises(DataError, match=r"manifest.json: " + message):
    PreparedData.open(prepared, tokenizer=BYTES, required=SUBSET)


def test_the_advice_for_a_corrupted_shard_works(clean, prepared):
  # Same size, one bit flipped: the preparation alone would think the source finished.
  shard = prepared / _manifest(prepared)["sources"]["oasst"]["shards"]["train"][0]["file"]
  raw = bytearray(shard.read_bytes())
  raw[100] ^= 1
  shard.write_bytes(bytes(raw))
  with pytest.raises(DataError, match=r"delete it and run the preparation again"):
    PreparedData.open(prepared, tokenizer=BYTES, required=SUBSET)
  shard.unlink()   # the advice
  specs = {s: SourceSpec(paths=(str(clean.parent / f"{s}.jsonl"),),
                         eval_fraction=0.1) for s in SUBSET}
  result = prepare(specs, BYTES, str(prepared), shard_tokens=4000, progress=False)
  assert result.prepared == ("oasst",) and set(result.skipped) == {"chat", "gutenberg"}
  PreparedData.open(prepared, tokenizer=BYTES, required=SUBSET)


def test_a_source_prepared_by_another_reader_version_is_warned_about(prepared):
  import warnings as w
  with w.catch_warnings():
    w.simplefilter("error")          # the clean directory: no warning
    PreparedData.open(prepared, tokenizer=BYTES, required=SUBSET)
  m = _manifest(prepared)
  del m["sources"][SUBSET[0]]["inputs"]["reader_version"]   # as an older version wrote it
  _save(prepared, m)
  with pytest.warns(UserWarning, match=rf"sources \['{SUBSET[0]}'\] were prepared by another "
                                       r"version of the readers \(this one is 2\)"):
    PreparedData.open(prepared, tokenizer=BYTES, required=SUBSET)

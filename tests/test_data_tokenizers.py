"""Tokenizers: exact round trips (bytes, BPE trained here, SentencePiece), fingerprints, eod ids."""

import hashlib
import json
import io

import numpy as np
import pytest

from andrea_jax.data import (ByteTokenizer, DataError, HFTokenizer, SentencePieceTokenizer,
                             load_tokenizer, train_bpe)
from andrea_jax.data.corpora.synthetic import builtin_documents

AWKWARD = [
    "",
    "plain ascii",
    "e\u0301 a\u0308 n\u0303 -- combining marks (e + acute, a + diaeresis)",
    "family \U0001F469\u200D\U0001F469\u200D\U0001F467, flag \U0001F1EB\U0001F1F7 (ZWJ, regional)",
    "RTL: \u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627 \u202eoverride\u202c",
    "NUL \x00 inside, and \x01\x7f controls",
    "  leading and trailing spaces  \n\n\ttabs\r\nCRLF ",
    "CJK \u4f60\u597d\u4e16\u754c, astral \U00010348 \U0001D11E",
    "a literal <|endoftext|> inside a document",
]


def test_byte_tokenizer_is_utf8():
  tok = load_tokenizer("bytes")
  assert isinstance(tok, ByteTokenizer)
  assert (tok.vocab_size, tok.eod_id, tok.name) == (257, 256, "bytes")
  assert tok.encode("h\u00e9").tolist() == [0x68, 0xC3, 0xA9]   # UTF-8 of U+00E9 is C3 A9
  assert tok.encode("x").dtype == np.int32
  for text in AWKWARD:
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode(text).tolist() == list(text.encode("utf-8"))
  assert tok.decode([256, 104, 256, 105]) == "hi"  # end-of-document ids are dropped
  assert [x.tolist() for x in tok.encode_batch(["a", "bc"])] == [[97], [98, 99]]
  with pytest.raises(ValueError, match="257"):
    tok.decode([300])


def test_byte_fingerprint_is_a_constant():
  assert ByteTokenizer().fingerprint == load_tokenizer("bytes").fingerprint
  assert len(ByteTokenizer().fingerprint) == 64


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
  texts = [d for s in ("chat", "gutenberg", "repo-docstrings") for d in builtin_documents(s, 0.02)]
  return train_bpe(iter(texts), 400, tmp_path_factory.mktemp("bpe") / "bpe.json")


def test_bpe_round_trip_on_builtin_corpus_and_awkward_unicode(bpe):
  assert isinstance(bpe, HFTokenizer)
  assert bpe.eod_id == 0 and 257 < bpe.vocab_size <= 400
  for source in ("chat", "extra-04", "extra-06", "dictionary"):
    for doc in builtin_documents(source, 0.003):
      ids = bpe.encode(doc)
      assert bpe.decode(ids) == doc
      assert ids.dtype == np.int32 and 0 not in ids.tolist()
  for text in AWKWARD:
    assert bpe.decode(bpe.encode(text)) == text
  prose = builtin_documents("chat", 0.003)[0]
  assert len(bpe.encode(prose)) < 0.7 * len(prose.encode())  # it did learn merges


def test_bpe_never_emits_eod_for_literal_special_token(bpe):
  ids = bpe.encode("before <|endoftext|> after")
  assert bpe.eod_id not in ids.tolist()
  batch = bpe.encode_batch(["x <|endoftext|>", "y"])
  assert bpe.eod_id not in batch[0].tolist()
  assert [bpe.decode(b) for b in batch] == ["x <|endoftext|>", "y"]


def test_bpe_fingerprint_is_sha256_of_the_file(bpe, tmp_path):
  raw = open(bpe.spec, "rb").read()
  assert bpe.fingerprint == hashlib.sha256(raw).hexdigest()
  again = load_tokenizer(bpe.spec)
  assert again.fingerprint == bpe.fingerprint and again.name == "hf:bpe.json"
  copy = tmp_path / "renamed.tok"  # recognised by content, whatever the extension
  copy.write_bytes(raw)
  assert load_tokenizer(str(copy)).fingerprint == bpe.fingerprint
  changed = tmp_path / "changed.json"
  changed.write_bytes(raw.replace(b'"vocab"', b'"vocab" ', 1))
  assert load_tokenizer(str(changed)).fingerprint != bpe.fingerprint


def test_hf_file_without_end_of_document_token(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel()
  tok.train_from_iterator(["abc abd"] * 10,
                          trainers.BpeTrainer(vocab_size=280, show_progress=False))
  tok.save(str(tmp_path / "noeod.json"))
  with pytest.raises(DataError, match="noeod.json: no end-of-document token"):
    load_tokenizer(str(tmp_path / "noeod.json"))


def test_train_bpe_rejects_small_vocab(tmp_path):
  with pytest.raises(ValueError, match="vocab_size must be >= 257"):
    train_bpe(["a"], 100, tmp_path / "x.json")


def test_sentencepiece_trained_here(tmp_path):
  import sentencepiece as spm
  texts = [d for d in builtin_documents("chat", 0.02)]
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=model, vocab_size=400, model_type="bpe",
      byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
      character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=1, pad_id=-1, minloglevel=3)
  path = tmp_path / "tiny.model"
  path.write_bytes(model.getvalue())
  tok = load_tokenizer(str(path))
  assert isinstance(tok, SentencePieceTokenizer)
  assert (tok.vocab_size, tok.eod_id) == (400, 1)
  assert tok.fingerprint == hashlib.sha256(model.getvalue()).hexdigest()
  awkward = "Assistant: caf\u00e9 \U0001F469\u200D\U0001F467 \u05e9\u05dc\u05d5\u05dd"
  for text in texts[:20] + [awkward]:
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and tok.eod_id not in ids.tolist()
    assert tok.decode(ids) == text
  assert tok.decode(np.concatenate([[tok.eod_id], tok.encode("hello")])) == "hello"
  assert [tok.decode(x) for x in tok.encode_batch(["ab", "cd"])] == ["ab", "cd"]


def test_load_tokenizer_errors(tmp_path):
  with pytest.raises(DataError, match="neither 'bytes' nor an existing file"):
    load_tokenizer(str(tmp_path / "missing.json"))
  junk = tmp_path / "junk.model"
  junk.write_bytes(b"\x00not a model")
  with pytest.raises(DataError, match="junk.model: not a SentencePiece model"):
    load_tokenizer(str(junk))
  bad_json = tmp_path / "bad.json"
  bad_json.write_text("{not json")
  with pytest.raises(DataError, match="bad.json: not a Hugging Face tokenizers JSON"):
    load_tokenizer(str(bad_json))


def test_hf_file_whose_end_of_document_token_is_not_special(bpe, tmp_path):
  # As tok.add_tokens([...]) leaves it: an added token, not special. encode would then turn text
  # spelling it into the end-of-document id.
  raw = json.loads(open(bpe.spec, encoding="utf-8").read())
  assert raw["added_tokens"][0]["content"] == "<|endoftext|>" and raw["added_tokens"][0]["special"]
  raw["added_tokens"][0]["special"] = False
  (tmp_path / "plain.json").write_text(json.dumps(raw), encoding="utf-8")
  with pytest.raises(DataError, match=r"plain.json: the end-of-document token '<\|endoftext\|>' "
                                      r"\(id 0\) is not a special token"):
    load_tokenizer(str(tmp_path / "plain.json"))


def test_a_saved_truncation_or_padding_is_ignored(bpe, tmp_path):
  # Some published tokenizer.json files carry truncation and padding: they would cut documents
  # and fill short ones with the pad id (here the end-of-document id, a fake boundary).
  import tokenizers
  raw = tokenizers.Tokenizer.from_file(bpe.spec)
  raw.enable_truncation(max_length=8)
  raw.enable_padding(pad_id=bpe.eod_id, pad_token="<|endoftext|>")
  raw.save(str(tmp_path / "trunc.json"))
  tok = load_tokenizer(str(tmp_path / "trunc.json"))
  text = "hello world " * 20
  np.testing.assert_array_equal(tok.encode(text), bpe.encode(text))
  short, long = tok.encode_batch(["hi", text])
  np.testing.assert_array_equal(short, bpe.encode("hi"))
  np.testing.assert_array_equal(long, bpe.encode(text))
  assert bpe.eod_id not in short.tolist()


def test_an_unknown_token_that_is_the_end_of_document_token_is_refused(tmp_path):
  import tokenizers
  from tokenizers import models
  t = tokenizers.Tokenizer(models.BPE(vocab={"</s>": 0, "a": 1, "b": 2}, merges=[],
                                      unk_token="</s>"))
  t.add_special_tokens(["</s>"])
  t.save(str(tmp_path / "unk.json"))
  with pytest.raises(DataError, match=r"unk.json: the unknown token is the end-of-document token "
                                      r"'</s>' \(id 0\)"):
    load_tokenizer(str(tmp_path / "unk.json"))


def test_a_tokenizer_path_with_a_tilde_is_expanded(bpe, tmp_path, monkeypatch):
  import shutil
  monkeypatch.setenv("HOME", str(tmp_path))
  shutil.copy(bpe.spec, tmp_path / "tok.json")
  assert load_tokenizer("~/tok.json").fingerprint == bpe.fingerprint


def test_a_unigram_unknown_id_that_is_the_end_of_document_id_is_refused(tmp_path):
  # Unigram stores unk_id (an index), not unk_token; the library exposes neither.
  import tokenizers
  from tokenizers import models
  t = tokenizers.Tokenizer(models.Unigram([("</s>", 0.0), ("a", -1.0), ("b", -2.0)], unk_id=0))
  t.add_special_tokens(["</s>"])
  t.save(str(tmp_path / "uni.json"))
  with pytest.raises(DataError, match=r"uni.json: the unknown token is the end-of-document token"):
    load_tokenizer(str(tmp_path / "uni.json"))

"""Word share of samples, and bits per byte from nats per token."""

import json
import math

import numpy as np
import pytest

from andrea_jax.data import PreparedData, SourceSpec, load_tokenizer, prepare, train_bpe
from andrea_jax.data.bpb import bits_per_byte, heldout_tokens_per_byte, tokens_per_byte
from andrea_jax.data.corpora.wordshare import vocabulary, word_share, words


def test_words_by_hand():
  text = "The cat's __init__(x2) costs 42 3rd naïve thøzhß."
  assert words(text) == ["The", "cat", "__init__", "costs", "naïve", "thøzhß"]
  assert words(text, min_chars=1) == [
      "The", "cat", "s", "__init__", "x2", "costs", "naïve", "thøzhß"]
  assert words("123 4.5 -- !! of a") == []


def test_word_share_on_text_known_by_hand():
  vocab = vocabulary(["the cat sat on the mat", "def f(x): return x"])
  assert vocab == {"the", "cat", "sat", "mat", "def", "return"}
  # 'the dog sat on the mats' has 5 words of 3+ characters, 3 of them known (the, sat, the).
  assert word_share("the dog sat on the mats", vocab) == pytest.approx(3 / 5)
  # Pooled over samples, repeats counted: (3 + 1) / (5 + 3); numbers and 'x' are not words.
  assert word_share(["the dog sat on the mats", "return 42 x thøzhß tsøzōkvß"], vocab) == \
      pytest.approx(4 / 8)
  # With every length: 4 of 6 known (the, sat, on, the).
  assert word_share("the dog sat on the mats", vocabulary(["the cat sat on the mat"], 1),
                    min_chars=1) == pytest.approx(4 / 6)
  assert word_share("The Cat", vocab) == 0.0     # case counts
  assert word_share(["", "42 !! a"], vocab) == 0.0   # no word at all


def test_bits_per_byte_by_hand():
  assert bits_per_byte(math.log(2), 1.0) == pytest.approx(1.0)   # 1 bit per byte-token
  assert bits_per_byte(1.0, 1.0) == pytest.approx(1.4426950408889634)  # 1 / ln 2
  assert bits_per_byte(2.0, 0.25) == pytest.approx(2.0 * 0.25 / 0.6931471805599453)
  with pytest.raises(ValueError, match="tokens_per_byte must be > 0"):
    bits_per_byte(1.0, 0.0)


def test_tokens_per_byte(tmp_path):
  texts = ["héllo wörld", "plain ascii"]   # 13 + 11 bytes
  assert tokens_per_byte(texts, load_tokenizer("bytes")) == 1.0
  bpe = train_bpe(["hello world plain ascii " * 50] * 20, 300, tmp_path / "bpe.json")
  n = sum(len(bpe.encode(t)) for t in texts)
  assert tokens_per_byte(texts, bpe) == pytest.approx(n / 24) and n < 24
  with pytest.raises(ValueError, match="no byte"):
    tokens_per_byte([""], load_tokenizer("bytes"))


def test_heldout_tokens_per_byte_reads_the_eval_split(tmp_path):
  # Four documents with eval_fraction 0.5: one of the first two held out, one of the last two.
  docs = ["héllo wörld, once", "plain ascii text here", "naïve ☃ snowman", "tokens per byte"]
  (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  bpe = train_bpe(docs * 30, 290, tmp_path / "bpe.json")
  spec = {"chat": SourceSpec(paths=(str(tmp_path / "a.jsonl"),), eval_fraction=0.5)}
  for tok in (load_tokenizer("bytes"), bpe):
    out = str(tmp_path / f"prep-{tok.name}")
    prepare(spec, tok, out, progress=False)
    data = PreparedData.open(out, tokenizer=tok, sources=("chat",))
    decoded = {tok.decode(x) for x in _eval_docs(data, tok)}
    held = [d for d in docs if d in decoded]
    assert len(held) == 2 and len(set(held) & set(docs[:2])) == 1
    expected = sum(len(tok.encode(d)) for d in held) / sum(len(d.encode()) for d in held)
    assert heldout_tokens_per_byte(data, "chat", tok) == pytest.approx(expected)
  assert heldout_tokens_per_byte(data, "chat", bpe) < 1.0
  with pytest.raises(ValueError, match="is not the one"):
    heldout_tokens_per_byte(data, "chat", load_tokenizer("bytes"))


def _eval_docs(data, tok):
  ids = np.concatenate([np.asarray(x, np.int64) for x in data.shards("chat", "eval")])
  return [p[p != tok.eod_id] for p in np.split(ids, np.flatnonzero(ids == tok.eod_id))
          if (p != tok.eod_id).any()]

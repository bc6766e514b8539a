"""The pieces: the held-out placement, the sizes on the real corpus, the leakage checks."""

import json
import os

import numpy as np
import pytest

from andrea_jax.data import readers
from andrea_jax.data.hashing import splitmix64
from andrea_jax.data.prepare_lib import eval_mask, prepare
from andrea_jax.data.tokenizers import load_tokenizer
from study.data_constrained import prep


def test_hash_order_is_a_fixed_shuffle():
  order = prep.hash_order(50, salt=7)
  assert sorted(order.tolist()) == list(range(50)) and order.tolist() != list(range(50))
  keys = [int(splitmix64(np.uint64(i ^ 7))[0]) for i in range(50)]
  assert order.tolist() == sorted(range(50), key=lambda i: keys[i])


def test_place_puts_the_chosen_documents_where_the_rule_holds_them_out():
  train, held = ["a", "b", "c"], ["X", "Y", "Z"]
  docs = prep.place("some-source", train, held, 0.5)
  mask = eval_mask("some-source", 0, 6, 0.5)
  assert [d for d, h in zip(docs, mask) if h] == held
  assert [d for d, h in zip(docs, mask) if not h] == train
  assert prep.split("some-source", docs, 0.5) == (train, held)
  with pytest.raises(ValueError, match="holds out 3 of 6"):
    prep.place("some-source", ["a", "b", "c", "d"], ["X", "Y"], 0.5)


def test_held_count_is_what_the_rule_holds_out():
  # At 0.5 the rule holds out one of every full block of two (and maybe one of a last, partial
  # block): 7 training documents need 6 or 7 held out, the least that the rule agrees with.
  for name, n, fraction in (("x", 7, 0.5), ("doc-small", 111, 0.02), ("y", 30, 0.1)):
    h = prep.held_count(name, n, fraction)
    assert eval_mask(name, 0, n + h, fraction).sum() == h
    assert all(eval_mask(name, 0, n + g, fraction).sum() != g for g in range(1, h))
  assert prep.held_count("x", 7, 0.5) in (6, 7)


def test_halves_split_by_size_two_at_a_time():
  docs = ["x" * 9, "x" * 8, "x" * 4, "x" * 3]        # 10, 9, 5 and 4 tokens
  assert prep.halves([0, 1, 2, 3], docs) == ([0, 3], [1, 2])
  # order within a half is the given order
  assert prep.halves([3, 2, 1, 0], docs) == ([3, 0], [2, 1])


@pytest.fixture(scope="module")
def cut(corpus):
  return prep.cut(corpus)


def _table(cut):
  return {r["source"]: r for r in prep.table(cut)}


def test_the_pieces_sizes_on_the_real_corpus(cut):
  t = _table(cut)
  # doc-small: at least 32,000 training tokens, at most one document (<= 4,096 tokens) more.
  assert 32_000 <= t["doc-small"]["train_tokens"] < 32_000 + prep.MAX_DOC_TOKENS
  assert 1 <= t["doc-small"]["eval_documents"] <= 4
  # doc-dev: two halves of equal counts and near-equal tokens, ~16K each.
  d = t["doc-dev"]
  assert d["train_documents"] == d["eval_documents"]
  assert abs(d["train_tokens"] - d["eval_tokens"]) <= prep.MAX_DOC_TOKENS
  assert 32_000 <= d["train_tokens"] + d["eval_tokens"] < 32_000 + 2 * prep.MAX_DOC_TOKENS
  # doc-test: the 186 docstrings stdlib holds out, 95,356 tokens, all held out.
  assert (t["doc-test"]["eval_documents"], t["doc-test"]["eval_tokens"]) == (186, 95_356)
  # the related sources as in stdlib (docs/data.md's table), the noisy one ~1.5M.
  assert t["reference"]["train_tokens"] == 436_235
  assert t["python-code"]["train_tokens"] == 7_585_253
  assert t["licenses"]["train_tokens"] == 38_947
  assert 1_400_000 < t["noisy-docstrings"]["train_tokens"] < 1_628_745
  # doc-plus-dev trains on doc-small's and doc-dev's documents, both halves.
  assert t["doc-plus-dev"]["train_tokens"] == (t["doc-small"]["train_tokens"] + d["train_tokens"]
                                               + d["eval_tokens"])


def test_no_document_of_the_small_pieces_is_longer_than_the_cap(cut):
  for s in ("doc-small", "doc-dev"):
    assert max(map(prep.tokens, cut.documents[s])) <= prep.MAX_DOC_TOKENS


def test_a_smaller_target_is_a_prefix_and_dev_and_test_stay(corpus, cut):
  small = prep.cut(corpus, target_tokens=8_000)
  for s in ("doc-dev", "doc-test", "reference"):
    assert small.documents[s] == cut.documents[s]
  train8 = prep.split("doc-small", small.documents["doc-small"], 0.02)[0]
  train32 = prep.split("doc-small", cut.documents["doc-small"], 0.02)[0]
  assert train32[:len(train8)] == train8 and sum(map(prep.tokens, train8)) >= 8_000


def test_the_leakage_checks_pass_and_catch_leaks(corpus, cut):
  checked = prep.check_leakage(cut, corpus["docstrings"])
  assert checked["test documents"] == 186
  test_doc = prep.split("doc-test", cut.documents["doc-test"], 0.5)[1][5]
  dev_doc = cut.documents["doc-dev"][3]
  leaks = {
      "a doc-test document is a substring": ("python-code", "# " + test_doc + "\n"),
      "a doc-dev document is a substring": ("reference", dev_doc),
  }
  for message, (source, doc) in leaks.items():
    bad = prep.Pieces({**cut.documents, source: cut.documents[source] + [doc]}, cut.roles)
    with pytest.raises(ValueError, match=message):
      prep.check_leakage(bad, corpus["docstrings"])
  # The noisy twin of a doc-small document put back into the noisy piece.
  twin_of = {i: t for t, i in prep.twins(corpus["docstrings"]).items()}
  twin = twin_of[cut.roles["doc-small"][0]]
  bad = prep.Pieces({**cut.documents,
                     "noisy-docstrings": cut.documents["noisy-docstrings"] + [twin]}, cut.roles)
  with pytest.raises(ValueError, match="is the twin of docstring"):
    prep.check_leakage(bad, corpus["docstrings"])
  # A document shared by dev and test.
  bad = prep.Pieces({**cut.documents, "doc-dev": cut.documents["doc-dev"] + [test_doc]},
                    cut.roles)
  with pytest.raises(ValueError, match="doc-dev and doc-test share"):
    prep.check_leakage(bad, corpus["docstrings"])


def test_the_products_preparation_splits_the_pieces_as_placed(pieces_dir):
  """The small pieces through the product's own preparation: the training and held-out tokens
  are the ones the placement meant (doc-plus-dev read under the name doc-small)."""
  manifest = json.load(open(os.path.join(pieces_dir, prep.MANIFEST)))
  want = {r["source"]: r for r in manifest["pieces"]}
  out = os.path.join(pieces_dir, "prepared-check")
  for piece in ("doc-small", "doc-dev", "doc-test", "doc-plus-dev"):
    name = prep.READ_AS.get(piece, piece)
    spec = readers.SourceSpec(paths=(os.path.join(pieces_dir, f"{piece}.jsonl"),),
                              format="jsonl", text_field="text",
                              eval_fraction=prep.EVAL_FRACTION[piece])
    prepare({name: spec}, load_tokenizer("bytes"), out + piece, progress=False,
            known_sources=(name,))
    got = json.load(open(os.path.join(out + piece, "manifest.json")))["sources"][name]["tokens"]
    assert (got["train"], got["eval"]) == (want[piece]["train_tokens"], want[piece]["eval_tokens"])

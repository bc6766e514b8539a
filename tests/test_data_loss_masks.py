"""Loss masks from the preparation to the batch: mask shards beside the token shards (counted by
hand), the cache key, the checks when opened, the sampler's and the held-out batches' ``loss_mask``
(recomputed from the text by hand), and runs without a mask left as they were."""

import json
import os
import re

import numpy as np
import pytest

from andrea_jax.data import (DataError, MixtureSampler, PreparedData, SourceSpec, eval_batches,
                             load_tokenizer, prepare)
from andrea_jax.data import config as config_lib
from andrea_jax.data import manifest as mf
from andrea_jax.data.hub.datasets import HubSpec
from andrea_jax.sources import SOURCES
from tests.test_data_sampler import _find

datasets = pytest.importorskip("datasets")
BYTES = load_tokenizer("bytes")
WORDS = "sun rain wind snow cloud storm fog hail ice mist".split()
ASSISTANT = re.compile(rb"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S)


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def _conversations(n: int, seed: int = 0) -> list[dict]:
  rng = np.random.default_rng(seed)
  say = lambda k: " ".join(rng.choice(WORDS, k))
  rows = []
  for i in range(n):
    turns = [{"role": "system", "content": "Météo. 天气"}] if i % 3 == 0 else []
    for _ in range(1 + i % 3):
      turns += [{"role": "user", "content": say(int(rng.integers(0, 6)))},
                {"role": "assistant", "content": say(int(rng.integers(0, 9)))}]
    rows.append({"messages": turns})
  return rows


def _spec(tmp_path, rows, **kw):
  path = tmp_path / "ds"
  if not path.exists():
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
  return HubSpec(str(path), layout="messages", **kw)


def _hand_mask(tokens: np.ndarray) -> np.ndarray:
  """1 for each byte of an assistant turn's text and its <|im_end|>, found in the shard's bytes
  (the end-of-document id, 256, read as a NUL byte, which the text never holds)."""
  text = np.where(tokens == 256, 0, tokens).astype(np.uint8).tobytes()
  mask = np.zeros(tokens.size, np.uint8)
  for m in ASSISTANT.finditer(text):
    mask[m.start(1):m.end(1)] = 1
  return mask


def _read(out, source, key, split="train"):
  m = mf.read_manifest(str(out))
  dtype = np.dtype(m["dtype"]) if key == "shards" else mf.MASK_DTYPE
  return np.concatenate([np.fromfile(os.path.join(out, s["file"]), dtype)
                         for s in m["sources"][source][key][split]])


def test_masks_are_stored_beside_the_shards_and_count_what_a_hand_count_counts(tmp_path):
  rows = _conversations(40)
  out_all, out = tmp_path / "all", tmp_path / "assistant"
  prepare({"chat": _spec(tmp_path, rows, eval_fraction=0.0)}, BYTES, str(out_all),
          progress=False)
  prepare({"chat": _spec(tmp_path, rows, eval_fraction=0.0, loss_on="assistant")}, BYTES,
          str(out), shard_tokens=1000, progress=False)
  entry = mf.read_manifest(str(out))["sources"]["chat"]
  # The same tokens whatever loss_on (only the shard size differs here).
  assert np.array_equal(_read(out, "chat", "shards"), _read(out_all, "chat", "shards"))
  # Counted by hand from the rows: each assistant turn's UTF-8 bytes and its <|im_end|>.
  by_hand = sum(len(t["content"].encode()) + len("<|im_end|>") for r in rows
                for t in r["messages"] if t["role"] == "assistant")
  assert entry["loss_on"] == "assistant"
  assert entry["loss_tokens"] == {"train": by_hand, "eval": 0}
  mask = _read(out, "chat", "masks")
  assert int(mask.sum()) == by_hand
  assert np.array_equal(mask, _hand_mask(_read(out, "chat", "shards")))
  # One mask shard per token shard, as long, listed with its checksum; none for 'all'.
  names = sorted(os.listdir(out))
  assert [s["tokens"] for s in entry["masks"]["train"]] == [s["tokens"]
                                                           for s in entry["shards"]["train"]]
  assert all(re.fullmatch(r"chat\.train\.\d{5}\.mask\.bin", s["file"])
             for s in entry["masks"]["train"])
  assert all(s["file"] in names for s in entry["masks"]["train"])
  assert not [n for n in os.listdir(out_all) if ".mask." in n]
  assert not {"loss_on", "masks", "loss_tokens"} & set(
      mf.read_manifest(str(out_all))["sources"]["chat"])


def test_changing_loss_on_prepares_the_source_again_and_its_mask_goes_with_it(tmp_path):
  rows = _conversations(20)
  out = str(tmp_path / "out")
  spec = _spec(tmp_path, rows)
  assert prepare({"chat": spec}, BYTES, out, progress=False).prepared == ("chat",)
  masked = spec._replace(loss_on="assistant")
  assert prepare({"chat": masked}, BYTES, out, progress=False).prepared == ("chat",)
  assert prepare({"chat": masked}, BYTES, out, progress=False).skipped == ("chat",)
  assert [n for n in os.listdir(out) if ".mask." in n]
  assert prepare({"chat": spec}, BYTES, out, progress=False).prepared == ("chat",)
  assert not [n for n in os.listdir(out) if ".mask." in n]
  # A source without a mask keeps the cache key it had before loss_on existed.
  inputs = mf.read_manifest(out)["sources"]["chat"]["inputs"]
  assert "loss_on" not in inputs["options"]


def test_a_mask_is_refused_where_there_are_no_turns_with_the_field_named():
  cfg = config_lib.data_config(("chat",), corpus="files")
  cfg.files.chat.paths = "/data/chat/*.jsonl"
  cfg.files.chat.loss_on = "assistant"
  with pytest.raises(ValueError, match=r"data\.files\.chat has fields \['loss_on'\] that format "
                                       r"'jsonl' does not take .* or set format 'hf', which takes them"):
    config_lib.validate_data_config(cfg, ("chat",))
  cfg.files.chat.update(format="hf", dataset="json", layout="text")
  with pytest.raises(ValueError, match=r"data\.files\.chat\.loss_on needs conversations .* "
                                       r"got 'assistant'"):
    config_lib.validate_data_config(cfg, ("chat",))
  cfg.files.chat.update(layout="messages", loss_on="assistants")
  with pytest.raises(ValueError, match=r"data\.files\.chat\.loss_on must be one of "
                                       r"\('all', 'assistant', 'generation'\), got 'assistants'"):
    config_lib.validate_data_config(cfg, ("chat",))


def test_generation_needs_marked_template_before_anything_is_read(tmp_path):
  spec = _spec(tmp_path, _conversations(4), loss_on="generation")
  with pytest.raises(DataError, match=r"source 'chat': loss_on 'generation' needs a Jinja chat "
                                      r"template with \{% generation %\} blocks; chatml has none"):
    prepare({"chat": spec}, BYTES, str(tmp_path / "out"), progress=False)
  assert not (tmp_path / "out").exists()


@pytest.fixture()
def masked_data(tmp_path):
  """``chat`` (conversations, assistant turns counted), ``books`` (text, every token)."""
  books = tmp_path / "books.jsonl"
  rng = np.random.default_rng(1)
  books.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS, 60))}) + "\n"
                           for _ in range(60)))
  specs = {"chat": _spec(tmp_path, _conversations(300), loss_on="assistant", eval_fraction=0.1),
           "books": SourceSpec(paths=(str(books),), eval_fraction=0.1)}
  out = str(tmp_path / "prepared")
  prepare(specs, BYTES, out, shard_tokens=4000, progress=False, known_sources=("chat", "books"))
  return PreparedData.open(out, tokenizer=BYTES, sources=("chat", "books"))


def test_batches_carry_each_target_s_mask_as_the_text_says(masked_data):
  data = masked_data
  assert data.masked_sources == ("chat",)
  assert len(data.masks("chat")) == len(data.shards("chat")) and data.masks("books") == ()
  seq = 48
  sampler = MixtureSampler(data, seq_len=seq, global_batch_size=16, seed=3)
  batch = sampler.batch(4, np.array([0.75, 0.25]))
  assert batch["loss_mask"].shape == (16, seq) and batch["loss_mask"].dtype == np.uint8
  stream = np.concatenate([np.asarray(m) for m in data.shards("chat")])
  hand = _hand_mask(stream)
  for b in range(16):
    window = np.concatenate([batch["inputs"][b], batch["targets"][b, -1:]])
    if batch["source_ids"][b] == 1:   # books: every target counts
      assert batch["loss_mask"][b].all()
      continue
    hits = _find(stream, window)
    assert hits, b
    # Where the window occurs (maybe more than once): its targets' mask from the text.
    assert any(np.array_equal(batch["loss_mask"][b], hand[h + 1:h + seq + 1]) for h in hits), b
  assert 0 < batch["loss_mask"][batch["source_ids"] == 0].mean() < 1
  # Held-out windows carry it too, ones for the unmasked source.
  held = eval_batches(data, "chat", seq_len=seq, num_sequences=4)
  eval_stream = np.concatenate([np.asarray(m) for m in data.shards("chat", "eval")])
  eval_hand = _hand_mask(eval_stream)
  for b in range(4):
    window = np.concatenate([held["inputs"][b], held["targets"][b, -1:]])
    assert any(np.array_equal(held["loss_mask"][b], eval_hand[h + 1:h + seq + 1])
               for h in _find(eval_stream, window))
  assert eval_batches(data, "books", seq_len=seq, num_sequences=2)["loss_mask"].all()


def test_without_a_masked_source_batches_are_as_before(tmp_path):
  path = tmp_path / "a.jsonl"
  path.write_text("".join(json.dumps({"text": "x" * 200}) + "\n" for _ in range(10)))
  prepare({"chat": SourceSpec(paths=(str(path),))}, BYTES, str(tmp_path / "p"), progress=False)
  data = PreparedData.open(str(tmp_path / "p"), tokenizer=BYTES, sources=SOURCES,
                           required=("chat",))
  assert data.masked_sources == ()
  batch = MixtureSampler(data, seq_len=16, global_batch_size=4, seed=0).batch(
      0, np.eye(len(SOURCES))[SOURCES.index("chat")])
  assert sorted(batch) == ["inputs", "positions", "segment_ids", "source_ids", "targets"]


def test_a_damaged_or_mismatched_mask_stops_the_opening(masked_data, tmp_path):
  out = masked_data.path
  entry = masked_data.manifest["sources"]["chat"]
  mask_file = os.path.join(out, entry["masks"]["train"][0]["file"])
  original = open(mask_file, "rb").read()
  with open(mask_file, "r+b") as f:
    f.write(bytes([1 - original[0]]))
  with pytest.raises(DataError, match=r"chat\.train\.00000\.mask\.bin of source 'chat': SHA-256"):
    PreparedData.open(out, tokenizer=BYTES, sources=("chat", "books"))
  with open(mask_file, "wb") as f:
    f.write(original[:-1])
  with pytest.raises(DataError, match=r"mask\.bin of source 'chat' is truncated or padded"):
    PreparedData.open(out, tokenizer=BYTES, sources=("chat", "books"))


def test_a_required_source_whose_loss_counts_nothing_is_refused(tmp_path):
  rows = [{"messages": [{"role": "user", "content": f"question {i}"}]} for i in range(10)]
  out = str(tmp_path / "out")
  prepare({"chat": _spec(tmp_path, rows, loss_on="assistant")}, BYTES, out, progress=False,
          known_sources=("chat",))
  with pytest.raises(DataError, match=r"required source 'chat' was prepared with loss_on "
                                      r"'assistant', and none of its training tokens counts"):
    PreparedData.open(out, tokenizer=BYTES, sources=("chat",))


def test_tree_threads_count_their_assistant_turns(tmp_path):
  from tests.test_data_hub import OASST
  datasets.Dataset.from_list(OASST).save_to_disk(str(tmp_path / "oasst"))
  out = str(tmp_path / "out")
  prepare({"oasst": HubSpec(str(tmp_path / "oasst"), layout="tree", loss_on="assistant",
                            eval_fraction=0.0)}, BYTES, out, progress=False)
  entry = mf.read_manifest(out)["sources"]["oasst"]
  # The threads (p1 a2), (p1 a1 q1), (p2 b1): each assistant reply once, with its <|im_end|>.
  replies = ["Short waves scatter.", "Rayleigh scattering.", "Salut !"]
  assert entry["loss_tokens"]["train"] == sum(len(r.encode()) + 10 for r in replies)
  assert np.array_equal(_read(out, "oasst", "masks"), _hand_mask(_read(out, "oasst", "shards")))

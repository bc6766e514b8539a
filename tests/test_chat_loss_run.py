"""A whole run with the loss on the assistant's replies only: two conversation sources (ChatML and
plain, ``loss_on = "assistant"``) and one text source. Its logged loss is the masked loss worked
out with numpy from the same batch, each batch's mask is the one the text says, the evaluation
reports the masked and the all-token loss (numpy again), and a run killed after a checkpoint and
resumed writes the uninterrupted run's logs, byte for byte."""

import json
import re

import jax
import numpy as np
import pytest

from andrea_jax import curriculum, runconfig, train
from andrea_jax import data as data_lib
from andrea_jax import evaluate as eval_lib
from andrea_jax.config import load_config_file
from tests.test_data_sampler import _find
from tests.test_hub_run import OVERRIDES, _sentence
from tests.util import REPO, kill_after_checkpoint, set_fields

datasets = pytest.importorskip("datasets")

NAMES = ("chat", "qa", "books")
ARG = f"{REPO / 'experiments' / 'own_data.py'}:{','.join(NAMES)}"
# The counted text of each conversation source, found in its shard's bytes (NUL for the
# end-of-document id): ChatML's assistant turns and their end marker; plain's assistant paragraphs.
COUNTED = {"chat": re.compile(rb"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S),
           "qa": re.compile(rb"Assistant: (.*?)(?=\n\nUser: |\x00|$)", re.S)}


def _data(tmp_path) -> dict:
  rng = np.random.default_rng(0)
  words = lambda n: " ".join(rng.choice(("sun rain wind snow cloud storm fog hail ice mist "
                                         "dew frost gale haze").split(), n))
  chat = [{"messages": [{"role": "user", "content": _sentence(i, 6)},
                        {"role": "assistant", "content": words(int(rng.integers(2, 14)))},
                        {"role": "user", "content": words(3)},
                        {"role": "assistant", "content": words(int(rng.integers(1, 9)))}]}
          for i in range(300)]
  datasets.Dataset.from_list(chat).save_to_disk(str(tmp_path / "chat_ds"))
  with open(tmp_path / "qa.jsonl", "w") as f:
    for i in range(300):
      f.write(json.dumps({"conversations": [{"from": "human", "value": _sentence(i, 6)},
                                            {"from": "gpt", "value": words(10)}]}) + "\n")
  with open(tmp_path / "books.jsonl", "w") as f:
    for i in range(200):
      f.write(json.dumps({"text": " ".join(_sentence(i + j) for j in range(8))}) + "\n")
  return {
      "data.files.chat.format": "hf", "data.files.chat.dataset": str(tmp_path / "chat_ds"),
      "data.files.chat.layout": "messages", "data.files.chat.loss_on": "assistant",
      "data.files.qa.format": "hf", "data.files.qa.dataset": "json",
      "data.files.qa.paths": str(tmp_path / "qa.jsonl"), "data.files.qa.layout": "messages",
      "data.files.qa.messages_field": "conversations", "data.files.qa.template": "plain",
      "data.files.qa.loss_on": "assistant",
      "data.files.books.format": "hf", "data.files.books.dataset": "json",
      "data.files.books.paths": str(tmp_path / "books.jsonl"),
  }


def _nll(model, params, batch) -> np.ndarray:
  """``[B, T]`` cross-entropy of every target, a row at a time, log-softmax in numpy."""
  out = []
  for i in range(len(batch["inputs"])):
    logits = np.asarray(model.apply({"params": params}, batch["inputs"][i:i + 1],
                                    segment_ids=batch["segment_ids"][i:i + 1],
                                    positions=batch["positions"][i:i + 1]), np.float64)[0]
    m = logits.max(-1, keepdims=True)
    logz = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    out.append(logz - logits[np.arange(len(logits)), batch["targets"][i]])
  return np.stack(out)


def _hand_masks(data, source, split="train"):
  """The source's token stream and its mask from the text (1 for every token of a counted span)."""
  stream = np.concatenate([np.asarray(m) for m in data.shards(source, split)]).astype(np.int64)
  mask = np.zeros(stream.size, np.uint8)
  if source in COUNTED:
    text = np.where(stream == data.eod_id, 0, stream).astype(np.uint8).tobytes()
    for m in COUNTED[source].finditer(text):
      mask[m.start(1):m.end(1)] = 1
  else:
    mask[:] = 1
    mask[stream == data.eod_id] = 1   # a text source counts every target, its boundaries too
  return stream, mask


def _check_masks_against_the_text(data, batch, sources):
  """Each row's loss_mask is the hand mask wherever its window occurs in its source; a window
  that occurs at places with different masks (rare) is only required to be one of them."""
  cache = {}
  unambiguous = 0
  T = batch["inputs"].shape[1]
  for b in range(len(batch["inputs"])):
    name = sources[int(batch["source_ids"][b])]
    stream, mask = cache.setdefault(name, _hand_masks(data, name))
    window = np.concatenate([batch["inputs"][b], batch["targets"][b, -1:]])
    hits = _find(stream.astype(np.uint16), window)
    candidates = {mask[h + 1:h + T + 1].tobytes() for h in hits}
    assert batch["loss_mask"][b].tobytes() in candidates, (name, b)
    unambiguous += len(candidates) == 1
  assert unambiguous >= 0.8 * len(batch["inputs"])


@pytest.mark.slow
def test_a_run_on_assistant_turns_trains_on_the_masked_loss_and_resumes_bit_identically(
    tmp_path, data_cache):
  overrides = {**OVERRIDES, **_data(tmp_path), "eval.sequences_per_source": 4}

  def config():
    c = load_config_file(ARG)
    set_fields(c, overrides)
    return c

  whole = train.train_and_evaluate(config(), str(tmp_path / "whole"))
  assert whole["end_step"] == 20
  records = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").open()]

  # Step 0's batch, rebuilt: the fresh state's weights, the run's sampler.
  c = config()
  run = runconfig.build(c)
  data = data_lib.open_training_data(run.data, required=run.evaluated, progress=False)
  assert data.masked_sources == ("chat", "qa")
  state = jax.jit(lambda: train.init_state(run, train.run_keys(c.seed)))()
  w = np.asarray(curriculum.weights_at(jax.tree.map(np.asarray, curriculum.schedule(
      state.curriculum)), 0), np.float64)
  sampler = data_lib.MixtureSampler(data, seq_len=c.data.seq_len,
                                    global_batch_size=c.data.global_batch_size, seed=c.seed)
  batch = sampler.batch(0, w)
  _check_masks_against_the_text(data, batch, run.sources)
  counted = (batch["loss_mask"] > 0) & (batch["segment_ids"] > 0)
  assert 0 < counted.sum() < counted.size
  nll = _nll(run.step.model, state.params, batch)
  first = next(r for r in records if r["step"] == 0)
  assert first["loss"] == pytest.approx(float((nll * counted).sum() / counted.sum()), rel=1e-5)
  every = batch["segment_ids"] > 0
  assert abs(first["loss"] - float((nll * every).sum() / every.sum())) > 1e-3   # not the same
  for i, name in enumerate(run.sources):   # the per-source losses and token shares, by hand
    rows = batch["source_ids"] == i
    if counted[rows].sum():
      assert first[f"loss/{name}"] == pytest.approx(
          float((nll[rows] * counted[rows]).sum() / counted[rows].sum()), rel=1e-5)
    assert first[f"share/{name}"] == pytest.approx(counted[rows].sum() / counted.sum(), rel=1e-6)

  # The evaluation: the masked and the all-token held-out losses, against numpy.
  final = records[-1]
  for name in ("chat", "qa"):
    assert final[f"eval/loss/{name}"] != final[f"eval/loss_all_tokens/{name}"]
    assert f"eval/bpb_all_tokens/{name}" in final
  assert "eval/loss_all_tokens/books" not in final
  evaluator = eval_lib.HeldOut(run, data, run.data.tokenizer)
  held = evaluator.batch
  nll = _nll(run.step.model, state.params, held)
  losses, every = evaluator.losses_and_all_tokens(state.params)
  for i, name in enumerate(run.sources):
    rows = held["source_ids"] == i
    seg = held["segment_ids"][rows] > 0
    cnt = seg & (held["loss_mask"][rows] > 0)
    assert losses[name] == pytest.approx(float((nll[rows] * cnt).sum() / cnt.sum()), rel=1e-5)
    if name in every:
      assert every[name] == pytest.approx(float((nll[rows] * seg).sum() / seg.sum()), rel=1e-5)

  # Killed after a checkpoint and resumed: the same logs, byte for byte.
  kill_after_checkpoint(ARG, tmp_path / "killed", overrides, step=8)
  resumed = train.train_and_evaluate(config(), str(tmp_path / "killed"))
  assert 8 <= resumed["start_step"] < 20
  assert ((tmp_path / "killed" / "metrics.jsonl").read_text()
          == (tmp_path / "whole" / "metrics.jsonl").read_text())

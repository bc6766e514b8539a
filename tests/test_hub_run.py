"""A run whose every source is read through the ``datasets`` library from local data (no network):
a save_to_disk conversation set rendered with ChatML, a ShareGPT-style set in JSON Lines, and plain
text. 20 steps killed after a checkpoint and resumed give the uninterrupted run's logs, byte for
byte."""

import json

import pytest

from andrea_jax import train
from andrea_jax.config import load_config_file
from tests.util import REPO, kill_after_checkpoint, set_fields

datasets = pytest.importorskip("datasets")

NAMES = ("chat", "qa", "books")
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega").split()


def _sentence(i: int, n: int = 12) -> str:
  return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n)) + "."


def _datasets(tmp_path) -> dict:
  """The three sources' data: ``data.files`` overrides for each."""
  chat = [{"messages": [{"role": "user", "content": _sentence(i)},
                        {"role": "assistant", "content": _sentence(i + 1, 20)}]}
          for i in range(300)]
  datasets.Dataset.from_list(chat).save_to_disk(str(tmp_path / "chat_ds"))
  with open(tmp_path / "qa.jsonl", "w") as f:
    for i in range(300):
      f.write(json.dumps({"conversations": [{"from": "human", "value": _sentence(i, 6)},
                                            {"from": "gpt", "value": _sentence(i + 2, 15)}]})
              + "\n")
  with open(tmp_path / "books.jsonl", "w") as f:
    for i in range(200):
      f.write(json.dumps({"text": " ".join(_sentence(i + j) for j in range(8))}) + "\n")
  return {
      "data.files.chat.format": "hf", "data.files.chat.dataset": str(tmp_path / "chat_ds"),
      "data.files.chat.layout": "messages",
      "data.files.qa.format": "hf", "data.files.qa.dataset": "json",
      "data.files.qa.paths": str(tmp_path / "qa.jsonl"), "data.files.qa.layout": "messages",
      "data.files.qa.messages_field": "conversations", "data.files.qa.template": "plain",
      "data.files.books.format": "hf", "data.files.books.dataset": "json",
      "data.files.books.paths": str(tmp_path / "books.jsonl"),
      "data.files.books.streaming": True,
  }


OVERRIDES = {
    "model.num_layers": 2, "model.num_heads": 2, "model.d_model": 32, "model.d_mlp": 128,
    "model.max_len": 64, "data.seq_len": 32, "data.global_batch_size": 12,
    "train.num_steps": 20, "train.log_every": 1, "train.checkpoint_every": 4,
    "train.progress_bar": False, "train.plot": False, "train.tensorboard": False,
    "eval.every": 0, "eval.sequences_per_source": 2, "eval.sample_tokens": 0,
    "optim.warmup_steps": 4, "optim.peak_lr": 3e-3,
}


@pytest.mark.slow
def test_a_run_on_datasets_read_sources_resumes_bit_identically(tmp_path, data_cache):
  overrides = {**OVERRIDES, **_datasets(tmp_path)}
  arg = f"{REPO / 'experiments' / 'own_data.py'}:{','.join(NAMES)}"

  def config():
    c = load_config_file(arg)
    set_fields(c, overrides)
    return c

  whole = train.train_and_evaluate(config(), str(tmp_path / "whole"))
  assert whole["end_step"] == 20
  records = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").open()]
  assert all(f"loss/{n}" in r for r in records if "loss" in r for n in NAMES
             if r[f"share/{n}"] > 0)
  kill_after_checkpoint(arg, tmp_path / "killed", overrides, step=8)
  resumed = train.train_and_evaluate(config(), str(tmp_path / "killed"))
  assert 8 <= resumed["start_step"] < 20
  assert ((tmp_path / "killed" / "metrics.jsonl").read_text()
          == (tmp_path / "whole" / "metrics.jsonl").read_text())

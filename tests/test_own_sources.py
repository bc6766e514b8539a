"""A run over three sources of its own names, read from local files: the names reach the logs,
TensorBoard and the summary figure; a SIGKILL and a resume give the uninterrupted run; a resume
over the list reordered or renamed is refused, naming both lists, before anything compiles."""

import json
import re

import pytest

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax.data.corpora import synthetic
from andrea_jax import plots, train
from andrea_jax.config import load_config_file, with_sources
from tests.faults import harness
from tests.util import REPO, kill_after_checkpoint, set_fields, tensorboard_scalars

NAMES = ("code", "docs", "reference")
OVERRIDES = {
    "model.num_layers": 2, "model.num_heads": 2, "model.d_model": 32, "model.d_mlp": 128,
    "model.max_len": 64, "data.seq_len": 32, "data.global_batch_size": 12,
    "train.num_steps": 24, "train.log_every": 1, "train.checkpoint_every": 4,
    "train.progress_bar": False, "eval.every": 0, "eval.sequences_per_source": 2,
    "eval.sample_tokens": 0, "optim.warmup_steps": 4, "optim.peak_lr": 3e-3,
}


def _files(tmp_path):
  """Three JSONL files; their text is three of the synthetic corpus's styles (any text would do)."""
  paths = {}
  for name, style in zip(NAMES, ("repo-docstrings", "gutenberg", "dictionary")):
    path = tmp_path / f"{name}.jsonl"
    with open(path, "w") as f:
      for doc in synthetic.builtin_documents(style, scale=0.05):
        f.write(json.dumps({"text": doc}) + "\n")
    paths[name] = path
  return paths


def _overrides(paths):
  out = dict(OVERRIDES)
  for name, path in paths.items():
    out[f"data.files.{name}.paths"] = str(path)
  return out


def _config(overrides):
  c = load_config_file(f"{REPO / 'experiments' / 'own_data.py'}:{','.join(NAMES)}")
  set_fields(c, overrides)
  return c


@pytest.mark.slow
def test_own_sources_by_name_killed_and_resumed(tmp_path, data_cache):
  overrides = _overrides(_files(tmp_path))
  whole = tmp_path / "whole"
  summary = train.train_and_evaluate(_config(overrides), str(whole))
  records = [json.loads(line) for line in (whole / "metrics.jsonl").open()]
  steps = [r for r in records if "loss" in r]
  assert len(steps) == 24
  for name in NAMES:
    assert all(f"weight/{name}" in r and f"share/{name}" in r for r in steps)
    assert f"eval/loss/{name}" in records[-1]
  assert not any("hermes3" in k for r in records for k in r)
  tags = {tag for tag, _, _ in tensorboard_scalars(whole / "tensorboard")}
  assert {f"weight/{n}" for n in NAMES} <= tags and {f"loss/{n}" for n in NAMES} <= tags
  fig = plots.summary_figure(str(whole), NAMES)
  legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes]
  assert list(NAMES) in legends[1:]
  assert (whole / "summary.png").is_file() and summary["plot"].endswith("summary.png")

  # The same run from the command line, killed once a checkpoint exists, then resumed.
  killed = tmp_path / "killed"
  kill_after_checkpoint(f"{REPO / 'experiments' / 'own_data.py'}:{','.join(NAMES)}", killed,
                        overrides, step=8)
  resumed = train.train_and_evaluate(_config(overrides), str(killed))
  assert 8 <= resumed["start_step"] < 24
  assert (killed / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()

  # Another list, or the same in another order: refused before anything compiles.
  for names in (("docs", "code", "reference"), ("code", "docs", "manual")):
    c = with_sources(_config(overrides), names)
    c.data.files[names[-1]].paths = overrides["data.files.reference.paths"]
    c.data.corpus = "files"
    message = (f"saved over the sources {list(NAMES)}, and this run's are {list(names)}: resume "
               "with the same list in the same order")
    with pytest.raises(ckpt_lib.CheckpointError, match=re.escape(message)):
      with harness.count_compiles() as compiled:
        train.train_and_evaluate(c, str(killed))
    assert compiled.count == 0

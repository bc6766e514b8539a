"""Rewinding the run logs on resume: one rule, ``step < k`` kept, for metrics and samples alike."""

import json
import os
import types

from andrea_jax import logs


def _jsonl(*records) -> str:
  return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)


# A run logging every 5 steps and evaluating every 10, in the order the trainer writes them: the
# training record of step 9 (the 10th update) before the evaluation of the weights after 10 steps.
TRAIN_4, TRAIN_9 = {"step": 4, "loss": 5.1}, {"step": 9, "loss": 4.7}
EVAL_10 = {"step": 10, "eval/mean_loss": 4.6, "samples": [{"prompt": "The ", "greedy": "a"}]}
TRAIN_14, TRAIN_19 = {"step": 14, "loss": 4.2}, {"step": 19, "loss": 3.9}
EVAL_20 = {"step": 20, "eval/mean_loss": 3.8}
RUN = (TRAIN_4, TRAIN_9, EVAL_10, TRAIN_14, TRAIN_19, EVAL_20)


def test_truncate_jsonl_keeps_the_records_before_the_checkpoint(tmp_path):
  path = tmp_path / "metrics.jsonl"
  # Resuming from checkpoint 10: the training records of steps 0..9 are kept; the evaluation at
  # step 10 is made again by the resumed run, so it goes with everything after it.
  for resume, kept in [(10, RUN[:2]), (11, RUN[:3]), (20, RUN[:5]), (0, ()), (21, RUN)]:
    path.write_text(_jsonl(*RUN))
    logs.truncate_jsonl(str(path), resume)
    assert path.read_text() == _jsonl(*kept), resume


def test_truncate_jsonl_stops_at_a_line_cut_by_a_kill(tmp_path):
  path = tmp_path / "metrics.jsonl"
  whole = _jsonl(TRAIN_4, TRAIN_9)
  # Cut inside the object, and cut just before its newline: neither was committed.
  for cut in (_jsonl(TRAIN_14)[:9], _jsonl(TRAIN_14)[:-1]):
    path.write_text(whole + cut)
    logs.truncate_jsonl(str(path), 100)
    assert path.read_text() == whole
  logs.truncate_jsonl(str(tmp_path / "absent.jsonl"), 10)
  assert not (tmp_path / "absent.jsonl").exists()


SAMPLES_10 = "=== step 10 ===\n['The '] greedy : 'the the'\n['The '] sampled: 'a cat'\n"
SAMPLES_20 = "=== step 20 ===\n['The '] greedy : '=== step 5 ==='\n['The '] sampled: 'dog'\n"


def test_truncate_samples_applies_the_same_rule_to_blocks(tmp_path):
  path = tmp_path / "samples.txt"
  # A block goes with its header's step; a sample that looks like a header (inside quotes) does
  # not start a block.
  for resume, kept in [(10, ""), (11, SAMPLES_10), (20, SAMPLES_10), (21, SAMPLES_10 + SAMPLES_20)]:
    path.write_text(SAMPLES_10 + SAMPLES_20)
    logs.truncate_samples(str(path), resume)
    assert path.read_text() == kept, resume
  # A kill while the block of step 20 was written came before checkpoint 20 was saved: the run
  # resumes from an earlier one, and the block's lines (the cut one too) go.
  path.write_text(SAMPLES_10 + SAMPLES_20[:30])
  logs.truncate_samples(str(path), 20)
  assert path.read_text() == SAMPLES_10
  path.write_text(SAMPLES_10 + SAMPLES_20[:30])
  logs.truncate_samples(str(path), 100)   # only complete lines survive, whatever the step
  assert path.read_text() == SAMPLES_10 + SAMPLES_20[:SAMPLES_20.index("\n") + 1]


def test_a_run_resumed_within_the_same_second_keeps_both_event_files(tmp_path, monkeypatch):
  """tensorboardX names an event file by the second and opens it with "wb": without a suffix, a
  run resumed within the second of the last one overwrote its file and lost steps 0..k-1. Both
  files are kept, in the order written, and TensorBoard shows the first run's steps before the
  resume step and the resumed run's from it on."""
  import tensorboardX.event_file_writer
  from tests.util import tensorboard_scalars

  # Both runs open their files in this second (the clock of tensorboardX's writer only).
  monkeypatch.setattr(tensorboardX.event_file_writer, "time",
                      types.SimpleNamespace(time=lambda: 1_764_512_345.25))
  first = logs.RunLogger(str(tmp_path), 0)
  for step in range(6):
    first.write({"step": step, "loss": 10.0 - step})
  first.close()
  resumed = logs.RunLogger(str(tmp_path), 3)
  for step in range(3, 6):
    resumed.write({"step": step, "loss": 100.0 - step})
  resumed.close()
  monkeypatch.undo()
  names = sorted(os.listdir(tmp_path / "tensorboard"))
  assert len(names) == 2 and all(".tfevents.1764512345." in n for n in names)
  assert tensorboard_scalars(tmp_path / "tensorboard") == [
      ("loss", 0, 10.0), ("loss", 1, 9.0), ("loss", 2, 8.0),
      ("loss", 3, 97.0), ("loss", 4, 96.0), ("loss", 5, 95.0)]

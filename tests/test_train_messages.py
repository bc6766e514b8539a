"""train: what a resumed run says about its checkpoint's config, and what a flagged cliff says."""

from andrea_jax import config as config_lib
from andrea_jax import train


def test_changes_are_listed_by_field_and_free_fields_are_not():
  saved = {"seed": 0, "optim": {"peak_lr": 1e-3, "warmup_steps": 10},
           "train": {"num_steps": 100, "stop_step": 50, "log_every": 10},
           "eval": {"every": 25}, "mesh": {"data": 1}, "curriculum": {"prompts": ["a", "b"]}}
  current = {"seed": 7, "optim": {"peak_lr": 0.5, "warmup_steps": 10},
             "train": {"num_steps": 100, "stop_step": 0, "log_every": 1},
             "eval": {"every": 5}, "mesh": {"data": 2}, "curriculum": {"prompts": ("a", "b")},
             "cliff": {"window": 3}}
  assert train.config_changes(saved, current) == [
      "cliff.window: (absent) -> 3", "optim.peak_lr: 0.001 -> 0.5", "seed: 0 -> 7"]


def test_the_same_config_through_json_has_no_change():
  import json
  c = config_lib.base_config()
  saved = json.loads(json.dumps(c.to_dict()))   # what the checkpoint's meta holds
  assert train.config_changes(saved, c.to_dict()) == []
  assert train.config_changes(None, c.to_dict()) == []
  c.curriculum.eta = 0.25
  assert train.config_changes(saved, c.to_dict()) == [
      f"curriculum.eta: {saved['curriculum']['eta']!r} -> 0.25"]


def test_a_cliff_names_its_source_and_offers_the_exclusion():
  rec = {"loss": 0.4123, "cliff/source": "repo-docs", "curriculum/geometry": 1}
  names = ("v2_warmup", "v2_firehose", "v3_polish")
  assert train.cliff_message(rec, 150, names, respond=False) == (
      "zombie cliff at step 150: loss 0.412 far below its recent values; source 'repo-docs'; to "
      "exclude it, add it to curriculum.geometries.v2_firehose.exclude and resume, or train with "
      "--config.cliff.respond=True, which excludes what the detector flags")
  assert train.cliff_message(rec, 150, names, respond=True).endswith(
      "source 'repo-docs' excluded from the next phase on")
  assert train.cliff_message({**rec, "cliff/source": None}, 150, names, False).endswith(
      "no source named")

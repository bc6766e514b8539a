"""The arms: valid runs of the demo that differ from each other in the mixture (and the gain's
probe, and one arm's target piece) only."""

import json

import numpy as np
import pytest

from andrea_jax import curriculum, runconfig
from andrea_jax.config import load_config_file
from study.data_constrained import arms, score

OTHERS = [a for a in arms.ARMS if a not in ("best_static", "best_schedule")]


def _flat(d, prefix=""):
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out |= _flat(v, f"{prefix}{k}.")
    else:
      out[prefix + k] = v
  return out


def _diff(a, b):
  fa, fb = _flat(a.to_dict()), _flat(b.to_dict())
  return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))


def test_the_base_is_the_demo_on_the_pieces(study_pieces):
  demo = load_config_file(arms.DEMO)
  c = arms.get_config("arm=uniform,seed=3")
  assert c.model.to_dict() == demo.model.to_dict() and c.optim.to_dict() == demo.optim.to_dict()
  assert (c.data.seq_len, c.data.global_batch_size, c.train.num_steps) == (128, 32, 1000)
  assert c.seed == 3 and c.sources == arms.SOURCES
  assert c.eval.untrained == "doc-dev,doc-test" and c.eval.sequences_per_source == 256
  assert {k: v for k, v in c.eval.target.items() if v} == {"doc_dev": 1.0}
  assert c.cliff.respond is False and c.data.corpus == "files"
  assert c.data.files.doc_small.paths == f"{study_pieces}/doc-small.jsonl"
  assert c.data.files.doc_dev.eval_fraction == 0.5


@pytest.mark.parametrize("arm", OTHERS)
def test_every_arm_differs_from_uniform_in_its_mixture_only(arm, study_pieces):
  c, u = arms.get_config(f"arm={arm}"), arms.get_config("arm=uniform")
  allowed = ("curriculum.", "probes.") + (("data.files.doc_small.",) if arm == "target_only_dev"
                                          else ())
  assert [k for k in _diff(c, u) if not k.startswith(allowed)] == []
  run = runconfig.build(c)
  assert bool(run.step.probes) == (arm in arms.GAIN_ARMS)
  if arm in arms.GAIN_ARMS:
    assert dict(run.step.probes[0].rows) == {"probe": 10, "target": 8}   # 5 trainable sources
    assert c.probes.target_gain.target_split == "train"
  assert (c.curriculum.mixer.get("reward") == "target_gain") == (arm == "walk_gain")
  if arm == "target_only_dev":
    assert c.data.files.doc_small.paths.endswith("/doc-plus-dev.jsonl")


def test_the_mixers_the_arms_name():
  names = {a: arms.get_config(f"arm={a}").curriculum.mixer.name for a in
           ("walk_gain", "walk_progress", "exp3", "dga", "uniform")}
  assert names == {"walk_gain": "andrea", "walk_progress": "andrea", "exp3": "exp3",
                   "dga": "study.data_constrained.mixers:dga", "uniform": "static"}
  assert arms.get_config("arm=walk_progress").curriculum.mixer.reward == "progress"


def _held(c):
  m = c.curriculum.mixer.mixture
  return {s: m[curriculum.source_key(s)] for s in c.sources if m[curriculum.source_key(s)]}


def test_static_mixtures_worked_out_by_hand(study_pieces):
  assert arms.static_mixture(0.4, "nrcl") == pytest.approx(
      {"doc-small": 0.4, "noisy-docstrings": 0.15, "reference": 0.15, "python-code": 0.15,
       "licenses": 0.15})
  assert _held(arms.get_config("arm=t05_nr")) == pytest.approx(
      {"doc-small": 0.05, "noisy-docstrings": 0.475, "reference": 0.475})
  assert _held(arms.get_config("arm=target_only")) == {"doc-small": 1.0}
  assert _held(arms.get_config("arm=uniform")) == {s: 1.0 for s in arms.TRAINABLE}
  with pytest.raises(ValueError, match="names no other source"):
    arms.static_mixture(0.4, "")


def test_schedules_halve_then_double_the_target_share(study_pieces):
  late, early = (arms.schedule_mixtures(0.1, "nr", k) for k in ("late", "early"))
  assert late[0] == pytest.approx({"doc-small": 0.05, "noisy-docstrings": 0.475,
                                   "reference": 0.475})
  assert late[1] == pytest.approx({"doc-small": 0.2, "noisy-docstrings": 0.4, "reference": 0.4})
  assert early == (late[1], late[0])
  assert arms.schedule_mixtures(0.6, "nrcl", "late")[1] == {"doc-small": 1.0}
  c = arms.get_config("arm=late_t10_nr,steps=1250")
  g = c.curriculum.geometries
  assert (g.first.start_step, g.second.start_step) == (0, 750)
  assert g.second.mixture.doc_small == pytest.approx(0.2) and g.second.mixture.licenses == 0
  assert c.train.num_steps == 1250 and c.eval.every == 250
  runconfig.build(c)


def test_unimax_gives_the_designs_shares():
  tokens = {"doc-small": 32_000, "licenses": 38_947, "reference": 436_235,
            "noisy-docstrings": 1_500_000, "python-code": 7_585_253}
  m = arms.unimax_mixture(tokens, 4_096_000, 16)
  # T capped at 16 x 32K = 512K = 12.5%; L at 16 x 38,947 = 623,152 = 15.21%; the rest equal.
  assert m["doc-small"] == pytest.approx(0.125)
  assert m["licenses"] == pytest.approx(623_152 / 4_096_000)
  rest = (4_096_000 - 512_000 - 623_152) / 3 / 4_096_000
  for s in ("reference", "noisy-docstrings", "python-code"):
    assert m[s] == pytest.approx(rest)
  assert sum(m.values()) == pytest.approx(1.0)


def test_unimax_reads_the_pieces_tokens(study_pieces):
  tokens = arms.piece_tokens(study_pieces)
  w = _held(arms.get_config("arm=unimax16"))
  assert w["doc-small"] == pytest.approx(16 * tokens["doc-small"] / 4_096_000)


def _fake(root, arm, seed, select, target="32k"):
  d = root / score.run_name({"arm": arm, "seed": seed, "target": target})
  d.mkdir(parents=True)
  (d / "metrics.jsonl").write_text(json.dumps(
      {"step": 1000, arms.SCORE_KEY: 2.0, arms.SELECT_KEY: select}) + "\n")


def test_best_static_and_best_schedule_are_the_pilots_picks(study_pieces, tmp_path, monkeypatch):
  monkeypatch.setattr(score, "ROOT", str(tmp_path))
  with pytest.raises(ValueError, match="has no pick yet"):
    arms.get_config("arm=best_static")
  for name, loss in zip(score.GRID, (1.9, 1.8, 1.7, 1.75, 1.85)):
    _fake(tmp_path, name, 100, loss)
  _fake(tmp_path, "t20_nr", 100, 1.72)
  c = arms.get_config("arm=best_static,seed=2")
  assert _held(c) == pytest.approx(arms.static_mixture(0.2, "nrcl")) and c.seed == 2
  _fake(tmp_path, "late_t20_nrcl", 100, 1.6)
  _fake(tmp_path, "early_t20_nrcl", 100, 1.65)
  g = arms.get_config("arm=best_schedule").curriculum.geometries
  assert g.first.mixture.doc_small == pytest.approx(0.1)


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match="takes arm="):
    arms.get_config("arm=uniform,width=2")
  with pytest.raises(ValueError, match="unknown arm 'nope'"):
    arms.get_config("arm=nope")
  with pytest.raises(ValueError, match="target= takes"):
    arms.get_config("arm=uniform,target=4k")


def test_the_dga_arm_refuses_to_run_without_its_probe(study_pieces):
  c = arms.get_config("arm=dga")
  c.probes.target_gain.every = 0
  with pytest.raises(ValueError, match="target_gain"):
    runconfig.build(c)
  assert np.isclose(arms.GAIN["every"], 4)

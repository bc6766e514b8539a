"""The zombie-cliff detector inside the real training loop: a planted cliff is caught, attributed
to repo-docs and answered by its exclusion; the same run without the plant raises nothing."""


import ml_collections
import pytest

from andrea_jax import logs
from andrea_jax import train
from andrea_jax import curriculum
from andrea_jax.curriculum import geometry
from tests.util import small_run_config

STEPS = 42
PLANT = 30      # first step whose repo-docs rows carry the memorised string
MAX_PHASE = 7   # phases last 4-7 steps
LAG = 2         # the curriculum's decision lag (steps between a decision and its phase)


def _experiment():
  from experiments import zombie_cliff
  return zombie_cliff


def _config():
  """The small model; only chat, extra-05 and repo-docs, 1/3 each; the detector armed at step 20
  on a 10-step window, responding. A high rate so that the carrier's string is memorised (its loss
  under 0.01) well before the plant."""
  c = small_run_config(num_steps=STEPS)
  c.train.update(log_every=1, checkpoint_every=0)
  c.eval.update(sample_tokens=0)
  c.optim.peak_lr = 1e-2
  g = ml_collections.ConfigDict()
  g.docs = geometry("docs", 0, only=("chat", "extra-05", "repo-docs"))
  c.curriculum.geometries = g
  c.curriculum.update(phase_min_steps=4, phase_max_steps=MAX_PHASE, decision_lag=LAG)
  curriculum.set_mixer(c, "static")
  c.cliff.update(window=10, warmup=20, cooldown=10, respond=True)
  return c


def _records(workdir):
  return [r for r in logs.read_jsonl(str(workdir / "metrics.jsonl")) if "loss" in r]


@pytest.mark.slow
def test_a_planted_cliff_is_flagged_on_repo_docs_and_excluded(tmp_path, data_cache, capsys):
  with _experiment().plant_passage("z", start_step=PLANT, carrier="extra-05"):
    train.train_and_evaluate(_config(), str(tmp_path))
  records = _records(tmp_path)
  assert [r["step"] for r in records] == list(range(STEPS))
  flags = [r for r in records if "cliff/score" in r]
  assert [(r["step"], r["cliff/source"]) for r in flags] == [(PLANT, "repo-docs")]
  assert flags[0]["cliff/score"] > 6.0
  assert flags[0]["loss/repo-docs"] < 0.1 < 2.0 < records[PLANT - 1]["loss/repo-docs"]
  # Before the remedy every step has 1/3 of each source. The remedy starts with the first phase
  # still undecided at the flag: decided at its start - lag - 1 > PLANT, and starting at most one
  # phase after the latest one already decided (which starts by PLANT + lag + 1).
  zero = [r["step"] for r in records if r["weight/repo-docs"] == 0.0]
  assert zero, "repo-docs was never excluded"
  first = zero[0]
  assert zero == list(range(first, STEPS))
  assert PLANT + LAG + 2 <= first <= PLANT + LAG + 1 + MAX_PHASE
  assert records[first]["curriculum/phase_start"] == first
  for r in records:
    if r["step"] < first:
      assert r["weight/repo-docs"] == pytest.approx(1 / 3, abs=1e-6)
    else:
      assert r["weight/chat"] == pytest.approx(0.5, abs=1e-6)
      assert r["weight/extra-05"] == pytest.approx(0.5, abs=1e-6)
      assert "loss/repo-docs" not in r     # no repo-docs rows in the batch
  assert f"zombie cliff at step {PLANT}" in capsys.readouterr().out


@pytest.mark.slow
def test_the_same_run_without_the_plant_raises_no_flag(tmp_path, data_cache):
  train.train_and_evaluate(_config(), str(tmp_path))
  records = _records(tmp_path)
  assert len(records) == STEPS
  assert not [r["step"] for r in records if "cliff/score" in r or "cliff/source" in r]
  assert all(r["weight/repo-docs"] == pytest.approx(1 / 3, abs=1e-6) for r in records)

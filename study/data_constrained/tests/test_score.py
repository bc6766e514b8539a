"""The rules fixed in advance, on hand-made runs and tables: the pilot's picks, "beats", the
equal-compute worth on a turned curve, the verdict, the batches and the report."""

import json

import pytest

from study import equal_compute
from study.data_constrained import arms, report, run, score

SEL = score.SELECTION_SEED


def _fake(root, arm, seed, loss=2.0, select=2.0, steps=1000, target="32k", weights=None):
  args = {"arm": arm, "seed": seed, "steps": steps, "target": target}
  d = root / score.run_name(args)
  d.mkdir(parents=True, exist_ok=True)
  w = weights or {s: 1 / len(arms.TRAINABLE) for s in arms.TRAINABLE}
  recs = [{"step": t, "loss": 2.0, "loss/doc-small": 1.0, "data/epochs/doc-small": t / 40,
           **{f"weight/{s}": v for s, v in w.items()}} for t in range(9, steps, 10)]
  recs.append({"step": steps, arms.SCORE_KEY: loss, arms.SELECT_KEY: select})
  (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_run_names():
  assert score.run_name({"arm": "walk_gain", "seed": 0}) == "walk_gain_s0"
  assert score.run_name({"arm": "best_static", "seed": 1, "steps": 1250,
                         "target": "32k"}) == "best_static_s1_n1250"
  assert score.run_name({"arm": "t40_nrcl", "seed": 100, "target": "8k"}) == "t40_nrcl_s100_8k"


def test_an_unfinished_run_has_no_result(tmp_path):
  _fake(tmp_path, "uniform", 0, steps=1000)
  assert score.result({"arm": "uniform", "seed": 0}, str(tmp_path))[arms.SCORE_KEY] == 2.0
  assert score.result({"arm": "uniform", "seed": 0, "steps": 1250}, str(tmp_path)) is None
  # a record of the score at another step than the last is no result
  d = tmp_path / "uniform_s1"
  d.mkdir()
  (d / "metrics.jsonl").write_text(json.dumps({"step": 500, arms.SCORE_KEY: 1.0}) + "\n")
  assert score.result({"arm": "uniform", "seed": 1}, str(tmp_path)) is None


def test_the_pilot_picks_on_dev_b_never_on_the_score(tmp_path):
  root = str(tmp_path)
  assert score.grid_pick("32k", root) is None and score.regime(root) is None
  # t10 has the lowest dev-B; t40 the lowest score (never read for picking).
  for name, sel, loss in zip(score.GRID, (1.9, 1.8, 1.75, 1.7, 1.72), (1.9, 1.0, 1.8, 1.8, 1.8)):
    _fake(tmp_path, name, SEL, loss=loss, select=sel)
  assert score.grid_pick("32k", root) == "t10_nrcl" and score.regime(root) == "32k"
  assert [a["arm"] for a in run.pilot_plan(root)][-1] == "t10_nr"
  assert score.static_pick("32k", root) is None                # step 2 not run
  _fake(tmp_path, "t10_nr", SEL, select=1.69)
  assert score.static_pick("32k", root) == "t10_nr"
  assert [a["arm"] for a in run.pilot_plan(root)][-2:] == ["late_t10_nr", "early_t10_nr"]
  _fake(tmp_path, "late_t10_nr", SEL, select=1.7)
  _fake(tmp_path, "early_t10_nr", SEL, select=1.7)             # a tie: the first
  assert score.schedule_pick("32k", root) == "late_t10_nr"
  assert score.pilot_pick("best_schedule", "32k", root) == "late_t10_nr"


def test_the_regime_check_falls_back_to_8k_then_stops(tmp_path):
  root = str(tmp_path)
  for name, sel in zip(score.GRID, (1.5, 1.8, 1.75, 1.7, 1.72)):
    _fake(tmp_path, name, SEL, select=sel)
  assert score.grid_pick("32k", root) == "target_only" and score.regime(root) is None
  assert {a["target"] for a in run.pilot_plan(root)[5:]} == {"8k"}
  assert run.plan("core0", root) == []
  with pytest.raises(ValueError, match="no pick yet"):
    score.pilot_pick("best_static", "32k", root)
  for name, sel in zip(score.GRID, (1.6, 1.5, 1.75, 1.7, 1.72)):
    _fake(tmp_path, name, SEL, select=sel, target="8k")
  assert score.regime(root) == "8k"
  assert {a["target"] for a in run.plan("core0", root)} == {"8k"}
  assert run.plan("optional", root) == []                      # options dropped
  _fake(tmp_path, "target_only", SEL, select=1.0, target="8k")   # overwrite: it wins again
  assert score.regime(root) == "none" and run.plan("core0", root) == []


def test_the_batches_in_priority_order(tmp_path):
  root = str(tmp_path)
  for name, sel in zip(score.GRID, (1.9, 1.8, 1.7, 1.75, 1.85)):
    _fake(tmp_path, name, SEL, select=sel)
  # before step 2 has run, best_static and best_schedule wait; "all" fills a slot with the next
  assert [a["arm"] for a in run.plan("core0", root)] == [
      a for a in run.CORE if a not in ("best_static", "best_schedule")]
  assert [a["arm"] for a in run.plan("all", root)][5:8] == ["t20_nr", "walk_gain", "target_only"]
  _fake(tmp_path, "t20_nr", SEL, select=1.8)
  for name in ("late_t20_nrcl", "early_t20_nrcl"):
    _fake(tmp_path, name, SEL, select=1.8)
  assert [a["arm"] for a in run.plan("core0", root)] == list(run.CORE)
  assert len(run.plan("decisive", root)) == 8
  assert [(a["arm"], a["steps"]) for a in run.plan("long", root)] == (
      [("best_static", 1250)] * 3 + [("best_static", 1500)] * 3)
  assert {a["seed"] for a in run.plan("decisive34", root)} == {3, 4}
  assert len(run.plan("rest", root)) == 8 + 6 and len(run.plan("optional", root)) == 6


def test_beats_is_more_than_the_larger_sd():
  a, b = [1.0, 1.2], [1.5, 1.5]               # means 1.1 and 1.5; sds 0.1414 and 0
  assert score.beats(a, b) is True
  assert score.beats([1.0, 1.4], [1.4, 1.4]) is False   # 0.2 lower, sd 0.283
  assert score.beats([1.0], [2.0, 2.1]) is None
  assert score.stats([1.0, 1.2]) == (pytest.approx(1.1), pytest.approx(0.02 ** 0.5), 2)
  # Welch: variances 0.01 each, n = 3: t = -0.4 / sqrt(0.01/3 + 0.01/3) = -4.90 on 4 degrees of
  # freedom: one-sided p = 0.0040.
  assert score.welch_p([1.0, 1.1, 1.2], [1.4, 1.5, 1.6]) == pytest.approx(0.0040, abs=2e-4)
  assert score.welch_p([1.4, 1.5, 1.6], [1.0, 1.1, 1.2]) > 0.99


def test_the_worth_reads_a_turned_curve_on_its_envelope(tmp_path):
  root = str(tmp_path)
  for s in range(3):
    for n, loss in zip(score.LENGTHS, (2.0, 1.8, 1.9)):
      _fake(tmp_path, "best_static", s, loss=loss + 0.01 * (s - 1), steps=n)
  lengths, means, seeds = score.curve("best_static", "32k", root)
  assert lengths == [1000, 1250, 1500] and seeds == [0, 1, 2]
  assert means == pytest.approx([2.0, 1.8, 1.9])
  # 1.9: half way from 2.0 to 1.8 on the envelope: 1000 x 1.25^0.5 steps, over 1000 x 1.16.
  value, rel = score.worth(1.9, lengths, means, 0.16)
  assert rel == "=" and value == pytest.approx(1000 * 1.25 ** 0.5 / 1160)
  assert score.worth(1.7, lengths, means, 0.16) == (pytest.approx(1500 / 1160),
                                                    equal_compute.NOT_REACHABLE)
  assert score.worth(1.7, [], [], 0.16) is None


TABLE = {"best_static": [1.50, 1.51, 1.49], "target_only": [1.60, 1.61, 1.59],
         "uniform": [1.58, 1.59, 1.57], "unimax16": [1.55, 1.56, 1.54],
         "best_schedule": [1.47, 1.48, 1.46], "walk_gain": [1.45, 1.46, 1.44]}


def test_verdict_a_and_its_conditions():
  v = score.verdict(TABLE, (1.2, "="), pilot_passed=True)
  assert v["verdict"] == "A"
  assert all(v["conditions"][k] for k in v["conditions"] if k.startswith(("A", "regime")))
  # A not-reachable worth of 1.29 is a lower bound: it passes; a "<" never does.
  assert score.verdict(TABLE, (1.29, equal_compute.NOT_REACHABLE), True)["verdict"] == "A"
  assert score.verdict(TABLE, (0.86, "<"), True)["verdict"] == "D"


def test_verdict_b_when_a_schedule_beats_the_walk_or_beats_best_static_alone():
  t = dict(TABLE, best_schedule=[1.40, 1.41, 1.39])
  assert score.verdict(t, (1.2, "="), True)["verdict"] == "B"
  t = dict(TABLE, walk_gain=[1.50, 1.51, 1.49], best_schedule=[1.45, 1.46, 1.44])
  assert score.verdict(t, (1.0, "="), True)["verdict"] == "B"


def test_verdict_c_parity_without_tuning_and_d_otherwise():
  t = dict(TABLE, walk_gain=[1.50, 1.52, 1.49], best_schedule=[1.50, 1.51, 1.49])
  assert score.verdict(t, (1.0, "="), True)["verdict"] == "C"
  t = dict(t, unimax16=[1.51, 1.50, 1.50])              # the walk no longer beats UniMax
  assert score.verdict(t, (1.0, "="), True)["verdict"] == "D"


def test_no_regime_no_verdict_and_missing_runs_leave_it_undecided():
  assert score.verdict(TABLE, (1.2, "="), pilot_passed=False)["verdict"] == "regime not reached"
  t = dict(TABLE, target_only=[1.45, 1.46, 1.44])       # best_static no longer beats it
  assert score.verdict(t, (1.2, "="), True)["verdict"] == "regime not reached"
  assert score.verdict(TABLE, None, True)["verdict"] == "undecided: A"
  assert score.verdict(dict(TABLE, target_only=[1.6]), (1.2, "="), True)["verdict"] == (
      "undecided: regime")


def test_the_report_and_figures_from_fake_runs(tmp_path, monkeypatch):
  root = str(tmp_path)
  monkeypatch.setattr(score, "gain_overhead", lambda root=None: 0.16)
  for name, sel in zip(score.GRID, (1.9, 1.8, 1.7, 1.75, 1.85)):
    _fake(tmp_path, name, SEL, select=sel)
  for arm, losses in TABLE.items():
    for s, loss in enumerate(losses):
      _fake(tmp_path, arm, s, loss=loss, weights={"doc-small": 0.6, "licenses": 0.4,
                                                   "noisy-docstrings": 0, "reference": 0,
                                                   "python-code": 0})
  text = report.report(root)
  assert "Verdict: **undecided: A**" in text                  # best_static's curve has not run
  assert "| `walk_gain` | 3 | 1.4500 | 0.0100 |" in text
  # beside: doc-small's epochs at the last logged step (999 / 40), the mean mixture, the gap
  # (training loss 1.0 less the score 1.45), no cliff flag
  assert ("| `walk_gain` | 25.0 / 0.0 / 0.0 / 0.0 / 0.0 | 0.60 / 0.00 / 0.00 / 0.00 / 0.40 | "
          "-0.450 | 0.0 |") in text
  from study.data_constrained import figures
  paths = figures.make_all(root, str(tmp_path / "figs"))
  assert [p.rsplit("/", 1)[1] for p in paths] == ["mixture_paths.png", "gains.png", "scores.png"]

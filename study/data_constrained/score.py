r"""The study's rules, fixed before any scored run: the runs' results, the pilot's picks, the
statistics, the equal-compute worth and the verdict.

* **Results.** A run's result is its last evaluation record, if it reached its last step:
  ``eval/loss/doc-test`` (the score, :data:`arms.SCORE_KEY`) and ``eval/target_loss`` (dev-B, the
  selection metric, :data:`arms.SELECT_KEY`). Nothing is ever picked on the score.
* **The pilot** (seed :data:`SELECTION_SEED`, never scored). Step 1: the grid :data:`GRID` (T at
  100%, 40%, 20%, 10%, 5%, the rest equally over N, R, C, L); the lowest dev-B loss wins (ties: the
  first in :data:`GRID`). Step 2: its share with the rest over N and R only; ``best_static`` is the
  better of the two. Step 3: the ``late`` and ``early`` schedules of ``best_static``;
  ``best_schedule`` is the better. Step 4, the regime check: if ``target_only`` wins step 1, the
  pieces are cut again with ``doc-small`` at about 8K tokens (``target=8k``) and steps 1-3 run
  again; if it wins again, the study stops (:func:`regime` is ``"none"``).
* **Beats.** Arm ``a`` beats ``b`` when its mean score is lower by more than the larger of the two
  arms' standard deviations over seeds (both on two seeds or more; else undecided). A one-sided
  Welch t-test is reported beside it and decides nothing.
* **Worth.** The walk's mean score in ``best_static``'s steps: ``best_static``'s curve is its mean
  score at 1000, 1250 and 1500 steps (each on its own schedule; over the seeds that ran every
  length), read on its lower envelope (:mod:`study.equal_compute`), divided by the walk's compute,
  1000 x (1 + the target gain's FLOPs per step, XLA's count, :func:`gain_overhead`).
* **The verdict** (:func:`verdict`), the first of A, B, C, D that holds, after the regime check:
  the regime is confirmed when the pilot's step 4 passed and ``best_static`` beats
  ``target_only``; otherwise the verdict reads "regime not reached", whatever the walk does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import numpy as np

from study import equal_compute
from study.data_constrained import arms

ROOT = os.environ.get("DATA_CONSTRAINED_ROOT",
                      str(arms.REPO / "runs" / "data_constrained" / "runs"))
SELECTION_SEED = 100
GRID = ("target_only", "t40_nrcl", "t20_nrcl", "t10_nrcl", "t05_nrcl")
SEEDS = {"walk_gain": range(5), "best_static": range(5)}   # the two decisive arms; others 0-2
LENGTHS = (1000, 1250, 1500)           # best_static's (and uniform's) own-schedule run lengths
WORTH_NEEDED = 1.10                    # verdict A's equal-compute threshold, after the gain's cost


def seeds_of(arm: str) -> range:
  return SEEDS.get(arm, range(3))


def run_name(args: Mapping) -> str:
  """``walk_gain_s0``, ``best_static_s1_n1250``, ``t40_nrcl_s100_8k``."""
  name = f"{args['arm']}_s{args['seed']}"
  if int(args.get("steps", arms.STEPS)) != arms.STEPS:
    name += f"_n{int(args['steps'])}"
  if args.get("target", "32k") != "32k":
    name += f"_{args['target']}"
  return name


def config_arg(args: Mapping) -> str:
  return ",".join(f"{k}={v}" for k, v in args.items())


def records(args: Mapping, root: str = ROOT) -> list[dict]:
  path = os.path.join(root, run_name(args), "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def result(args: Mapping, root: str = ROOT) -> dict | None:
  """The last evaluation of a run that reached its last step (``None`` otherwise)."""
  steps = int(args.get("steps", arms.STEPS))
  final = [r for r in records(args, root) if arms.SCORE_KEY in r and r["step"] == steps]
  return final[-1] if final else None


# --------------------------------------------------------------------------------------------------
# The pilot.


def _select(names: Sequence[str], target: str, root: str) -> str | None:
  """The name of lowest dev-B loss at the selection seed (ties: the first); ``None`` until all
  have run."""
  losses = []
  for n in names:
    r = result({"arm": n, "seed": SELECTION_SEED, "target": target}, root)
    if r is None:
      return None
    losses.append(r[arms.SELECT_KEY])
  return names[int(np.argmin(losses))]


def grid_pick(target: str = "32k", root: str = ROOT) -> str | None:
  return _select(GRID, target, root)


def informed_name(pick: str) -> str:
  """Step 2's run: the grid pick's share of T, the rest over N and R only."""
  return pick.rsplit("_", 1)[0] + "_nr"


def static_pick(target: str = "32k", root: str = ROOT) -> str | None:
  pick = grid_pick(target, root)
  if pick is None or pick == "target_only":
    return pick
  return _select((pick, informed_name(pick)), target, root)


def schedule_names(static: str) -> tuple[str, str]:
  return f"late_{static}", f"early_{static}"


def schedule_pick(target: str = "32k", root: str = ROOT) -> str | None:
  static = static_pick(target, root)
  if static is None or static == "target_only":
    return None
  return _select(schedule_names(static), target, root)


def regime(root: str = ROOT) -> str | None:
  """The pieces the scored runs use: ``"32k"``, ``"8k"`` (the fallback), ``"none"`` (target-only
  won both grids: stop), or ``None`` while the grid that decides has not run."""
  for target in ("32k", "8k"):
    pick = grid_pick(target, root)
    if pick is None:
      return None
    if pick != "target_only":
      return target
  return "none"


def pilot_pick(arm: str, target: str = "32k", root: str = ROOT) -> str:
  """The mixture ``best_static`` or ``best_schedule`` stands for (a ``ValueError`` until the pilot
  has picked it)."""
  pick = (static_pick if arm == "best_static" else schedule_pick)(target, root)
  if pick is None or pick == "target_only":
    raise ValueError(f"{arm} (target {target}) has no pick yet: python -m "
                     "study.data_constrained.run --batch pilot")
  return pick


# --------------------------------------------------------------------------------------------------
# Statistics.


def stats(x: Sequence[float]) -> tuple[float, float, int]:
  """``(mean, sd with ddof 1 (0 for one value), n)``."""
  x = np.asarray(x, np.float64)
  return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0, int(x.size)


def beats(a: Sequence[float], b: Sequence[float]) -> bool | None:
  """Whether ``a``'s mean is lower than ``b``'s by more than the larger sd; ``None`` (undecided)
  unless both have two values or more."""
  if len(a) < 2 or len(b) < 2:
    return None
  (ma, sa, _), (mb, sb, _) = stats(a), stats(b)
  return bool(ma < mb - max(sa, sb))


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
  """One-sided Welch t-test p-value of "``a``'s mean is lower than ``b``'s"."""
  if len(a) < 2 or len(b) < 2:
    return None
  from scipy import stats as sps
  return float(sps.ttest_ind(a, b, equal_var=False, alternative="less").pvalue)


def gain_overhead(root: str = ROOT) -> float:
  """The target gain's FLOPs per step of ``walk_gain``, as a fraction of a step's: XLA's count for
  the step measuring at every step, less the step without a probe (``walk_progress``), over
  ``every`` (as ``study/target_reward/run.gain_overhead``). Cached in ``root``."""
  cache = os.path.join(root, "gain_overhead.json")
  if os.path.exists(cache):
    saved = json.load(open(cache))
    if saved["gain"] == arms.GAIN:
      return saved["overhead"]
  configs = [arms.get_config(f"arm={arm}") for arm in ("walk_progress", "walk_gain")]
  configs[1].probes.target_gain.every = 1
  flops = [equal_compute.step_flops(c) for c in configs]
  overhead = (flops[1] - flops[0]) / flops[0] / arms.GAIN["every"]
  os.makedirs(root, exist_ok=True)
  json.dump({"gain": arms.GAIN, "flops": flops, "overhead": overhead}, open(cache, "w"))
  return overhead


# --------------------------------------------------------------------------------------------------
# The verdict.


def curve(arm: str, target: str, root: str = ROOT) -> tuple[list[int], list[float], list[int]]:
  """An arm's mean score at each of :data:`LENGTHS`, over the seeds 0-2 that ran every length:
  ``(lengths, means, seeds)`` (empty lists when no seed did)."""
  def at(n, s):
    return result({"arm": arm, "seed": s, "steps": n, "target": target}, root)
  seeds = [s for s in range(3) if all(at(n, s) for n in LENGTHS)]
  if not seeds:
    return [], [], []
  return (list(LENGTHS), [stats([at(n, s)[arms.SCORE_KEY] for s in seeds])[0] for n in LENGTHS],
          seeds)


def worth(loss: float, lengths: Sequence[int], means: Sequence[float], overhead: float
          ) -> tuple[float, str] | None:
  """``loss`` in the steps of a baseline's curve, over the run's compute (lower envelope)."""
  if len(lengths) < 2:
    return None
  return equal_compute.worth(lengths, means, loss, arms.STEPS, overhead, envelope=True)


def verdict(scores: Mapping[str, Sequence[float]], walk_worth: tuple[float, str] | None,
            pilot_passed: bool) -> dict:
  """The verdict by the rules fixed in advance, and each condition (True, False, or None:
  undecided, a missing run or seed).

  Args:
    scores: arm -> its seeds' scores (``walk_gain``, ``best_static``, ``best_schedule``,
      ``target_only``, ``uniform``, ``unimax16``).
    walk_worth: ``walk_gain``'s worth in ``best_static``'s steps after its FLOPs cost (``(value,
      relation)`` of :mod:`study.equal_compute`), or ``None`` when the curve has not run.
    pilot_passed: the pilot's step 4 (``target_only`` did not win the grid of the pieces used).

  Returns ``{"verdict": "A" | "B" | "C" | "D" | "regime not reached" | "undecided: ...",
  "conditions": {name: bool | None}}``. Conditions:

  * regime: ``pilot_passed`` and ``best_static`` beats ``target_only``;
  * A1 ``walk_gain`` beats ``best_static``; A2 its worth >= 1.10 (a ``"<"`` worth fails, a
    ``">"`` or "not reachable" one is a lower bound and passes if it is >= 1.10); A3 it beats
    ``target_only``; A4 ``best_schedule`` does not beat it. A: all four.
  * B: A1-A3 hold and ``best_schedule`` beats the walk; or ``best_schedule`` beats
    ``best_static`` while the walk does not.
  * C: neither of ``walk_gain`` and ``best_static`` beats the other, and the walk beats
    ``uniform`` and ``unimax16``.
  * D: anything else.

  A verdict whose conditions are undecided is "undecided", naming them.
  """
  s = lambda a: list(scores.get(a, ()))
  b = lambda x, y: beats(s(x), s(y))
  neg = lambda v: None if v is None else not v
  c = {"regime": b("best_static", "target_only") if pilot_passed else False}
  c["A1 walk_gain beats best_static"] = b("walk_gain", "best_static")
  c["A2 worth >= 1.10 best_static steps"] = (
      None if walk_worth is None else walk_worth[1] != "<" and walk_worth[0] >= WORTH_NEEDED)
  c["A3 walk_gain beats target_only"] = b("walk_gain", "target_only")
  c["A4 best_schedule does not beat walk_gain"] = neg(b("best_schedule", "walk_gain"))
  c["B best_schedule beats walk_gain"] = b("best_schedule", "walk_gain")
  c["B best_schedule beats best_static"] = b("best_schedule", "best_static")
  c["C best_static does not beat walk_gain"] = neg(b("best_static", "walk_gain"))
  c["C walk_gain beats uniform"] = b("walk_gain", "uniform")
  c["C walk_gain beats unimax16"] = b("walk_gain", "unimax16")
  a = [c[k] for k in c if k.startswith("A")]
  rules = {
      "regime": [c["regime"]],
      "A": a,
      "B1": a[:3] + [c["B best_schedule beats walk_gain"]],
      "B2": [c["B best_schedule beats best_static"], neg(c["A1 walk_gain beats best_static"])],
      "C": [neg(c["A1 walk_gain beats best_static"]), c["C best_static does not beat walk_gain"],
            c["C walk_gain beats uniform"], c["C walk_gain beats unimax16"]],
  }

  def holds(rule):   # True, False, or None (undecided)
    vals = rules[rule]
    return False if False in vals else None if None in vals else True

  if holds("regime") is not True:
    out = "regime not reached" if holds("regime") is False else "undecided: regime"
    return {"verdict": out, "conditions": c}
  for letter, parts in (("A", ("A",)), ("B", ("B1", "B2")), ("C", ("C",))):
    got = [holds(p) for p in parts]
    if True in got:
      return {"verdict": letter, "conditions": c}
    if None in got:
      return {"verdict": f"undecided: {letter}", "conditions": c}
  return {"verdict": "D", "conditions": c}

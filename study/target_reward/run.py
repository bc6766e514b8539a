r"""The study's runs in batches, and its scoreboard.

  python -m study.target_reward.run --batch grid        # the static grid at the selection seed
  python -m study.target_reward.run --batch scored      # every arm, seeds 0-2, 1000 steps
  python -m study.target_reward.run --batch baselines   # uniform and target_only at 1.25x-2x
  python -m study.target_reward.run --batch larger      # the two best arms and the best baseline, width 2
  python -m study.target_reward.run --report            # the tables, from what has run

Each run is ``python -m andrea_jax.main --config=study/target_reward/arms.py:<args>`` in a process
of its own, ``--jobs`` at a time (one CPU thread each), into ``--root`` (default
``runs/target_reward``); a finished run is never run again, so an interrupted batch is resumed by
the same command. The protocol (which runs, how they are scored) is fixed in ``arms.py`` and here;
see the README.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from study import equal_compute
from study.target_reward import arms

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.environ.get("TARGET_REWARD_ROOT", os.path.join(REPO, "runs", "target_reward"))


def run_name(args: dict) -> str:
  return "_".join(f"{k}{v}" for k, v in sorted(args.items()))


def config_arg(args: dict) -> str:
  return ",".join(f"{k}={v}" for k, v in args.items())


def plan(batch: str, root: str = ROOT) -> list[dict]:
  """The runs of ``batch``, as config arguments."""
  if batch == "grid":
    return [{"grid": g, "seed": arms.SELECTION_SEED} for g in arms.GRID]
  if batch == "scored":
    return [{"arm": a, "seed": s} for s in arms.SEEDS for a in arms.ARMS]
  if batch == "baselines":
    return [{"arm": a, "seed": s, "steps": round(f * arms.STEPS)} for f in arms.LENGTHS[1:]
            for s in arms.SEEDS for a in arms.BASELINES]
  if batch == "larger":
    return [{"arm": a, "seed": s, "width": 2} for s in arms.SEEDS for a in larger_arms(root)]
  raise ValueError(f"unknown batch {batch!r}")


def result(args: dict, root: str = ROOT) -> dict | None:
  """The final evaluation of a finished run (``None`` if it has not finished)."""
  path = os.path.join(root, run_name(args), "metrics.jsonl")
  if not os.path.exists(path):
    return None
  final = None
  for line in open(path):
    rec = json.loads(line)
    if "eval/target_loss" in rec:
      final = rec
  steps = int(args.get("steps", arms.STEPS))
  return final if final is not None and final["step"] == steps else None


def _launch(args: dict, root: str) -> subprocess.Popen:
  workdir = os.path.join(root, run_name(args))
  # One thread per run (XLA's CPU runtime without its intra-op pool): --jobs runs share the cores.
  env = dict(os.environ, PYTHONUNBUFFERED="1", TARGET_REWARD_ROOT=root, XLA_FLAGS=" ".join(
      [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_multi_thread_eigen=false"]).strip())
  log = open(workdir + ".log", "w")
  return subprocess.Popen(
      [sys.executable, "-m", "andrea_jax.main",
       f"--config=study/target_reward/arms.py:{config_arg(args)}", f"--workdir={workdir}"],
      cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def run_batch(batch: str, jobs: int, root: str = ROOT) -> None:
  todo = [a for a in plan(batch, root) if result(a, root) is None]
  os.makedirs(root, exist_ok=True)
  print(f"{batch}: {len(todo)} runs to go, {jobs} at a time, into {root}", flush=True)
  running: list[tuple[dict, subprocess.Popen, float]] = []
  while todo or running:
    while todo and len(running) < jobs:
      args = todo.pop(0)
      running.append((args, _launch(args, root), time.time()))
    time.sleep(5)
    for item in list(running):
      args, proc, t0 = item
      if proc.poll() is not None:
        running.remove(item)
        r = result(args, root)
        status = (f"target {r['eval/target_loss']:.4f}" if r else
                  f"FAILED (exit {proc.returncode}, see {run_name(args)}.log)")
        print(f"  {run_name(args)}: {status} in {time.time() - t0:.0f} s", flush=True)


# --------------------------------------------------------------------------------------------------
# The scoreboard.


def selected_grid_point(root: str = ROOT) -> str:
  """The grid point of lowest target loss at the selection seed (all of them must have run)."""
  losses = {}
  for g in arms.GRID:
    r = result({"grid": g, "seed": arms.SELECTION_SEED}, root)
    if r is None:
      raise ValueError(f"the grid has not run at seed {arms.SELECTION_SEED} (point {g!r}): "
                       "python -m study.target_reward.run --batch grid")
    losses[g] = r["eval/target_loss"]
  return min(losses, key=losses.get)


def gain_overhead() -> float:
  """The target gain's compute per step of the ``andrea_gain`` arm, as a fraction of a step's
  FLOPs: XLA's count for the step measuring at every step, less the step without, over
  ``GAIN_EVERY``."""
  base, gain = arms.get_config("arm=andrea"), arms.get_config("arm=andrea_gain")
  gain.probes.target_gain.every = 1
  flops = [equal_compute.step_flops(c) for c in (base, gain)]
  return (flops[1] - flops[0]) / flops[0] / arms.GAIN_EVERY


def _stats(runs: list[dict]) -> tuple[float, float]:
  x = np.array([r["eval/target_loss"] for r in runs])
  return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else 0.0


def scoreboard(root: str = ROOT, width: int = 1) -> list[dict]:
  """One row per arm: target loss (mean, sd over seeds), mean held-out loss, and what its final
  target loss is worth in the steps of each baseline on its own schedules."""
  overhead = gain_overhead()
  # A baseline's curve: its mean target loss at each run length over the seeds that ran every
  # length (all three when the budget allows; fewer are said in the report).
  curves = {}
  for b in arms.BASELINES:
    length = lambda f, s: result({"arm": b, "seed": s, **(
        {"steps": round(f * arms.STEPS)} if f != 1 else {})}, root)
    seeds = [s for s in arms.SEEDS if all(length(f, s) for f in arms.LENGTHS)]
    if seeds and width == 1:
      curves[b] = ([round(f * arms.STEPS) for f in arms.LENGTHS],
                   [_stats([length(f, s) for s in seeds])[0] for f in arms.LENGTHS], seeds)
  rows = []
  for a in arms.ARMS:
    runs = [result({"arm": a, "seed": s, **({"width": 2} if width == 2 else {})}, root)
            for s in arms.SEEDS]
    runs = [r for r in runs if r is not None]
    if not runs:
      continue
    mean, sd = _stats(runs)
    row = {"arm": a, "seeds": len(runs), "target": mean, "sd": sd,
           "mean_loss": float(np.mean([r["eval/mean_loss"] for r in runs])),
           "overhead": overhead if a == "andrea_gain" else 0.0}
    for b, (steps, losses, seeds) in curves.items():
      row[f"worth_{b}"] = equal_compute.worth(steps, losses, mean, arms.STEPS, row["overhead"])
      row[f"curve_seeds_{b}"] = seeds
    rows.append(row)
  return rows


def larger_arms(root: str = ROOT) -> list[str]:
  """The two best arms at width 1 by target loss, and the best baseline (uniform or target_only),
  as the protocol fixes them (an arm counted once)."""
  rows = {r["arm"]: r for r in scoreboard(root)}
  ranked = sorted((a for a in rows if a not in arms.BASELINES), key=lambda a: rows[a]["target"])
  best_baseline = min((a for a in arms.BASELINES if a in rows), key=lambda a: rows[a]["target"])
  return ranked[:2] + [best_baseline]


def report(root: str = ROOT) -> str:
  lines = []
  for width in (1, 2):
    rows = scoreboard(root, width)
    if not rows:
      continue
    lines.append(f"\nwidth {width} ({'the demo' if width == 1 else 'd_model 256'}), "
                 f"{arms.STEPS} steps, eval/target_loss at the last step (nats/byte):\n")
    head = "| arm | seeds | target loss | sd | mean held-out loss |"
    if width == 1:
      for b in arms.BASELINES:
        seeds = next((r[f"curve_seeds_{b}"] for r in rows if f"curve_seeds_{b}" in r), None)
        head += (f" worth in {b}'s steps" + ("" if seeds is None or len(seeds) == len(arms.SEEDS)
                                              else f" (its curve: seeds {seeds})") + " |")
    lines += [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in sorted(rows, key=lambda r: r["target"]):
      cells = [r["arm"], str(r["seeds"]), f"{r['target']:.4f}", f"{r['sd']:.4f}",
               f"{r['mean_loss']:.4f}"]
      if width == 1:
        for b in arms.BASELINES:
          w = r.get(f"worth_{b}")
          cells.append("" if w is None else
                        f"{'<' if w[1] == '<' else '>' if w[1] == '>' else ''}{w[0]:.2f}x")
      lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", choices=("grid", "scored", "baselines", "larger"))
  parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
  parser.add_argument("--root", default=ROOT)
  parser.add_argument("--report", action="store_true")
  args = parser.parse_args()
  if args.batch:
    run_batch(args.batch, args.jobs, args.root)
  if args.report:
    print(report(args.root))


if __name__ == "__main__":
  main()

r"""The study's runs in batches, in the protocol's priority order, and its report.

  python -m study.data_constrained.prep --out runs/data_constrained/pieces   # the pieces, once
  python -m study.data_constrained.run --smoke            # every arm type for 20 steps (60)
  python -m study.data_constrained.run --batch pilot      # the selection pilot (seed 100)
  python -m study.data_constrained.run --batch core0      # seed 0 of every core arm
  python -m study.data_constrained.run --batch decisive   # seeds 1-2 of the four decisive arms
  python -m study.data_constrained.run --batch long       # best_static at 1250 and 1500 steps
  python -m study.data_constrained.run --batch decisive34 # seeds 3-4 of walk_gain, best_static
  python -m study.data_constrained.run --batch rest       # the other seeds; uniform's longer runs
  python -m study.data_constrained.run --batch optional   # dga, target_only_dev
  python -m study.data_constrained.run --batch all        # all of them, in that order
  python -m study.data_constrained.run --report           # the scoreboard and the verdict
  python -m study.data_constrained.run --figures          # figures/*.png

Each run is ``nice -n 10 python -m andrea_jax.main --config=study/data_constrained/arms.py:<args>``
in a process of its own, ``--jobs`` at a time (one XLA thread each), into ``--root`` (default
``runs/data_constrained/runs``, :data:`score.ROOT`). A finished run is never run again; an
interrupted one resumes from its last checkpoint (every 250 steps) when its batch is run again.
The pilot's later steps are planned when the earlier have run (:func:`plan` is asked again as
each run ends). The scored runs use the pieces the pilot's regime check chose
(:func:`score.regime`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from study.data_constrained import arms, score

CORE = ("walk_gain", "best_static", "best_schedule", "target_only", "uniform", "unimax16", "exp3",
        "walk_progress")
DECISIVE = ("walk_gain", "best_static", "target_only", "best_schedule")
BATCHES = ("pilot", "core0", "decisive", "long", "decisive34", "rest", "optional")
SMOKE = ("walk_gain", "walk_progress", "exp3", "dga", "uniform", "target_only", "unimax16",
         "t40_nr", "late_t40_nrcl", "early_t40_nrcl", "target_only_dev")


def pilot_plan(root: str = score.ROOT) -> list[dict]:
  """The pilot's runs that can run now (step 1; step 2 once step 1 has run; step 3 once step 2
  has; the 8K grid if ``target_only`` won the 32K one)."""
  out = []
  for target in ("32k", "8k"):
    run = lambda names: [{"arm": n, "seed": score.SELECTION_SEED, "target": target}
                         for n in names]
    out += run(score.GRID)
    pick = score.grid_pick(target, root)
    if pick is None:
      return out
    if pick == "target_only":
      continue                                   # step 4: the fallback grid (or the end)
    out += run([score.informed_name(pick)])
    static = score.static_pick(target, root)
    if static is not None:
      out += run(score.schedule_names(static))
    return out
  return out


def plan(batch: str, root: str = score.ROOT) -> list[dict]:
  """The runs of ``batch`` that can be planned now, in order (``best_static`` and
  ``best_schedule`` once the pilot has picked them; ``"all"``: every batch's, in
  :data:`BATCHES`' order, so that a free slot takes the next run the protocol can start)."""
  if batch == "all":
    return [r for b in BATCHES for r in plan(b, root)]
  if batch == "pilot":
    return pilot_plan(root)
  target = score.regime(root)
  if target in (None, "none"):
    return []                                    # the pilot decides first (or the study stops)
  picked = {"best_static": score.static_pick(target, root) is not None,
            "best_schedule": score.schedule_pick(target, root) is not None}
  return [r for r in _batch(batch, target) if picked.get(r["arm"], True)]


def _batch(batch: str, target: str) -> list[dict]:
  runs = lambda names, seeds, steps=arms.STEPS: [
      {"arm": a, "seed": s, **({"steps": steps} if steps != arms.STEPS else {}),
       "target": target} for s in seeds for a in names]
  if batch == "core0":
    return runs(CORE, [0])
  if batch == "decisive":
    return runs(DECISIVE, [1, 2])
  if batch == "long":
    return [r for n in score.LENGTHS[1:] for r in runs(["best_static"], range(3), n)]
  if batch == "decisive34":
    return runs(["walk_gain", "best_static"], [3, 4])
  if batch == "rest":
    return (runs(("uniform", "unimax16", "exp3", "walk_progress"), [1, 2])
            + [r for n in score.LENGTHS[1:] for r in runs(["uniform"], range(3), n)])
  if batch == "optional":
    return [] if target == "8k" else runs(("dga", "target_only_dev"), range(3))
  raise ValueError(f"unknown batch {batch!r}; batches are {', '.join(BATCHES)}")


def _launch(args: dict, root: str) -> subprocess.Popen:
  workdir = os.path.join(root, score.run_name(args))
  os.makedirs(root, exist_ok=True)
  # One XLA thread per run (no intra-op pool): --jobs runs share the cores with others' work.
  env = dict(os.environ, PYTHONUNBUFFERED="1", DATA_CONSTRAINED_ROOT=os.path.abspath(root),
             XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""),
                                 "--xla_cpu_multi_thread_eigen=false"]).strip())
  log = open(workdir + ".log", "a")              # an interrupted run's log is continued
  return subprocess.Popen(
      ["nice", "-n", "10", sys.executable, "-m", "andrea_jax.main",
       f"--config=study/data_constrained/arms.py:{score.config_arg(args)}",
       f"--workdir={workdir}"], cwd=str(arms.REPO), env=env, stdout=log, stderr=subprocess.STDOUT)


def prepare_data(targets=("32k", "8k")) -> None:
  """Prepares (tokenizes into the cache) the data of every kind of run once, here, so that runs
  started together never prepare the same source at once. Pieces not cut yet are skipped."""
  from andrea_jax import data as data_lib
  for target in targets:
    if not os.path.exists(os.path.join(arms.PIECES[target], "pieces.json")):
      continue
    for arm in ("uniform", "target_only_dev"):
      c = arms.get_config(f"arm={arm},target={target}")
      data_lib.open_training_data(c.data, data_lib.load_tokenizer(c.data.tokenizer),
                                  sources=c.sources, progress=False)


def run_batch(batch: str, jobs: int, root: str = score.ROOT, planner=None) -> None:
  """Runs ``batch``'s unfinished runs ``jobs`` at a time; re-plans as each ends."""
  planner = planner or (lambda: plan(batch, root))
  prepare_data()
  running: dict[str, tuple[dict, subprocess.Popen, float]] = {}
  failed: set[str] = set()
  print(f"{batch}: into {root}, {jobs} at a time", flush=True)
  while True:
    todo = [a for a in planner() if score.result(a, root) is None
            and score.run_name(a) not in running and score.run_name(a) not in failed]
    while todo and len(running) < jobs:
      args = todo.pop(0)
      running[score.run_name(args)] = (args, _launch(args, root), time.time())
      print(f"  start {score.run_name(args)}", flush=True)
    if not running:
      break
    time.sleep(10)
    for name, (args, proc, t0) in list(running.items()):
      if proc.poll() is None:
        continue
      del running[name]
      r = score.result(args, root)
      if r is None:
        failed.add(name)
      status = (f"score {r[arms.SCORE_KEY]:.4f}, dev-B {r[arms.SELECT_KEY]:.4f}" if r else
                f"FAILED (exit {proc.returncode}, see {name}.log)")
      print(f"  {name}: {status} in {time.time() - t0:.0f} s", flush=True)


def smoke(jobs: int, root: str) -> None:
  """Every arm type for 20 steps (the protocol's smoke test), into ``root``; the gain-reading
  mixers also for 60 steps, past their first decisions (the first phase is uniform)."""
  todo = ([{"arm": a, "seed": 0, "steps": 20} for a in SMOKE]
          + [{"arm": a, "seed": 0, "steps": 60} for a in arms.GAIN_ARMS])
  run_batch("smoke", jobs, root, planner=lambda: todo)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", choices=BATCHES + ("all",), action="append", default=[])
  parser.add_argument("--jobs", type=int, default=2, help="runs at a time (at most 2 here)")
  parser.add_argument("--root", default=score.ROOT)
  parser.add_argument("--smoke", action="store_true")
  parser.add_argument("--report", action="store_true")
  parser.add_argument("--figures", action="store_true")
  args = parser.parse_args(argv)
  if args.smoke:
    smoke(args.jobs, os.path.join(os.path.dirname(os.path.abspath(args.root)), "smoke"))
  for batch in args.batch:
    run_batch(batch, args.jobs, args.root)
  if args.report:
    from study.data_constrained import report
    print(report.report(args.root))
  if args.figures:
    from study.data_constrained import figures
    for path in figures.make_all(args.root):
      print(path)


if __name__ == "__main__":
  main()

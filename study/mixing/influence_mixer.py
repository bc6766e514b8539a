r"""The influence mixer: the run measures its sources' elasticities once, then holds their mixture.

    python -m study.mixing.influence_mixer [--out runs/influence_mixer] [--seeds 0,1,2]
        [--at 50,100] [--cg-iters 100] [--layers 2 --d-model 64]

``study/mixing/gradient_probe.py --method influence`` found that the truncated-horizon influence of the
uniform run's state, ``b_s = w_s (g_s^A)^T (G + lambda P^{-1})^{-1} g_s^B`` with ``lambda = 1 /
sum_t lr_t``, gives the 20 designed probes' elasticities back (r 0.93 of the power-1.5 mixtures,
r 0.90 of ``b``, in the same units) from the target run itself, with no probe run. Here it is
used as a mixing strategy: the run trains on uniform batches until step ``t_m``, measures the
elasticities there, holds ``proxy.elasticity_mixture(b, power=1.5)`` until half the run, then
goes back to uniform, the designed proxy's schedule with the probes replaced by one measurement.

The arms, fixed before their runs (this file's first commit): ``influence_at50`` and
``influence_at100``, ``t_m`` = 50 and 100 of the study's 800 steps; ``lambda = 1 / sum_{t < 400}
lr_t``, the first half's horizon counted from step 0 to the end of the hold (the learning-rate
schedule is known in advance); ``G``, ``g^A`` and ``g^B`` from the four batches of steps
``t_m .. t_m + 3`` the uniform run would draw (training data only; 128 rows, 8 of each source),
at the uniform run's parameters and Adam state at step ``t_m`` (the arm's own: its first ``t_m``
steps are uniform's); conjugate
gradients as in the screen (100 iterations at most, relative residual 1e-3). Seeds 0, 1, 2 at
0.13M (the study's 2 x 64 model), each against uniform's run of the same seed; the issue's line:
uniform's final mean held-out loss reached in at least 20% fewer steps, averaged over the seeds.
The measurement's cost is printed beside a whole run's.

Found (``study/mixing/LOG.md``, "Measured in the run itself, early"): both lose to uniform on every
seed, +0.084 and +0.033. Early, the run's curvature ranks the sources learned fastest first (the
noise source and ``extra-04`` at step 50, ``extra-02`` and ``extra-04`` at step 100: r 0.23 and
0.46 with the probes' mixture), as quarter-length probes do. Measured late in a uniform pilot's
first half instead, the same estimate is ``influence_pilot_p15_early`` (19.5% fewer steps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HOLD = 0.5         # the mixture is held until half the run, then uniform
POWER = 1.5


def _load(name: str):
  """The study's module ``name`` (``gradient_probe.load_bench``)."""
  from study.mixing import gradient_probe as gp
  return gp if name == "gradient_probe" else gp.load_bench(name)


def measure(cfg, at: int, horizon: int, batches: int = 4, iters: int = 100,
            tol: float = 1e-3) -> dict:
  """Trains ``cfg`` (uniform batches) to step ``at`` and returns the truncated-horizon influence
  there: ``{"b": [S], "lambda", "wall_s", "solve_s"}`` with ``lambda = 1 / sum_{t < horizon}
  lr_t``, ``G`` and the half-gradients from the batches of steps ``at .. at + batches - 1``."""
  import jax

  from andrea_jax import curriculum
  gp = _load("gradient_probe")
  cfg, run, sampler, state, train_step = gp.uniform_run(cfg)
  num = len(run.sources)
  model, doc = run.step.model, run.step.document_mask
  t0 = time.time()
  for t in range(at):
    w_S = np.asarray(curriculum.weights_at(curriculum.schedule(state.curriculum), t), np.float64)
    state, _ = train_step(state, sampler.batch(t, w_S))
  schedule = run.step.schedule
  lam = 1.0 / sum(float(schedule(t)) for t in range(horizon))
  m0 = time.time()
  w_S = np.asarray(curriculum.weights_at(curriculum.schedule(state.curriculum), at), np.float64)
  big = [jax.tree.map(np.asarray, sampler.batch(t, w_S)) for t in range(at, at + batches)]
  big = {k: np.concatenate([b[k] for b in big]) for k in big[0]}
  b, _ = gp.influence(model, doc, state.params, state.opt_state, big, num, lam,
                      float(cfg.optim.eps), float(cfg.optim.b2), iters=iters, tol=tol)
  return {"b": b.tolist(), "lambda": lam, "train_s": m0 - t0, "solve_s": time.time() - m0}


def arm_geometries(mixture: Sequence[float], at: int, switch: int, sources: Sequence[str]):
  """Uniform (the full simplex) until ``at``, ``mixture`` until ``switch``, uniform after."""
  import ml_collections

  from andrea_jax.curriculum import geometry
  g = ml_collections.ConfigDict()
  g.before = geometry("before", 0, sources=sources)
  g.influence = geometry("influence", at, mixture=dict(zip(sources, np.asarray(mixture).tolist())),
                         sources=sources)
  g.uniform = geometry("uniform", switch, sources=sources)
  return g


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="runs/influence_mixer")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--at", default="50,100", help="comma-separated measurement steps (the arms)")
  p.add_argument("--cg-iters", type=int, default=100,
                 help="conjugate-gradient iterations per source (study/mixing/influence_cost.py's pick: "
                 "10; the arms are then named influence_at<t>_cg<n>)")
  p.add_argument("--layers", type=int, default=None)
  p.add_argument("--d-model", type=int, default=None)
  args = p.parse_args(argv)

  from study.mixing import proxy
  from andrea_jax.sources import SOURCES
  cm = _load("compare_mixers")
  exp = cm.load_experiment()
  seeds = [int(s) for s in args.seeds.split(",")]
  ats = [int(a) for a in args.at.split(",")]
  if exp.TUNING_SEED in seeds:
    p.error(f"seed {exp.TUNING_SEED} is the tuning seed; report other seeds")

  args.num_steps, args.quick, args.data_scale = exp.NUM_STEPS, False, None

  def config(seed: int):
    return cm._config(exp, "uniform", seed, args)   # the study's uniform arm, --layers, --d-model

  num_steps = int(config(seeds[0]).train.num_steps)
  switch = round(HOLD * num_steps)
  suffix = "" if args.cg_iters == 100 else f"_cg{args.cg_iters}"
  names = {a: f"influence_at{a}{suffix}" for a in ats}
  runs = {"uniform": {}, **{names[a]: {} for a in ats}}
  costs = {names[a]: [] for a in ats}
  for seed in seeds:
    c = config(seed)
    wd = os.path.join(args.out, "runs", "uniform", f"seed{seed}")
    wall = cm.run_arm(c, wd)
    runs["uniform"][seed] = dict(cm.read_run(wd, SOURCES), wall_s=wall)
    print(f"uniform seed {seed}: {runs['uniform'][seed]['eval_mean'][-1]:.4f} ({wall:.0f} s)",
          flush=True)
    for a in ats:
      arm = names[a]
      mpath = os.path.join(args.out, "measurements", f"{arm}_seed{seed}.json")
      if os.path.exists(mpath):
        with open(mpath) as f:
          m = json.load(f)
      else:
        m = measure(config(seed), a, switch, iters=args.cg_iters)
        os.makedirs(os.path.dirname(mpath), exist_ok=True)
        with open(mpath, "w") as f:
          json.dump(m, f)
      mix = proxy.elasticity_mixture(np.asarray(m["b"]), power=POWER)
      ca = config(seed)
      ca.curriculum.geometries = arm_geometries(mix, a, switch, SOURCES)
      wd = os.path.join(args.out, "runs", arm, f"seed{seed}")
      wall = cm.run_arm(ca, wd)
      runs[arm][seed] = dict(cm.read_run(wd, SOURCES), wall_s=wall)
      costs[arm].append((m["solve_s"], runs["uniform"][seed]["wall_s"]))
      print(f"{arm} seed {seed}: {runs[arm][seed]['eval_mean'][-1]:.4f} ({wall:.0f} s; "
            f"measurement {m['solve_s']:.0f} s)", flush=True)

  summary = cm.summarize(runs, num_steps, SOURCES)
  rows = [["arm", "final mean held-out loss", "vs uniform (paired)", "steps to uniform's final",
           "fewer steps", "measurement / a uniform run (wall)"]]
  for arm, r in summary.items():
    steps = ", ".join(f"{x:.0f}" for x in r["steps_to_uniform_final"])
    fewer = f"{100 * r['fewer_steps']:.1f}%" if np.isfinite(r["fewer_steps"]) else \
        f"— ({r['reached']}/{len(r['seeds'])} reach it)"
    cost = ("" if arm == "uniform" else
            f"{np.mean([s / w for s, w in costs[arm]]):.2f}")
    rows.append([arm, f"{r['final_mean']:.4f} ± {r['final_sd']:.4f}",
                 f"{r['delta_vs_uniform']:+.4f} ± {r['delta_sd']:.4f}",
                 f"{r['mean_steps']:.0f} ({steps})" if np.isfinite(r["mean_steps"]) else steps,
                 fewer, cost])
  print()
  print(cm.markdown_table(rows))
  print()
  print(cm.source_tables(summary, SOURCES))
  with open(os.path.join(args.out, f"summary{suffix}.json"), "w") as f:
    json.dump(cm.json_safe(summary), f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())

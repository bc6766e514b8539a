r"""How cheap can the influence measurement be? Cheaper estimates against the exact one, and costs.

    python -m study.mixing.influence_cost [--out runs/influence_cost] [--seed 100] [--at 100]

The influence mixer (``study/mixing/influence_mixer.py``) measures the truncated-horizon influence once,
``b_s = w_s (g_s^A)^T (G + lambda P^{-1})^{-1} g_s^B``, with one conjugate-gradient solve per
source (up to 100 Gauss-Newton products each, on 128 rows): some 1,600 products, several runs'
worth of compute on this testbed. Two ways to make it cheap, side by side on the same state (the
uniform run at the tuning seed 100, step ``--at``, ``lambda = 1 / sum_{t < 400} lr_t`` as in the
mixer):

* fewer conjugate-gradient iterations (10, 25, 50), and one batch (32 rows) instead of four;
* a low-rank solve shared by every source (``gradient_probe.influence_lowrank``): ``k`` Lanczos
  steps on the preconditioned Gauss-Newton matrix ``P^{1/2} G P^{1/2}``, started from the sources'
  summed preconditioned gradient, exact on that Krylov space and first order off it: ``k``
  products in all, ``k`` = 4, 8, 16, 32, 64, on 32 and on 128 rows.

Each variant's power-1.5 mixture is compared (Pearson r) with the exact estimate's and with the
0.13M probes'. Cost: Gauss-Newton products times rows, in training steps (a step is 32 rows) --
one product costs about a forward and a backward pass, as a training step does; the per-row
gradients, about four steps, are not counted -- and the wall time of the variant (compilation
included) against a training step timed in the same process.

The rule, fixed before any number (this file's first commit): the cheapest variant (fewest
products x rows) whose mixture has r >= 0.95 with the exact estimate's is the one the mixer is run
with next, on the same arms and seeds as the exact one (``study/mixing/influence_mixer.py --cg-iters``).

Found (``study/mixing/LOG.md``, "How cheap the measurement can be"): 10 iterations (r 0.989 at step
100, 0.983 at step 350), a tenth of the products; one batch is too few rows, and no low-rank
solve tried is accurate (r -0.18 to 0.88). The mixer's arms it would have been run with had lost
to uniform on every seed, so it was not run with them.
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

CG_VARIANTS = ((100, 4), (50, 4), (25, 4), (10, 4), (100, 1))      # (iterations, batches)
RANKS = (4, 8, 16, 32, 64)
THRESHOLD = 0.95
HORIZON = 400
POWER = 1.5


def _load(name: str):
  """The study's module ``name`` (``gradient_probe.load_bench``)."""
  from study.mixing import gradient_probe as gp
  return gp if name == "gradient_probe" else gp.load_bench(name)


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="runs/influence_cost")
  p.add_argument("--seed", type=int, default=100)
  p.add_argument("--at", type=int, default=100)
  args = p.parse_args(argv)

  import jax

  from andrea_jax import curriculum
  from study.mixing import proxy
  gp = _load("gradient_probe")
  cm = gp.load_bench("compare_mixers")
  exp = cm.load_experiment()
  cfg, run, sampler, state, train_step = gp.uniform_run(exp.arm_config("uniform", seed=args.seed))
  num = len(run.sources)
  model, doc = run.step.model, run.step.document_mask
  for t in range(args.at):
    w_S = np.asarray(curriculum.weights_at(curriculum.schedule(state.curriculum), t), np.float64)
    state, metrics = train_step(state, sampler.batch(t, w_S))
  float(metrics["loss"])
  schedule = run.step.schedule
  lam = 1.0 / sum(float(schedule(t)) for t in range(HORIZON))
  eps, b2 = float(cfg.optim.eps), float(cfg.optim.b2)
  w_S = np.asarray(curriculum.weights_at(curriculum.schedule(state.curriculum), args.at))
  batches = [jax.tree.map(np.asarray, sampler.batch(t, w_S)) for t in range(args.at, args.at + 4)]

  def rows(k):
    return {key: np.concatenate([b[key] for b in batches[:k]]) for key in batches[0]}
  params = jax.tree.map(lambda x: x.copy(), state.params)
  opt_state = jax.tree.map(lambda x: x.copy(), state.opt_state)

  # a training step's time in this process (the same batch, a copy of the state each time)
  times = []
  for _ in range(6):
    s = jax.tree.map(lambda x: x.copy(), state)
    t0 = time.perf_counter()
    s, m = train_step(s, batches[0])
    float(m["loss"])
    times.append(time.perf_counter() - t0)
  step_s = float(np.median(times[1:]))
  batch_rows = int(cfg.data.global_batch_size)

  results = []
  for iters, k in CG_VARIANTS:
    t0 = time.perf_counter()
    b, _ = gp.influence(model, doc, params, opt_state, rows(k), num, lam, eps, b2, iters=iters)
    results.append({"variant": f"CG {iters} iterations per source, {32 * k} rows",
                    "b": b.tolist(), "products": num * iters, "rows": batch_rows * k,
                    "wall_s": time.perf_counter() - t0, "upper_bound": True})
  for k in (1, 4):
    for rank in RANKS:
      t0 = time.perf_counter()
      b = gp.influence_lowrank(model, doc, params, opt_state, rows(k), num, lam, eps, b2, rank)
      results.append({"variant": f"Lanczos rank {rank}, {32 * k} rows", "b": b.tolist(),
                      "products": rank, "rows": batch_rows * k,
                      "wall_s": time.perf_counter() - t0, "upper_bound": False})

  exact = np.asarray(results[0]["b"])
  exact_mix = proxy.elasticity_mixture(exact, power=POWER)
  ref_mix = proxy.elasticity_mixture(np.asarray(exp.PROXY_HALF_ELASTICITY), power=POWER)
  table = [["variant", "Gauss-Newton products", "cost in training steps (products x rows / 32)",
            "wall / a training step", "r with the exact mixture", "r with the probes' mixture"]]
  for r in results:
    mix = proxy.elasticity_mixture(np.asarray(r["b"]), power=POWER)
    r["r_exact"] = float(np.corrcoef(mix, exact_mix)[0, 1])
    r["r_probes"] = float(np.corrcoef(mix, ref_mix)[0, 1])
    r["cost_steps"] = r["products"] * r["rows"] / batch_rows
    prefix = "<= " if r["upper_bound"] else ""
    table.append([r["variant"], f"{prefix}{r['products']}", f"{prefix}{r['cost_steps']:.0f}",
                  f"{r['wall_s'] / step_s:.0f}", f"{r['r_exact']:+.3f}", f"{r['r_probes']:+.3f}"])
  print(cm.markdown_table(table))
  ok = [r for r in results[1:] if r["r_exact"] >= THRESHOLD]
  pick = min(ok, key=lambda r: r["cost_steps"]) if ok else None
  print(f"\nseed {args.seed}, step {args.at}, lambda {lam:.3f}, a training step {1e3 * step_s:.0f} "
        f"ms. The rule's pick (cheapest with r >= {THRESHOLD} to the exact mixture): "
        f"{pick['variant'] if pick else 'none'}")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"cost_seed{args.seed}_at{args.at}.json"), "w") as f:
    json.dump({"seed": args.seed, "at": args.at, "lambda": lam, "step_s": step_s,
               "results": results, "pick": pick["variant"] if pick else None}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())

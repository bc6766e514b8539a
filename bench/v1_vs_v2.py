"""v1 (no warmup) against v2 (a warmup) at small scale: final loss, repetition, collapses.

Trains, for each depth, one vmapped program over every (peak rate, init scale, warmup, seed) of
``experiments/v1_vs_v2.py`` (``andrea_jax.ablation.train_variants``), then prints one table: per
setting and warmup, the final training loss (mean of the last 10 steps) and held-out loss as
mean +- std over seeds, the early loss (mean of steps 0..N/10, where v1 and v2 differ most), the
repetition of greedy and sampled continuations, collapsed greedy samples (score >= 0.5) out of
seeds x prompts, and non-finite steps skipped.

Usage:
  python -m bench.v1_vs_v2 [--quick] [--steps N] [--depths 2,4,8] [--lrs 3e-3,3e-2]
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import sys
import time

import numpy as np

from andrea_jax import ablation

REPO = pathlib.Path(__file__).resolve().parent.parent


def study_module():
  from experiments import v1_vs_v2
  return v1_vs_v2


def _floats(text):
  return tuple(float(x) for x in text.split(","))


def main():
  study = study_module()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="100 steps, 2 seeds, 2 rates, 1 init")
  parser.add_argument("--steps", type=int, default=None)
  parser.add_argument("--depths", type=lambda s: tuple(int(x) for x in s.split(",")), default=None)
  parser.add_argument("--lrs", type=_floats, default=None)
  parser.add_argument("--inits", type=_floats, default=None)
  parser.add_argument("--seeds", type=int, default=None, help="number of seeds")
  args = parser.parse_args()
  steps = args.steps or (100 if args.quick else study.NUM_STEPS)
  warmup = max(1, round(study.WARMUP * steps / study.NUM_STEPS))
  seeds = (tuple(range(args.seeds)) if args.seeds
           else study.SEEDS[:2] if args.quick else study.SEEDS)
  lrs = args.lrs or ((3e-3, 3e-2) if args.quick else study.PEAK_LRS)
  inits = args.inits or ((0.02,) if args.quick else study.INIT_STDS)
  depths = args.depths or study.DEPTHS
  grid = list(itertools.product(lrs, inits, (0, warmup), seeds))
  variants = [{"peak_lr": lr, "init_std": s, "warmup_steps": w, "seed": seed}
              for lr, s, w, seed in grid]
  print(f"command: {' '.join(sys.argv)}")
  print(f"settings: {steps} steps, warmup 0 (v1) vs {warmup} (v2-like), seeds {list(seeds)}, "
        f"peak rates {list(lrs)}, init std {list(inits)}, depths {list(depths)}; "
        f"{len(variants)} variants per program")
  head = (f"{'layers':>6} {'peak lr':>8} {'init':>5} {'warmup':>6} {'early loss':>13} "
          f"{'final loss':>13} {'held-out':>13} {'greedy rep':>10} {'sampled rep':>11} "
          f"{'collapsed':>9} {'skipped':>7}")
  rows = [head, "-" * len(head)]
  for depth in depths:
    c = study.get_config()
    c.model.num_layers = depth
    t0 = time.perf_counter()
    res = ablation.train_variants(c, variants, steps, eval_every=steps, chunk_steps=50)
    took = time.perf_counter() - t0
    early = np.nanmean(res.loss[:, :max(1, steps // 10)], axis=1)
    final, held = res.final_loss(), res.final_eval_loss()
    g_rep, s_rep = res.repetition("greedy"), res.repetition("sampled")
    collapsed = res.collapsed("greedy")
    for lr, s, w in itertools.product(lrs, inits, (0, warmup)):
      idx = [k for k, v in enumerate(res.variants)
             if (v.peak_lr, v.init_std, v.warmup_steps) == (lr, s, w)]
      ms = lambda x: f"{np.mean(x[idx]):.3f}+-{np.std(x[idx]):.3f}"
      rows.append(f"{depth:>6} {lr:>8.0e} {s:>5.2f} {w:>6} {ms(early):>13} {ms(final):>13} "
                  f"{ms(held):>13} {g_rep[idx].mean():>10.3f} {s_rep[idx].mean():>11.3f} "
                  f"{int(collapsed[idx].sum()):>4}/{len(idx) * g_rep.shape[1]:<4} "
                  f"{int(res.skipped[idx].sum()):>7}")
    print(f"depth {depth}: {len(variants)} variants x {steps} steps in {took:.0f} s "
          f"(compile {res.compile_seconds:.0f} s)")
  print("\n".join(rows))


if __name__ == "__main__":
  main()

"""How much faster is one vmapped program than the same variants trained one after another?

Trains K variants (seeds x warmup lengths) of the tiny model for N steps twice, on the same batches:
``ablation.train_variants`` (one ``jit(scan(vmap(step)))`` program, compiled once for all
variants) and ``ablation.loop_baseline`` (each variant with the normal jitted train step, compiled
once per variant, as separate jobs would be). Prints compile and run seconds and the speed-up; the
two must agree on the losses (max |difference| is printed as a check).

CPU: state the ratios only (2 shared cores); GPU: the absolute times count too.

Usage:
  python -m bench.ablation [--quick] [--variants 8] [--steps 100]
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax
import numpy as np

from andrea_jax import ablation

REPO = pathlib.Path(__file__).resolve().parent.parent


def tiny_config():
  from experiments import tiny
  return tiny.get_config()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="a 2-layer 64-wide model, 4 variants")
  parser.add_argument("--variants", type=int, default=None, help="K (half warmup 0, half 20)")
  parser.add_argument("--steps", type=int, default=None, help="N training steps")
  args = parser.parse_args()
  c = tiny_config()
  c.eval.update(sample_tokens=0, sequences_per_source=2)
  k = args.variants or (4 if args.quick else 8)
  n = args.steps or (40 if args.quick else 100)
  if args.quick:
    c.model.update(num_layers=2, d_model=64, num_heads=2, d_mlp=256, max_len=64)
    c.data.update(seq_len=64, global_batch_size=16)
  variants = [{"seed": i // 2, "warmup_steps": 0 if i % 2 == 0 else min(20, n)} for i in range(k)]
  runs = {}
  for name, fn in (("vmap", ablation.train_variants), ("loop", ablation.loop_baseline)):
    t0 = time.perf_counter()
    runs[name] = fn(c, variants, n, chunk_steps=min(50, n), samples=False)
    runs[name].wall = time.perf_counter() - t0
  fast, slow = runs["vmap"], runs["loop"]
  device = jax.devices()[0]
  print(f"{k} variants x {n} steps, model {c.model.num_layers}x{c.model.d_model}, batch "
        f"{c.data.global_batch_size}x{c.data.seq_len}, {device.platform} ({device.device_kind})")
  head = f"{'method':<8} {'compile s':>10} {'run s':>8} {'total s':>8} {'variant-steps/s':>16}"
  print(head)
  print("-" * len(head))
  for name, r in runs.items():
    print(f"{name:<8} {r.compile_seconds:>10.1f} {r.run_seconds:>8.1f} {r.seconds:>8.1f} "
          f"{k * n / r.run_seconds:>16.1f}")
  print(f"speed-up of vmap: run x{slow.run_seconds / fast.run_seconds:.2f}, compile "
        f"x{slow.compile_seconds / fast.compile_seconds:.2f}, total "
        f"x{slow.seconds / fast.seconds:.2f}; max |loss difference| "
        f"{np.abs(fast.loss - slow.loss).max():.2e}")


if __name__ == "__main__":
  main()

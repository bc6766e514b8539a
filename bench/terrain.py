"""Cost of the basin-width measurements and of the cliff detector, printed as one table.

Every measurement runs on the model's next-token loss over one fixed batch and is reported in
seconds per call and as a ratio to one gradient evaluation (``jax.value_and_grad`` of the same
loss), the unit these analyses are naturally counted in: an HVP is about two gradients, Lanczos
with ``m`` steps about ``m`` HVPs, a 2-D slice of ``P x P`` points ``P^2`` forward passes. The cliff
detector's row is one ``cliff_update`` (window 200, 16 sources) inside a scan, against the same
gradient.

CPU: ``tiny()`` in float32; only the ratios mean anything on a shared CPU.
GPU: ``andrea_120m(attention_impl="xla")`` (124M parameters, float32) at B=8, T=1024.

Usage:
  python -m bench.terrain [--quick]
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from andrea_jax import cliff
from andrea_jax import model as m
from andrea_jax import terrain


def timed(fn, *args, repeats: int):
  """(compile-and-first-call seconds, seconds per call afterwards) of a jitted ``fn(*args)``."""
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(repeats):
    out = fn(*args)
  jax.block_until_ready(out)
  return first, (time.perf_counter() - t0) / repeats


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller batch and grids")
  args = parser.parse_args()
  device = jax.devices()[0]
  on_gpu = device.platform == "gpu"
  if on_gpu:
    # HVPs differentiate the backward pass: XLA attention, not cuDNN's fused kernel (no JVP rule).
    cfg, batch, seq_len = m.andrea_120m(attention_impl="xla"), 8, 1024
    lanczos_m, grid, samples, repeats = (10, 5, 4, 1) if args.quick else (20, 11, 8, 2)
    slice_batch = 4
  else:
    cfg = m.tiny()
    batch, seq_len = (2, 32) if args.quick else (4, 64)
    lanczos_m, grid, samples, repeats = (8, 5, 4, 2) if args.quick else (20, 11, 8, 3)
    slice_batch = 8

  params = jax.jit(m.init_params)(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (batch, seq_len + 1), 0, cfg.vocab_size)
  model = m.Transformer(cfg)

  def loss_fn(p):
    logits = model.apply({"params": p}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  n = m.count_params(params)
  print(f"device: {device.device_kind} ({device.platform}); model: {n:,} parameters, "
        f"B={batch}, T={seq_len}")
  key = jax.random.key(2)
  sigmas = jnp.array([0.01, 0.05, 0.1, 0.2])
  g = jnp.linspace(-1.0, 1.0, grid)
  dx = jax.jit(terrain.random_direction)(jax.random.key(3), params)
  dy = jax.jit(terrain.random_direction)(jax.random.key(4), params)
  v = dx

  rows = [
      ("gradient (value_and_grad)", "1", jax.jit(jax.value_and_grad(loss_fn)), (params,)),
      ("loss (forward)", "1", jax.jit(loss_fn), (params,)),
      ("hvp", "1", jax.jit(functools.partial(terrain.hvp, loss_fn)), (params, v)),
      (f"hessian top-1, Lanczos m={lanczos_m}", f"{lanczos_m} HVPs",
       jax.jit(lambda p, k: terrain.hessian_top_eigenvalues(loss_fn, p, k, k=1,
                                                            num_iters=lanczos_m)), (params, key)),
      (f"hessian trace, {samples} samples", f"{samples} HVPs",
       jax.jit(lambda p, k: terrain.hessian_trace(loss_fn, p, k, samples, batch_size=1)),
       (params, key)),
      (f"sharpness {sigmas.size} sigmas x {samples}", f"{sigmas.size * samples} fwd",
       jax.jit(lambda p, k: terrain.perturbation_sharpness(loss_fn, p, k, sigmas, samples,
                                                           batch_size=1).mean), (params, key)),
      (f"slice 2-D {grid}x{grid}, lax.map b={slice_batch}", f"{grid * grid} fwd",
       jax.jit(lambda p, a, b: terrain.loss_slice_2d(loss_fn, p, a, b, g, g,
                                                     batch_size=slice_batch)), (params, dx, dy)),
  ]
  if not on_gpu:  # all points at once: grid^2 copies of the weights, fine only for a small model
    rows.append((f"slice 2-D {grid}x{grid}, vmap", f"{grid * grid} fwd",
                 jax.jit(lambda p, a, b: terrain.loss_slice_2d(loss_fn, p, a, b, g, g)),
                 (params, dx, dy)))

  # The cliff detector as it runs in the train step: one update per step, here 1000 in a scan.
  ccfg = cliff.CliffConfig()
  rng = np.random.default_rng(0)
  losses_TxS = jnp.asarray(3.0 + 0.1 * rng.normal(size=(1000, 16)), jnp.float32)
  tokens_TxS = jnp.asarray(rng.integers(0, 5, size=(1000, 16)) * 1024.0, jnp.float32)

  @jax.jit
  def cliff_scan(losses_TxS, tokens_TxS):
    def body(state, xs):
      t, l_S, k_S = xs
      return cliff.cliff_update(ccfg, state, t, jnp.mean(l_S), l_S, k_S)
    xs = (jnp.arange(1000), losses_TxS, tokens_TxS)
    return jax.lax.scan(body, cliff.cliff_init(16, ccfg.window), xs)[1].score

  header = f"{'measurement':<40} {'work':>12} {'compile s':>10} {'s/call':>10} {'x grad':>8}"
  print(header)
  print("-" * len(header))
  grad_s = None
  for label, work, fn, fn_args in rows:
    try:
      first, per = timed(fn, *fn_args, repeats=repeats)
    except Exception as e:  # noqa: BLE001 -- report an OOM as a row and go on
      print(f"{label:<40} {work:>12}   failed: {type(e).__name__}: {str(e).splitlines()[0][:60]}")
      continue
    grad_s = grad_s or per
    print(f"{label:<40} {work:>12} {first - per:>10.1f} {per:>10.4f} {per / grad_s:>8.2f}")
  first, per = timed(cliff_scan, losses_TxS, tokens_TxS, repeats=3)
  per_step = per / 1000
  print(f"{'cliff_update (W=200, S=16), per step':<40} {'1 step':>12} {first - per:>10.1f} "
        f"{per_step:>10.6f} {per_step / grad_s:>8.4f}")


if __name__ == "__main__":
  main()

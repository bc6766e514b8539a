"""Cost and memory of the basin-width measurements and of the cliff detector, printed as one table.

Every measurement runs on the held-out loss the terrain command measures
(:func:`andrea_jax.terrain.run.heldout_loss_fn`) at the demo's evaluation size, in chunks of windows
and of perturbations sized from one memory budget, as ``python -m andrea_jax.terrain`` sizes them.
Each row gives the compile time, the seconds per call, the ratio to one gradient evaluation of the
same loss (the unit these analyses are naturally counted in: an HVP is about two gradients, Lanczos
with ``m`` steps about ``m`` HVPs, a 2-D slice of ``P x P`` points ``P^2`` forward passes), the
memory XLA plans for the call (temporaries and outputs, from the compiled program) and the peak
resident memory the call added to the process (CPU only: the kernel's high-water mark, reset
before each row through ``/proc/self/clear_refs``).

The 2-D slices at growing ``P`` with a fixed chunk (no larger than the smallest grid) are the
memory check: their peak memory must stay flat while their time grows with ``P^2``. The last slice row is the same grid evaluated at once (all
points, all windows, as the terrain did before it chunked): only compiled, never run, its plan is
the memory it would ask for. The cliff detector's row is one ``cliff_update`` (window 200, 16
sources) inside a scan, against the same gradient.

CPU: the demo's model (``experiments/tiny.py``: 0.9M parameters) on 128 windows of 128 tokens
(16 sources x 8, its evaluation), float32, budget 0.25 GiB; only the ratios and the memory mean
much on a shared CPU.
GPU: ``andrea_120m(attention_impl="xla")`` (124M parameters, float32) on 32 windows of 1024
tokens, the default budget (half the device's memory).

Usage:
  python -m bench.terrain [--quick] [--memory_budget_gib 0.25]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import cliff, terrain
from andrea_jax import model as m
from andrea_jax.terrain import budget as budget_lib
from andrea_jax.terrain import run as terrain_run

MIB = 2 ** 20


def _rss_reset() -> int | None:
  """Resets the process's peak resident memory to the current one; returns it (bytes)."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return _status("VmRSS")
  except OSError:
    return None


def _status(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024
  raise KeyError(field)


def measure(fn, args, *, repeats: int):
  """Compile ``fn`` on ``args`` and time ``repeats`` calls (after one untimed call when
  ``repeats > 1``; a single call is timed as it comes: the costly rows run once).

  Returns ``(compile s, s/call, XLA plan bytes, peak RSS the calls added, bytes, or None)``.
  """
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  stats = compiled.memory_analysis()
  plan = stats.temp_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
  rss0 = _rss_reset()   # after compiling: the row's peak is its execution's, not LLVM's
  if repeats > 1:
    jax.block_until_ready(compiled(*args))
  t0 = time.perf_counter()
  for _ in range(repeats):
    out = compiled(*args)
  jax.block_until_ready(out)
  per = (time.perf_counter() - t0) / repeats
  peak = None if rss0 is None else _status("VmHWM") - rss0
  return compile_s, per, plan, peak


def heldout_like(vocab: int, windows: int, seq_len: int, seed: int = 1) -> dict[str, np.ndarray]:
  """Random tokens shaped as the trainer's held-out batch: one document per window."""
  tokens = np.random.default_rng(seed).integers(0, vocab, (windows, seq_len + 1)).astype(np.int32)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
          "segment_ids": np.ones((windows, seq_len), np.int32),
          "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (windows, seq_len)).copy(),
          "source_ids": np.arange(windows, dtype=np.int32) % 16}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer windows, smaller grids")
  parser.add_argument("--memory_budget_gib", type=float, default=None,
                      help="the terrain's memory budget (default 0.25 on a CPU, else automatic)")
  args = parser.parse_args()
  device = jax.devices()[0]
  on_gpu = device.platform == "gpu"
  if on_gpu:
    # HVPs differentiate the backward pass: XLA attention, not cuDNN's fused kernel (no JVP rule).
    cfg, windows, seq_len = m.andrea_120m(attention_impl="xla"), 32, 1024
    lanczos_m, samples, grids = (5, 2, (3, 5)) if args.quick else (10, 4, (3, 5, 7, 9))
  else:
    cfg = m.tiny(max_len=128)   # the demo's model (experiments/tiny.py)
    windows, seq_len = (32, 64) if args.quick else (128, 128)
    lanczos_m, samples, grids = (4, 2, (3, 5)) if args.quick else (10, 4, (3, 5, 7, 9))
  gib = args.memory_budget_gib if args.memory_budget_gib is not None else (0 if on_gpu else 0.25)
  budget = budget_lib.budget_bytes(gib)

  params = jax.jit(m.init_params)(cfg, jax.random.key(0))
  batch = heldout_like(cfg.vocab_size, windows, seq_len)
  n = m.count_params(params)
  basis = lanczos_m * n * 4
  window_chunk = terrain_run.windows_per_chunk(cfg, batch, params, budget, reserve=basis)
  loss_fn = terrain_run.heldout_loss_fn(cfg, batch, window_batch=window_chunk)
  plan = terrain.chunk_plan(loss_fn, params, memory_budget=budget, lanczos_iters=lanczos_m)
  points, trace_chunk, sharp_chunk = plan["points"], plan["trace_samples"], plan["sharpness_samples"]
  print(f"device: {device.device_kind} ({device.platform}); model: {n:,} parameters; "
        f"{windows} held-out windows of {seq_len} tokens, {window_chunk} per chunk; memory budget "
        f"{budget_lib.format_bytes(budget)}: {points} slice points, {sharp_chunk} sharpness "
        f"samples, {trace_chunk} Hutchinson vectors per chunk")
  key = jax.random.key(2)
  sigmas = jnp.array([0.05, 0.2])
  dx = jax.jit(terrain.random_direction)(jax.random.key(3), params)
  dy = jax.jit(terrain.random_direction)(jax.random.key(4), params)

  def slice_2d(size, batch_size, fn=loss_fn):
    g = jnp.linspace(-1.0, 1.0, size)
    return lambda p, a, b: terrain.loss_slice_2d(fn, p, a, b, g, g, batch_size=batch_size)

  rows = [
      ("gradient (value_and_grad)", "1", jax.value_and_grad(loss_fn), (params,), 2),
      ("loss (forward)", "1", loss_fn, (params,), 2),
      ("Hessian-vector product", "1", lambda p, v: terrain.hvp(loss_fn, p, v), (params, dx), 2),
      (f"Hessian top-1, Lanczos m = {lanczos_m}", f"{lanczos_m} HVPs",
       lambda p, k: terrain.hessian_top_eigenvalues(loss_fn, p, k, k=1, num_iters=lanczos_m),
       (params, key), 1),
      (f"Hessian trace, {samples} samples, chunks of {trace_chunk}", f"{samples} HVPs",
       lambda p, k: terrain.hessian_trace(loss_fn, p, k, samples, batch_size=trace_chunk),
       (params, key), 1),
      (f"sharpness {sigmas.size} sigmas x {samples}, chunks of {sharp_chunk}",
       f"{sigmas.size * samples} fwd",
       lambda p, k: terrain.perturbation_sharpness(loss_fn, p, k, sigmas, samples,
                                                   batch_size=sharp_chunk).mean, (params, key), 1),
  ]
  # Every grid at least one chunk, so that the chunk, not the grid, sets the memory.
  grid_chunk = min(points, grids[0] ** 2)
  rows += [(f"2-D slice {size} x {size}, chunks of {grid_chunk}", f"{size * size} fwd",
            slice_2d(size, grid_chunk), (params, dx, dy), 1) for size in grids]

  # The cliff detector as it runs in the train step: one update per step, here 1000 in a scan.
  ccfg = cliff.CliffConfig()
  rng = np.random.default_rng(0)
  losses_TxS = jnp.asarray(3.0 + 0.1 * rng.normal(size=(1000, 16)), jnp.float32)
  tokens_TxS = jnp.asarray(rng.integers(0, 5, size=(1000, 16)) * 1024.0, jnp.float32)

  def cliff_scan(losses_TxS, tokens_TxS):
    def body(state, xs):
      t, l_S, k_S = xs
      return cliff.cliff_update(ccfg, state, t, jnp.mean(l_S), l_S, k_S)
    xs = (jnp.arange(1000), losses_TxS, tokens_TxS)
    return jax.lax.scan(body, cliff.cliff_init(16, ccfg.window), xs)[1].score

  header = (f"{'measurement':<44} {'work':>10} {'compile s':>9} {'s/call':>9} {'x grad':>7} "
            f"{'XLA MiB':>9} {'peak MiB':>9}")
  print(header)
  print("-" * len(header))
  grad_s = None
  mib = lambda b: "n/a" if b is None else f"{b / MIB:.1f}"
  for label, work, fn, fn_args, repeats in rows:
    compile_s, per, plan_b, peak = measure(fn, fn_args, repeats=repeats)
    grad_s = grad_s or per
    print(f"{label:<44} {work:>10} {compile_s:>9.1f} {per:>9.3f} {per / grad_s:>7.2f} "
          f"{mib(plan_b):>9} {mib(peak):>9}", flush=True)
  # The largest grid at once (every point, every window), as the terrain ran before it chunked:
  # compiled only; its plan is what it would ask for.
  whole = terrain_run.heldout_loss_fn(cfg, batch)
  size = grids[-1]
  at_once = budget_lib.compiled_bytes(slice_2d(size, None, whole), params, dx, dy)
  print(f"{f'2-D slice {size} x {size}, at once (not run)':<44} {f'{size * size} fwd':>10} "
        f"{'':>9} {'':>9} {'':>7} {mib(at_once):>9} {'':>9}")
  compile_s, per, plan_b, peak = measure(cliff_scan, (losses_TxS, tokens_TxS), repeats=3)
  per_step = per / 1000
  print(f"{'cliff_update (W=200, S=16), per step':<44} {'1 step':>10} {compile_s:>9.1f} "
        f"{per_step:>9.6f} {per_step / grad_s:>7.1e} {mib(plan_b):>9} {mib(peak):>9}")


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  main()

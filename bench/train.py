"""Training-step throughput and the curriculum's overhead, printed as one table.

Rows:
* the tiny model's full training step (forward, backward, AdamW, per-source losses, curriculum and
  zombie-cliff updates) on this machine: tokens/s, and MFU against the device's peak (on a CPU, against
  the FLOP/s of a large float32 matmul measured in the same run, labelled as such);
* the same step with a fixed mixture: the curriculum and detector updates replaced by the identity.
  The ratio of the two is the curriculum's overhead (target: within 1%). The two are timed interleaved,
  several rounds, and compared by their medians, so machine noise hits both alike;
* on a GPU, ANDREA-120M at B=64, T=1024 in bf16 (see also bench/gpu.py).

Usage:
  python -m bench.train [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import cliff as cliff_lib
from andrea_jax import curriculum
from andrea_jax import logs
from andrea_jax import runconfig
from andrea_jax import step as step_lib
from andrea_jax import train
from andrea_jax.model import count_params, flops_per_token


def tiny_config(batch: int, seq_len: int):
  from experiments import tiny
  c = tiny.get_config()
  c.data.seq_len, c.data.global_batch_size = seq_len, batch
  c.model.max_len = max(c.model.max_len, seq_len)
  return c


def random_batch(key, batch: int, seq_len: int, vocab: int, num_sources: int):
  k1, k2 = jax.random.split(key)
  tokens = jax.random.randint(k1, (batch, seq_len + 1), 1, vocab)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
          "segment_ids": jnp.ones((batch, seq_len), jnp.int32),
          "positions": jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), (batch, seq_len)),
          "source_ids": jax.random.randint(k2, (batch,), 0, num_sources)}


@contextlib.contextmanager
def fixed_mixture():
  """Steps *traced* inside the block skip the curriculum and the detector (identity updates)."""
  real_update, real_cliff = curriculum.update, cliff_lib.cliff_update

  def no_cliff(cfg, state, *args):
    event_shape = jax.eval_shape(lambda *a: real_cliff(cfg, *a), state, *args)[1]
    return state, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), event_shape)

  step_lib.curriculum.update = lambda spec, state, *args: state
  step_lib.cliff_lib.cliff_update = no_cliff
  try:
    yield
  finally:
    step_lib.curriculum.update, step_lib.cliff_lib.cliff_update = real_update, real_cliff


def build(config):
  run = runconfig.build(config)
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  return run, state, step_lib.jit_step(run.step)


def time_steps(step_fn, state, batch, n):
  state, m = step_fn(state, batch)
  jax.block_until_ready(m["loss"])
  t0 = time.perf_counter()
  for _ in range(n):
    state, m = step_fn(state, batch)
  jax.block_until_ready(m["loss"])
  return state, (time.perf_counter() - t0) / n


def matmul_flops(n: int = 2048, reps: int = 5) -> float:
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  jax.block_until_ready(f(a))
  t0 = time.perf_counter()
  for _ in range(reps):
    out = f(a)
  jax.block_until_ready(out)
  return 2 * n**3 * reps / (time.perf_counter() - t0)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--quick", action="store_true", help="fewer steps and rounds")
  args = ap.parse_args()
  steps, rounds = (5, 3) if args.quick else (20, 7)
  device = jax.devices()[0]
  rows = []
  batch, seq_len = 32, 128
  config = tiny_config(batch, seq_len)
  run, state, full_step = build(config)
  data = random_batch(jax.random.PRNGKey(0), batch, seq_len, run.model.vocab_size,
                      len(run.sources))
  with fixed_mixture():   # compile (trace) the fixed-mixture step while the identities are in place
    _, state_f, fixed_step = build(config)
    state_f, _ = fixed_step(state_f, data)
  full_t, fixed_t = [], []
  for _ in range(rounds):   # interleaved, so drifts in machine load hit both
    state, t = time_steps(full_step, state, data, steps)
    full_t.append(t)
    state_f, t = time_steps(fixed_step, state_f, data, steps)
    fixed_t.append(t)
  full, fixed = float(np.median(full_t)), float(np.median(fixed_t))
  tokens = batch * seq_len
  flops = flops_per_token(run.model, seq_len)
  peak = logs.peak_flops()
  peak_note = "device peak"
  if peak is None:
    peak, peak_note = matmul_flops(), "vs measured f32 matmul FLOP/s"
  n = count_params(state.params)
  for name, t in (("tiny, full step (curriculum + detector)", full),
                  ("tiny, fixed mixture", fixed)):
    rows.append((name, f"{batch}x{seq_len}", f"{tokens / t:,.0f}", f"{tokens * flops / t / peak:.1%}",
                 f"{t / fixed:.4f}"))
  print(f"device: {device.device_kind} ({device.platform}); tiny model {n:,} parameters, "
        f"{flops / 1e6:.2f} MFLOP/token; MFU {peak_note}; {rounds} interleaved rounds x {steps} steps")
  print(f"{'step':44s} {'BxT':>8s} {'tokens/s':>10s} {'MFU':>6s} {'time / fixed':>13s}")
  for r in rows:
    print(f"{r[0]:44s} {r[1]:>8s} {r[2]:>10s} {r[3]:>6s} {r[4]:>13s}")
  print(f"curriculum overhead: {100 * (full / fixed - 1):+.2f}% of the step "
        f"(spread of the full-step rounds: {100 * (max(full_t) - min(full_t)) / full:.1f}%)")
  if device.platform == "gpu":
    from andrea_jax.model import andrea_120m
    c = tiny_config(64, 1024)
    c.model.update(andrea_120m(dtype="bfloat16").to_dict())
    run, state, step_fn = build(c)
    data = random_batch(jax.random.PRNGKey(0), 64, 1024, run.model.vocab_size, 16)
    _, t = time_steps(step_fn, state, data, steps)
    tps = 64 * 1024 / t
    print(f"{'andrea_120m bf16, full step':44s} {'64x1024':>8s} {tps:>10,.0f} "
          f"{tps * flops_per_token(run.model, 1024) / logs.peak_flops():>6.1%}")


if __name__ == "__main__":
  main()

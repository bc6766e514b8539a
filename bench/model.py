"""Forward + backward throughput of the Transformer, printed as one table.

CPU: ``tiny()`` (float32, with and without remat, and bfloat16), as ratios to the first row: on a
shared CPU only side-by-side ratios mean anything.
GPU: ``andrea_120m()`` at B=64, T=1024 in bfloat16, XLA against cuDNN attention, plain causal and
with packed documents (``segment_ids``), with tokens/s and MFU = flops_per_token * tokens/s / peak.

Usage:
  python -m bench.model [--quick]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax

from andrea_jax import logs
from andrea_jax import model as m

# Dense bf16 peak FLOP/s per device kind: the trainer's own table (andrea_jax.logs).
peak_flops = logs.peak_flops


def measure(cfg: m.ModelConfig, batch: int, seq_len: int, steps: int, packed: bool):
  """(compile seconds, tokens/s) of a jitted value_and_grad of next-token cross-entropy."""
  params = jax.jit(m.init_params)(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (batch, seq_len + 1), 0, cfg.vocab_size)
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  # Packed rows: four documents per row, positions restarting at each.
  doc_len = seq_len // 4
  segment_ids = positions = None
  if packed:
    segment_ids = jnp.broadcast_to(1 + jnp.arange(seq_len) // doc_len, (batch, seq_len))
    positions = jnp.broadcast_to(jnp.arange(seq_len) % doc_len, (batch, seq_len))

  @jax.jit
  def step(params):
    def loss_fn(params):
      logits = m.Transformer(cfg).apply({"params": params}, inputs, segment_ids, positions)
      return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
    return jax.value_and_grad(loss_fn)(params)

  t0 = time.perf_counter()
  jax.block_until_ready(step(params))
  compile_s = time.perf_counter() - t0
  jax.block_until_ready(step(params))  # one more warm-up step
  t0 = time.perf_counter()
  for _ in range(steps):
    out = step(params)
  jax.block_until_ready(out)
  return compile_s, batch * seq_len * steps / (time.perf_counter() - t0)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller batches, fewer steps")
  args = parser.parse_args()
  device = jax.devices()[0]
  on_gpu = device.platform == "gpu"
  big = m.andrea_120m()
  n_big = m.count_params(jax.eval_shape(m.init_params, big, jax.random.key(0)))
  print(f"device: {device.device_kind} ({device.platform}); andrea_120m: {n_big:,} parameters, "
        f"{m.flops_per_token(big, 1024) / 1e9:.3f} GFLOP/token at T=1024")

  rows = []  # (label, cfg, batch, seq_len, steps, packed)
  if on_gpu:
    batch, steps = (16, 5) if args.quick else (64, 20)
    for packed in (False, True):
      for impl in ("xla", "cudnn"):
        cfg = m.andrea_120m(dtype="bfloat16", attention_impl=impl)
        rows.append((f"andrea_120m bf16 {impl}" + (" packed" if packed else ""), cfg, batch,
                     1024, steps, packed))
  else:
    batch, seq_len, steps = (4, 128, 3) if args.quick else (8, 256, 10)
    rows += [("tiny f32", m.tiny(), batch, seq_len, steps, False),
             ("tiny f32 remat", m.tiny(remat=True), batch, seq_len, steps, False),
             ("tiny f32 packed", m.tiny(), batch, seq_len, steps, True),
             ("tiny bf16", m.tiny(dtype="bfloat16"), batch, seq_len, steps, False)]

  peak = peak_flops(device) if on_gpu else None
  header = (f"{'model':<30} {'B':>4} {'T':>5} {'compile s':>9} {'tokens/s':>12} {'ratio':>6} "
            f"{'MFU':>6}")
  print(header)
  print("-" * len(header))
  base = None
  for label, cfg, b, t, s, packed in rows:
    try:
      compile_s, tps = measure(cfg, b, t, s, packed)
    except Exception as e:  # noqa: BLE001 -- report OOM / unsupported kernels as a row and go on
      reason = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
      print(f"{label:<30} {b:>4} {t:>5}   failed: {reason}")
      continue
    base = base or tps
    mfu = f"{m.flops_per_token(cfg, t) * tps / peak:6.1%}" if peak else f"{'-':>6}"
    print(f"{label:<30} {b:>4} {t:>5} {compile_s:>9.1f} {tps:>12,.0f} {tps / base:>6.2f} {mfu}")


if __name__ == "__main__":
  main()

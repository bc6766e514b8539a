"""The curriculum's cost next to a training step, and the simulator's speed.

    python -m bench.curriculum [--quick]

Rows, all measured in one run on the same device (on a CPU, read the ratios, not the times):

* ``train step``: the tiny model (``andrea_jax.model.tiny()``, B=16, T=256), forward + backward +
  ``optax.adamw``, jitted with the state donated; the reference (ratio 1).
* ``train step + curriculum.update``: the same step with the update fused in, as the trainer runs it
  (per-source mean losses and token counts from the batch). The difference is the update's cost in
  the step; below the machine's timing noise, read the scan row for the update's own compute.
* ``update, jitted call``: one call from Python per step, on a step without and with a phase
  decision (dispatch overhead included).
* ``update, in a lax.scan``: amortised over many steps, decisions included (one per ~24.5 steps).
* ``simulate``: the ANDREA curriculum against the synthetic reward model, 200K steps (20K with
  ``--quick``), after compilation; and the compilation itself.

Times are medians of interleaved repeats (a change of machine load hits every row alike).
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from andrea_jax import curriculum
from andrea_jax.curriculum import simulate as sim
from andrea_jax.model import Transformer, init_params, tiny

B, T, S = 16, 256, 16


def _median_seconds(fns: dict, repeats: int) -> dict:
  """Median seconds per call of each zero-argument function, called in turn in every repeat."""
  for fn in fns.values():
    jax.block_until_ready(fn())
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - t0)
  return {name: float(np.median(t)) for name, t in times.items()}


def _train_parts():
  cfg = tiny()
  model = Transformer(cfg)
  tx = optax.adamw(3e-4, b1=0.9, b2=0.95, weight_decay=0.1)
  params = init_params(cfg, jax.random.key(0))
  opt_state = tx.init(params)
  rng = np.random.default_rng(0)
  tokens_BxT = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, T + 1)), jnp.int32)
  source_B = jnp.asarray(rng.integers(0, S, B), jnp.int32)

  def losses(params, tokens_BxT):
    logits_BxTxV = model.apply({"params": params}, tokens_BxT[:, :-1])
    nll_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, tokens_BxT[:, 1:])
    return jnp.mean(nll_BxT), jnp.mean(nll_BxT, axis=1)

  def train_step(params, opt_state, tokens_BxT):
    (loss, seq_loss_B), grads = jax.value_and_grad(losses, has_aux=True)(params, tokens_BxT)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, seq_loss_B

  return train_step, params, opt_state, tokens_BxT, source_B


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer repeats, a 20K-step simulation")
  args = parser.parse_args()
  repeats = 5 if args.quick else 30
  sim_steps = 20_000 if args.quick else 200_000
  scan_steps = 2_000 if args.quick else 20_000

  spec = curriculum.spec_from_config(curriculum.curriculum_config(curriculum.andrea_geometries()))
  cur0 = curriculum.init(spec, jax.random.key(1))
  train_step, params, opt_state, tokens_BxT, source_B = _train_parts()

  plain = jax.jit(train_step, donate_argnums=(0, 1))

  @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
  def fused(params, opt_state, cur, tokens_BxT, step):
    params, opt_state, loss, seq_loss_B = train_step(params, opt_state, tokens_BxT)
    tokens_S = jax.ops.segment_sum(jnp.full((B,), float(T)), source_B, S)
    loss_sum_S = jax.ops.segment_sum(seq_loss_B * T, source_B, S)
    losses_S = loss_sum_S / jnp.maximum(tokens_S, 1.0)
    return params, opt_state, curriculum.update(spec, cur, step, losses_S, tokens_S), loss

  update = jax.jit(functools.partial(curriculum.update, spec))
  losses_S, tokens_S = jnp.full((S,), 3.0), jnp.full((S,), float(B * T / S))
  decision_step = int(cur0.next_start) - spec.decision_lag - 1

  @jax.jit
  def scanned(cur):
    def body(c, t):
      return curriculum.update(spec, c, t, losses_S - 1e-5 * t, tokens_S), None
    return jax.lax.scan(body, cur, jnp.arange(scan_steps, dtype=jnp.int32))[0]

  # Donated buffers are consumed: every call gets the previous call's outputs.
  box = {"plain": (params, opt_state), "fused": (jax.tree.map(jnp.copy, params),
                                                 jax.tree.map(jnp.copy, opt_state),
                                                 jax.tree.map(jnp.copy, cur0))}

  def run_plain():
    p, o, loss, _ = plain(*box["plain"], tokens_BxT)
    box["plain"] = (p, o)
    return loss

  def run_fused():
    p, o, c = box["fused"]
    p, o, c, loss = fused(p, o, c, tokens_BxT, jnp.int32(0))
    box["fused"] = (p, o, c)
    return loss

  seconds = _median_seconds({
      "train": run_plain,
      "fused": run_fused,
      "call": lambda: update(cur0, jnp.int32(0), losses_S, tokens_S),
      "call_decision": lambda: update(cur0, jnp.int32(decision_step), losses_S, tokens_S),
      "scan": lambda: scanned(cur0),
  }, repeats)

  t0 = time.perf_counter()
  jax.block_until_ready(sim.simulate(spec, jax.random.key(0), 1000).weights)
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  result = sim.simulate(spec, jax.random.key(0), sim_steps)
  sim_s = time.perf_counter() - t0

  train = seconds["train"]
  rows = [
      ("train step (tiny, B=16, T=256, fwd+bwd+AdamW)", train),
      ("train step + curriculum.update (fused)", seconds["fused"]),
      ("  difference (timing noise dominates on a CPU)", seconds["fused"] - train),
      ("update, jitted call, no decision", seconds["call"]),
      ("update, jitted call, decision step", seconds["call_decision"]),
      (f"update, in a lax.scan (per step, {scan_steps} steps)", seconds["scan"] / scan_steps),
  ]
  print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}); median of {repeats}")
  print(f"{'what':52s} {'ms':>10s} {'x train step':>13s}")
  for name, s in rows:
    print(f"{name:52s} {s * 1e3:10.4f} {s / train:13.5f}")
  print(f"{f'simulate {sim_steps:,} steps (after compilation)':52s} {sim_s * 1e3:10.1f} "
        f"{'':>13s}  = {sim_steps / sim_s:,.0f} steps/s")
  print(f"{'simulate: compilation + 1000 steps':52s} {compile_s * 1e3:10.1f}")
  assert result.lag_consistent.all()


if __name__ == "__main__":
  main()

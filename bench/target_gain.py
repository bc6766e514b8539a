"""What measuring the target gain costs a training step, printed as one table.

The demo's step (``experiments/tiny.py``: the whole jitted step, curriculum included) three ways,
on the same random tokens: without target gains; with ``target_gain.every = 1`` (a measurement at
every step: its cost alone); and with the run's default rows. The two are timed interleaved,
several rounds, and compared by their medians, so machine noise hits both alike. The cost of a
measurement, in steps, divided by ``every`` is the overhead of a run that measures every ``every``
steps (the step does nothing extra on the other steps: a ``lax.cond``).

Usage:
  python -m bench.target_gain [--quick]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import curriculum, probes, runconfig, step as step_lib, train
from bench.train import random_batch


def _config(measure: bool, rows_per_source: int, target_rows: int):
  from experiments import tiny
  c = tiny.get_config()
  if measure:
    c.probes.target_gain.update(every=1, rows_per_source=rows_per_source,
                               target_rows=target_rows)
    curriculum.set_mixer(c, "andrea", reward="target_gain")
  return c


def _timer(c, key):
  run = runconfig.build(c)
  state = train.init_state(run, train.run_keys(0))
  vocab, seq = run.model.vocab_size, c.data.seq_len
  k1, k2, k3 = jax.random.split(key, 3)
  batch = random_batch(k1, c.data.global_batch_size, seq, vocab, len(run.sources))
  for gain in run.step.probes:   # the target gain's rows: probe rows of each trainable source
    probe = random_batch(k2, gain.rows["probe"], seq, vocab, 1)
    used = [run.sources.index(s) for s in run.trainable]
    probe["source_ids"] = jnp.asarray(np.repeat(used, gain.rows["probe"] // len(used)), jnp.int32)
    batch.update({probes.rows_key(gain.name, "probe", k): v for k, v in probe.items()})
    batch.update({probes.rows_key(gain.name, "target", k): v for k, v in random_batch(
        k3, gain.rows["target"], seq, vocab, len(run.sources)).items()})
  step = step_lib.jit_step(run.step)
  state, m = step(state, batch)
  jax.block_until_ready(m["loss"])

  def time_steps(n):
    nonlocal state
    t0 = time.perf_counter()
    for _ in range(n):
      state, m = step(state, batch)
    jax.block_until_ready(m["loss"])
    return (time.perf_counter() - t0) / n
  return time_steps


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="fewer rounds and steps")
  args = parser.parse_args()
  rounds, steps = (3, 5) if args.quick else (7, 20)
  defaults = probes.probe_config("target_gain")
  rows, target_rows = defaults.rows_per_source, defaults.target_rows
  timers = {"off": _timer(_config(False, rows, target_rows), jax.random.key(0)),
            "every step": _timer(_config(True, rows, target_rows), jax.random.key(0))}
  times = {k: [] for k in timers}
  for _ in range(rounds):
    for k, t in timers.items():
      times[k].append(t(steps))
  off, on = (float(np.median(times[k])) for k in ("off", "every step"))
  cost = on / off - 1
  print(f"target gain on the demo's step ({jax.devices()[0].device_kind}; "
        f"{rows} rows per source, {target_rows} target rows; medians of {rounds} rounds of "
        f"{steps} steps)")
  print(f"{'':34s} {'ms/step':>9s} {'overhead':>9s}")
  print(f"{'no measurement':34s} {1e3 * off:9.2f} {'':>9s}")
  print(f"{'a measurement at every step':34s} {1e3 * on:9.2f} {cost:9.1%}")
  for every in (4, 8, 16, 32):
    print(f"{f'probes.target_gain.every = {every}':34s} {1e3 * (off + (on - off) / every):9.2f} "
          f"{cost / every:9.1%}")


if __name__ == "__main__":
  main()

"""Simulate a curriculum alone, without a model, against a synthetic reward model.

  python -m andrea_jax.curriculum --config experiments/andrea_curriculum.py --out runs/sim

Writes ``weights.npy`` (``[N, S]`` float32, the weights used at each step), ``phases.json`` (start,
length, label and geometry of each phase), ``sources.json`` (the source order), ``weights.png`` (the
mixture as stacked areas, regimes marked) and ``triangle.png`` (a walk on the seed's three-source
example, ``H >= 0.5``, ``D <= 0.25``, with the same phase and bandit settings). Any config field can
be overridden, e.g. ``--config.curriculum.mixer.eta=0.5``,
``--config.curriculum.mixer.name=exp3`` or
``--config.curriculum.geometries.v3_polish.floors.hermes3_general=0.6``.
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from andrea_jax.curriculum import spec as spec_lib
from andrea_jax.curriculum import plots
from andrea_jax.curriculum import registry
from andrea_jax.curriculum import simulate as sim
from andrea_jax.simplex import vertices

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A config file whose get_config() has a `curriculum` section (and `seed`).",
    lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 0, "Steps to simulate; 0 = the config's train.num_steps.")
_OUT = flags.DEFINE_string("out", None, "Output directory (created).")
_TRIANGLE_STEPS = flags.DEFINE_integer(
    "triangle_steps", 1000, "Steps of the three-source walk on the triangle; 0 = none.")
_PLOTS = flags.DEFINE_bool("plots", True, "Write the PNG figures.")


def run(config, num_steps: int, out: str, *, triangle_steps: int = 1000, make_plots: bool = True
        ) -> dict:
  """Simulates ``config.curriculum`` for ``num_steps`` steps; writes the outputs under ``out``."""
  spec = spec_lib.spec_from_config(config.curriculum, sources=config.sources)
  key = jax.random.key(int(config.seed))
  t0 = time.perf_counter()
  result = sim.simulate(spec, key, num_steps)
  elapsed = time.perf_counter() - t0
  os.makedirs(out, exist_ok=True)
  np.save(os.path.join(out, "weights.npy"), result.weights.astype(np.float32))
  phases = result.phases(spec)
  with open(os.path.join(out, "phases.json"), "w") as f:
    json.dump(phases, f, indent=0)
  with open(os.path.join(out, "sources.json"), "w") as f:
    json.dump(list(spec.sources), f, indent=1)
  if make_plots:
    plots.plot_weights(result.weights, spec.sources, os.path.join(out, "weights.png"),
                       geometry_starts=spec.starts.tolist(), geometry_names=spec.geometry_names,
                       title=f"curriculum '{spec.mixer_name}', {num_steps:,} simulated steps")
    if triangle_steps > 0:
      tri = sim.seed_triangle_spec(config.curriculum)
      walk = sim.simulate(tri, key, triangle_steps)
      starts = [p["start"] for p in walk.phases(tri)]
      plots.plot_triangle_walk(walk.weights[starts], vertices(tri.lowers[0], tri.uppers[0]),
                               os.path.join(out, "triangle.png"),
                               kinds=[p["label"] for p in walk.phases(tri)],
                               title=f"H >= 0.5, D <= 0.25: {len(starts)} phases")
  labels = [p["label"] for p in phases]
  return {"steps": num_steps, "phases": len(phases), "seconds": elapsed,
          "random": labels.count("random"), "bandit": labels.count("bandit"),
          "lag_consistent": bool(result.lag_consistent.all())}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config is None or _OUT.value is None:
    raise app.UsageError("--config and --out are required")
  registry.apply_name_override(config, config_flags.get_override_values(flags.FLAGS["config"]))
  steps = _STEPS.value or int(config.train.num_steps)
  if steps <= 0:
    raise app.UsageError("--steps must be positive (or the config must set train.num_steps)")
  s = run(config, steps, _OUT.value, triangle_steps=_TRIANGLE_STEPS.value, make_plots=_PLOTS.value)
  print(f"{s['steps']:,} steps, {s['phases']:,} phases ({s['random']} random, "
        f"{s['bandit']} bandit) simulated in {s['seconds']:.2f} s (compilation included); "
        f"schedule lag-consistent: {s['lag_consistent']}; outputs in {_OUT.value}")


if __name__ == "__main__":
  app.run(main)

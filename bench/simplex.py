"""Simplex geometry: exact projection against jaxopt's bisection, and uniform sampling throughput.

    python -m bench.simplex [--quick]

Projection: a batch of 4096 random 16-dim points, each with its own random floors, ceilings and
exclusions, projected by ``andrea_jax.simplex.project`` (both exact bracketings) and by
``jaxopt.projection.projection_box_section`` (bisection, jaxopt's defaults); jitted, timed after
warmup, median of repeats; worst ``|sum w - 1|`` and worst distance to a float64 numpy bisection
run to convergence.
Sampling: ``sample_uniform`` samples per second in the v3 polish region and the plain simplex.
Needs jaxopt (``pip install -e .[bench]``). On a CPU, compare the rows of one run with each other.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax.simplex import Region, project, sample_uniform

# The tests' independent float64 answer (numpy bisection on tau, 200 halvings).
from tests.test_simplex_projection import oracle as _bisection_reference


def _random_regions(rng: np.random.Generator, batch: int, n: int):
  """Random feasible (x, lower, upper) in float64: floors, ceilings and a few exclusions."""
  x = rng.normal(0, 0.5, (batch, n))
  upper = np.where(rng.random((batch, n)) < 0.5, rng.uniform(0.05, 1, (batch, n)), 1.0)
  upper = np.where(rng.random((batch, n)) < 0.1, 0.0, upper)
  lower = np.where(rng.random((batch, n)) < 0.3, rng.uniform(0, 1, (batch, n)) * upper, 0.0)
  # Rescale floors into sum <= 0.9 and keep sum(upper) >= 1 by opening the first ceiling.
  lower *= np.minimum(1, 0.9 / np.maximum(lower.sum(1, keepdims=True), 1e-12))
  short = upper.sum(1) < 1
  upper[short, 0] = 1.0
  lower[short, 0] = np.minimum(lower[short, 0], 0.5)
  return x, lower, upper


def _time_interleaved(fns: dict, args, repeats: int) -> dict:
  """Median seconds per call of each function, the candidates timed in turn in every repeat so
  that a change of machine load hits all of them alike."""
  for fn in fns.values():
    jax.block_until_ready(fn(*args))
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - t0)
  return {name: float(np.median(t)) for name, t in times.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer repeats and samples")
  args = parser.parse_args()
  repeats = 5 if args.quick else 50
  from jaxopt.projection import projection_box_section

  def jaxopt_project(x, lower, upper):
    ones = jnp.ones_like(x)
    return jax.vmap(lambda x, l, u, o: projection_box_section(x, (l, u, o, 1.0)))(
        x, lower, upper, ones)

  candidates = {
      "ours (auto)": jax.jit(project),
      "ours (pairwise)": jax.jit(lambda x, l, u: project(x, l, u, method="pairwise")),
      "ours (sort)": jax.jit(lambda x, l, u: project(x, l, u, method="sort")),
      "jaxopt projection_box_section": jax.jit(jaxopt_project),
  }
  rng = np.random.default_rng(0)
  x64, l64, u64 = _random_regions(rng, 4096, 16)
  exact = _bisection_reference(x64, l64, u64)

  rows = []
  for dtype in (np.float32, np.float64):
    with jax.enable_x64(dtype == np.float64):
      data = tuple(jnp.asarray(a, dtype) for a in (x64, l64, u64))
      seconds = _time_interleaved(candidates, data, repeats)
      for name, fn in candidates.items():
        w = np.asarray(fn(*data), np.float64)
        rows.append((name, np.dtype(dtype).name, seconds[name] * 1e3,
                     float(np.max(np.abs(w.sum(1) - 1))), float(np.max(np.abs(w - exact)))))

  print("projection of 4096 x 16 points (jit, median of %d)" % repeats)
  print(f"{'method':32s} {'dtype':8s} {'ms/batch':>9s} {'vs jaxopt':>9s} {'max|sum-1|':>11s} "
        f"{'max|w-exact|':>13s}")
  ref = {dtype: ms for name, dtype, ms, _, _ in rows if name.startswith("jaxopt")}
  for name, dtype, ms, sum_err, err in rows:
    print(f"{name:32s} {dtype:8s} {ms:9.3f} {ms / ref[dtype]:8.2f}x {sum_err:11.2e} {err:13.2e}")

  polish = Region.from_bounds({"hermes3-general": 0.7}, {"dictionary": 0.25},
                              exclude=("repo-docs", "repo-docstrings"), label="v3_polish")
  plain = Region.from_bounds(label="simplex")
  num = 1024 if args.quick else 16384
  print(f"\nsample_uniform, {num} samples per call (jit, median of {repeats})")
  print(f"{'region':10s} {'method':8s} {'path':>4s} {'samples/s':>12s}")
  for region in (polish, plain):
    for method in ("auto", "chain"):
      n_draw = num if method == "auto" else max(num // 16, 64)
      fn = jax.jit(lambda k, l, u, m=method, s=n_draw: sample_uniform(k, l, u, s, method=m))
      data = (jax.random.key(0), jnp.asarray(region.lower, jnp.float32),
              jnp.asarray(region.upper, jnp.float32))
      seconds = _time_interleaved({"fn": fn}, data, max(3, repeats // 5))["fn"]
      path = int(fn(*data)[1].path)
      print(f"{region.label:10s} {method:8s} {path:4d} {n_draw / seconds:12.4g}")


if __name__ == "__main__":
  main()

"""How wide is the basin of a saved run? Basin-width report of one checkpoint.

  python -m andrea_jax.terrain --workdir runs/tiny                 # the newest checkpoint
  python -m andrea_jax.terrain --workdir runs/tiny --step 500 --sigmas 0.01,0.05,0.1 --batch_size 4

Rebuilds the run's config from the checkpoint, restores the parameters of ``--step`` and measures
the terrain of the held-out loss (the run's own evaluation windows) around them: perturbation
sharpness, top Hessian eigenvalues, Hessian trace, 1-D and 2-D slices
(:func:`andrea_jax.terrain.write_basin_report`). Writes ``basin.json``, ``slice_1d.png``,
``slice_2d.png`` and ``sharpness.png`` into ``--out`` (default ``<workdir>/basin/<step>``).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Any

import jax

from andrea_jax.terrain.report import write_basin_report
from andrea_jax.terrain.run import heldout_batch, heldout_loss_fn, load_checkpoint


def _floats(text: str) -> list[float]:
  try:
    values = [float(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
  if not values:
    raise argparse.ArgumentTypeError(f"expected at least one number, got {text!r}")
  return values


def _names(text: str) -> list[str]:
  return [x.strip() for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m andrea_jax.terrain",
                              description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True, help="the run's directory (holds checkpoints/)")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
  p.add_argument("--out", default=None, help="output directory (default <workdir>/basin/<step>)")
  p.add_argument("--sigmas", type=_floats, default=[0.01, 0.02, 0.05, 0.1, 0.2, 0.5],
                 help="relative perturbation sizes, comma-separated")
  p.add_argument("--num_samples", type=int, default=8, help="random directions per sigma")
  p.add_argument("--hessian_k", type=int, default=3, help="top Hessian eigenvalues (0 = none)")
  p.add_argument("--hessian_iters", type=int, default=30, help="Lanczos steps")
  p.add_argument("--trace_samples", type=int, default=8, help="Hutchinson samples (0 = none)")
  p.add_argument("--slice_points", type=int, default=21, help="grid points per slice axis")
  p.add_argument("--slice_range", type=float, default=1.0, help="slice coordinates in [-r, r]")
  p.add_argument("--batch_size", type=int, default=None,
                 help="perturbed losses evaluated together (default all at once; set it for "
                      "large models)")
  p.add_argument("--sequences_per_source", type=int, default=None,
                 help="held-out windows per source (default the run's eval.sequences_per_source)")
  p.add_argument("--sources", type=_names, default=None,
                 help="comma-separated sources of the held-out batch (default the run's)")
  p.add_argument("--seed", type=int, default=0, help="seed of the random directions")
  return p


def run(args: argparse.Namespace) -> dict[str, Any]:
  """Loads the checkpoint, measures and writes the report; returns the report dict."""
  saved = load_checkpoint(args.workdir, args.step)
  out = args.out or os.path.join(args.workdir, "basin", str(saved.step))
  batch = heldout_batch(saved.config, saved.run, sequences_per_source=args.sequences_per_source,
                        sources=args.sources)
  loss_fn = heldout_loss_fn(saved.run.model_config, batch)
  name = os.path.basename(os.path.normpath(args.workdir))
  report = write_basin_report(
      loss_fn, saved.params, jax.random.PRNGKey(args.seed), out, title=f"{name}, step {saved.step}",
      sigmas=args.sigmas, num_samples=args.num_samples, hessian_k=args.hessian_k,
      hessian_iters=args.hessian_iters, trace_samples=args.trace_samples,
      slice_points=args.slice_points, slice_range=args.slice_range, batch_size=args.batch_size)
  report["step"] = saved.step
  report["out"] = out
  report["heldout"] = {"sources": sorted({saved.run.sources[i] for i in batch["source_ids"]}),
                       "sequences": int(batch["inputs"].shape[0]),
                       "seq_len": int(batch["inputs"].shape[1])}
  return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parser().parse_args(argv)
  t0 = time.perf_counter()
  r = run(args)
  eig = r["hessian"].get("top_eigenvalues")
  # The report writes a non-finite number as None (JSON has no NaN): printed as n/a.
  num = lambda x, spec: "n/a" if x is None else format(x, spec)
  print(f"step {r['step']}: held-out loss {num(r['loss'], '.4f')} on {r['heldout']['sequences']} "
        f"windows of {r['heldout']['seq_len']} tokens, {r['num_params']:,} parameters")
  if eig:
    print("top Hessian eigenvalues: " + ", ".join(num(e, ".4g") for e in eig))
  if "trace" in r["hessian"]:
    print(f"Hessian trace {num(r['hessian']['trace'], '.4g')} +- "
          f"{num(r['hessian']['trace_stderr'], '.2g')}")
  for s, m in zip(r["sharpness"]["sigmas"], r["sharpness"]["mean_increase"]):
    print(f"sigma {s:g}: mean loss increase {num(m, '.4g')}")
  print(f"wrote {r['out']}/basin.json, slice_1d.png, slice_2d.png, sharpness.png "
        f"in {time.perf_counter() - t0:.1f} s")
  return r


if __name__ == "__main__":
  main()

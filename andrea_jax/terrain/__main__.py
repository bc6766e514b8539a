"""How wide is the basin of a saved run? Basin-width report of one checkpoint.

  python -m andrea_jax.terrain --workdir runs/tiny                 # the newest checkpoint
  python -m andrea_jax.terrain --workdir runs/tiny --step 500 --sigmas 0.01,0.05,0.1
  python -m andrea_jax.terrain --workdir runs/andrea120m --step 112000 --memory_budget_gib 40

Rebuilds the run's config from the checkpoint, restores the parameters of ``--step`` and measures
the terrain of the held-out loss (the run's own evaluation windows) around them: perturbation
sharpness, top Hessian eigenvalues, Hessian trace, 1-D and 2-D slices
(:func:`andrea_jax.terrain.write_basin_report`), under a progress bar. Writes ``basin.json``,
``sharpness.png``, ``slice_1d.png`` and ``slice_2d.png`` into ``--out`` (default
``<workdir>/basin/<step>``), each as soon as its part is measured.

Memory: ``--memory_budget_gib`` (default the run's ``terrain.memory_budget_gib``; 0 = half the
accelerator's memory, or 2 GiB on a CPU) bounds what the evaluations allocate beyond the weights.
The held-out windows go through the model in chunks that fit one Hessian-vector product beside the
Lanczos basis (:func:`andrea_jax.terrain.run.windows_per_chunk`), and the perturbations in chunks
that fit the budget (:func:`andrea_jax.terrain.chunk_plan`); ``--window_batch`` and
``--batch_size`` set either by hand.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Any

import jax

from andrea_jax.checkpoint import load_checkpoint
from andrea_jax.terrain import budget as budget_lib
from andrea_jax.terrain.report import write_basin_report
from andrea_jax.terrain.run import heldout_batch, heldout_loss_fn, windows_per_chunk


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
  p.add_argument("--memory_budget_gib", type=float, default=None,
                 help="GiB the evaluations may allocate beyond the weights (default the run's "
                      "terrain.memory_budget_gib; 0 = half the accelerator's memory, 2 GiB on a "
                      "CPU)")
  p.add_argument("--batch_size", type=int, default=None,
                 help="perturbations evaluated together (default: as many as the budget allows)")
  p.add_argument("--window_batch", type=int, default=None,
                 help="held-out windows per loss chunk (default: as many as the budget allows)")
  p.add_argument("--progress_bar", action=argparse.BooleanOptionalAction, default=True,
                 help="show a progress bar")
  p.add_argument("--sequences_per_source", type=int, default=None,
                 help="held-out windows per source (default the run's eval.sequences_per_source)")
  p.add_argument("--sources", type=_names, default=None,
                 help="comma-separated sources of the held-out batch (default the run's)")
  p.add_argument("--seed", type=int, default=0, help="seed of the random directions")
  return p


def memory_budget(args: argparse.Namespace, config: Any) -> int:
  """The budget in bytes: ``--memory_budget_gib``, else the run's ``terrain.memory_budget_gib``
  (a run trained before the field existed has none), 0 meaning the default budget."""
  if args.memory_budget_gib is not None:
    return budget_lib.budget_bytes(args.memory_budget_gib, name="--memory_budget_gib")
  section = config.get("terrain") or {}
  return budget_lib.budget_bytes(section.get("memory_budget_gib", 0.0),
                                 name="terrain.memory_budget_gib")


def run(args: argparse.Namespace) -> dict[str, Any]:
  """Loads the checkpoint, measures and writes the report; returns the report dict."""
  for name in ("batch_size", "window_batch"):
    value = getattr(args, name)
    if value is not None and value < 1:
      raise ValueError(f"--{name} must be >= 1, got {value}")
  if args.memory_budget_gib is not None:   # a bad flag fails before the checkpoint is read
    budget_lib.budget_bytes(args.memory_budget_gib, name="--memory_budget_gib")
  saved = load_checkpoint(args.workdir, args.step)
  budget = memory_budget(args, saved.config)
  out = args.out or os.path.join(args.workdir, "basin", str(saved.step))
  batch = heldout_batch(saved.config, saved.run, sequences_per_source=args.sequences_per_source,
                        sources=args.sources)
  windows = args.window_batch
  if windows is None:
    leaves = jax.tree.leaves(saved.params)
    num_params = sum(x.size for x in leaves)
    lanczos = (min(args.hessian_iters, num_params) * num_params * leaves[0].dtype.itemsize
               if args.hessian_k > 0 else 0)   # the Lanczos basis, beside each HVP
    windows = windows_per_chunk(saved.run.model, batch, saved.params, budget,
                                reserve=lanczos)
  rows = int(batch["inputs"].shape[0])
  windows = -(-rows // -(-rows // min(windows, rows)))   # the chunks heldout_loss_fn makes: even
  loss_fn = heldout_loss_fn(saved.run.model, batch, window_batch=windows)
  name = os.path.basename(os.path.normpath(args.workdir))
  heldout = {"sources": sorted({saved.run.sources[i] for i in batch["source_ids"]}),
             "sequences": int(batch["inputs"].shape[0]), "seq_len": int(batch["inputs"].shape[1]),
             "windows_per_chunk": windows}
  print(f"{name}, step {saved.step}: {heldout['sequences']} held-out windows, {windows} per "
        f"chunk; memory budget {budget_lib.format_bytes(budget)}; writing {out}", flush=True)

  def add_run_fields(report: dict[str, Any], part: str) -> None:
    # Into the dict before it is written, so that every basin.json says what it measured.
    report.update(step=saved.step, heldout=heldout)

  report = write_basin_report(
      loss_fn, saved.params, jax.random.PRNGKey(args.seed), out, title=f"{name}, step {saved.step}",
      sigmas=args.sigmas, num_samples=args.num_samples, hessian_k=args.hessian_k,
      hessian_iters=args.hessian_iters, trace_samples=args.trace_samples,
      slice_points=args.slice_points, slice_range=args.slice_range, batch_size=args.batch_size,
      memory_budget=budget, progress=args.progress_bar, on_part=add_run_fields)
  report["out"] = out
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

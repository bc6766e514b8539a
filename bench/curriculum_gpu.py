"""The curriculum's overhead at GPU speed: ANDREA-120M trained 200 steps with the ANDREA curriculum
and with the static mixture, by the real launcher, printed as one table.

Both runs are ``python -m andrea_jax.main --config=experiments/andrea120m.py:v2:synthetic``
(bf16, T=1024,
the document mask, the v2 warmup geometry: seven sources) on one GPU, cut to what one GPU holds
(B=64 rows, no gradient accumulation) and stopped at step 200 (``train.stop_step``: the schedules
stay laid out over 200K steps), on the built-in corpus through the real host pipeline (the mixture
sampler in its prefetch thread, the schedule feed, metrics read every ``train.log_every`` steps).
They differ in one field: ``curriculum.mixer.name`` = ``andrea`` (random and bandit phases, their
decisions in the step, the sampler following them) or ``static`` (the uniform mixture projected on
the region: a fixed mixture, the same pipeline). The tuned XLA flags of bench/gpu.py are set
(``--flags`` picks another of its sets).

Step time: per log interval of ``log_every`` steps, from the run's own ``throughput.jsonl``; the
first interval (it holds the compilation) is left out; the table gives the median, and the fastest
and slowest intervals. Overhead = median step time with the curriculum / without - 1; target: under
1% of a step.

Usage (from the repository root):
  python -m bench.curriculum_gpu                    # one GPU, 200 steps per run (~3 min, est.)
  python -m bench.curriculum_gpu --steps=60 --log_every=10     # what bench/device_check.py runs
  python -m bench.curriculum_gpu --cpu              # tiny model on the CPU: checks the script
  python -m bench.curriculum_gpu --json=out/curriculum.json --workdir=/tmp/curriculum_gpu
Without a GPU (and without --cpu) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench import gpu

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
STRATEGIES = ("andrea", "static")
TARGET_OVERHEAD = 0.01                  # of a step


def overrides(cpu: bool, steps: int, log_every: int) -> list[str]:
  """The command-line overrides of experiments/andrea120m.py:v2:synthetic shared by both runs."""
  o = {"data.global_batch_size": 64, "optim.grad_accum_steps": 1, "train.stop_step": steps,
       "train.log_every": log_every, "train.checkpoint_every": 0, "train.progress_bar": False,
       "train.plot": False, "train.tensorboard": False,
       # The evaluation at the stop step: one window per source, no samples (no generation to
       # compile; the runs measure training).
       "eval.every": 0, "eval.sequences_per_source": 1, "eval.sample_tokens": 0}
  if cpu:   # the tiny model of bench/gpu.py --cpu, float32 (a CPU has no bf16 matmul units)
    o.update({"model.num_layers": 2, "model.num_heads": 2, "model.d_model": 64,
              "model.d_mlp": 256, "model.max_len": 64, "model.vocab_size": 0,
              "model.dtype": "float32", "data.seq_len": 64, "data.global_batch_size": 8})
  return [f"--config.{k}={v}" for k, v in o.items()]


def _read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def run_one(strategy: str, workdir: str, cpu: bool, steps: int, log_every: int,
            timeout: float, flags: str = "tuned") -> dict:
  """Trains one run in a subprocess: its step times (seconds per step, per log interval after the
  first), wall time and last logged loss. A run that fails or times out after logging two
  intervals (in its final evaluation or checkpoint, say) keeps its figures, with the reason under
  ``note``; one that logged fewer gets ``error`` instead."""
  env = dict(os.environ)
  env.setdefault("CUDA_VISIBLE_DEVICES", "0")
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + gpu.FLAG_SETS[flags]).strip()
  env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.90")   # the GPU is this run's alone
  if cpu:
    env["JAX_PLATFORMS"] = "cpu"
  cmd = [sys.executable, "-m", "andrea_jax.main", "--config=experiments/andrea120m.py:v2:synthetic",
         f"--workdir={workdir}", f"--config.curriculum.mixer.name={strategy}",
         *overrides(cpu, steps, log_every)]
  t0 = time.perf_counter()
  problem, stderr = None, ""
  try:
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
      tail = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]
      why = next((line for line in reversed(tail) if "rror" in line), tail[-1] if tail else "")
      problem, stderr = f"exit {out.returncode}: {why.strip()[:200]}", out.stderr[-3000:]
  except subprocess.TimeoutExpired:
    problem = f"timed out after {timeout:.0f} s"
  wall = time.perf_counter() - t0
  perf = _read_jsonl(os.path.join(workdir, "throughput.jsonl"))
  records = [r for r in _read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "loss" in r]
  tokens_per_step = (8 * 64) if cpu else (64 * 1024)
  step_s = [tokens_per_step / r["tokens_per_s"] for r in perf[1:]]   # the first holds compilation
  if not step_s:
    return {"error": problem or f"fewer than two log intervals in {workdir}/throughput.jsonl",
            "command": " ".join(cmd), "stderr_tail": stderr}
  mfu = [r["mfu"] for r in perf[1:] if "mfu" in r]
  r = {"step_s": step_s, "median_step_s": statistics.median(step_s),
       "tokens_per_s": tokens_per_step / statistics.median(step_s),
       "mfu": statistics.median(mfu) if mfu else None, "wall_s": wall,
       "loss": records[-1]["loss"] if records else None,
       "last_step": records[-1]["step"] if records else None, "command": " ".join(cmd)}
  if problem:
    r.update(note=f"{problem} (figures from the {len(step_s)} intervals logged before)",
             stderr_tail=stderr)
  return r


def overhead(results: dict) -> float | None:
  """Median step time with the ANDREA curriculum over the static mixture's, minus 1."""
  a, s = results.get("andrea", {}), results.get("static", {})
  if "median_step_s" not in a or "median_step_s" not in s:
    return None
  return a["median_step_s"] / s["median_step_s"] - 1


def main(argv: list[str] | None = None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--cpu", action="store_true", help="tiny model on the CPU (checks the script)")
  ap.add_argument("--steps", type=int, default=0, help="steps per run (default 200, CPU 40)")
  ap.add_argument("--log_every", type=int, default=0, help="steps per timed interval (20, CPU 10)")
  ap.add_argument("--timeout", type=float, default=300, help="seconds per run at most")
  ap.add_argument("--budget", type=float, default=0, help="seconds for both runs: the first gets "
                  "half, the second what is left (0: --timeout each)")
  ap.add_argument("--workdir", default="", help="where the two runs go (default: a temporary "
                  "folder, removed at the end)")
  ap.add_argument("--flags", default="tuned", choices=list(gpu.FLAG_SETS),
                  help="bench/gpu.py's XLA flag set for both runs")
  ap.add_argument("--json", default="", help="also write the results to this file")
  args = ap.parse_args(argv)
  if not args.cpu and not gpu._gpu_present():
    print("bench/curriculum_gpu.py: no NVIDIA GPU here (nvidia-smi -L failed): skipped. "
          "Run it on a GPU, or with --cpu to check the script on a tiny model.")
    return
  steps = args.steps or (40 if args.cpu else 200)
  log_every = args.log_every or (10 if args.cpu else 20)
  what = "tiny model on the CPU (checks the script; the numbers say nothing)" if args.cpu else \
      "ANDREA-120M, bf16, B=64 T=1024, document mask, one GPU"
  print(f"bench/curriculum_gpu.py: {what}; {steps} steps per run, timed every {log_every}",
        flush=True)
  with tempfile.TemporaryDirectory(prefix="curriculum_gpu_") as tmp:
    root = args.workdir or tmp
    results = {}
    started = time.perf_counter()
    for i, strategy in enumerate(STRATEGIES):
      timeout = args.timeout
      if args.budget:
        left = args.budget - (time.perf_counter() - started)
        timeout = min(timeout, left / (len(STRATEGIES) - i))
      results[strategy] = run_one(strategy, os.path.join(root, strategy), args.cpu, steps,
                                  log_every, timeout, args.flags)
      r = results[strategy]
      print(f"  {strategy}: failed -- {r['error']}" if "error" in r else
            f"  {strategy}: done ({r['wall_s']:.0f} s)" + (f" -- {r['note']}" if "note" in r else ""),
            flush=True)
  print(f"\n{'curriculum':12s} {'step ms':>8s} {'fastest':>8s} {'slowest':>8s} {'tokens/s':>11s} "
        f"{'MFU':>6s} {'loss':>7s} {'wall s':>7s}")
  for strategy, r in results.items():
    if "error" in r:
      print(f"{strategy:12s} failed: {r['error']}")
      continue
    mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "n/a"
    loss = f"{r['loss']:.3f}" if r.get("loss") is not None else "n/a"
    print(f"{strategy:12s} {1e3 * r['median_step_s']:>8.1f} {1e3 * min(r['step_s']):>8.1f} "
          f"{1e3 * max(r['step_s']):>8.1f} {r['tokens_per_s']:>11,.0f} {mfu:>6s} {loss:>7s} "
          f"{r['wall_s']:>7.0f}")
  for strategy, r in results.items():
    if r.get("note"):
      print(f"{strategy}: {r['note']}")
  over = overhead(results)
  verdict = {"value": over, "target": TARGET_OVERHEAD,
             "pass": None if over is None else over < TARGET_OVERHEAD}
  word = {True: "PASS", False: "FAIL", None: "n/a "}[verdict["pass"]]
  if args.cpu:
    print("(CPU: the verdict below checks the script's arithmetic, not a speed)")
  print(f"  {word} curriculum overhead "
        + ("n/a" if over is None else f"{over:+.2%}") + f" of a step < {TARGET_OVERHEAD:.0%}")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"cpu": args.cpu, "steps": steps, "log_every": log_every, "flags": args.flags,
                 "runs": results,
                 "overhead": verdict}, f, indent=1)


if __name__ == "__main__":
  main()

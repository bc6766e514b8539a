"""ANDREA-120M training throughput on one GPU, against a PyTorch yardstick, printed as one table.

Each row is the real training step (``andrea_jax.step.jit_step``: forward, backward, clipping,
AdamW, per-source losses, curriculum and zombie-cliff updates) of ANDREA-120M (``andrea_120m()``,
bf16 compute, float32 master weights, fused QKV, vocabulary padded to 50304, state donated, cuDNN
attention picked by ``attention_impl = "auto"``) at B=64, T=1024 on synthetic tokens already on
the device, timed over back-to-back steps with no host sync in between. Columns: tokens/s, MFU =
``flops_per_token`` (6N + 12 L d T) x tokens/s / peak (989 TFLOP/s dense bf16 on an H100 SXM or
H200), peak device memory (``peak_bytes_in_use``), the attention kernel found in the compiled
program, and the ratio to the last row: GPT-2-small in plain PyTorch (bench/torch_gpt2.py:
torch.compile, flash ``scaled_dot_product_attention``, bf16 autocast, fused AdamW) on the same GPU.

Every row runs in its own subprocess (XLA flags must be set before jax starts; a crash, an
out-of-memory or a timeout fills that row with the reason and the table goes on).

Rows (the XLA flag sets are listed under the table):
  default flags, causal       -- train.document_mask = False: plain causal, no mask tensor
  tuned flags, causal         -- latency-hiding scheduler on, Triton GEMMs off (cuBLAS)
  no command buffers, causal  -- CUDA graphs off, to measure what they bring (full run only)
  tuned, packed documents     -- the default document mask (cuDNN gets it as a dense bias)
  tuned, causal, remat        -- model.remat = True (memory for compute)
  tuned, causal, 2 x 32 accum -- optim.grad_accum_steps = 2 (memory of B=32, batch of 64)
  pytorch yardstick

Targets on one H100: >= 470K tokens/s (40% MFU), aiming at 520K (45%); >= 1.1x the yardstick.

Usage:
  python bench/gpu.py                     # every row, 25 timed steps each (~7 min on an H100)
  python bench/gpu.py --quick             # the first two rows and PyTorch, 10 steps (~3 min)
  python bench/gpu.py --variants=default,lhs,no_triton_gemm,no_cmd_buffer   # causal rows to run
  python bench/gpu.py --quick --cpu       # tiny model on the CPU: checks the script, not a speed
Without a GPU (and without --cpu) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# XLA flag sets (appended to any XLA_FLAGS already in the environment).
FLAG_SETS = {
    "default": "",
    "tuned": "--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false",
    "lhs": "--xla_gpu_enable_latency_hiding_scheduler=true",
    "no_triton_gemm": "--xla_gpu_enable_triton_gemm=false",
    "no_cmd_buffer": "--xla_gpu_enable_command_buffer=",
}
TARGET_TOKENS, AIM_TOKENS, TARGET_RATIO = 470e3, 520e3, 1.1


def _gpu_present() -> bool:
  smi = shutil.which("nvidia-smi")
  if smi is None:
    return False
  try:
    return subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


# ------------------------------------------------------------------------------------------------
# Child: one JAX measurement (runs with its XLA flags already in the environment).


def _config(cpu: bool, batch: int, seq_len: int, packed: bool, remat: bool, accum: int):
  from andrea_jax import config as config_lib
  from andrea_jax.model import andrea_120m, tiny

  c = config_lib.base_config()
  if cpu:
    shape = tiny(max_len=seq_len, num_layers=2, num_heads=2, d_model=64, d_mlp=256)
  else:
    shape = andrea_120m(dtype="bfloat16")
  c.model.update(shape.to_dict())
  c.model.remat = remat
  c.data.seq_len, c.data.global_batch_size = seq_len, batch
  c.optim.grad_accum_steps = accum
  c.train.document_mask = packed
  return c


def _synthetic_batch(batch: int, seq_len: int, vocab: int, packed: bool) -> dict:
  """Random tokens; ``packed``: four documents per row (segment ids 1..4, positions restarting)."""
  import numpy as np
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, vocab, size=(batch, seq_len + 1), dtype=np.int32)
  t_T = np.arange(seq_len, dtype=np.int32)
  doc = seq_len // 4 if packed else seq_len
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
          "segment_ids": np.broadcast_to(1 + t_T // doc, (batch, seq_len)).astype(np.int32),
          "positions": np.broadcast_to(t_T % doc, (batch, seq_len)).astype(np.int32),
          "source_ids": rng.integers(0, 16, size=(batch,), dtype=np.int32)}


def _jax_child(spec: dict) -> dict:
  import jax
  import numpy as np

  from andrea_jax import runconfig
  from andrea_jax import sharding
  from andrea_jax import step as step_lib
  from andrea_jax import train
  from andrea_jax.model import count_params, flops_per_token

  device = jax.devices()[0]
  c = _config(spec["cpu"], spec["batch"], spec["seq_len"], spec["packed"], spec["remat"],
              spec["accum"])
  run = runconfig.build(c)
  mesh = sharding.make_mesh(c.mesh, devices=[device])
  state, state_sh = sharding.init_sharded(
      lambda: train.init_state(run, train.run_keys(0)),
      lambda s: sharding.state_shardings(s, mesh, c.mesh.fsdp_min_size))
  batch_sh = sharding.batch_sharding(mesh)
  batch = sharding.global_batch(
      _synthetic_batch(spec["batch"], spec["seq_len"], run.model_config.vocab_size, spec["packed"]),
      batch_sh, spec["batch"])
  t0 = time.perf_counter()
  compiled = step_lib.jit_step(run.step_config, state_sh, batch_sh).lower(state, batch).compile()
  hlo = compiled.as_text()
  attention = "cudnn" if "cudnn$fmha" in hlo or "__cudnn$fmha" in hlo else "xla"
  for _ in range(2):                       # warm-up: autotuning, allocator, first transfers
    state, metrics = compiled(state, batch)
  jax.block_until_ready(metrics["loss"])
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(spec["steps"]):           # dispatched back to back; the device never waits
    state, metrics = compiled(state, batch)
  loss = float(jax.block_until_ready(metrics["loss"]))
  elapsed = time.perf_counter() - t0
  tokens_per_s = spec["batch"] * spec["seq_len"] * spec["steps"] / elapsed
  peak = runconfig.peak_flops(device)
  stats = device.memory_stats() or {}
  return {"tokens_per_s": tokens_per_s, "step_s": elapsed / spec["steps"], "compile_s": compile_s,
          "mfu": tokens_per_s * flops_per_token(run.model_config, spec["seq_len"]) / peak
          if peak else None,
          "peak_bytes": stats.get("peak_bytes_in_use"), "attention": attention,
          "loss": loss, "finite": bool(np.isfinite(loss)), "device": device.device_kind,
          "platform": device.platform, "params": count_params(state.params),
          "xla_flags": os.environ.get("XLA_FLAGS", "")}


# ------------------------------------------------------------------------------------------------
# Parent: the rows, each in a subprocess, and the table.


def _rows(args) -> list[dict]:
  cpu = args.cpu
  base = dict(kind="jax", cpu=cpu, batch=4 if cpu else 64, seq_len=64 if cpu else 1024,
              packed=False, remat=False, accum=1,
              steps=3 if cpu else (10 if args.quick else 25))
  if args.variants:
    variants = args.variants.split(",")
  else:
    variants = ["default", "tuned"] + ([] if args.quick else ["no_cmd_buffer"])
  rows = [dict(base, label=f"{v} flags, causal", flags=v) for v in variants]
  if not args.quick and not args.variants:
    rows += [dict(base, label="tuned, packed documents", flags="tuned", packed=True),
             dict(base, label="tuned, causal, remat", flags="tuned", remat=True),
             dict(base, label=f"tuned, causal, 2 x {base['batch'] // 2} accum", flags="tuned",
                  accum=2)]
  rows.append(dict(kind="torch", label="pytorch yardstick", cpu=cpu, quick=args.quick or cpu,
                   batch=base["batch"], seq_len=base["seq_len"], flags="default"))
  return rows


def _run_row(row: dict, timeout: float) -> dict:
  env = dict(os.environ)
  env.setdefault("CUDA_VISIBLE_DEVICES", "0")          # one GPU, whatever the host has
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  if row["kind"] == "jax":
    unknown = row["flags"] not in FLAG_SETS
    if unknown:
      return {"error": f"unknown flag set {row['flags']!r} (have {', '.join(FLAG_SETS)})"}
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + FLAG_SETS[row["flags"]]).strip()
    if row["cpu"]:
      env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(row)]
  else:
    cmd = [sys.executable, os.path.join(HERE, "torch_gpt2.py"), "--json",
           f"--batch={row['batch']}", f"--seq_len={row['seq_len']}"]
    cmd += ["--quick"] if row["quick"] else []
    cmd += ["--cpu", "--no_compile"] if row["cpu"] else []   # inductor on a CPU: minutes, no signal
  try:
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:.0f} s"}
  except OSError as e:
    return {"error": f"could not start: {e}"}
  lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
  if out.returncode != 0 or not lines:
    tail = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]
    why = next((line for line in reversed(tail) if "Error" in line or "error" in line),
               tail[-1] if tail else f"exit {out.returncode}")
    if "RESOURCE_EXHAUSTED" in out.stderr or "out of memory" in out.stderr.lower():
      why = "out of memory"
    return {"error": why.strip()[:160]}
  try:
    return json.loads(lines[-1])
  except json.JSONDecodeError as e:
    return {"error": f"unreadable result: {e}"}


def _fmt_row(label: str, r: dict, ref: float | None) -> str:
  if "error" in r:
    return f"{label:34s} failed: {r['error']}"
  mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "n/a"
  peak = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else "n/a"
  ratio = f"{r['tokens_per_s'] / ref:.2f}x" if ref else "n/a"
  kernel = r.get("attention", "sdpa")
  return (f"{label:34s} {r['tokens_per_s']:>11,.0f} {mfu:>6s} {peak:>8s} {1e3 * r['step_s']:>8.1f} "
          f"{r['compile_s']:>8.1f} {kernel:>6s} {ratio:>8s}")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="two JAX rows and PyTorch, fewer steps")
  ap.add_argument("--cpu", action="store_true", help="tiny model on the CPU (checks the script)")
  ap.add_argument("--variants", default="",
                  help=f"comma-separated flag sets: {', '.join(FLAG_SETS)}")
  ap.add_argument("--timeout", type=float, default=0, help="seconds per row (default 300, CPU 600)")
  ap.add_argument("--child", default="", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    print(json.dumps(_jax_child(json.loads(args.child))))
    return
  if not args.cpu and not _gpu_present():
    print("bench/gpu.py: no NVIDIA GPU here (nvidia-smi -L failed): skipped. "
          "Run it on a GPU, or with --quick --cpu to check the script on a tiny model.")
    return
  timeout = args.timeout or (600 if args.cpu else 300)
  rows = _rows(args)
  what = "tiny model on the CPU (checks the script; the numbers say nothing)" if args.cpu else \
      "ANDREA-120M, bf16, B=64 T=1024, one GPU"
  print(f"bench/gpu.py: {what}; {len(rows)} rows, each in its own process", flush=True)
  header = (f"{'row':34s} {'tokens/s':>11s} {'MFU':>6s} {'peak GiB':>8s} {'step ms':>8s} "
            f"{'compile':>8s} {'attn':>6s} {'vs torch':>8s}")
  results = []
  started = time.perf_counter()
  for row in rows:                         # progress, in case the outer command is cut short
    r = _run_row(row, timeout)
    results.append(r)
    print(f"  done: {row['label']} ({time.perf_counter() - started:.0f} s)"
          + (f" -- {r['error']}" if "error" in r else ""), flush=True)
  torch_r = results[-1]
  ref = torch_r.get("tokens_per_s") if "error" not in torch_r else None
  per_token = next((r["mfu"] / r["tokens_per_s"] for r in results[:-1] if r.get("mfu")), None)
  if ref and per_token:                    # the same model and T: the same FLOPs per token
    torch_r["mfu"] = per_token * ref
  device = next((r["device"] for r in results if "device" in r), "?")
  print(f"\ndevice: {device}; JAX rows: the real train step; the ratio is to the PyTorch row")
  print(header)
  for row, r in zip(rows, results):
    print(_fmt_row(row["label"], r, ref))
  print("XLA flag sets: " + "; ".join(f"{k} = {v or '(none)'}" for k, v in FLAG_SETS.items()
                                      if any(row.get("flags") == k for row in rows[:-1])))
  causal = [r for row, r in zip(rows, results)
            if row["kind"] == "jax" and not row["packed"] and not row["remat"]
            and row["accum"] == 1 and "error" not in r]
  if causal and not args.cpu:
    best = max(causal, key=lambda r: r["tokens_per_s"])
    verdict = "met" if best["tokens_per_s"] >= TARGET_TOKENS else "NOT met"
    print(f"best causal JAX row: {best['tokens_per_s']:,.0f} tokens/s "
          f"(target {TARGET_TOKENS:,.0f}, aim {AIM_TOKENS:,.0f}: {verdict})"
          + (f"; {best['tokens_per_s'] / ref:.2f}x PyTorch (target {TARGET_RATIO}x)"
             if ref else ""))
  bad = [row["label"] for row, r in zip(rows, results) if r.get("finite") is False]
  if bad:
    print(f"non-finite loss in: {', '.join(bad)}")


if __name__ == "__main__":
  main()

"""ANDREA-120M training throughput on one GPU, against a PyTorch yardstick, printed as one table.

Each JAX row is the real training step (``andrea_jax.step.jit_step``: forward, backward, clipping,
AdamW, per-source losses, curriculum and zombie-cliff updates) of ANDREA-120M (``andrea_120m()``,
bf16 compute, float32 master weights, fused QKV, vocabulary padded to 50304, state donated) at
B=64, T=1024 on synthetic tokens already on the device, timed over back-to-back steps with no host
sync in between. Columns: tokens/s, MFU = ``flops_per_token`` (6N + 12 L d T) x tokens/s / peak
(989 TFLOP/s dense bf16 on an H100 SXM or H200), peak device memory (``peak_bytes_in_use``), the
attention kernel found in the compiled program, and the ratio to the PyTorch row: GPT-2-small in
plain PyTorch (bench/torch_gpt2.py: torch.compile, flash ``scaled_dot_product_attention``, bf16
autocast, fused AdamW) on the same GPU, in the same run.

Every row runs in its own subprocess (XLA flags must be set before jax starts; a crash, an
out-of-memory or a timeout fills that row with the reason and the table goes on).

Rows (``--rows``, comma-separated, in the order given; the flag sets are printed under the table):
  cudnn               cuDNN attention, plain causal (train.document_mask = False), tuned flags
  xla                 the attention written out in jnp, plain causal, tuned flags
  cudnn-packed        cuDNN, the document mask of packed rows (cuDNN gets it as a dense bias)
  xla-packed          XLA attention, the document mask
  cudnn-remat         cuDNN, causal, model.remat = True (memory for compute)
  cudnn-accum2        cuDNN, causal, optim.grad_accum_steps = 2 (memory of B=32, batch of 64)
  cudnn-default       cuDNN, causal, no XLA flags (what the tuned flags bring); xla-default likewise
  cudnn-lhs, cudnn-no-triton-gemm, cudnn-no-cmd-buffer   one flag each (the last: CUDA graphs off)
  torch               the PyTorch yardstick
The default is every row; ``--quick`` is cudnn, cudnn-default and torch with 10 timed steps.

Targets on one H100-class GPU: >= 470K tokens/s at B=64, T=1024 (40% MFU), aiming at 520K (45%);
>= 1.1x the yardstick. The best plain-causal JAX row is checked against them (PASS/FAIL lines).

Usage (from the repository root):
  python -m bench.gpu                        # every row, 25 timed steps each (~8 min, estimated)
  python -m bench.gpu --quick                # cudnn, cudnn-default, torch; 10 steps (~3 min, est.)
  python -m bench.gpu --rows=cudnn,torch,xla --budget=240 --json=out/gpu.json
  python -m bench.gpu --quick --cpu          # tiny model on the CPU: checks the script, not a speed
``--budget`` skips the rows that would start with less than a minute of it left (their line says
so). On the CPU, cuDNN rows run the ``auto`` attention, which is XLA there (the attn column says
what ran). Without a GPU (and without --cpu) it says so and exits 0.
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
_CAUSAL = dict(kind="jax", attn="cudnn", flags="tuned", packed=False, remat=False, accum=1)
ROWS = {
    "cudnn": dict(_CAUSAL, label="cudnn, causal, tuned"),
    "xla": dict(_CAUSAL, attn="xla", label="xla, causal, tuned"),
    "cudnn-packed": dict(_CAUSAL, packed=True, label="cudnn, packed documents, tuned"),
    "xla-packed": dict(_CAUSAL, attn="xla", packed=True, label="xla, packed documents, tuned"),
    "cudnn-remat": dict(_CAUSAL, remat=True, label="cudnn, causal, remat, tuned"),
    "cudnn-accum2": dict(_CAUSAL, accum=2, label="cudnn, causal, 2 x B/2 accum, tuned"),
    "cudnn-default": dict(_CAUSAL, flags="default", label="cudnn, causal, default flags"),
    "xla-default": dict(_CAUSAL, attn="xla", flags="default", label="xla, causal, default flags"),
    "cudnn-lhs": dict(_CAUSAL, flags="lhs", label="cudnn, causal, lhs flag only"),
    "cudnn-no-triton-gemm": dict(_CAUSAL, flags="no_triton_gemm",
                                 label="cudnn, causal, no triton gemm only"),
    "cudnn-no-cmd-buffer": dict(_CAUSAL, flags="no_cmd_buffer",
                                label="cudnn, causal, no CUDA graphs"),
    "torch": dict(kind="torch", label="pytorch yardstick"),
}
QUICK_ROWS = ("cudnn", "cudnn-default", "torch")
TARGET_TOKENS, AIM_TOKENS = 470e3, 520e3      # tokens/s at B=64, T=1024 on one H100-class GPU
TARGET_MFU, AIM_MFU = 0.40, 0.45              # by flops_per_token (6N + 12 L d T)
TARGET_RATIO = 1.1                            # JAX over the PyTorch yardstick, same run, same GPU
MIN_ROW_S = 60                                # a row is not started with less of --budget left


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


def _config(spec: dict):
  from andrea_jax import config as config_lib
  from andrea_jax.model import andrea_120m, tiny

  c = config_lib.base_config()
  if spec["cpu"]:
    shape = tiny(max_len=spec["seq_len"], num_layers=2, num_heads=2, d_model=64, d_mlp=256)
  else:
    shape = andrea_120m(dtype="bfloat16")
  c.model.update(shape.to_dict())
  # cuDNN cannot run on a CPU: "auto" is the XLA attention there (the table's attn column says so).
  c.model.attention_impl = "auto" if spec["cpu"] and spec["attn"] == "cudnn" else spec["attn"]
  c.model.remat = spec["remat"]
  c.data.seq_len, c.data.global_batch_size = spec["seq_len"], spec["batch"]
  c.optim.grad_accum_steps = spec["accum"]
  c.train.document_mask = spec["packed"]
  c.eval.sample_tokens = 0     # nothing is evaluated here: no sample has to fit the context
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
  c = _config(spec)
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
  attention = "cudnn" if "cudnn$fmha" in hlo else "xla"
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
  flops = flops_per_token(run.model_config, spec["seq_len"])
  stats = device.memory_stats() or {}
  return {"tokens_per_s": tokens_per_s, "step_s": elapsed / spec["steps"], "compile_s": compile_s,
          "mfu": tokens_per_s * flops / peak if peak else None, "flops_per_token": flops,
          "peak_flops": peak, "peak_bytes": stats.get("peak_bytes_in_use"), "attention": attention,
          "loss": loss, "finite": bool(np.isfinite(loss)), "device": device.device_kind,
          "platform": device.platform, "params": count_params(state.params),
          "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", "")}


# ------------------------------------------------------------------------------------------------
# Parent: the rows, each in a subprocess, and the table.


def _rows(args) -> list[dict]:
  names = [n for n in args.rows.split(",") if n] if args.rows else (
      list(QUICK_ROWS) if args.quick else list(ROWS))
  unknown = [n for n in names if n not in ROWS]
  if unknown:
    raise SystemExit(f"bench/gpu.py: unknown row(s) {', '.join(unknown)}; the rows are "
                     f"{', '.join(ROWS)}")
  cpu = args.cpu
  steps = args.steps or (3 if cpu else (10 if args.quick else 25))
  shape = dict(cpu=cpu, batch=4 if cpu else 64, seq_len=64 if cpu else 1024, steps=steps)
  rows = [dict(ROWS[n], name=n, **shape) for n in names]
  for row in rows:
    if row["kind"] == "jax" and row["accum"] > 1:
      row["label"] = row["label"].replace("B/2", str(row["batch"] // row["accum"]))
  return rows


def _run_row(row: dict, timeout: float) -> dict:
  env = dict(os.environ)
  env.setdefault("CUDA_VISIBLE_DEVICES", "0")          # one GPU, whatever the host has
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  if row["kind"] == "jax":
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + FLAG_SETS[row["flags"]]).strip()
    # The GPU is this row's alone: 90% of it rather than jax's 75% (the XLA attention keeps
    # float32 [B, H, T, T] probabilities of every layer for the backward pass).
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.90")
    if row["cpu"]:
      env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, "-m", "bench.gpu", "--child", json.dumps(row)]
  else:
    cmd = [sys.executable, "-m", "bench.torch_gpt2", "--json", f"--batch={row['batch']}",
           f"--seq_len={row['seq_len']}", f"--steps={row['steps']}"]
    cmd += ["--cpu", "--no_compile"] if row["cpu"] else []   # inductor on a CPU: minutes, no signal
  try:
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired as e:
    tail = (e.stderr or b"")
    tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
    return {"error": f"timed out after {timeout:.0f} s", "stderr_tail": tail[-3000:]}
  except OSError as e:
    return {"error": f"could not start: {e}"}
  lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
  if out.returncode != 0 or not lines:
    tail = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]
    why = next((line for line in reversed(tail) if "Error" in line or "error" in line),
               tail[-1] if tail else f"exit {out.returncode}")
    if "RESOURCE_EXHAUSTED" in out.stderr or "out of memory" in out.stderr.lower():
      why = "out of memory"
    return {"error": why.strip()[:160], "stderr_tail": out.stderr[-3000:]}
  try:
    return json.loads(lines[-1])
  except json.JSONDecodeError as e:
    return {"error": f"unreadable result: {e}"}


def _fmt_row(label: str, r: dict, ref: float | None) -> str:
  if "error" in r:
    return f"{label:36s} failed: {r['error']}"
  if "skipped" in r:
    return f"{label:36s} skipped: {r['skipped']}"
  mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "n/a"
  peak = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else "n/a"
  ratio = f"{r['tokens_per_s'] / ref:.2f}x" if ref else "n/a"
  kernel = r.get("attention", "sdpa")
  return (f"{label:36s} {r['tokens_per_s']:>11,.0f} {mfu:>6s} {peak:>8s} {1e3 * r['step_s']:>8.1f} "
          f"{r['compile_s']:>8.1f} {kernel:>6s} {ratio:>8s}")


def verdicts(rows: list[dict], results: list[dict]) -> dict:
  """The targets checked on the best plain-causal JAX row (B=64, T=1024, no remat, no accum):
  ``{"tokens_per_s": ..., "mfu": ..., "vs_torch": ...}``, each ``{"value", "target", "pass"}``
  (``pass`` is None where the figure is missing). ``best`` names the row they were read on."""
  causal = [(row, r) for row, r in zip(rows, results)
            if row["kind"] == "jax" and not row["packed"] and not row["remat"]
            and row["accum"] == 1 and "tokens_per_s" in r]
  torch_r = next((r for row, r in zip(rows, results) if row["kind"] == "torch"), {})
  best_row, best = max(causal, key=lambda x: x[1]["tokens_per_s"]) if causal else (None, {})
  ref = torch_r.get("tokens_per_s")
  tps, mfu = best.get("tokens_per_s"), best.get("mfu")
  ratio = tps / ref if tps and ref else None

  def check(value, target, aim=None):
    out = {"value": value, "target": target, "pass": None if value is None else value >= target}
    if aim is not None:
      out.update(aim=aim, aim_met=None if value is None else value >= aim)
    return out

  return {"best": best_row["name"] if best_row else None,
          "tokens_per_s": check(tps, TARGET_TOKENS, AIM_TOKENS),
          "mfu": check(mfu, TARGET_MFU, AIM_MFU), "vs_torch": check(ratio, TARGET_RATIO),
          "torch_mode": torch_r.get("mode")}


def _verdict_lines(v: dict) -> list[str]:
  word = lambda p: {True: "PASS", False: "FAIL", None: "n/a "}[p]
  aim = lambda c, fmt: f" (aim {fmt(c['aim'])}: {'met' if c['aim_met'] else 'not met'})"
  t, m, r = v["tokens_per_s"], v["mfu"], v["vs_torch"]
  tokens, share = (lambda x: f"{x:,.0f}"), (lambda x: f"{x:.0%}")
  value = lambda c, fmt: "n/a" if c["value"] is None else fmt(c["value"])
  return [f"targets, read on the best plain-causal JAX row ({v['best'] or 'none'}):",
          f"  {word(t['pass'])} tokens/s {value(t, tokens)} >= {tokens(t['target'])}"
          + aim(t, tokens),
          f"  {word(m['pass'])} MFU {value(m, lambda x: f'{x:.1%}')} >= {share(m['target'])}"
          + aim(m, share),
          f"  {word(r['pass'])} vs PyTorch {value(r, lambda x: f'{x:.2f}x')} >= {r['target']}x"
          + (f" (PyTorch ran {v['torch_mode']})" if v.get("torch_mode") else "")]


def main(argv: list[str] | None = None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help=f"rows {', '.join(QUICK_ROWS)}, 10 steps")
  ap.add_argument("--cpu", action="store_true", help="tiny model on the CPU (checks the script)")
  ap.add_argument("--rows", default="", help=f"comma-separated rows: {', '.join(ROWS)}")
  ap.add_argument("--steps", type=int, default=0, help="timed steps per row (after 2 warm-up)")
  ap.add_argument("--timeout", type=float, default=0, help="seconds per row (default 300, CPU 600)")
  ap.add_argument("--budget", type=float, default=0,
                  help="seconds for all rows; rows that would start with under a minute left are "
                       "skipped (0: no limit)")
  ap.add_argument("--json", default="", help="also write the rows and the verdicts to this file")
  ap.add_argument("--child", default="", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
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
      f"ANDREA-120M, bf16, B={rows[0]['batch']} T={rows[0]['seq_len']}, one GPU"
  print(f"bench/gpu.py: {what}; {len(rows)} rows, each in its own process", flush=True)
  header = (f"{'row':36s} {'tokens/s':>11s} {'MFU':>6s} {'peak GiB':>8s} {'step ms':>8s} "
            f"{'compile':>8s} {'attn':>6s} {'vs torch':>8s}")
  results = []
  started = time.perf_counter()
  for row in rows:                         # progress, in case the outer command is cut short
    left = args.budget - (time.perf_counter() - started) if args.budget else timeout
    if args.budget and left < MIN_ROW_S:
      r = {"skipped": f"{left:.0f} s of the {args.budget:.0f} s budget left"}
    else:
      r = _run_row(row, min(timeout, left))
    results.append(r)
    print(f"  done: {row['label']} ({time.perf_counter() - started:.0f} s)"
          + (f" -- {r.get('error') or r.get('skipped')}" if "tokens_per_s" not in r else ""),
          flush=True)
  torch_r = next((r for row, r in zip(rows, results) if row["kind"] == "torch"), {})
  ref = torch_r.get("tokens_per_s")
  per_token = next((r["mfu"] / r["tokens_per_s"] for r in results if r.get("mfu")), None)
  if ref and per_token:                    # the same model and T: the same FLOPs per token
    torch_r["mfu"] = per_token * ref
  device = next((r["device"] for r in results if "device" in r), "?")
  print(f"\ndevice: {device}; JAX rows: the real train step; the ratio is to the PyTorch row")
  print(header)
  for row, r in zip(rows, results):
    print(_fmt_row(row["label"], r, ref))
  used = [k for k in FLAG_SETS if any(row.get("flags") == k for row in rows)]
  print("XLA flag sets: " + "; ".join(f"{k} = {FLAG_SETS[k] or '(none)'}" for k in used))
  if torch_r.get("mode"):
    print(f"PyTorch: {torch_r['mode']}, torch {torch_r.get('torch', '?')}")
  v = verdicts(rows, results)
  if args.cpu:
    print("(CPU: the verdicts below check the script's arithmetic, not a speed)")
  print("\n".join(_verdict_lines(v)))
  bad = [row["label"] for row, r in zip(rows, results) if r.get("finite") is False]
  if bad:
    print(f"non-finite loss in: {', '.join(bad)}")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"device": device, "cpu": args.cpu, "flag_sets": FLAG_SETS,
                 "rows": [dict(row, result=r) for row, r in zip(rows, results)],
                 "verdicts": v}, f, indent=1)


if __name__ == "__main__":
  main()

"""ANDREA-120M training throughput on one GPU, against PyTorch yardsticks, printed as one table.

Each JAX row is the real training step (``andrea_jax.step.jit_step``: forward, backward, clipping,
AdamW, per-source losses, curriculum and zombie-cliff updates) of ANDREA-120M (``andrea_120m()``,
bf16 compute, float32 master weights, vocabulary padded to 50304, state donated) at B=64, T=1024 on
synthetic tokens already on the device, timed over back-to-back steps with no host sync in between.
Columns: tokens/s, MFU = ``flops_per_token`` (6N + 12 L d T) x tokens/s / peak (989 TFLOP/s dense
bf16 on an H100 SXM or H200), peak device memory (``peak_bytes_in_use``), the step's time, the
compilation's, the attention kernel found in the compiled program, and the ratio to the PyTorch
yardstick (bench/torch_gpt2.py: GPT-2-small with the whole loss in ``torch.compile``, flash SDPA,
bf16 autocast, fused AdamW) on the same GPU, in the same run.

The levers (issue: faster than PyTorch), each alone over the earlier step and all together:
  fused loss    the output projection and the cross-entropy fused (andrea_jax.xent: bf16 matmuls,
                bf16 logits) instead of the model's float32 logits and optax's loss
  lean update   the token count folded into the loss, one gradient norm for the metric and the
                clipping, instead of the gradient divided after and the clipping's own norm
  split qkv     q, k, v by three matmuls in the attention's layout, instead of copies out of one
The product has all three (the row ``cudnn``); ``levers-off`` is the step before them.

Rows (``--rows``, comma-separated; the flag sets are printed under the table):
  cudnn               the product: cuDNN attention, plain causal, every lever, tuned flags
  levers-off, fused-loss, lean-update, split-qkv   no lever, then each alone (cuDNN, tuned flags)
  torch, torch-eager-loss   the yardstick, and the earlier one (loss outside torch.compile)
  xla                 the attention written out in jnp, plain causal, tuned flags
  cudnn-packed, xla-packed   the document mask of packed rows (cuDNN gets it as a dense bias)
  cudnn-remat         model.remat = True (memory for compute); cudnn-accum2: 2 x B/2 accumulated
  cudnn-default       no XLA flags; cudnn-lhs, cudnn-no-triton-gemm, cudnn-no-cmd-buffer: one each
  flag-cublaslt, flag-triton-gemm-any, flag-cudnn-gemm-fusion, flag-exhaustive-tiling: the tuned
                      set with one flag from XLA's GPU guidance more; kept only if it wins (> 1%)
The default is the targets and the levers; ``--quick`` is torch, cudnn and levers-off, 10 steps.
JAX rows with the same flags run in one process (bench/gpu_step.py), one after the other (XLA's
autotuning results carry over, which shortens their compilations); every other row in its own (XLA
flags are read when jax starts; a crash, an out-of-memory or a timeout fills those rows with the
reason and the table goes on). ``--hlo=FILE.zip`` saves each JAX row's optimized HLO
(``compiled.as_text()``) in one zip.
``--parts`` times the blocks, the head and loss, and the update separately (bench/gpu_parts.py).

Targets on one H100-class GPU: >= 470K tokens/s at B=64, T=1024 (40% MFU), aiming at 520K (45%);
>= 1.1x the yardstick. The best plain-causal JAX row is checked against them (PASS/FAIL lines).

Usage (from the repository root):
  python -m bench.gpu                        # targets and levers, 20 timed steps each
  python -m bench.gpu --quick                # torch, cudnn, levers-off; 10 steps
  python -m bench.gpu --rows=cudnn,torch,xla --budget=240 --json=out/gpu.json --hlo=out/hlo.zip
  python -m bench.gpu --parts                # the parts table
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
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# XLA flag sets (appended to any XLA_FLAGS already in the environment).
_LHS = "--xla_gpu_enable_latency_hiding_scheduler=true"
_TUNED = f"{_LHS} --xla_gpu_enable_triton_gemm=false"
FLAG_SETS = {
    "default": "",
    "tuned": _TUNED,
    "lhs": _LHS,
    "no_triton_gemm": "--xla_gpu_enable_triton_gemm=false",
    "no_cmd_buffer": "--xla_gpu_enable_command_buffer=",
    # One flag from XLA's GPU guidance (docs.jax.dev gpu_performance_tips, NVIDIA JAX-Toolbox's GPU
    # performance page) over the tuned set. triton_gemm_any needs Triton GEMMs, which tuned turns
    # off.
    "cublaslt": f"{_TUNED} --xla_gpu_enable_cublaslt=true",
    "triton_gemm_any": f"{_LHS} --xla_gpu_triton_gemm_any=true",
    "cudnn_gemm_fusion": f"{_TUNED} --xla_gpu_cudnn_gemm_fusion_level=2",
    "exhaustive_tiling": f"{_TUNED} --xla_gpu_exhaustive_tiling_search=true",
}
LEVERS = ("fused_loss", "lean_update", "split_qkv")
LEVERS_ON = dict.fromkeys(LEVERS, True)
LEVERS_OFF = dict.fromkeys(LEVERS, False)
_CAUSAL = dict(kind="jax", attn="cudnn", flags="tuned", packed=False, remat=False, accum=1,
               **LEVERS_ON)
_BARE = {**_CAUSAL, **LEVERS_OFF}
ROWS = {
    "cudnn": dict(_CAUSAL, label="cudnn, causal, every lever (product)"),
    "levers-off": dict(_BARE, label="levers off (the earlier step)"),
    "fused-loss": dict(_BARE, fused_loss=True, label="fused loss alone"),
    "lean-update": dict(_BARE, lean_update=True, label="lean update alone"),
    "split-qkv": dict(_BARE, split_qkv=True, label="split qkv alone"),
    "torch": dict(kind="torch", variant="compiled-loss", label="pytorch yardstick"),
    "torch-eager-loss": dict(kind="torch", variant="eager-loss",
                             label="pytorch, loss outside compile"),
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
    "flag-cublaslt": dict(_CAUSAL, flags="cublaslt", label="tuned + cublaslt"),
    "flag-triton-gemm-any": dict(_CAUSAL, flags="triton_gemm_any", label="lhs + triton gemm any"),
    "flag-cudnn-gemm-fusion": dict(_CAUSAL, flags="cudnn_gemm_fusion",
                                   label="tuned + cudnn gemm fusion 2"),
    "flag-exhaustive-tiling": dict(_CAUSAL, flags="exhaustive_tiling",
                                   label="tuned + exhaustive tiling"),
}
TARGET_ROWS = ("cudnn", "torch")
LEVER_ROWS = ("levers-off", "fused-loss", "lean-update", "split-qkv")
FLAG_ROWS = tuple(n for n in ROWS if n.startswith("flag-"))
# The yardstick first, then the JAX rows in one process, the product first: under a budget, the
# targets' rows are the last to be skipped.
DEFAULT_ROWS = ("torch", "cudnn", "levers-off", "fused-loss", "lean-update", "split-qkv")
QUICK_ROWS = ("torch", "cudnn", "levers-off")
TARGET_TOKENS, AIM_TOKENS = 470e3, 520e3      # tokens/s at B=64, T=1024 on one H100-class GPU
TARGET_MFU, AIM_MFU = 0.40, 0.45              # by flops_per_token (6N + 12 L d T)
TARGET_RATIO = 1.1                            # JAX over the PyTorch yardstick, same run, same GPU
FLAG_WIN = 1.01                               # a flag row must beat the product row by 1% to win
MIN_ROW_S = 60                                # a row is not started with less of --budget left
HLO_ZIP_CAP = 14 * 2**20                      # bytes of --hlo's zip, under the 16 MiB a file the
                                              # device tool brings back


def _gpu_present() -> bool:
  smi = shutil.which("nvidia-smi")
  if smi is None:
    return False
  try:
    return subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


# ------------------------------------------------------------------------------------------------
# Parent: the rows, grouped into processes, and the table.


def _rows(args) -> list[dict]:
  names = [n for n in args.rows.split(",") if n] if args.rows else (
      list(QUICK_ROWS) if args.quick else list(DEFAULT_ROWS))
  unknown = [n for n in names if n not in ROWS]
  if unknown:
    raise SystemExit(f"bench/gpu.py: unknown row(s) {', '.join(unknown)}; the rows are "
                     f"{', '.join(ROWS)}")
  cpu = args.cpu
  steps = args.steps or (3 if cpu else (10 if args.quick else 20))
  shape = dict(cpu=cpu, batch=4 if cpu else 64, seq_len=64 if cpu else 1024, steps=steps)
  rows = [dict(ROWS[n], name=n, **shape) for n in names]
  for row in rows:
    if row["kind"] == "jax" and args.flags:
      row["flags"] = args.flags
    if row["kind"] == "jax" and row["accum"] > 1:
      row["label"] = row["label"].replace("B/2", str(row["batch"] // row["accum"]))
  return rows


def groups(rows: list[dict]) -> list[list[dict]]:
  """Consecutive JAX rows with the same XLA flags share a process; every other row is alone. On
  the CPU the flag sets, all GPU compiler flags, are not set (:func:`child_env`): consecutive JAX
  rows share a process whatever their flags."""
  out: list[list[dict]] = []
  for row in rows:
    prev = out[-1][-1] if out else None
    if prev and row["kind"] == prev["kind"] == "jax" and (
        row["flags"] == prev["flags"] or row["cpu"]):
      out[-1].append(row)
    else:
      out.append([row])
  return out


def child_env(flags: str | None, cpu: bool) -> dict:
  """The environment of a measuring process: the repository first on the path, one GPU, and for
  JAX on a GPU the XLA flag set ``flags`` appended to any already set. The sets are GPU compiler
  flags, which the CPU's compiler never reads: on the CPU none is set, so that rows differing only
  in them share a process and compile one program."""
  env = dict(os.environ)
  env.setdefault("CUDA_VISIBLE_DEVICES", "0")          # one GPU, whatever the host has
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  if flags is not None:
    if not cpu:
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + FLAG_SETS[flags]).strip()
    # The GPU is this process's alone: 90% of it rather than jax's 75% (the XLA attention keeps
    # float32 [B, H, T, T] probabilities of every layer for the backward pass).
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.90")
    if cpu:
      env["JAX_PLATFORMS"] = "cpu"
  return env


def _failure(stderr: str, default: str) -> str:
  tail = [line for line in stderr.splitlines() if line.strip()]
  why = next((line for line in reversed(tail) if "Error" in line or "error" in line),
             tail[-1] if tail else default)
  if "RESOURCE_EXHAUSTED" in stderr or "out of memory" in stderr.lower():
    why = "out of memory"
  return why.strip()[:160]


def _run_group(group: list[dict], timeout: float, deadline: float, hlo_dir: str) -> list[dict]:
  row = group[0]
  if row["kind"] == "jax":
    cmd = [sys.executable, "-m", "bench.gpu_step", json.dumps(group), str(deadline), hlo_dir]
    env = child_env(row["flags"], row["cpu"])
  else:
    cmd = [sys.executable, "-m", "bench.torch_gpt2", "--json", f"--batch={row['batch']}",
           f"--seq_len={row['seq_len']}", f"--steps={row['steps']}", f"--variant={row['variant']}"]
    cmd += ["--cpu", "--no_compile"] if row["cpu"] else []   # inductor on a CPU: minutes, no signal
    env = child_env(None, row["cpu"])
  stdout, stderr, why = "", "", None
  try:
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    stdout, stderr = out.stdout, out.stderr
    if out.returncode != 0:
      why = _failure(stderr + stdout, f"exit {out.returncode}")
  except subprocess.TimeoutExpired as e:
    stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    why = f"timed out after {timeout:.0f} s"
  except OSError as e:
    why = f"could not start: {e}"
  if row["kind"] == "jax":
    found = {}
    for line in stdout.splitlines():
      if line.startswith("ROW "):
        r = json.loads(line[4:])
        found[r["name"]] = r["result"]
    return [found.get(r["name"]) or {"error": why or "no result", "stderr_tail": stderr[-3000:]}
            for r in group]
  lines = [line for line in stdout.splitlines() if line.startswith("{")]
  if why or not lines:
    return [{"error": why or "no result", "stderr_tail": stderr[-3000:]}]
  try:
    return [json.loads(lines[-1])]
  except json.JSONDecodeError as e:
    return [{"error": f"unreadable result: {e}"}]


def _fmt_row(label: str, r: dict, ref: float | None) -> str:
  if "error" in r:
    return f"{label:38s} failed: {r['error']}"
  if "skipped" in r:
    return f"{label:38s} skipped: {r['skipped']}"
  mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "n/a"
  peak = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else "n/a"
  ratio = f"{r['tokens_per_s'] / ref:.2f}x" if ref else "n/a"
  kernel = r.get("attention", "sdpa")
  step = f"{1e3 * r['step_s']:.1f}" if "step_s" in r else "n/a"
  compile_s = f"{r['compile_s']:.1f}" if "compile_s" in r else "n/a"
  return (f"{label:38s} {r['tokens_per_s']:>11,.0f} {mfu:>6s} {peak:>8s} {step:>8s} "
          f"{compile_s:>8s} {kernel:>6s} {ratio:>8s}")


def _status(r: dict) -> str:
  if "tokens_per_s" in r:
    return f"{r['tokens_per_s']:,.0f} tokens/s"
  return f"skipped ({r['skipped']})" if "skipped" in r else f"failed ({r.get('error')})"


def _by_name(rows: list[dict], results: list[dict]) -> dict:
  return {row["name"]: r for row, r in zip(rows, results)}


def verdicts(rows: list[dict], results: list[dict]) -> dict:
  """The targets checked on the best plain-causal JAX row (B=64, T=1024, no remat, no accum):
  ``{"tokens_per_s": ..., "mfu": ..., "vs_torch": ...}``, each ``{"value", "target", "pass"}``
  (``pass`` is None where the figure is missing). ``best`` names the row they were read on; the
  ratio is to the yardstick (the ``torch`` row, the loss inside ``torch.compile``)."""
  causal = [(row, r) for row, r in zip(rows, results)
            if row["kind"] == "jax" and not row["packed"] and not row["remat"]
            and row["accum"] == 1 and "tokens_per_s" in r]
  torch_r = _by_name(rows, results).get("torch", {})
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


def levers(rows: list[dict], results: list[dict]) -> dict:
  """What each lever brings: ``{name: {"alone": x, "saved_ms": ms}}`` with ``x`` the row's
  tokens/s over ``levers-off``'s, minus 1, and ``"together"`` for the product row (``cudnn``);
  and for each flag row that ran, its tokens/s over the product row's and whether it wins (more
  than 1%). Missing figures are None."""
  by = _by_name(rows, results)
  base = by.get("levers-off", {})

  def gain(name, ref):
    r = by.get(name, {})
    if "tokens_per_s" not in r or "tokens_per_s" not in ref:
      return {"alone": None, "saved_ms": None}
    return {"alone": r["tokens_per_s"] / ref["tokens_per_s"] - 1,
            "saved_ms": 1e3 * (ref["step_s"] - r["step_s"])}
  out = {name: gain(name, base) for name in ("fused-loss", "lean-update", "split-qkv", "cudnn")
         if name in by}
  product = by.get("cudnn", {})
  out["flags"] = {}
  for name in FLAG_ROWS:
    if name in by and "tokens_per_s" in by[name] and "tokens_per_s" in product:
      ratio = by[name]["tokens_per_s"] / product["tokens_per_s"]
      out["flags"][name] = {"ratio": ratio, "wins": ratio >= FLAG_WIN}
  return out


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


def lever_lines(lv: dict) -> list[str]:
  """The levers' lines, over the earlier step (levers-off), then the flags' against the product."""
  names = {"fused-loss": "fused loss alone", "lean-update": "lean update alone",
           "split-qkv": "split qkv alone", "cudnn": "every lever together"}
  lines = [] if not any(k in lv for k in names) else ["levers, tokens/s over the earlier step:"]
  for key, label in names.items():
    if key in lv:
      g = lv[key]
      figure = "n/a" if g["alone"] is None else (
          f"{g['alone']:+.1%} ({abs(g['saved_ms']):.1f} ms a step "
          f"{'saved' if g['saved_ms'] >= 0 else 'lost'})")
      lines.append(f"  {label:22s} {figure}")
  if lv.get("flags"):
    lines.append(f"flags over the product's tuned set (keep those that win by > "
                 f"{FLAG_WIN - 1:.0%}):")
    for name, f in lv["flags"].items():
      lines.append(f"  {'KEEP' if f['wins'] else 'drop'} {name[5:]:20s} {f['ratio'] - 1:+.1%}")
  return lines


def _write_hlo(hlo_dir: str, path: str) -> None:
  """Appends each row's HLO text in ``hlo_dir`` to the zip ``path`` (one member per row), while the
  zip stays under :data:`HLO_ZIP_CAP` (what the device tool brings back is 16 MiB a file at most):
  a row past it is left out, and named."""
  files = sorted(os.listdir(hlo_dir))
  if not path or not files:
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  left_out = []
  with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
    for name in files:
      if sum(i.compress_size for i in z.infolist()) > HLO_ZIP_CAP:
        left_out.append(name)
      else:
        z.write(os.path.join(hlo_dir, name), arcname=name)
  if left_out:
    print(f"HLO left out of {path} (over {HLO_ZIP_CAP / 2**20:.0f} MiB): {', '.join(left_out)}")


def main(argv: list[str] | None = None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help=f"rows {', '.join(QUICK_ROWS)}, 10 steps")
  ap.add_argument("--cpu", action="store_true", help="tiny model on the CPU (checks the script)")
  ap.add_argument("--rows", default="", help=f"comma-separated rows: {', '.join(ROWS)}")
  ap.add_argument("--parts", action="store_true",
                  help="time the blocks, the head and loss, the update (bench/gpu_parts.py)")
  ap.add_argument("--steps", type=int, default=0, help="timed steps per row (after 2 warm-up)")
  ap.add_argument("--timeout", type=float, default=0, help="seconds per row (default 300, CPU 600)")
  ap.add_argument("--budget", type=float, default=0,
                  help="seconds for all rows; rows that would start with under a minute left are "
                       "skipped (0: no limit)")
  ap.add_argument("--json", default="", help="also write the rows and the verdicts to this file")
  ap.add_argument("--hlo", default="", help="append each JAX row's optimized HLO to this zip")
  ap.add_argument("--flags", default="", choices=[""] + list(FLAG_SETS),
                  help="one XLA flag set for every JAX row (e.g. default, where XLA rejects tuned)")
  args = ap.parse_args(argv)
  if not args.cpu and not _gpu_present():
    print("bench/gpu.py: no NVIDIA GPU here (nvidia-smi -L failed): skipped. "
          "Run it on a GPU, or with --quick --cpu to check the script on a tiny model.")
    return
  if args.parts:
    from bench import gpu_parts
    gpu_parts.main(args)
    return
  timeout = args.timeout or (600 if args.cpu else 300)
  rows = _rows(args)
  what = "tiny model on the CPU (checks the script; the numbers say nothing)" if args.cpu else \
      f"ANDREA-120M, bf16, B={rows[0]['batch']} T={rows[0]['seq_len']}, one GPU"
  print(f"bench/gpu.py: {what}; {len(rows)} rows", flush=True)
  results: dict[str, dict] = {}
  started = time.perf_counter()
  hlo_dir = tempfile.mkdtemp(prefix="andrea_hlo_")
  try:
    for group in groups(rows):
      left = args.budget - (time.perf_counter() - started) if args.budget else float("inf")
      if left < MIN_ROW_S:
        out = [{"skipped": f"{left:.0f} s of the {args.budget:.0f} s budget left"}] * len(group)
      else:
        out = _run_group(group, min(timeout * len(group), left), time.time() + left, hlo_dir)
      for row, r in zip(group, out):
        results[row["name"]] = r
        print(f"  {row['label']}: {_status(r)} ({time.perf_counter() - started:.0f} s)",
              flush=True)
    _write_hlo(hlo_dir, args.hlo)
  finally:
    shutil.rmtree(hlo_dir, ignore_errors=True)
  ordered = [results[row["name"]] for row in rows]
  torch_r = results.get("torch", {})
  ref = torch_r.get("tokens_per_s")
  per_token = next((r["mfu"] / r["tokens_per_s"] for r in ordered if r.get("mfu")), None)
  for row, r in zip(rows, ordered):            # the same model and T: the same FLOPs per token
    if row["kind"] == "torch" and per_token and r.get("tokens_per_s"):
      r["mfu"] = per_token * r["tokens_per_s"]
  device = next((r["device"] for r in ordered if "device" in r), "?")
  print(f"\ndevice: {device}; JAX rows: the real train step; the ratio is to the PyTorch yardstick")
  print(f"{'row':38s} {'tokens/s':>11s} {'MFU':>6s} {'peak GiB':>8s} {'step ms':>8s} "
        f"{'compile':>8s} {'attn':>6s} {'vs torch':>8s}")
  for row, r in zip(rows, ordered):
    print(_fmt_row(row["label"], r, ref))
  used = [k for k in FLAG_SETS if any(row.get("flags") == k for row in rows)]
  print("XLA flag sets: " + "; ".join(f"{k} = {FLAG_SETS[k] or '(none)'}" for k in used)
        + (" (GPU flags: not set on the CPU)" if args.cpu else ""))
  for row, r in zip(rows, ordered):
    if r.get("mode"):
      print(f"{row['label']}: {r['mode']}, torch {r.get('torch', '?')}")
  v, lv = verdicts(rows, ordered), levers(rows, ordered)
  if args.cpu:
    print("(CPU: the verdicts below check the script's arithmetic, not a speed)")
  print("\n".join(_verdict_lines(v) + lever_lines(lv)))
  bad = [row["label"] for row, r in zip(rows, ordered) if r.get("finite") is False]
  if bad:
    print(f"non-finite loss in: {', '.join(bad)}")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"device": device, "cpu": args.cpu, "flag_sets": FLAG_SETS,
                 "rows": [dict(row, result=r) for row, r in zip(rows, ordered)],
                 "verdicts": v, "levers": lv}, f, indent=1)


if __name__ == "__main__":
  main()

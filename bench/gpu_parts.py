"""Where a training step's time goes: ``python -m bench.gpu --parts`` times three parts of the
ANDREA-120M step (B=64, T=1024, bf16, cuDNN attention, plain causal) on their own, each in its
earlier form and with its lever, and prints one table.

  blocks        forward and backward from the token ids to the final LayerNorm's output (the
                embeddings, the 12 blocks, ln_f), against a fixed cotangent: q, k, v out of one
                [D, 3D] matmul (earlier) or three in the attention's layout (split qkv)
  head + loss   forward and backward of the tied output projection and the cross-entropy over the
                batch's tokens, from the final hidden states and the embedding: float32 logits
                sliced to the vocabulary and optax's loss (earlier), or andrea_jax.xent (fused)
  update        the gradient's norm, clipping, AdamW, the finiteness check and the select that
                skips a non-finite step (andrea_jax.step.apply_gradients): the gradient divided by
                the token count and clipping's own norm (earlier), or the lean form

Columns: milliseconds per call (back-to-back calls after two warm-ups, no host sync in between), the
time saved, and the compiled program's temporary memory (``compiled.memory_analysis()``: what the
part needs beyond its inputs and outputs). A whole step is more than its three parts (the per-source
sums, the curriculum, the detector, and the overlap XLA finds between parts): bench/device_check.py
prints that rest from the step rows of the same run. Each part's optimized HLO goes to ``--hlo``
with the rows'. On the CPU (``--cpu``) the tiny model checks the script.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from bench import gpu
from bench import gpu_step

PARTS = ("blocks", "head + loss", "update")


def _timed(fn, args: tuple, steps: int, donate: bool) -> tuple[float, object]:
  """Seconds per call of the compiled ``fn`` over ``steps`` back-to-back calls (after two);
  with ``donate`` each call's output is the next call's first argument."""
  import jax
  out = None
  for i in range(2 + steps):
    if i == 2:
      jax.block_until_ready(out)
      t0 = time.perf_counter()
    out = fn(*args)
    if donate:
      args = (out[0], *args[1:])
  jax.block_until_ready(out)
  return (time.perf_counter() - t0) / steps, out


def _programs(run, spec: dict, state, batch):
  """``{part: {"earlier": (fn, args, donate), "now": (...)}}``: each part's two forms, jitted."""
  import jax
  import jax.numpy as jnp
  import optax

  from andrea_jax import step as step_lib
  from andrea_jax import xent

  m = run.model
  earlier = gpu_step.step_config(run, dict(spec, **gpu.LEVERS_OFF))
  now = gpu_step.step_config(run, dict(spec, **gpu.LEVERS_ON))
  B, T, D = spec["batch"], spec["seq_len"], m.d_model
  weights_BxT = step_lib.loss_weights(batch)
  n = jnp.maximum(weights_BxT.sum(), 1.0)
  ct_BxTxD = jax.random.normal(jax.random.key(0), (B, T, D), m.compute_dtype)
  x_BxTxD = jax.random.normal(jax.random.key(1), (B, T, D), m.compute_dtype)

  def blocks(cfg):
    def f(params, batch, ct):
      hidden = lambda p: cfg.model.apply({"params": p}, batch["inputs"],
                                         positions=batch["positions"], hidden=True)
      return jax.grad(lambda p: jnp.vdot(hidden(p).astype(jnp.float32), ct))(params)
    return jax.jit(f), (state.params, batch, ct_BxTxD.astype(jnp.float32)), False

  def head_earlier(x, wte, targets, w):
    logits = jnp.einsum("btd,vd->btv", x, wte.astype(m.compute_dtype),
                        preferred_element_type=jnp.float32)[..., :m.vocab_size]
    return (optax.softmax_cross_entropy_with_integer_labels(logits, targets) * w).sum() / n

  def head_now(x, wte, targets, w):
    return xent.cross_entropy(x, wte, targets, w, vocab_size=m.vocab_size,
                              dtype=m.compute_dtype).sum() / n

  def head(loss):
    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    return f, (x_BxTxD, state.params["wte"]["embedding"], batch["targets"], weights_BxT), False

  grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), state.params)

  def update(cfg, divide):
    def f(po, grads, loss):
      g = jax.tree.map(lambda x: x / n, grads) if divide else grads
      params, opt_state, _, finite = step_lib.apply_gradients(cfg, *po, g, loss)
      return (params, opt_state), finite
    return jax.jit(f, donate_argnums=0), ((state.params, state.opt_state), grads,
                                          jnp.float32(3.0)), True

  return {"blocks": {"earlier": blocks(earlier), "now": blocks(now)},
          "head + loss": {"earlier": head(head_earlier), "now": head(head_now)},
          "update": {"earlier": update(earlier, True), "now": update(now, False)}}


def measure(spec: dict, hlo_dir: str) -> dict:
  """``{part: {form: {"ms", "temp_bytes", "compile_s"} or {"error"}}}`` for the three parts."""
  import jax

  from andrea_jax import runconfig
  from andrea_jax import train

  run = runconfig.build(gpu_step.config(spec))
  state = jax.jit(lambda: train.init_state(run, train.run_keys(0)))()
  batch = {k: jax.device_put(v) for k, v in gpu_step.synthetic_batch(
      spec["batch"], spec["seq_len"], run.model.vocab_size, False).items()}
  out: dict = {}
  for part, forms in _programs(run, spec, state, batch).items():
    out[part] = {}
    for form, (fn, args, donate) in forms.items():
      try:
        t0 = time.perf_counter()
        compiled = fn.lower(*args).compile()
        compile_s = time.perf_counter() - t0
        gpu_step.save_hlo(hlo_dir, f"part {part} {form}".replace(" + ", "_").replace(" ", "_"),
                     compiled.as_text())
        mem = compiled.memory_analysis()
        if donate:        # the update donates the state: time it on a copy
          args = (jax.tree.map(lambda x: x.copy(), args[0]), *args[1:])
        seconds, _ = _timed(compiled, args, spec["steps"], donate)
        out[part][form] = {"ms": 1e3 * seconds, "compile_s": compile_s,
                           "temp_bytes": getattr(mem, "temp_size_in_bytes", None)}
      except Exception as e:  # pylint: disable=broad-except -- the other parts still run
        out[part][form] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:160]}
      jax.clear_caches()
  return out


def table(parts: dict) -> list[str]:
  """The parts table's lines."""
  gib = lambda r: f"{r['temp_bytes'] / 2**30:.2f}" if r.get("temp_bytes") is not None else "n/a"
  lines = [f"{'part':14s} {'earlier ms':>10s} {'now ms':>8s} {'saved ms':>9s} "
           f"{'earlier temp GiB':>16s} {'now temp GiB':>12s}"]
  total = {"earlier": 0.0, "now": 0.0}
  for part in PARTS:
    e, n = parts.get(part, {}).get("earlier", {}), parts.get(part, {}).get("now", {})
    if "ms" not in e or "ms" not in n:
      lines.append(f"{part:14s} failed: {e.get('error') or n.get('error') or 'not run'}")
      total = {k: None for k in total}
      continue
    for k, r in (("earlier", e), ("now", n)):
      total[k] = None if total[k] is None else total[k] + r["ms"]
    lines.append(f"{part:14s} {e['ms']:>10.2f} {n['ms']:>8.2f} {e['ms'] - n['ms']:>9.2f} "
                 f"{gib(e):>16s} {gib(n):>12s}")
  if None not in total.values():
    lines.append(f"{'sum of parts':14s} {total['earlier']:>10.2f} {total['now']:>8.2f} "
                 f"{total['earlier'] - total['now']:>9.2f}")
  return lines


def main(args) -> None:
  """``python -m bench.gpu --parts``: measures in a process of its own with the tuned flags,
  prints the table, writes ``--json`` and appends the HLO to ``--hlo``."""
  import subprocess
  import sys
  cpu = args.cpu
  spec = dict(gpu.ROWS["cudnn"], name="parts", cpu=cpu, batch=4 if cpu else 64,
              seq_len=64 if cpu else 1024, steps=args.steps or (3 if cpu else 20))
  spec["flags"] = args.flags or spec["flags"]
  what = "tiny model on the CPU (checks the script)" if cpu else \
      "ANDREA-120M, bf16, B=64 T=1024, cuDNN, causal, one GPU"
  print(f"bench/gpu.py --parts: {what}", flush=True)
  hlo_dir = tempfile.mkdtemp(prefix="andrea_hlo_")
  try:
    cmd = [sys.executable, "-c", "import json, sys; from bench import gpu_parts; "
           "print('PARTS ' + json.dumps(gpu_parts.measure(json.loads(sys.argv[1]), sys.argv[2])))",
           json.dumps(spec), hlo_dir]
    timeout = args.budget or args.timeout or (900 if cpu else 400)
    try:
      out = subprocess.run(cmd, cwd=gpu.REPO, env=gpu.child_env(spec["flags"], cpu),
                           capture_output=True, text=True, timeout=timeout)
      found = [line[6:] for line in out.stdout.splitlines() if line.startswith("PARTS ")]
      parts = json.loads(found[-1]) if found else {
          "error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1][:160]}
    except subprocess.TimeoutExpired:
      parts = {"error": f"timed out after {timeout:.0f} s"}
    gpu._write_hlo(hlo_dir, args.hlo)
  finally:
    shutil.rmtree(hlo_dir, ignore_errors=True)
  if "error" in parts:
    print(f"parts: failed: {parts['error']}")
  else:
    print("\n".join(table(parts)))
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"cpu": cpu, "spec": spec, "parts": parts}, f, indent=1)

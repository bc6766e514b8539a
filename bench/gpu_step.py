"""One process's JAX rows of bench/gpu.py: ``python -m bench.gpu_step ROWS DEADLINE HLO_DIR``.

Runs the rows (a JSON list of bench/gpu.py row specs, all with the XLA flags already in this
process's environment) one after another: each builds ANDREA-120M's run (the tiny model with
``cpu``), applies the row's levers to the step, compiles it, saves its optimized HLO, runs two
warm-up steps then ``steps`` timed ones, and prints ``ROW {"name", "result"}`` at once, so that a
timeout keeps the rows before it. A row that would start with under a minute before ``DEADLINE``
(a ``time.time()``) is skipped; one that raises (an out-of-memory) records why and the next runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time

from bench import gpu


def config(spec: dict):
  """The row's run config: ANDREA-120M in bf16 (the tiny model on the CPU), its attention, mask,
  remat and accumulation, B x T, no evaluation samples."""
  from andrea_jax import config as config_lib
  from andrea_jax.model import andrea_120m, tiny

  c = config_lib.base_config()
  if spec["cpu"]:
    shape = tiny(max_len=spec["seq_len"], num_layers=2, num_heads=2, d_model=64, d_mlp=256)
  else:
    shape = andrea_120m(dtype="bfloat16")
  c.model.update({k: v for k, v in shape.to_dict().items() if k in c.model})
  # cuDNN cannot run on a CPU: "auto" is the XLA attention there (the table's attn column says so).
  c.model.attention_impl = "auto" if spec["cpu"] and spec["attn"] == "cudnn" else spec["attn"]
  c.model.remat = spec["remat"]
  c.data.seq_len, c.data.global_batch_size = spec["seq_len"], spec["batch"]
  c.optim.grad_accum_steps = spec["accum"]
  c.train.document_mask = spec["packed"]
  c.eval.sample_tokens = 0     # nothing is evaluated here: no sample has to fit the context
  return c


def step_config(run, spec: dict):
  """The run's step with the row's levers: the fused loss, the lean update, the split qkv."""
  from andrea_jax import xent
  from andrea_jax.model import Transformer
  model = Transformer(dataclasses.replace(run.model, split_qkv=spec["split_qkv"]))
  return dataclasses.replace(run.step, model=model, lean_update=spec["lean_update"],
                             xent=xent.XentConfig() if spec["fused_loss"] else None)


def synthetic_batch(batch: int, seq_len: int, vocab: int, packed: bool) -> dict:
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


def save_hlo(hlo_dir: str, name: str, text: str) -> None:
  """Writes a compiled program's HLO text to ``hlo_dir/<name>.hlo.txt`` (nothing without a
  folder), without the source locations (file names, lines, stack frames: about half its size)."""
  if hlo_dir:
    text = re.sub(r"\n(FileNames|FunctionNames|FileLocations|StackFrames)\n.*?\n\n", "\n", text,
                  flags=re.S)
    text = re.sub(r' (source_file="[^"]*"|source_line=\d+|source_end_line=\d+|'
                  r'source_column=\d+|source_end_column=\d+|stack_frame_id=\d+)', "", text)
    with open(os.path.join(hlo_dir, f"{name}.hlo.txt"), "w") as f:
      f.write(text)


def measure(spec: dict, hlo_dir: str) -> dict:
  """One row: the step compiled (its HLO saved), two warm-up steps, ``steps`` timed ones."""
  import jax
  import numpy as np

  from andrea_jax import runconfig
  from andrea_jax import logs
  from andrea_jax import sharding
  from andrea_jax import step as step_lib
  from andrea_jax import train
  from andrea_jax.model import count_params, flops_per_token

  device = jax.devices()[0]
  c = config(spec)
  run = runconfig.build(c)
  mesh = sharding.make_mesh(c.mesh, devices=[device])
  state, state_sh = sharding.init_sharded(
      lambda: train.init_state(run, train.run_keys(0)),
      lambda s: sharding.state_shardings(s, mesh, c.mesh.fsdp_min_size))
  batch_sh = sharding.batch_sharding(mesh)
  batch = sharding.global_batch(
      synthetic_batch(spec["batch"], spec["seq_len"], run.model.vocab_size, spec["packed"]),
      batch_sh, spec["batch"])
  t0 = time.perf_counter()
  compiled = step_lib.jit_step(step_config(run, spec), state_sh, batch_sh).lower(
      state, batch).compile()
  hlo = compiled.as_text()
  save_hlo(hlo_dir, spec["name"], hlo)
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
  peak = logs.peak_flops(device)
  flops = flops_per_token(run.model, spec["seq_len"])
  stats = device.memory_stats() or {}
  return {"tokens_per_s": tokens_per_s, "step_s": elapsed / spec["steps"], "compile_s": compile_s,
          "mfu": tokens_per_s * flops / peak if peak else None, "flops_per_token": flops,
          "peak_flops": peak, "peak_bytes": stats.get("peak_bytes_in_use"), "attention": attention,
          "loss": loss, "finite": bool(np.isfinite(loss)), "device": device.device_kind,
          "platform": device.platform, "params": count_params(state.params),
          "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", "")}


def run_rows(specs: list[dict], hlo_dir: str, deadline: float) -> None:
  """Runs the rows one after another in this process, printing ``ROW {json}`` after each (what
  a timeout cuts short keeps the rows before it); a row that would start past ``deadline`` (a
  ``time.time()``) less a minute is skipped."""
  import gc

  import jax
  for spec in specs:
    left = deadline - time.time()
    if left < gpu.MIN_ROW_S:
      r = {"skipped": f"{max(left, 0):.0f} s of the budget left"}
    else:
      try:
        r = measure(spec, hlo_dir)
      except Exception as e:  # pylint: disable=broad-except -- the next rows still run
        why = f"{type(e).__name__}: {e}"
        r = {"error": "out of memory" if "RESOURCE_EXHAUSTED" in why else why.splitlines()[0][:160]}
    print("ROW " + json.dumps({"name": spec["name"], "result": r}), flush=True)
    jax.clear_caches()
    gc.collect()                          # the row's state and executable leave the device


if __name__ == "__main__":
  run_rows(json.loads(sys.argv[1]), sys.argv[3], float(sys.argv[2]))

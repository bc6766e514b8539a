"""Helpers shared by the tests (and the benchmarks that reuse their harness)."""

import os
import pathlib
import struct

from andrea_jax.config import load_config_file

REPO = pathlib.Path(__file__).resolve().parent.parent


def small_run_config(num_steps: int = 30, **overrides):
  """The main job on the synthetic corpus (experiments/synthetic.py: ANDREA's sixteen sources) shrunk
  for tests: a 2-layer 32-wide model, 16 x 32-token batches.

  The curriculum keeps its three geometries, placed inside the short run.
  """
  from andrea_jax.curriculum import andrea_geometries

  c = load_config_file(REPO / "experiments" / "synthetic.py")
  c.model.update(num_layers=2, num_heads=2, d_model=32, d_mlp=128, max_len=64)
  c.data.update(seq_len=32, global_batch_size=16, builtin_scale=0.25)
  # No TensorBoard files: tensorboardX imports torch when it is installed (seconds per process).
  c.train.update(num_steps=num_steps, log_every=5, checkpoint_every=10, progress_bar=False,
                 plot=False, tensorboard=False)
  c.eval.update(every=0, sequences_per_source=2, sample_tokens=8, prompts=("The ",))
  c.optim.update(warmup_steps=5, peak_lr=3e-3)
  # The three regimes at 0, 30% and 60% of the run (phases of 7-42 steps need room).
  c.curriculum.geometries = andrea_geometries(10**6)
  c.curriculum.geometries.v2_firehose.start_step = max(7, int(0.3 * num_steps))
  c.curriculum.geometries.v3_polish.start_step = max(14, int(0.6 * num_steps))
  c.cliff.update(window=10, warmup=10, cooldown=10)
  for key, value in overrides.items():
    section, field = key.split("__")
    c[section][field] = value
  return c


def tensorboard_scalars(logdir: pathlib.Path) -> list[tuple[str, int, float]]:
  """The scalars TensorBoard shows for ``logdir``, in the order written: its event files read in
  name order, a ``SessionLog.START`` at step s dropping the events read before it with step >= s (as
  TensorBoard's event accumulator does). Wall-clock tags are left out."""
  from tensorboardX.proto import event_pb2
  shown = []
  for name in sorted(os.listdir(logdir)):
    data = (logdir / name).read_bytes()
    at = 0
    while at < len(data):   # TFRecord: u64 length, u32 crc, payload, u32 crc
      (length,) = struct.unpack("<Q", data[at:at + 8])
      event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
      at += 12 + length + 4
      if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
        shown = [s for s in shown if s[1] < event.step]
      for v in event.summary.value:
        if v.tag not in ("tokens_per_s", "mfu"):
          shown.append((v.tag, event.step, v.simple_value))
  return shown


def set_fields(config, overrides: dict) -> None:
  """``config.a.b = v`` for each ``"a.b": v`` of ``overrides`` (as the command line's
  ``--config.a.b=v`` does: a source's ``data.files.<source>.format`` switches its section first,
  :func:`andrea_jax.data.formats.switch_formats`)."""
  from andrea_jax.data import formats
  formats.switch_formats(config, overrides)
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value


def kill_after_checkpoint(config_arg: str, workdir, overrides: dict, step: int,
                          timeout: float = 600) -> str:
  """Starts ``python -m andrea_jax.main --config=<config_arg> --workdir=<workdir>`` with
  ``overrides``, SIGKILLs it once a checkpoint at ``step`` or later exists, and returns its output.
  An ``AssertionError`` if the run ended before that."""
  import signal
  import subprocess
  import sys
  import time
  cmd = [sys.executable, "-m", "andrea_jax.main", f"--config={config_arg}", f"--workdir={workdir}",
         *(f"--config.{k}={v}" for k, v in overrides.items())]
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  ckpts = pathlib.Path(workdir) / "checkpoints"
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None:
    if any(d.name.isdigit() and int(d.name) >= step for d in ckpts.glob("*")):
      proc.send_signal(signal.SIGKILL)
      break
    time.sleep(0.05)
  out = proc.communicate(timeout=60)[0].decode(errors="replace")
  assert proc.returncode == -signal.SIGKILL, out[-3000:]
  return out

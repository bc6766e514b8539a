"""Double launches on a real run, and takeovers of the lock a killed run leaves.

:func:`campaign` runs one job in a workdir as a chain of ``python -m andrea_jax.main`` processes.
Each trains a few steps past where it resumed, is frozen (SIGSTOP: it writes nothing meanwhile),
sees a second launch of the same command with another learning rate on the same workdir, is thawed,
trains a few steps more, and is SIGKILLed, leaving its lock behind; the next process takes the lock
over. A last process runs to the end. Had a second launch written anything, or a takeover lost a
step, the stitched run would differ from the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np

from andrea_jax import lock as lock_lib
from tests.faults import harness

_RESUMED = re.compile(r"(?:resuming|starting) from step (\d+)")


def tree(workdir: Path) -> dict[str, tuple[int, int]]:
  """Every file under ``workdir``: its size and modification time."""
  out = {}
  for root, _, files in os.walk(workdir):
    for name in files:
      st = os.stat(os.path.join(root, name))
      out[os.path.relpath(os.path.join(root, name), workdir)] = (st.st_size, st.st_mtime_ns)
  return out


@dataclasses.dataclass
class Trial:
  """One process of the chain and the second launch it met."""
  pid: int
  refused: bool            # the second launch exited 1 naming this process, having started nothing
  untouched: bool          # nothing in the workdir changed, the lock still names this process
  refused_after: float     # seconds from the second launch to its exit
  newest_after_kill: int   # the newest complete checkpoint the kill left
  output: str


def _wait_for_step(proc, workdir: Path, since: float, step: int, timeout: float) -> None:
  deadline = time.time() + timeout
  while True:
    logged = harness._last_logged_step(workdir, since)
    if logged is not None and logged >= step:
      return
    if proc.poll() is not None or time.time() > deadline:
      raise RuntimeError(f"the run ended or stalled before step {step} (exit {proc.poll()})")
    time.sleep(0.01)


def _trial(config, other, workdir: Path, env, rng, log: Path, timeout: float) -> Trial:
  ckpts = workdir / "checkpoints"
  newest = max(harness.final_steps(ckpts), default=0)
  t0 = time.time()
  with open(log, "wb") as out:
    proc = subprocess.Popen(harness.command(config, workdir), cwd=harness.REPO, env=env,
                            stdout=out, stderr=subprocess.STDOUT)
  try:
    # Its metrics.jsonl rewritten after t0: it holds the lock and trains.
    _wait_for_step(proc, workdir, t0, newest + int(rng.integers(1, 5)), timeout)
    proc.send_signal(signal.SIGSTOP)
    before = tree(workdir)
    start = time.time()
    second = subprocess.run(harness.command(other, workdir), cwd=harness.REPO, env=env,
                            capture_output=True, text=True, timeout=timeout, check=False)
    refused_after = time.time() - start
    holder = lock_lib.holder(str(workdir))
    refused = (second.returncode == 1
               and f"is in use by another run: process {proc.pid} on host" in second.stderr
               and not _RESUMED.search(second.stdout + second.stderr))
    untouched = tree(workdir) == before and holder is not None and holder.pid == proc.pid
    proc.send_signal(signal.SIGCONT)
    logged = harness._last_logged_step(workdir, t0)
    _wait_for_step(proc, workdir, t0, logged + int(rng.integers(1, 4)), timeout)
    proc.kill()
    proc.wait()
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  return Trial(proc.pid, refused, untouched, refused_after,
               max(harness.final_steps(ckpts), default=0), log.read_text(errors="replace"))


def campaign(config, other, workdir: Path, trials: int, *, env: dict[str, str], seed: int = 0,
             timeout: float = 600, progress=None) -> tuple[list[Trial], harness.Segment]:
  """``trials`` processes as described in the module docstring (``other``: the second launch's
  config), then one to the end; returns the trials and that last segment."""
  rng = np.random.default_rng(seed)
  workdir.parent.mkdir(parents=True, exist_ok=True)
  out = []
  for k in range(trials):
    out.append(_trial(config, other, workdir, env, rng,
                      workdir.parent / f"{workdir.name}.double{k:02d}.log", timeout))
    if progress is not None:
      progress(k, out[-1])
  last = harness.run_segment(config, workdir, "none", env=env, rng=rng,
                             num_steps=config.train.num_steps, timeout=timeout,
                             log=workdir.parent / f"{workdir.name}.double-last.log")
  return out, last


def takeovers(trials: list[Trial], last: harness.Segment, workdir: Path) -> list[int | None]:
  """Per trial, the committed steps lost at the takeover that followed its kill (``None``: the next
  process did not say it took the lock over from it)."""
  lost = []
  for k, t in enumerate(trials):
    nxt = trials[k + 1].output if k + 1 < len(trials) else last.output
    said = f"taking over the lock of {workdir}: process {t.pid} on host" in nxt
    resumed = _RESUMED.search(nxt)
    lost.append(t.newest_after_kill - int(resumed.group(1)) if said and resumed else None)
  return lost

"""Driving real training runs in subprocesses: kills and signals at chosen moments, and the checks.

A *campaign* runs one training job as a chain of subprocesses (``python -m andrea_jax.main``, the
command a user types), each ended by a fault -- SIGKILL while orbax writes a checkpoint
asynchronously, right after a commit (before or during its seal), after a random training step, at
a random wall-clock moment (start-up included), SIGTERM or SIGINT -- and finishes with one
uninterrupted segment. After each segment it records what a restart must honour: the newest
complete checkpoint (a directory under its final step name: orbax renames a finished write into
place), the temporary directories left behind, and whether every complete checkpoint still
verifies. :func:`check_campaign` turns that into the figures of bench/faults.py and the assertions
of tests/faults/test_kills.py.

Subprocesses share a persistent XLA compilation cache (``JAX_COMPILATION_CACHE_DIR``): only the
first run of a configuration compiles; a killed run never writes a half entry because the reference
run has filled the cache before any kill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import jax
import numpy as np

from andrea_jax import checkpoint as ckpt_lib
from tests.util import REPO, small_run_config

TMP_MARK = ".orbax-checkpoint-tmp"
KILLS = ("async_write", "after_commit", "random_step", "random_time")
# After a random step; and SIGTERM at a random moment from the launch on (imports, start-up,
# training or the final evaluation and checkpoint).
SIGNALS = {"sigterm": signal.SIGTERM, "sigint": signal.SIGINT, "sigterm_anytime": signal.SIGTERM}
# The trainer prints one of these once it has opened the checkpoints ("starting from step 0" when
# there was none to restore).
_RESUMED = re.compile(r"(?:resuming|starting) from step (\d+)")


class _Counter:
  count = 0


@contextlib.contextmanager
def count_compiles():
  """Counts XLA compilations (persistent-cache hits included) made by this thread in the block.

  Other threads (a previous test's orbax commit, a prefetcher) may compile meanwhile; the listener
  runs in the compiling thread, so it can tell.
  """
  counter = _Counter()
  me = threading.get_ident()

  def listener(event, duration, **kwargs):
    if threading.get_ident() == me and (event == "/jax/core/compile/backend_compile_duration"
                                        or "cache_retrieval" in event):
      counter.count += 1

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield counter
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def fault_config(num_steps: int = 24):
  """The tests' tiny run, logging every step and checkpointing every 2 steps (keep 3)."""
  c = small_run_config(num_steps=num_steps)
  c.train.update(log_every=1, checkpoint_every=2, keep_checkpoints=3)
  c.eval.sample_tokens = 0   # no generation program to compile
  return c


def command(config, workdir: str | os.PathLike, module: str = "andrea_jax.main") -> list[str]:
  """``python -m <module> --config=experiments/synthetic.py --workdir=... --config.x.y=v ...``."""
  flat = {}
  for section in ("model", "data", "train", "eval", "optim", "cliff"):
    for k, v in config[section].items():
      if not hasattr(v, "items"):
        flat[f"{section}.{k}"] = v
  for g in ("v2_firehose", "v3_polish"):
    flat[f"curriculum.geometries.{g}.start_step"] = config.curriculum.geometries[g].start_step
  flags = []
  for k, v in flat.items():
    if isinstance(v, (tuple, list)):
      v = "(" + ",".join(repr(x) for x in v) + ",)"
    flags.append(f"--config.{k}={v}")
  return [sys.executable, "-m", module, f"--config={REPO / 'experiments' / 'synthetic.py'}",
          f"--workdir={workdir}", *flags]


def environment(xla_cache: str, **extra: str) -> dict[str, str]:
  """The subprocesses' environment: unbuffered output, CPU, a shared compilation cache."""
  tests = str(REPO / "tests")
  return dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu",
              JAX_COMPILATION_CACHE_DIR=xla_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
              PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]), **extra)


def final_steps(ckpt_dir: Path) -> list[int]:
  """Steps with a directory under their final name: orbax's complete checkpoints."""
  if not ckpt_dir.is_dir():
    return []
  return sorted(int(n) for n in os.listdir(ckpt_dir) if n.isdigit())


def leftovers(ckpt_dir: Path) -> set[str]:
  """Temporary files and directories a killed run left: orbax's, a half-written seal, a step
  renamed for deletion but not yet removed."""
  if not ckpt_dir.is_dir():
    return set()
  out = {n for n in os.listdir(ckpt_dir) if TMP_MARK in n}
  if (ckpt_dir / "deleting").is_dir():
    out |= {f"deleting/{n}" for n in os.listdir(ckpt_dir / "deleting")}
  out |= {f"{n}/{ckpt_lib.SEAL}.tmp" for n in os.listdir(ckpt_dir)
          if n.isdigit() and (ckpt_dir / n / f"{ckpt_lib.SEAL}.tmp").exists()}
  return out


def _last_logged_step(workdir: Path, since: float) -> int | None:
  """The step of the last record of ``metrics.jsonl`` if the file was rewritten after ``since``."""
  path = workdir / "metrics.jsonl"
  try:
    if path.stat().st_mtime < since:
      return None
    with open(path, "rb") as f:   # the tail is enough (polled every few milliseconds)
      f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
      lines = f.read().splitlines()
  except FileNotFoundError:
    return None
  for line in reversed(lines):
    try:
      return int(json.loads(line)["step"])
    except (ValueError, KeyError):
      continue
  return None


@dataclasses.dataclass
class Segment:
  """One subprocess of a campaign and what it left."""
  fault: str                      # a KILLS or SIGNALS name, or "none" (run to the end)
  fired: bool                     # the fault was injected (the run had not finished first)
  returncode: int
  resumed_from: int | None        # "resuming from step N" in its output (None: not printed)
  newest_before: int              # newest complete checkpoint when it started (0: none)
  newest_after: int               # newest complete checkpoint when it ended
  leftovers_before: set[str]
  leftovers_after: set[str]
  unverified: list[str]           # complete checkpoints that fail verification after it
  seconds: float
  started_after: float | None     # seconds from the launch to its first logged step
  output: str

  @property
  def initialised(self) -> bool:
    """It got as far as opening the checkpoints (so orbax had cleaned its temporaries)."""
    return (self.resumed_from is not None or self.newest_after != self.newest_before
            or (self.returncode == 0 and "before the run started" not in self.output))

  @property
  def steps_lost(self) -> int | None:
    """Committed steps the restart did not resume from (0 is the target; None: not known)."""
    if self.resumed_from is not None:
      return self.newest_before - self.resumed_from
    if self.initialised:   # it opened the checkpoints and did not resume: from scratch
      return self.newest_before
    return None


def run_segment(config, workdir: Path, fault: str, *, env: dict[str, str],
                rng: np.random.Generator, log: Path, num_steps: int, timeout: float = 600,
                random_time_max: float = 8.0, module: str = "andrea_jax.main",
                step_window: int | None = None) -> Segment:
  """Run one subprocess of the job in ``workdir`` and inject ``fault`` (see the module docstring).

  ``random_step``, ``sigterm`` and ``sigint`` strike after a step drawn uniformly from the resume
  point to the end of the run, or to ``step_window`` steps past it; ``random_time`` and
  ``sigterm_anytime`` at a moment drawn uniformly in ``[0, random_time_max]`` seconds after the
  launch (start-up included), or at step ``step_window`` past the resume point if that comes first.
  """
  ckpt_dir = workdir / "checkpoints"
  steps_before = set(final_steps(ckpt_dir))
  newest_before = max(steps_before, default=0)
  left_before = leftovers(ckpt_dir)
  tmp_before = {n for n in left_before if TMP_MARK in n}
  # A random step from the resume point on, before the last one.
  last = num_steps - 1 if step_window is None else min(num_steps - 1, newest_before + step_window)
  kill_step = int(rng.integers(newest_before, last)) if newest_before < last else -1
  delay = float(rng.uniform(0, random_time_max))
  t0 = time.time()
  with open(log, "wb") as out:
    proc = subprocess.Popen(command(config, workdir, module), cwd=REPO, env=env, stdout=out,
                            stderr=subprocess.STDOUT)
    fired = False
    started_after = None
    try:
      while proc.poll() is None and not fired:
        logged = _last_logged_step(workdir, t0)
        if started_after is None and logged is not None and logged >= newest_before:
          started_after = time.time() - t0
        if time.time() - t0 > timeout:
          raise TimeoutError(f"segment {fault} ran past {timeout} s; log {log}")
        if fault == "async_write":
          fire = ckpt_dir.is_dir() and any(TMP_MARK in n and n not in tmp_before
                                           for n in os.listdir(ckpt_dir))
        elif fault == "after_commit":
          fire = bool(set(final_steps(ckpt_dir)) - steps_before)
        elif fault in ("random_time", "sigterm_anytime"):
          # A random moment of the start-up or of the first steps, but never past step_window.
          fire = (time.time() - t0 >= delay or (step_window is not None and logged is not None
                                                and logged >= newest_before + step_window))
        elif fault in ("random_step", "sigterm", "sigint"):
          fire = kill_step >= 0 and logged is not None and logged >= kill_step
          if fire and fault == "random_step":
            time.sleep(float(rng.uniform(0, 0.05)))   # anywhere inside the next step
        elif fault == "none":
          fire = False
        else:
          raise ValueError(f"unknown fault {fault!r}")
        if fire:
          proc.send_signal(SIGNALS.get(fault, signal.SIGKILL))
          fired = True
        else:
          time.sleep(0.002)
      proc.wait(timeout=max(1.0, timeout - (time.time() - t0)))
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  output = log.read_text(errors="replace")
  resumed = _RESUMED.findall(output)
  steps_after = final_steps(ckpt_dir)
  unverified = [f"{s}: {p}" for s in steps_after
                if (p := ckpt_lib.verify(str(ckpt_dir / str(s)))) is not None]
  return Segment(fault=fault, fired=fired, returncode=proc.returncode,
                 resumed_from=int(resumed[-1]) if resumed else None, newest_before=newest_before,
                 newest_after=max(steps_after, default=0), leftovers_before=left_before,
                 leftovers_after=leftovers(ckpt_dir), unverified=unverified,
                 seconds=time.time() - t0, started_after=started_after, output=output)


def campaign(config, workdir: Path, faults: list[str], *, env: dict[str, str], seed: int = 0,
             timeout: float = 600, random_time_max: float = 8.0, step_window: int | None = None,
             progress=None) -> list[Segment]:
  """Run the job in ``workdir`` as one segment per fault, then one to the end.

  ``progress(k, segment)`` is called after each segment (the bench prints a line).
  """
  rng = np.random.default_rng(seed)
  segments = []
  num_steps = config.train.num_steps
  for k, fault in enumerate(list(faults) + ["none"]):
    segments.append(run_segment(config, workdir, fault, env=env, rng=rng, num_steps=num_steps,
                                log=workdir.parent / f"{workdir.name}.{k:02d}.{fault}.log",
                                timeout=timeout, random_time_max=random_time_max,
                                step_window=step_window))
    if progress is not None:
      progress(k, segments[-1])
  return segments


@dataclasses.dataclass
class Check:
  """What a campaign proved, fault by fault."""
  injected: dict[str, int]
  survived: dict[str, int]
  steps_lost: dict[str, int]
  lost_any: dict[str, int]        # faults after which a committed step was lost or fails to verify
  problems: list[str]


def check_campaign(segments: list[Segment]) -> Check:
  """Count each injected fault and whether the job survived it.

  A fault is survived when: a SIGKILL ended the process (-9) or a signal ended it cleanly (exit 0)
  with a new complete checkpoint at the step it reached (or, arriving before the run started or
  after its last step, with nothing new to save); every complete checkpoint left verifies; the
  next segment that opened the checkpoints (one stopped or killed while still importing did not)
  resumed from the newest complete one (0 steps lost), and the temporary directories left before it
  were gone once it had opened them.
  """
  injected, survived, lost, lost_any, problems = {}, {}, {}, {}, []
  for k, seg in enumerate(segments):
    # The restart that counts is the next segment that opened the checkpoints: one stopped by a
    # signal or killed while still importing neither resumed nor lost anything.
    nxt = next((s for s in segments[k + 1:] if s.initialised), None)
    if seg.fault == "none":
      if seg.returncode != 0:
        problems.append(f"final segment exited {seg.returncode}:\n{seg.output[-3000:]}")
      continue
    if not seg.fired:
      if seg.returncode != 0:
        problems.append(f"segment {k} ({seg.fault}) exited {seg.returncode} before its fault:\n"
                        f"{seg.output[-3000:]}")
      continue   # the run finished before the fault could be injected
    injected[seg.fault] = injected.get(seg.fault, 0) + 1
    why = []
    if seg.fault in SIGNALS:
      stopped = "checkpointing and exiting" in seg.output
      nothing_new = "before the run started" in seg.output or "done:" in seg.output
      if seg.returncode != 0 or not (stopped or nothing_new):
        why.append(f"exited {seg.returncode} without a clean checkpoint")
      elif stopped and seg.newest_after <= max(seg.newest_before, seg.resumed_from or 0):
        why.append("no new checkpoint at the interruption")
    elif seg.returncode != -signal.SIGKILL:
      why.append(f"exited {seg.returncode}, not by the kill")
    lost_any.setdefault(seg.fault, 0)
    if seg.unverified:
      why.append(f"complete checkpoints fail verification: {seg.unverified}")
    if nxt is not None:
      n = nxt.steps_lost
      if n is not None:
        lost[seg.fault] = lost.get(seg.fault, 0) + n
        if n:
          why.append(f"the restart resumed from {nxt.resumed_from}, not {nxt.newest_before}")
      if nxt.initialised and seg.leftovers_after & nxt.leftovers_after:
        why.append(f"temporaries not cleaned: {sorted(seg.leftovers_after & nxt.leftovers_after)}")
    lost_any[seg.fault] += bool(seg.unverified or (nxt is not None and nxt.steps_lost))
    if why:
      problems.append(f"segment {k} ({seg.fault}): " + "; ".join(why))
    else:
      survived[seg.fault] = survived.get(seg.fault, 0) + 1
  return Check(injected, survived, lost, lost_any, problems)


def read_state(step_dir: Path) -> dict[str, np.ndarray]:
  """Every array of a checkpoint's state, by dotted path (read with orbax, without a target)."""
  import orbax.checkpoint as ocp
  tree = ocp.StandardCheckpointer().restore(str(step_dir / "state"))
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in flat}


def differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
  """Entries whose dtype, shape or bytes differ (NaN equals NaN: the comparison is bitwise)."""
  out = sorted(set(a) ^ set(b))
  for k in sorted(set(a) & set(b)):
    if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes():
      out.append(k)
  return out


_F32_MAX = float(np.finfo(np.float32).max)


def exact_projection(x, lower, upper):
  """The projection in exact rational arithmetic: the root of sum clip(x + t, l, u) = 1 found on the
  sorted breakpoints, then interpolated (+-inf taken as the largest float32, its limit)."""
  xs = [Fraction(min(max(v, -_F32_MAX), _F32_MAX)) for v in map(float, x)]
  lo, hi = [Fraction(float(v)) for v in lower], [Fraction(float(v)) for v in upper]

  def total(t):
    return sum(min(max(xi + t, li), ui) for xi, li, ui in zip(xs, lo, hi))

  points = sorted({li - xi for xi, li in zip(xs, lo)} | {ui - xi for xi, ui in zip(xs, hi)})
  values = [total(t) for t in points]
  tau = points[0]
  for (t0, v0), (t1, v1) in zip(zip(points, values), zip(points[1:], values[1:])):
    if v0 <= 1 <= v1:
      tau = t0 if v1 == v0 else t0 + (1 - v0) * (t1 - t0) / (v1 - v0)
      break
  return np.array([float(min(max(xi + tau, li), ui)) for xi, li, ui in zip(xs, lo, hi)])

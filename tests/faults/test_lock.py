"""Two runs in one workdir: the second is refused at once and writes nothing; SIGTERM releases the
lock; after a SIGKILL the next run takes it over and resumes bit for bit; readers open the run
while it trains. (The lock itself: tests/test_workdir.py; two processes: tests/test_multihost.py.)
"""

import json
import os
import signal
import subprocess
import threading
import time

import jax
import numpy as np
import pytest

from andrea_jax import plots
from andrea_jax import lock as lock_lib
from andrea_jax.checkpoint import load_checkpoint
from andrea_jax.sources import SOURCES
from tests.faults import double_launch, harness


def _wait_for(check, proc, what, timeout=300):
  deadline = time.time() + timeout
  while not check():
    assert proc.poll() is None, f"the run ended before {what}"
    assert time.time() < deadline, f"no {what} in {timeout} s"
    time.sleep(0.05)


def _wait_until_stopped(pid: int, timeout: float = 30.0) -> None:
  """Returns once every thread of ``pid`` is stopped (state T in /proc)."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
      try:
        states.append(open(f"/proc/{pid}/task/{task}/stat").read().rsplit(")", 1)[1].split()[0])
      except FileNotFoundError:
        continue
    if states and all(st in "tT" for st in states):
      return
    time.sleep(0.01)
  raise AssertionError(f"process {pid} did not stop within {timeout} s")


def _launch(config, workdir, env, log):
  out = open(log, "wb")
  return subprocess.Popen(harness.command(config, workdir), cwd=harness.REPO, env=env, stdout=out,
                          stderr=subprocess.STDOUT), out


def _logged(workdir) -> int:
  try:
    return max(json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text()
               .splitlines() if line.endswith("}"))
  except (FileNotFoundError, ValueError):
    return -1


@pytest.mark.slow
def test_a_second_run_is_refused_and_a_killed_one_is_taken_over_and_resumed(reference, xla_cache,
                                                                             tmp_path):
  config = harness.fault_config()
  config.train.keep_checkpoints = 50   # no step deleted under the readers (not part of the numbers)
  workdir, env = tmp_path / "run", harness.environment(xla_cache)
  ckpts = workdir / "checkpoints"
  first, log = _launch(config, workdir, env, tmp_path / "first.log")
  try:
    _wait_for(lambda: 2 in harness.final_steps(ckpts), first, "checkpoint 2")
    # Frozen, the first run writes nothing while the second launch tries; that one has another
    # learning rate: had it written anything, the run's numbers would differ from the reference's.
    first.send_signal(signal.SIGSTOP)
    _wait_until_stopped(first.pid)   # delivered later: a thread may still be writing a file
    before = double_launch.tree(workdir)
    other = harness.fault_config()
    other.optim.peak_lr *= 2
    start = time.time()
    second = subprocess.run(harness.command(other, workdir), cwd=harness.REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    refused_after = time.time() - start
    assert second.returncode == 1, second.stdout + second.stderr
    holder = lock_lib.holder(str(workdir))
    assert holder.pid == first.pid
    assert (f"error: the workdir {workdir} is in use by another run: process {first.pid} on host "
            f"{holder.host} (since ") in second.stderr, second.stderr
    assert f"nothing in {workdir} was changed by this command" in second.stderr
    assert "starting from" not in second.stdout and "resuming" not in second.stdout
    assert double_launch.tree(workdir) == before
    assert refused_after < 60, refused_after   # the interpreter, jax and the config: seconds
    print(f"second launch refused after {refused_after:.1f} s")
    # Readers of the held workdir: the newest trustworthy checkpoint's weights, the plots.
    assert load_checkpoint(str(workdir)).step >= 2
    assert plots.summary_figure(str(workdir), SOURCES).axes
    # SIGTERM (delivered as it continues): a checkpoint, and the lock released on the way out.
    first.send_signal(signal.SIGTERM)
    first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0
    assert not (workdir / "run.lock").exists()
  finally:
    if first.poll() is None:
      first.kill()
      first.wait()
    log.close()
  stopped = max(harness.final_steps(ckpts))

  # Resumed, read while it trains, then SIGKILLed: the lock stays, naming a process now gone.
  resumed, log = _launch(config, workdir, env, tmp_path / "resumed.log")
  read = []
  reader = threading.Thread(target=lambda: read.append(load_checkpoint(str(workdir))))
  try:
    _wait_for(lambda: _logged(workdir) > stopped, resumed, "a step after the resume")
    reader.start()
    _wait_for(lambda: max(harness.final_steps(ckpts)) > stopped, resumed, "a new checkpoint")
    resumed.kill()
    resumed.wait()
  finally:
    if resumed.poll() is None:
      resumed.kill()
      resumed.wait()
    log.close()
    if reader.ident is not None:
      reader.join()
  assert read and read[0].step >= stopped
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(read[0].params))
  assert lock_lib.holder(str(workdir)).pid == resumed.pid
  newest = max(harness.final_steps(ckpts))

  seg = harness.run_segment(config, workdir, "none", env=env, rng=np.random.default_rng(0),
                            log=tmp_path / "last.log", num_steps=config.train.num_steps)
  assert seg.returncode == 0, seg.output[-3000:]
  assert (f"taking over the lock of {workdir}: process {resumed.pid} on host {holder.host} "
          "(since ") in seg.output and "which held it, no longer exists" in seg.output
  assert seg.resumed_from == newest, seg.output[-3000:]
  assert not (workdir / "run.lock").exists()
  assert (workdir / "metrics.jsonl").read_text() == (reference / "metrics.jsonl").read_text()
  final = f"checkpoints/{config.train.num_steps}"
  assert harness.differences(harness.read_state(workdir / final),
                             harness.read_state(reference / final)) == []

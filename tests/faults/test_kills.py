"""SIGKILL at chosen and random moments of a real run, SIGINT, resume: nothing lost, bit for bit.

The long campaign (>= 20 kills, SIGTERM and SIGINT ten times each) is ``bench/faults.py``; this test
injects one fault of each kind that matters.
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.faults import harness


@pytest.mark.slow
def test_kills_and_sigint_then_resume_reproduce_the_uninterrupted_run(reference, xla_cache,
                                                                       tmp_path):
  config = harness.fault_config()
  workdir = tmp_path / "run"
  # While orbax writes a checkpoint asynchronously; right after a commit (in or before its seal);
  # after a random step; then a SIGINT; then the run to its end.
  faults = ["async_write", "after_commit", "random_step", "sigint"]
  segments = harness.campaign(config, workdir, faults, env=harness.environment(xla_cache), seed=1)
  logs = "\n".join(f"--- {s.fault} rc={s.returncode} resumed={s.resumed_from} "
                   f"newest {s.newest_before}->{s.newest_after} left={sorted(s.leftovers_after)}\n"
                   f"{s.output[-1500:]}" for s in segments)
  check = harness.check_campaign(segments)
  assert not check.problems, "\n".join(check.problems) + logs
  assert check.injected == {f: 1 for f in faults}, logs
  assert all(n == 0 for n in check.steps_lost.values()), logs
  # The async-write kill really left a temporary directory, and the restart removed it.
  assert any(harness.TMP_MARK in n for n in segments[0].leftovers_after), logs
  assert not harness.leftovers(workdir / "checkpoints")

  # Losses, learning rates, mixture weights, curriculum and bandit metrics of every step.
  assert (workdir / "metrics.jsonl").read_text() == (reference / "metrics.jsonl").read_text()
  # And the whole final state: parameters, AdamW moments, curriculum with its bandit statistics,
  # the cliff detector.
  steps = config.train.num_steps
  ours = harness.read_state(workdir / "checkpoints" / str(steps))
  theirs = harness.read_state(reference / "checkpoints" / str(steps))
  # the bandit's statistics (the run's mixer's state, the first of the run's mixers)
  assert any("['mixer']" in k and k.endswith("['counts']") for k in ours), sorted(ours)
  assert harness.differences(ours, theirs) == []
  assert not np.isnan(ours[next(k for k in ours if "params" in k)]).any()


def _catches(pid: int, sig: int) -> bool:
  """Whether process ``pid`` has a handler installed for ``sig`` (Linux: SigCgt in /proc)."""
  try:
    status = Path(f"/proc/{pid}/status").read_text()
  except FileNotFoundError:
    return False
  caught = int(next(l.split()[1] for l in status.splitlines() if l.startswith("SigCgt:")), 16)
  return bool(caught >> (int(sig) - 1) & 1)


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["python -m", "console script"])
def test_a_signal_during_start_up_exits_cleanly_and_leaves_the_checkpoints(entry, xla_cache,
                                                                          tmp_path):
  """While Python imports jax and the flags load the config file, the trainer's own handlers are not
  installed yet: a SIGTERM or SIGINT there must still end the process with 0 and a message, not with
  the default action's -15 (found by bench/faults.py's "SIGTERM at a random moment"). The signal is
  sent once the process has its first handler (andrea_jax.launch, milliseconds after the
  interpreter starts); before that no program can catch anything."""
  config = harness.fault_config()
  cmd = harness.command(config, tmp_path / "unused")
  if entry == "console script":
    script = Path(sys.executable).parent / "andrea-train"
    if not script.exists():
      pytest.skip("andrea-train is not installed in this environment")
    cmd = [str(script), *cmd[3:]]   # drop "python -m andrea_jax.main"
  for k, (sig, delay) in enumerate([(signal.SIGTERM, 0.0), (signal.SIGTERM, 0.2),
                                    (signal.SIGINT, 0.1)]):
    workdir = tmp_path / f"run{k}"
    run_cmd = [a if not a.startswith("--workdir=") else f"--workdir={workdir}" for a in cmd]
    proc = subprocess.Popen(run_cmd, cwd=harness.REPO, env=harness.environment(xla_cache),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while not _catches(proc.pid, signal.SIGTERM):
      assert proc.poll() is None and time.time() < deadline, "no handler installed"
      time.sleep(0.001)
    time.sleep(delay)
    proc.send_signal(sig)
    out = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode == 0, (entry, sig, delay, out[-2000:])
    assert f"signal {int(sig)} before the run started" in out, out[-2000:]
    assert harness.final_steps(workdir / "checkpoints") == []


@pytest.mark.slow
def test_a_signal_recorded_before_the_trainer_started_stops_it_at_the_first_step(data_cache,
                                                                                 tmp_path):
  """A signal the command line recorded while jax.distributed was connecting (or the trainer was
  installing its handlers) is handed over, never dropped: the run checkpoints its first step."""
  from andrea_jax import signals, train
  from tests.util import small_run_config
  before = signal.getsignal(signal.SIGTERM)
  signals.RECEIVED.append(signal.SIGTERM)   # as signals.hold() notes one
  summary = train.train_and_evaluate(small_run_config(num_steps=30), str(tmp_path))
  assert signals.RECEIVED == []             # acted on once
  assert summary["interrupted_at"] == 1
  assert harness.final_steps(tmp_path / "checkpoints") == [1]
  assert signal.getsignal(signal.SIGTERM) is before   # the handlers were put back


def _segment(fault, returncode, resumed, before, after, output=""):
  return harness.Segment(fault=fault, fired=fault != "none", returncode=returncode,
                         resumed_from=resumed, newest_before=before, newest_after=after,
                         leftovers_before=set(), leftovers_after=set(), unverified=[], seconds=1.0,
                         started_after=None, output=output)


def test_campaign_bookkeeping_skips_restarts_that_never_started():
  """A SIGINT checkpoints step 13; the next process is stopped while importing (it opens nothing);
  the one after resumes from 13: nothing lost. Resuming from 8 instead would lose 5 steps."""
  stop = "signal 2 at step 13: checkpointing and exiting"
  early = "signal 15 before the run started: nothing to save"
  segments = [_segment("sigint", 0, 8, 8, 13, stop),
              _segment("sigterm_anytime", 0, None, 13, 13, early),
              _segment("random_time", -9, None, 13, 13),
              _segment("none", 0, 13, 13, 20, "done: 20 steps")]
  check = harness.check_campaign(segments)
  assert check.problems == []
  assert check.steps_lost == {"sigint": 0, "sigterm_anytime": 0, "random_time": 0}
  assert check.lost_any == {"sigint": 0, "sigterm_anytime": 0, "random_time": 0}
  assert check.survived == {"sigint": 1, "sigterm_anytime": 1, "random_time": 1}

  segments[-1] = _segment("none", 0, 8, 13, 20, "done: 20 steps")
  check = harness.check_campaign(segments)
  assert check.steps_lost["sigint"] == 5 and check.lost_any["sigint"] == 1 and check.problems

  # A restart that loses the newest checkpoint (13 -> 11) before it is killed, silently: the final
  # run resumes from the newest one left, 11, but two committed steps are gone.
  segments = [_segment("sigint", 0, 8, 8, 13, stop),
              _segment("random_time", -9, None, 13, 11),
              _segment("none", 0, 11, 11, 20, "done: 20 steps")]
  check = harness.check_campaign(segments)
  assert check.steps_lost["sigint"] == 13 and check.problems
  # One that opened the checkpoints and trained from scratch before it was killed.
  segments[1] = _segment("random_time", -9, 0, 13, 13, "starting from step 0")
  segments[2] = _segment("none", 0, 13, 13, 20, "done: 20 steps")
  check = harness.check_campaign(segments)
  assert check.steps_lost["sigint"] == 13 and check.problems

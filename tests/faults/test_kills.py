"""SIGKILL at chosen and random moments of a real run, SIGINT, resume: nothing lost, bit for bit.

The long campaign (>= 20 kills, SIGTERM and SIGINT ten times each) is ``bench/faults.py``; this test
injects one fault of each kind that matters.
"""

import numpy as np

from faults import harness


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
  assert any("bandit" in k for k in ours), sorted(ours)
  assert harness.differences(ours, theirs) == []
  assert not np.isnan(ours[next(k for k in ours if "params" in k)]).any()


def test_a_signal_during_start_up_exits_cleanly_and_leaves_the_checkpoints(xla_cache, tmp_path):
  """While Python imports jax and the flags load the config file, the trainer's own handlers are not
  installed yet: a SIGTERM or SIGINT there must still end the process with 0 and a message, not with
  the default action's -15 (found by bench/faults.py's "SIGTERM at a random moment")."""
  import signal
  import subprocess
  import time

  config = harness.fault_config()
  for k, (sig, delay) in enumerate([(signal.SIGTERM, 0.05), (signal.SIGTERM, 0.3),
                                    (signal.SIGINT, 0.15)]):
    workdir = tmp_path / f"run{k}"
    proc = subprocess.Popen(harness.command(config, workdir), cwd=harness.REPO,
                            env=harness.environment(xla_cache), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    time.sleep(delay)
    proc.send_signal(sig)
    out = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode == 0, (sig, delay, out[-2000:])
    assert f"signal {int(sig)} before the run started" in out, out[-2000:]
    assert harness.final_steps(workdir / "checkpoints") == []


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
  assert check.survived == {"sigint": 1, "sigterm_anytime": 1, "random_time": 1}

  segments[-1] = _segment("none", 0, 8, 13, 20, "done: 20 steps")
  check = harness.check_campaign(segments)
  assert check.steps_lost["sigint"] == 5 and check.problems

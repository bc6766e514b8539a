"""Two processes on one machine over loopback (gloo CPU collectives) train like one process.

Each process has two simulated CPU devices; the mesh is ``fsdp = 4`` over the four, so every
parameter and moment is split across the two processes, each process builds only its half of the
global batch, and each writes its own shards of every checkpoint. Process 0 holds the workdir's
lock for both: a second launch of two processes on the same workdir is refused.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest

from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import distributed
from andrea_jax import logs
from tests.util import REPO, small_run_config
from tests.test_sharding import assert_same_records, reference_config, reference_records


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _flags(c) -> list[str]:
  """Command-line overrides that turn experiments/synthetic.py into the config ``c``."""
  out = []
  for section in ("model", "data", "train", "eval", "optim", "cliff", "mesh"):
    for k, v in c[section].items():
      if hasattr(v, "items"):
        continue
      if isinstance(v, (tuple, list)):
        v = "(" + ",".join(repr(x) for x in v) + ",)"
      out.append(f"--config.{section}.{k}={v}")
  for g in ("v2_firehose", "v3_polish"):
    out.append(f"--config.curriculum.geometries.{g}.start_step="
               f"{c.curriculum.geometries[g].start_step}")
  return out


def _start(c, workdir, env) -> list[subprocess.Popen]:
  port = _free_port()
  procs = []
  for pid in range(2):
    cmd = [sys.executable, "-m", "andrea_jax.main", f"--config={REPO / 'experiments' / 'synthetic.py'}",
           f"--workdir={workdir}", *_flags(c),
           f"--config.distributed.coordinator_address=127.0.0.1:{port}",
           "--config.distributed.num_processes=2", f"--config.distributed.process_id={pid}"]
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  return procs


def _finish(procs, timeout=240) -> list[str]:
  outs = []
  try:
    for p in procs:
      outs.append(p.communicate(timeout=timeout)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-4000:]
  return outs


CLUSTER_ENV = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS",
               "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


def test_maybe_initialize_validates_before_connecting(monkeypatch):
  for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", *CLUSTER_ENV):
    monkeypatch.delenv(var, raising=False)
  c = small_run_config()
  assert distributed.maybe_initialize(c) is False      # nothing set: one process, nothing to do
  c.distributed.coordinator_address = "127.0.0.1:1"
  with pytest.raises(ValueError, match="needs num_processes"):
    distributed.maybe_initialize(c)
  c.distributed.num_processes, c.distributed.process_id = 2, 2
  with pytest.raises(ValueError, match="process_id = 2 must be < num_processes = 2"):
    distributed.maybe_initialize(c)
  for ids in ("0,x", "0,-1", "1,1"):
    c.distributed.process_id, c.distributed.local_device_ids = 1, ids
    with pytest.raises(ValueError, match="distributed.local_device_ids must be distinct "
                                         "comma-separated integers >= 0"):
      distributed.maybe_initialize(c)
  # Negative counts are refused even without a coordinator (they would fall back to one process).
  for field, value in (("num_processes", -3), ("process_id", -7)):
    c = small_run_config()
    c.distributed[field] = value
    with pytest.raises(ValueError, match=rf"distributed.{field} must be >= -?\d, got {value}"):
      distributed.maybe_initialize(c)


def test_a_single_process_job_or_missing_coordinator_is_handled(monkeypatch):
  for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", *CLUSTER_ENV):
    monkeypatch.delenv(var, raising=False)
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  c = small_run_config()
  # An salloc shell or a one-task batch job: one process, no initialisation.
  monkeypatch.setenv("SLURM_JOB_ID", "123")
  monkeypatch.setenv("SLURM_NTASKS", "1")
  assert distributed.maybe_initialize(c) is False and calls == []
  # A job step of two tasks is a cluster JAX sets up.
  monkeypatch.setenv("SLURM_STEP_NODELIST", "node[1-2]")
  monkeypatch.setenv("SLURM_NTASKS", "2")
  assert distributed.maybe_initialize(c) is True and len(calls) == 1
  for var in CLUSTER_ENV:
    monkeypatch.delenv(var, raising=False)
  # Without a coordinator, two hosts would each train alone into the shared workdir.
  c.distributed.num_processes, c.distributed.process_id = 2, 1
  with pytest.raises(ValueError, match=r"distributed.num_processes = 2, distributed.process_id = "
                                       r"1 without a coordinator"):
    distributed.maybe_initialize(c)
  c.distributed.num_processes, c.distributed.process_id = 1, 0   # this one process: fine
  assert distributed.maybe_initialize(c) is False
  c.distributed.num_processes, c.distributed.process_id = 0, -1
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  with pytest.raises(ValueError, match=r"^JAX_NUM_PROCESSES = 4 without a coordinator"):
    distributed.maybe_initialize(c)
  monkeypatch.setenv("JAX_NUM_PROCESSES", "1")
  assert distributed.maybe_initialize(c) is False
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
  with pytest.raises(ValueError, match="environment variable JAX_NUM_PROCESSES = 'two' is not an "
                                       "integer"):
    distributed.maybe_initialize(c)
  # A failure inside jax.distributed.initialize names the section.
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "0")

  def fail(**kw):
    raise RuntimeError("coordinator_address should be defined.")
  monkeypatch.setattr(jax.distributed, "initialize", fail)
  with pytest.raises(ValueError, match=r"distributed: jax.distributed.initialize failed "
                                       r"\(coordinator_address should be defined.\)"):
    distributed.maybe_initialize(c)


@pytest.mark.slow
def test_two_processes_equal_one_and_resume_after_both_are_killed(tmp_path, tmp_path_factory,
                                                                  data_cache):
  c = reference_config()
  c.mesh.update(data=-1, fsdp=4, fsdp_min_size=1)
  num_steps, first = c.train.num_steps, c.train.checkpoint_every
  workdir = tmp_path / "two"
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=2",
             # The restarted processes reuse the first ones' compilations.
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"))
  procs, refused = _start(c, workdir, env), []
  seal = workdir / "checkpoints" / str(first) / ckpt_lib.SEAL
  try:
    want = reference_records(tmp_path_factory)      # one process, one device (while they compile)
    deadline = time.time() + 300
    while not seal.exists():
      for p in procs:
        assert p.poll() is None, p.stdout.read()[-4000:]
      assert time.time() < deadline
      time.sleep(0.05)
    # A second launch of the same job (its own coordinator) on the same workdir, while the first
    # is paused: process 0 is refused the lock, the other is told, neither writes anything.
    for p in procs:
      p.send_signal(signal.SIGSTOP)
    files = sorted(str(f) for f in workdir.rglob("*"))
    refused = _start(c, workdir, env)
    outs = [p.communicate(timeout=240)[0] for p in refused]
    assert [p.returncode for p in refused] == [1, 1], outs
    busy = f"the workdir {workdir} is in use by another run: process {procs[0].pid} on host "
    assert f"error: process 0 of 2: {busy}" in outs[0], outs[0][-3000:]
    assert (f"error: process 1 of 2: process 0 could not take the workdir's lock: {busy}"
            in outs[1]), outs[1][-3000:]
    assert sorted(str(f) for f in workdir.rglob("*")) == files
    for p in procs:
      p.send_signal(signal.SIGCONT)
  except BaseException:
    for p in procs + refused:
      p.kill()
    raise
  for p in procs:                                    # kill both mid-run (a preemption notice)
    p.send_signal(signal.SIGTERM)
  outs = _finish(procs)
  stops = [int(re.search(r"at step (\d+): checkpointing and exiting", o).group(1)) for o in outs]
  assert stops[0] == stops[1], outs                  # both stopped after the same step
  assert first <= stops[0] < num_steps, outs
  # Process 0 sealed the checkpoint only once both processes' shards were committed.
  sealed = json.loads(seal.read_text())["files"]
  assert any("process_1" in f for f in sealed) and any("process_0" in f for f in sealed), sealed

  assert not (workdir / "run.lock").exists()          # released by process 0 on its way out
  outs = _finish(_start(c, workdir, env))            # restart both: they resume
  assert f"resuming from step {stops[0]}" in outs[0], outs[0][-4000:]
  assert f"done: {num_steps} steps" in outs[0]
  # Equal to the single-process run to float32 rounding, not bit for bit: the batch's loss and
  # gradient are sums split over 4 devices in 2 processes and all-reduced, added in another order.
  assert_same_records(logs.read_jsonl(str(workdir / "metrics.jsonl")), want)

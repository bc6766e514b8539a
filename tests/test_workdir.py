"""The workdir lock: refused while held, taken over when its holder is gone, released at exit; and
the failed-write errors of andrea_jax.storage. (Whole runs: tests/faults/test_lock.py.)"""

import dataclasses
import errno
import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from andrea_jax import storage
from andrea_jax import lock as lock_lib


def _write_lock(workdir, **changes) -> lock_lib.Holder:
  """A lock file as another process would have left it: this process's fields, with ``changes``."""
  holder = dataclasses.replace(lock_lib.Holder.this_process(), **changes)
  (workdir / lock_lib.LOCK_FILE).write_text(json.dumps(dataclasses.asdict(holder)))
  return holder


def test_a_held_workdir_is_refused_naming_the_holder_and_released_at_exit(tmp_path):
  lines = []
  lock = lock_lib.acquire(str(tmp_path), log=lines.append)
  path = tmp_path / "run.lock"
  held = json.loads(path.read_text())
  assert held["pid"] == os.getpid() and held["token"] == lock.holder.token
  before = path.read_bytes()
  start = time.monotonic()
  with pytest.raises(lock_lib.WorkdirBusy) as e:
    lock_lib.acquire(str(tmp_path), log=lines.append)
  assert time.monotonic() - start < 1   # this machine: judged at once, no waiting
  assert (f"the workdir {tmp_path} is in use by another run: process {os.getpid()} on host "
          in str(e.value)) and str(path) in str(e.value)
  assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["run.lock"]
  assert lines == []
  assert lock_lib.holder(str(tmp_path)).token == lock.holder.token   # read-only look
  lock.release()
  assert os.listdir(tmp_path) == []
  lock_lib.acquire(str(tmp_path)).release()   # free again


def test_hold_releases_the_lock_when_the_block_raises(tmp_path):
  with pytest.raises(KeyboardInterrupt):
    with lock_lib.hold(str(tmp_path)) as lock:
      assert (tmp_path / "run.lock").exists() and lock.lost is None
      raise KeyboardInterrupt   # a second Ctrl-C
  assert not (tmp_path / "run.lock").exists()


def test_the_lock_of_a_process_that_no_longer_exists_is_taken_over_at_once(tmp_path):
  done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  dead = int(done.stdout)
  _write_lock(tmp_path, pid=dead, token="dead")
  lines = []
  lock = lock_lib.acquire(str(tmp_path), log=lines.append)
  assert lines == [f"taking over the lock of {tmp_path}: process {dead} on host "
                   f"{lock.holder.host} (since " + lines[0].split("(since ")[1]]
  assert lines[0].endswith("which held it, no longer exists")
  assert json.loads((tmp_path / "run.lock").read_text())["token"] == lock.holder.token
  assert os.listdir(tmp_path) == ["run.lock"]   # the stale file was not left aside
  lock.release()


def test_a_reused_pid_and_a_zombie_do_not_hold_a_lock(tmp_path):
  # Our own pid, but written by a process started at another time: the pid was reused.
  me = lock_lib.Holder.this_process()
  _write_lock(tmp_path, token="old", proc_start=me.proc_start - 1)
  lines = []
  lock_lib.acquire(str(tmp_path), log=lines.append).release()
  assert len(lines) == 1 and "no longer exists" in lines[0]
  # A child that exited but was not reaped yet is a zombie: its pid exists, its process does not.
  child = subprocess.Popen([sys.executable, "-c", "pass"])
  deadline = time.time() + 30
  while lock_lib._proc_stat(child.pid)[0] != "Z":
    assert time.time() < deadline
    time.sleep(0.01)
  _write_lock(tmp_path, token="zombie", pid=child.pid,
              proc_start=lock_lib._proc_stat(child.pid)[1])
  lock_lib.acquire(str(tmp_path), log=lines.append).release()
  child.wait()
  assert len(lines) == 2 and f"process {child.pid} " in lines[1]


def test_a_lock_from_another_machine_is_taken_over_once_it_stops_being_renewed(tmp_path):
  _write_lock(tmp_path, token="remote", host="gpu-7", boot_id="another-boot")
  lines = []
  start = time.monotonic()
  lock = lock_lib.acquire(str(tmp_path), lease_s=0.6, heartbeat_s=0.2, log=lines.append)
  waited = time.monotonic() - start
  assert 0.6 <= waited < 5
  assert lines[0].startswith(f"the workdir {tmp_path} is locked by process {os.getpid()} on host "
                             "gpu-7")
  assert lines[1].startswith(f"taking over the lock of {tmp_path}: process {os.getpid()} on host "
                             "gpu-7") and lines[1].endswith(
      "has not renewed it for 1 s (its machine is down or cut off)")
  lock.release()
  # An unreadable file (a holder killed between creating it and writing it) too.
  (tmp_path / "run.lock").write_text("{")
  lock_lib.acquire(str(tmp_path), lease_s=0.3, heartbeat_s=0.1, log=lines.append).release()
  assert "an unreadable lock file" in lines[-1]


def test_a_renewed_lock_from_another_machine_is_refused_within_a_heartbeat(tmp_path):
  _write_lock(tmp_path, token="remote", host="gpu-7", boot_id="another-boot")
  stop = threading.Event()

  def renew():   # the remote holder's heartbeat, every 0.2 s
    while not stop.wait(0.2):
      os.utime(tmp_path / "run.lock")

  t = threading.Thread(target=renew)
  t.start()
  try:
    start = time.monotonic()
    with pytest.raises(lock_lib.WorkdirBusy, match="on host gpu-7"):
      lock_lib.acquire(str(tmp_path), lease_s=30, heartbeat_s=0.2, log=lambda line: None)
    assert time.monotonic() - start < 2
  finally:
    stop.set()
    t.join()
  assert json.loads((tmp_path / "run.lock").read_text())["token"] == "remote"


def test_of_many_processes_racing_for_one_stale_lock_exactly_one_wins(tmp_path):
  outcomes = []
  for trial in range(5):
    _write_lock(tmp_path, token=f"stale{trial}", pid=2**22 + 1)   # beyond Linux's pid_max
    barrier = threading.Barrier(6)
    got = []

    def contend(barrier=barrier, got=got):
      barrier.wait()
      try:
        got.append(lock_lib.acquire(str(tmp_path), log=lambda line: None))
      except lock_lib.WorkdirBusy:
        got.append(None)

    threads = [threading.Thread(target=contend) for _ in range(6)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    winners = [lock for lock in got if lock is not None]
    outcomes.append(len(winners))
    token = json.loads((tmp_path / "run.lock").read_text())["token"]
    assert [w.holder.token for w in winners] == [token]
    winners[0].release()
    assert os.listdir(tmp_path) == []
  assert outcomes == [1] * 5


def test_a_takeover_killed_halfway_does_not_block_the_next_one(tmp_path, monkeypatch):
  # A process killed between claiming a takeover and finishing it left its marker (and the stale
  # file it had moved aside): the next run waits out _TAKEOVER_S, then takes the lock, and removes
  # what is older than that.
  monkeypatch.setattr(lock_lib, "_TAKEOVER_S", 0.3)
  seen = _write_lock(tmp_path, token="stale", pid=2**22 + 1)
  raw = (tmp_path / "run.lock").read_bytes()
  marker = tmp_path / f"run.lock.{hashlib.sha256(raw).hexdigest()[:16]}.takeover"
  marker.touch()
  aside = tmp_path / "run.lock.0123.stale"
  aside.write_text("{}")
  old = time.time() - 10
  os.utime(aside, (old, old))
  lines = []
  lock = lock_lib.acquire(str(tmp_path), log=lines.append)
  assert lines == [f"taking over the lock of {tmp_path}: {seen.describe()}, which held it, no "
                   "longer exists"]
  assert sorted(os.listdir(tmp_path)) == ["run.lock"]
  lock.release()


def test_preparing_data_waits_its_turn_and_says_so(tmp_path, capsys):
  import fcntl
  from andrea_jax.data import SourceSpec, load_tokenizer, prepare
  (tmp_path / "chat.jsonl").write_text('{"text": "hello there"}\n' * 4)
  spec = {"chat": SourceSpec(paths=(str(tmp_path / "chat.jsonl"),), format="jsonl",
                             text_field="text")}
  out = tmp_path / "out"
  out.mkdir()
  done = []
  with open(out / ".lock", "a") as held:   # another process preparing the same directory
    fcntl.flock(held, fcntl.LOCK_EX)
    t = threading.Thread(target=lambda: done.append(
        prepare(spec, load_tokenizer("bytes"), str(out), progress=False)))
    t.start()
    deadline = time.time() + 30
    while "waiting for another process preparing" not in capsys.readouterr().err:
      assert time.time() < deadline and not done
      time.sleep(0.02)
    assert not done
    fcntl.flock(held, fcntl.LOCK_UN)
  t.join()
  assert done[0].prepared == ("chat",)


def test_the_heartbeat_renews_the_lock_and_notices_when_it_is_taken(tmp_path):
  lock = lock_lib.acquire(str(tmp_path), heartbeat_s=0.05)
  path = tmp_path / "run.lock"
  first = path.stat().st_mtime_ns
  os.utime(path, ns=(first - 10**9, first - 10**9))   # a second older
  deadline = time.time() + 10
  while path.stat().st_mtime_ns < first:
    assert time.time() < deadline
    time.sleep(0.02)
  lock.raise_if_lost()
  _write_lock(tmp_path, token="other", pid=12345, host="gpu-7")   # another run took it over
  while lock.lost is None:
    assert time.time() < deadline
    time.sleep(0.02)
  with pytest.raises(lock_lib.WorkdirLost, match=r"no longer holds the lock .*process 12345 "
                                                    r"on host gpu-7"):
    lock.raise_if_lost()
  lock.release()
  assert json.loads(path.read_text())["token"] == "other"   # not ours to remove


def test_an_unwritable_workdir_is_a_write_error_naming_the_lock(tmp_path, monkeypatch):
  real_open = os.open

  def read_only(path, *args, **kwargs):
    if str(path).endswith("run.lock"):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    return real_open(path, *args, **kwargs)

  monkeypatch.setattr(os, "open", read_only)
  with pytest.raises(storage.WriteError) as e:
    lock_lib.acquire(str(tmp_path))
  assert str(e.value) == (f"cannot write {tmp_path / 'run.lock'}: Read-only file system (EROFS). "
                          f"Nothing was written in {tmp_path}: give a --workdir this user can "
                          "write to, on a disk with free space")
  assert e.value.errno == errno.EROFS
  assert os.listdir(tmp_path) == []


# --- storage -----------------------------------------------------------------------------------

# What tensorstore raised when orbax wrote a checkpoint's arrays to a full tmpfs (300 KiB).
TENSORSTORE_ENOSPC = (
    'RESOURCE_EXHAUSTED: Error writing "w/0" in OCDBT database at local file "/mnt/small/'
    'checkpoints/3.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/": Failed '
    'writing: "/mnt/small/checkpoints/3.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/'
    'ocdbt.process_0/d/aa7aef5c55103420ef7cb2b343aff2a5": Failed to write 43133 bytes to file 4: '
    "No space left on device [os_error_code='28']")


def test_failed_writes_are_recognised_in_both_forms_and_through_the_chain():
  assert storage.failed_write(ValueError(TENSORSTORE_ENOSPC)) == (
      28, ("/mnt/small/checkpoints/3.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/"
           "ocdbt.process_0/d/aa7aef5c55103420ef7cb2b343aff2a5"))
  assert storage.failed_write(OSError(errno.EDQUOT, "Disk quota exceeded")) == (errno.EDQUOT, None)
  assert storage.failed_write(OSError(errno.EIO, "I/O error")) is None      # not room/permission
  assert storage.failed_write(ValueError("os_error_code='5'")) is None
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device", "/r/x")
    except OSError as inner:
      raise RuntimeError("wrapped") from inner
  except RuntimeError as outer:
    assert storage.failed_write(outer) == (errno.ENOSPC, "/r/x")
  err = storage.write_error(ValueError(TENSORSTORE_ENOSPC), "/mnt/small/checkpoints/3", "Then.")
  assert str(err) == ("cannot write /mnt/small/checkpoints/3: No space left on device (ENOSPC, "
                      "writing /mnt/small/checkpoints/3.orbax-checkpoint-tmp/state.orbax-"
                      "checkpoint-tmp/ocdbt.process_0/d/aa7aef5c55103420ef7cb2b343aff2a5). Then.")
  assert isinstance(err, OSError) and err.errno == 28


def test_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
  path = tmp_path / "manifest.json"
  path.write_text("old")
  real_fsync = os.fsync

  def full(fd):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(storage.WriteError, match=rf"^cannot write {path}: No space left on device "
                                               r"\(ENOSPC\)\. it is as it was$"):
    storage.atomic_write(str(path), b"new", "it is as it was")
  monkeypatch.setattr(os, "fsync", real_fsync)
  assert path.read_text() == "old" and os.listdir(tmp_path) == ["manifest.json"]
  # Not a failed write: raised as it is, and the consequence is not even computed.
  with pytest.raises(ZeroDivisionError):
    with storage.writing(str(path), lambda: 1 / 0):
      raise ZeroDivisionError


def test_a_stale_lock_removed_between_the_look_and_the_rename_is_looked_at_again(tmp_path,
                                                                                 monkeypatch):
  """Its holder (or another taker) removes the stale lock just after this process judged it: the
  rename finds nothing, and the process looks again and takes the free workdir."""
  done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  _write_lock(tmp_path, pid=int(done.stdout), token="dead")
  real_rename = os.rename
  calls = []

  def removed_first(src, dst):
    calls.append(src)
    if len(calls) == 1:
      os.remove(src)          # gone between the look and the rename
    return real_rename(src, dst)

  monkeypatch.setattr(lock_lib.os, "rename", removed_first)
  lock = lock_lib.acquire(str(tmp_path), log=lambda line: None)
  assert calls == [str(tmp_path / "run.lock")]
  assert json.loads((tmp_path / "run.lock").read_text())["token"] == lock.holder.token
  lock.release()


@pytest.mark.parametrize("index", [0, 1])
def test_an_unexpected_error_of_process_0_reaches_the_other_processes(tmp_path, monkeypatch,
                                                                       index):
  """Two processes: process 0 fails to take the lock for a reason nobody planned for (a
  PermissionError reading it, say). It raises that error; the other learns of it from the
  broadcast, instead of waiting, and stops with WorkdirBusy naming it."""
  from jax.experimental import multihost_utils
  sent = []

  def broadcast(x):   # process 0's array reaches everybody
    if not sent:
      sent.append(x)
    return sent[0]

  def fail(*args, **kwargs):
    raise PermissionError(13, "Permission denied", str(tmp_path / "run.lock"))

  monkeypatch.setattr(lock_lib.jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", broadcast)
  monkeypatch.setattr(lock_lib, "acquire", fail)
  if index == 1:   # what process 0 broadcast, as process 1 receives it
    monkeypatch.setattr(lock_lib.jax, "process_index", lambda: 0)
    with pytest.raises(PermissionError):
      with lock_lib.hold(str(tmp_path)):
        pass
    monkeypatch.setattr(lock_lib.jax, "process_index", lambda: 1)
    with pytest.raises(lock_lib.WorkdirBusy, match=r"process 0 could not take the workdir's "
                                                      r"lock: PermissionError: .*Permission denied"):
      with lock_lib.hold(str(tmp_path)):
        pass
  else:
    monkeypatch.setattr(lock_lib.jax, "process_index", lambda: 0)
    with pytest.raises(PermissionError, match="Permission denied"):
      with lock_lib.hold(str(tmp_path)):
        pass
    assert len(sent) == 1 and bytes(sent[0]).rstrip(b"\0").startswith(b"PermissionError")

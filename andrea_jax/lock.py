"""One run per workdir: ``<workdir>/run.lock``, taken before anything is written, held to the end.

A second training run started on a workdir that a run holds is refused at once, before it writes
anything, with :class:`WorkdirBusy` naming the workdir and the process that holds it; the command
line prints it as one ``error:`` line. Only training takes the lock: the read-only commands (terrain
diagnostics, ``load_checkpoint`` for sampling, the plots) never look at it and work while a run
trains.

**The lock file** is JSON naming its holder: a random token, host name, pid, the kernel's boot id
and pid namespace, the process's start time, when it was taken and the command line. It is created
with ``O_CREAT | O_EXCL``, which is atomic on local disks and on NFSv3+, Lustre and GPFS alike.

**Released** when :func:`hold`'s block exits: at the run's end, on an exception, and after SIGTERM,
SIGINT or a preemption notice (the trainer checkpoints at a step boundary and returns). A process
that cannot run its exit (SIGKILL, the OOM killer, a crashed host) leaves the file, and the next run
judges whether its holder still exists:

* **Held on this machine** (same boot id and pid namespace): the holder is gone when its pid no
  longer exists, is a zombie, or now belongs to a process started at another time (a reused pid).
  Such a lock is taken over at once.
* **Held elsewhere** (another host, or another container of this one): the holder renews the file's
  modification time every :data:`HEARTBEAT_S` seconds from a thread. A lock whose time does not
  move for :data:`LEASE_S` seconds (measured by the waiting process's own clock, comparing the
  file's times only with each other, so the hosts' clocks need not agree) belongs to a host that is
  down or cut off, and is taken over; one that moves is refused within a heartbeat.

A takeover prints one line (``taking over the lock of <workdir>: ...``). Processes that find the
same stale lock at once race for an exclusive marker file; the winner checks that the lock is still
the one it judged and removes it, the others look again, and all then race to create the lock
anew, which exactly one wins. A holder that finds its file replaced (its heartbeat stalled past the
lease, and another run took over) stops at its next step without writing more.

Why not ``flock``/``fcntl`` locks: the kernel drops them when their process dies, but on network
file systems they depend on a lock service (NFSv3's lockd keeps a crashed client's locks until that
host comes back), Lustre mounted with ``localflock`` locks per node only, and several FUSE file
systems ignore them: two hosts would then both hold one. Exclusive create and rename keep their
meaning on all of these.

**Several processes** (one per host) form one run: process 0 takes the lock and tells the others
the outcome (:func:`hold` broadcasts it), so the processes of a second run are all refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import jax
import numpy as np

from andrea_jax import storage

LOCK_FILE = "run.lock"
HEARTBEAT_S = 5.0    # how often a holder renews its lock
LEASE_S = 60.0       # a lock held on another machine and not renewed for this long is stale
_ATTEMPTS = 5        # takeovers raced by other processes before giving up
_TAKEOVER_S = 10.0   # a takeover takes milliseconds: a marker older than this was left by a kill
_MESSAGE_BYTES = 4096


class WorkdirBusy(RuntimeError):
  """Another run holds the workdir (or took it from this one)."""


class WorkdirLost(WorkdirBusy):
  """Another run took the workdir over while this one trained (its heartbeat stalled)."""


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a lock: what the lock file says."""
  token: str
  host: str
  pid: int
  boot_id: str | None
  pid_ns: str | None
  proc_start: int | None    # the process's start time in clock ticks since boot (Linux)
  taken: float              # time.time() when the lock was taken
  command: str

  @classmethod
  def this_process(cls) -> Holder:
    pid = os.getpid()
    stat = _proc_stat(pid)
    return cls(token=uuid.uuid4().hex, host=socket.gethostname(), pid=pid, boot_id=_boot_id(),
               pid_ns=_pid_ns(), proc_start=stat[1] if stat else None, taken=time.time(),
               command=" ".join(sys.argv)[:200])

  def describe(self) -> str:
    """``process 4242 on host gpu-3 (since 2025-01-31 12:00:05: python -m andrea_jax.main ...)``"""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.taken))
    return (f"process {self.pid} on host {self.host} (since {since}"
            + (f": {self.command}" if self.command else "") + ")")

  def on_this_machine(self) -> bool:
    """Whether its pid means a process of this machine, as ours do (same kernel boot and pid
    namespace; a host name alone could be shared by containers or reused after a reboot)."""
    return (self.host == socket.gethostname() and self.boot_id == _boot_id()
            and self.pid_ns == _pid_ns() and os.name != "nt")

  def alive(self) -> bool:
    """Whether its process still runs (on this machine: :meth:`on_this_machine`)."""
    stat = _proc_stat(self.pid)
    if stat is None:
      # No /proc (macOS), or not readable (another user's process under hidepid): whether the
      # pid exists, which signal 0 tells without sending anything.
      try:
        os.kill(self.pid, 0)
      except ProcessLookupError:
        return False
      except PermissionError:
        return True
      return True
    state, start = stat
    return state not in ("Z", "X") and (self.proc_start is None or start == self.proc_start)


def _read_text(path: str) -> str | None:
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return None


def _boot_id() -> str | None:
  return _read_text("/proc/sys/kernel/random/boot_id")


def _pid_ns() -> str | None:
  try:
    return os.readlink("/proc/self/ns/pid")
  except OSError:
    return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
  """``(state, start time in ticks since boot)`` of ``pid`` from ``/proc``; ``None`` when it
  cannot be read there (no such process, no ``/proc``, or hidden from this user)."""
  text = _read_text(f"/proc/{pid}/stat")
  if not text:
    return None
  fields = text[text.rindex(")") + 2:].split()   # the command name may hold spaces and parentheses
  return fields[0], int(fields[19])


def _parse(raw: bytes) -> Holder | None:
  try:
    d = json.loads(raw)
    return Holder(**{f.name: d[f.name] for f in dataclasses.fields(Holder)})
  except (ValueError, TypeError, KeyError):
    return None


@dataclasses.dataclass(frozen=True)
class _Seen:
  raw: bytes
  mtime_ns: int


def _look(path: str) -> _Seen | None:
  """The lock file's bytes and modification time (``None``: no lock). Opened, not stat'ed: on NFS
  an open revalidates the cached attributes (close-to-open consistency), a stat may not."""
  try:
    with open(path, "rb") as f:
      return _Seen(f.read(), os.fstat(f.fileno()).st_mtime_ns)
  except FileNotFoundError:
    return None


def _create(path: str, holder: Holder) -> bool:
  """Creates the lock file naming ``holder``; ``False`` if one exists."""
  workdir = os.path.dirname(path)
  advice = (f"Nothing was written in {workdir}: give a --workdir this user can write to, on a "
            "disk with free space")
  with storage.writing(path, advice):
    try:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return False
  with storage.writing(path, advice, cleanup=lambda: os.remove(path)):
    try:
      os.write(fd, json.dumps(dataclasses.asdict(holder), sort_keys=True).encode() + b"\n")
      os.fsync(fd)
    finally:
      os.close(fd)
  return True


def _busy(workdir: str, path: str, holder: Holder | None) -> WorkdirBusy:
  who = holder.describe() if holder else "another process"
  return WorkdirBusy(
      f"the workdir {workdir} is in use by another run: {who} holds {path}. Two runs in one "
      "workdir would overwrite each other's checkpoints and logs: wait for it to finish, stop it "
      "(Ctrl-C or SIGTERM: it checkpoints and exits), or give another --workdir")


def _stale(path: str, seen: _Seen, lease_s: float, heartbeat_s: float,
           log: Callable[[str], None]) -> str | None:
  """Why the lock ``seen`` is stale; ``None`` when it changed hands meanwhile (look again).
  Raises :class:`WorkdirBusy` when its holder runs."""
  workdir = os.path.dirname(path)
  holder = _parse(seen.raw)
  for _ in range(20):   # a process between its exclusive create and its write
    if holder is not None:
      break
    time.sleep(0.05)
    seen = _look(path)
    if seen is None:
      return None
    holder = _parse(seen.raw)
  if holder is not None and holder.on_this_machine():
    if holder.alive():
      raise _busy(workdir, path, holder)
    return f"{holder.describe()}, which held it, no longer exists"
  who = holder.describe() if holder else f"an unreadable lock file {path}"
  log(f"the workdir {workdir} is locked by {who}, on another machine: waiting up to "
      f"{lease_s:.0f} s for it to renew the lock, as a running holder does every "
      f"{heartbeat_s:.0f} s")
  deadline = time.monotonic() + lease_s
  while time.monotonic() < deadline:
    time.sleep(min(heartbeat_s / 4, max(deadline - time.monotonic(), 0)))
    now = _look(path)
    if now is None or now.raw != seen.raw:
      return None
    if now.mtime_ns != seen.mtime_ns:
      raise _busy(workdir, path, holder)
  return f"{who} has not renewed it for {lease_s:.0f} s (its machine is down or cut off)"


def _take_over(path: str, seen: _Seen, why: str, log: Callable[[str], None]) -> None:
  """Removes the stale lock ``seen`` (unless it changed meanwhile), one process at a time: the
  processes that found it stale race for an exclusive marker, and the others look again once it
  is gone (by then the winner has taken the workdir, or it is free)."""
  marker = f"{path}.{hashlib.sha256(seen.raw).hexdigest()[:16]}.takeover"
  if not _claim(marker):
    return
  try:
    now = _look(path)
    if now is None or now.raw != seen.raw:
      return   # released, or taken over already
    aside = f"{path}.{uuid.uuid4().hex}.stale"
    try:
      with storage.writing(path, "Nothing was written"):
        os.rename(path, aside)
    except FileNotFoundError:
      return   # released between the look and the rename: the caller looks again
    try:
      with open(aside, "rb") as f:
        moved = f.read()
    except OSError:
      moved = None
    if moved == seen.raw:
      log(f"taking over the lock of {os.path.dirname(path)}: {why}")
    else:   # its holder, alive after all, released it and a new run took the workdir: put it back
      with contextlib.suppress(OSError):
        os.link(aside, path)
    storage.remove_quietly(aside)
  finally:
    storage.remove_quietly(marker)


def _claim(marker: str) -> bool:
  """Creates ``marker`` exclusively; ``False`` (after waiting for it to go) if another process
  holds it. One left by a process killed while taking over is removed after
  :data:`_TAKEOVER_S` seconds."""
  with storage.writing(marker, "Nothing was written"):
    try:
      os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
      return True
    except FileExistsError:
      pass
  deadline = time.monotonic() + _TAKEOVER_S
  while os.path.exists(marker):
    if time.monotonic() > deadline:
      storage.remove_quietly(marker)
      break
    time.sleep(0.01)
  return False


def _remove_leftovers(path: str) -> None:
  """Removes the takeover markers and stale files that a process killed in the middle of a
  takeover left (older than :data:`_TAKEOVER_S`: no takeover is still using them)."""
  workdir, name = os.path.split(path)
  for leftover in os.listdir(workdir):
    if leftover.startswith(name + ".") and leftover.endswith((".takeover", ".stale")):
      with contextlib.suppress(OSError):
        if time.time() - os.stat(os.path.join(workdir, leftover)).st_mtime > _TAKEOVER_S:
          os.remove(os.path.join(workdir, leftover))


class WorkdirLock:
  """A lock this process holds; a thread renews it every ``heartbeat_s`` seconds and records in
  :attr:`lost` why it no longer names this run, if it ever does not."""

  def __init__(self, path: str, holder: Holder, heartbeat_s: float = HEARTBEAT_S):
    self.path, self.holder = path, holder
    self.lost: str | None = None
    self._heartbeat_s = heartbeat_s
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._beat, name="workdir-lock", daemon=True)
    self._thread.start()

  def _lost_because(self) -> str | None:
    try:
      seen = _look(self.path)
    except OSError:
      return None   # unreadable for now (a network hiccup): judged at the next beat
    if seen is None:
      return f"{self.path} was removed"
    holder = _parse(seen.raw)
    if holder is None or holder.token != self.holder.token:
      return f"{self.path} now names {holder.describe() if holder else 'something else'}"
    return None

  def _beat(self) -> None:
    while not self._stop.wait(self._heartbeat_s):
      self.lost = self._lost_because()
      if self.lost:
        return
      with contextlib.suppress(OSError):
        os.utime(self.path)

  def raise_if_lost(self) -> None:
    """:class:`WorkdirBusy` when another run took the lock over (this run must stop writing)."""
    if self.lost:
      raise WorkdirLost(f"this run no longer holds the lock of {os.path.dirname(self.path)} "
                        f"({self.lost}; its heartbeat stalled for over {LEASE_S:.0f} s and "
                        "another run took it over): stopping without writing more")

  def release(self) -> None:
    """Stops the heartbeat and removes the lock file if it still names this run."""
    self._stop.set()
    self._thread.join()
    if self._lost_because() is None:
      storage.remove_quietly(self.path)


class _Joined:
  """What processes other than 0 hold: process 0's lock, by agreement."""
  lost = None

  def raise_if_lost(self) -> None:
    pass


def _stderr(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def acquire(workdir: str, *, lease_s: float = LEASE_S, heartbeat_s: float = HEARTBEAT_S,
            log: Callable[[str], None] = _stderr) -> WorkdirLock:
  """Takes ``<workdir>/run.lock`` for this process (see the module docstring); ``workdir`` must
  exist. Raises :class:`WorkdirBusy` naming the holder when a run holds it, and
  :class:`andrea_jax.storage.WriteError` when the workdir cannot be written.

  Example:
    >>> lock = acquire("runs/tiny")
    >>> acquire("runs/tiny")
    WorkdirBusy: the workdir runs/tiny is in use by another run: process 4242 on host ...
    >>> lock.release()
  """
  path = os.path.join(workdir, LOCK_FILE)
  holder = Holder.this_process()
  for _ in range(_ATTEMPTS):
    if _create(path, holder):
      _remove_leftovers(path)
      return WorkdirLock(path, holder, heartbeat_s)
    seen = _look(path)
    if seen is None:
      continue   # released meanwhile
    why = _stale(path, seen, lease_s, heartbeat_s, log)
    if why is not None:
      _take_over(path, seen, why, log)
  raise WorkdirBusy(f"could not take {path}: {_ATTEMPTS} attempts were each overtaken by another "
                    "process starting a run in the same workdir")


def holder(workdir: str) -> Holder | None:
  """Who holds ``workdir``'s lock (``None``: nobody, or an unreadable file); reads only."""
  seen = _look(os.path.join(workdir, LOCK_FILE))
  return None if seen is None else _parse(seen.raw)


def _agree(error: Exception | None) -> None:
  """Process 0's outcome, broadcast: on the other processes, :class:`WorkdirBusy` if it failed."""
  from jax.experimental import multihost_utils
  text = np.zeros(_MESSAGE_BYTES, np.uint8)
  if error is not None:
    text_of = str(error) if isinstance(error, (WorkdirBusy, storage.WriteError)) else (
        f"{type(error).__name__}: {error}")
    message = text_of.encode()[:_MESSAGE_BYTES - 1] or b"?"
    text[:len(message)] = np.frombuffer(message, np.uint8)
  got = np.asarray(multihost_utils.broadcast_one_to_all(text))
  message = bytes(got).rstrip(b"\0").decode(errors="replace")
  if message and jax.process_index() != 0:   # process 0 raises its own error
    raise WorkdirBusy(f"process 0 could not take the workdir's lock: {message}")


@contextlib.contextmanager
def hold(workdir: str, **kwargs) -> Iterator[WorkdirLock | _Joined]:
  """The run's lock for the block: taken by process 0 (:func:`acquire`, with ``kwargs``), its
  outcome shared by every process, released at the block's exit however it ends.

  Example:
    >>> with hold("runs/tiny") as lock:
    ...   for t in range(steps):
    ...     lock.raise_if_lost()
    ...     train_step(t)
  """
  lock, error = None, None
  if jax.process_index() == 0:
    try:
      lock = acquire(workdir, **kwargs)
    except BaseException as e:   # any failure, unexpected ones too, must reach the others
      error = e
  try:
    if jax.process_count() > 1:
      _agree(error)
  except BaseException:
    if lock is not None:
      lock.release()
    raise
  if error is not None:
    raise error
  try:
    yield lock if lock is not None else _Joined()
  finally:
    if lock is not None:
      lock.release()

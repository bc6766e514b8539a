"""A full disk, simulated: one write of a real run fails with ``ENOSPC`` at a chosen site.

:func:`inject` patches one write path so that the write it names fails the way a full disk makes
it fail, after part of the bytes went out (no disk is filled). The sites:

* ``checkpoint@S``: orbax's array write of the checkpoint at step S, in its background commit;
  raised as tensorstore reports it (a ``ValueError`` ending ``[os_error_code='28']``), after the
  data was written;
* ``commit@S``: orbax's commit marker of the checkpoint at step S (an ``OSError``): every array
  written, the step not yet renamed into place;
* ``seal@S``: the checksum seal of checkpoint S, half written (the checkpoint itself committed);
* ``log@S``: the ``metrics.jsonl`` record of step S, half a line written;
* ``shard@SOURCE``: the first shard of SOURCE while data is prepared, half a block written;
* ``manifest@K``: the K-th write of a ``manifest.json`` while data is prepared.

``python -m faults.enospc <the trainer's flags>`` (``tests/`` on the path) is the training command
with the fault named by ``$ANDREA_FAULTS_ENOSPC`` (``site@at``); everything else is the real
command.
"""

import errno
import os
import re

from andrea_jax import signals

if __name__ == "__main__":
  signals.hold()   # as the real command does, before the heavy imports

SITES = ("checkpoint", "commit", "seal", "log", "shard", "manifest")


def _enospc(path: str | None = None) -> OSError:
  return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([path] if path else []))


class _FullDisk:
  """A file opened for writing whose ``write`` fails once ``full(data)`` says so, after writing
  the first half of ``data`` (a ``write()`` that fails names no file, as the system call's)."""

  def __init__(self, f, full):
    self._f, self._full = f, full

  def write(self, data):
    if self._full(data):
      self._f.write(data[:len(data) // 2])
      self._f.flush()
      raise _enospc()
    return self._f.write(data)

  def __getattr__(self, name):
    return getattr(self._f, name)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._f.close()


def _patch_open(module, fails):
  """``module``'s own ``open``: files for writing at paths ``fails(path)`` accepts are
  :class:`_FullDisk` files whose writes fail as ``fails(path)(data)`` says."""
  def fake_open(path, mode="r", *args, **kwargs):
    f = open(path, mode, *args, **kwargs)
    full = fails(os.fspath(path)) if any(c in mode for c in "wax") else None
    return f if full is None else _FullDisk(f, full)
  module.open = fake_open
  return lambda: delattr(module, "open")


def inject(site: str, at: str):
  """Patches the write path of ``site`` (see the module docstring) to fail at ``at``; returns the
  function that undoes it."""
  if site not in SITES:
    raise ValueError(f"unknown ENOSPC site {site!r}; one of {SITES}")
  if site == "checkpoint":
    from orbax.checkpoint._src.serialization import serialization
    write = serialization.async_serialize_from_host

    async def failing_write(*args, **kwargs):
      await write(*args, **kwargs)
      spec = str(kwargs.get("tensorstore_spec", args[1] if len(args) > 1 else ""))
      tmp = re.search(rf"'(/[^']*/{at}\.orbax-checkpoint-tmp/[^']*)'", spec)
      if tmp:
        raise ValueError(
            f'RESOURCE_EXHAUSTED: Error writing "w/0" in OCDBT database at local file '
            f'"{tmp.group(1)}": Failed writing: "{tmp.group(1)}d/5f0e4b2a": Failed to write '
            f"4096 bytes to file 7: No space left on device [os_error_code='28']")

    serialization.async_serialize_from_host = failing_write
    return lambda: setattr(serialization, "async_serialize_from_host", write)
  if site == "commit":
    from orbax.checkpoint._src.path import async_path
    write_text = async_path.write_text

    async def failing_write_text(path, text):
      if path.name == "commit_success.txt" and f"/{at}.orbax-checkpoint-tmp" in str(path):
        raise _enospc(str(path))
      return await write_text(path, text)

    async_path.write_text = failing_write_text
    return lambda: setattr(async_path, "write_text", write_text)
  if site == "seal":
    from andrea_jax import checkpoint
    seal = f"{os.sep}{at}{os.sep}andrea_checksums.json.tmp"
    return _patch_open(checkpoint, lambda p: (lambda data: True) if p.endswith(seal) else None)
  if site == "log":
    from andrea_jax import logs
    record = re.compile(rf'"step": {int(at)}[,}}]')
    return _patch_open(logs, lambda p: (lambda data: bool(record.search(data)))
                       if p.endswith("metrics.jsonl") else None)
  if site == "shard":
    from andrea_jax.data import manifest
    return _patch_open(manifest, lambda p: (lambda data: True)
                       if os.path.basename(p).startswith(f".{at}.train.00000.bin") else None)
  from andrea_jax import storage
  count = [0]

  def manifest_write(path):
    if not os.path.basename(path).startswith("manifest.json.tmp"):
      return None
    count[0] += 1
    return (lambda data: True) if count[0] == int(at) else None

  return _patch_open(storage, manifest_write)


# --- a campaign: one run, ended by a full disk at each site in turn, then run to its end ------


def prepared_dirs(cache_dir: str) -> list[str]:
  """The prepared directories of the built-in corpora under ``cache_dir``."""
  import glob
  return sorted(glob.glob(os.path.join(cache_dir, "builtin", "*", "prepared-*")))


def campaign(config, workdir, faults: list[str], *, env: dict[str, str],
             progress=None) -> tuple[list[str], list]:
  """Run the job in ``workdir`` as one segment per fault (``site@at``), each the training command
  with that fault (this module), then one to the end (the real command).

  A step written ``+n`` counts from the newest complete checkpoint when the segment starts
  (``checkpoint@+4``: the second checkpoint it saves, with one every 2 steps). Before each data
  fault (``shard``, ``manifest``) the prepared data under ``config.data.cache_dir`` is removed, so
  that the run prepares it again. ``progress(k, fault, segment)`` after each segment. Returns the
  faults with their steps resolved and the :class:`tests.faults.harness.Segment` of each, the last
  one the run to the end.
  """
  import shutil

  import numpy as np

  from tests.faults import harness
  resolved, segments = [], []
  for k, fault in enumerate(list(faults) + ["none"]):
    site, _, at = fault.partition("@")
    if at.startswith("+"):
      at = str(max(harness.final_steps(workdir / "checkpoints"), default=0) + int(at))
      fault = f"{site}@{at}"
    if site in ("shard", "manifest"):
      for d in prepared_dirs(config.data.cache_dir):
        shutil.rmtree(d)
    faulty = fault != "none"
    segments.append(harness.run_segment(
        config, workdir, "none", env=dict(env, ANDREA_FAULTS_ENOSPC=fault) if faulty else env,
        rng=np.random.default_rng(k), num_steps=config.train.num_steps,
        log=workdir.parent / f"{workdir.name}.enospc{k:02d}.log",
        module="faults.enospc" if faulty else "andrea_jax.main"))
    if faulty:
      resolved.append(fault)
    if progress is not None:
      progress(k, fault, segments[-1])
  return resolved, segments


def failed_path(fault: str, workdir, cache_dir: str) -> str:
  """A pattern of the file (or checkpoint) the error of ``fault`` must name."""
  site, at = fault.split("@")
  if site in ("checkpoint", "commit", "seal"):
    return re.escape(f"{workdir}/checkpoints/{at}")
  if site == "log":
    return re.escape(f"{workdir}/metrics.jsonl")
  prepared = prepared_dirs(cache_dir)[0]
  if site == "shard":   # written in the staging folder beside the prepared one (data.commit)
    parent, name = os.path.split(prepared)
    return re.escape(f"{parent}/.{name}.staging-") + r"\d+" + re.escape(f"/{at}.train.00000.bin")
  return re.escape(f"{prepared}/manifest.json")


def _data_problem(cache_dir: str) -> str | None:
  """What in the prepared data would be taken for good and is not: a listed shard missing or not
  matching its SHA-256, a temporary file left."""
  from andrea_jax.data import hashing
  from andrea_jax.data import manifest as mf
  for prepared in prepared_dirs(cache_dir):
    if os.path.exists(os.path.join(prepared, mf.MANIFEST)):
      for name, entry in mf.read_manifest(prepared)["sources"].items():
        for split in mf.SPLITS:
          for shard in entry["shards"][split]:
            path = os.path.join(prepared, shard["file"])
            if not os.path.isfile(path) or hashing.sha256_file(path) != shard["sha256"]:
              return f"{path} is listed for {name} but is not what was written"
    tmp = [n for n in os.listdir(prepared) if ".tmp" in n]
    if tmp:
      return f"temporary files left in {prepared}: {tmp}"
  return None


def check(segments, faults: list[str], workdir, cache_dir: str) -> list[dict]:
  """Per fault: ``named`` (the command ended with exit 1 and one ``error:`` line naming the file),
  ``lost`` (what it lost, ``[]`` for nothing: a complete checkpoint that fails verification, the
  failed checkpoint renamed into place, half-written data taken for good, a next run that did not
  resume from the newest complete checkpoint) and ``steps_lost`` (committed steps that run did not
  resume from)."""
  from tests.faults import harness
  out = []
  for k, (fault, seg) in enumerate(zip(faults, segments)):
    site, at = fault.split("@")
    lost = []
    want = f"error: cannot write {failed_path(fault, workdir, cache_dir)}: No space left on device"
    named = (seg.returncode == 1 and seg.output.count("error: ") == 1
             and re.search(want, seg.output) is not None)
    if seg.unverified:
      lost.append(f"complete checkpoints fail verification: {seg.unverified}")
    if site in ("checkpoint", "commit") and int(at) in harness.final_steps(workdir / "checkpoints"):
      lost.append(f"checkpoint {at} was renamed into place")
    problem = _data_problem(cache_dir)
    if problem:
      lost.append(problem)
    nxt = next((s for s in segments[k + 1:] if s.resumed_from is not None), None)
    steps = seg.newest_after - (nxt.resumed_from if nxt is not None else 0)
    if steps:
      lost.append(f"the next run resumed from {nxt and nxt.resumed_from}, not from the newest "
                  f"complete checkpoint {seg.newest_after}")
    out.append({"fault": fault, "site": site, "named": named, "lost": lost, "steps_lost": steps,
                "output": seg.output[-2000:]})
  return out


if __name__ == "__main__":
  inject(*os.environ["ANDREA_FAULTS_ENOSPC"].split("@"))
  from andrea_jax import main
  main.run()

"""Fault campaign: kills and signals on a real run, two runs in one workdir, full disks, damaged and
untrusted checkpoints, hostile configs, hostile data and extreme numbers. Prints one table.

  python -m bench.faults            # 24 SIGKILLs, 10 SIGTERM, 10 SIGINT, 6 double launches, 18 full
                                    # disks, 2000 configs...
  python -m bench.faults --quick    # 8 SIGKILLs, 2 + 2 signals, 2 double launches, 6 full disks...
  python -m bench.faults --quick --only=lock,enospc   # some parts (the reference run comes along)

Almost all the time goes to the campaigns on a real run: every segment is a fresh
``python -m andrea_jax.main`` (imports, data checks, a compilation-cache load).

The kill campaign trains ``tests/faults/harness.fault_config(num_steps)`` (the tests' tiny model,
checkpoints every 2 steps, keep 3) as a chain of subprocesses, each ended by a fault drawn at random
(SIGKILL while orbax writes asynchronously / right after a commit / after a random step / at a
random wall-clock moment, SIGTERM, SIGINT), then run to the end. A fault is *survived* when the
process died by the kill or exited 0 with a checkpoint at the interruption, every complete
checkpoint verifies, the restart resumed from the newest complete checkpoint (*steps lost* counts
committed steps the restart did not resume from; the target is 0) and the temporary directories
were gone. The stitched run must equal the uninterrupted one bit for bit (every step's losses and
mixture weights, and the whole final state: parameters, AdamW moments, curriculum and bandit
statistics).

The lock campaign (tests/faults/double_launch.py) freezes the running process at a random step,
launches the same command with another learning rate on its workdir (*survived*: refused, exit 1,
naming the holder, nothing in the workdir changed), then SIGKILLs it a few steps later: the next
process must take the lock over and resume from the newest checkpoint. The full-disk campaign
(tests/faults/enospc.py) injects ENOSPC at one write site per process (orbax's array write and
commit marker, the seal, a metrics.jsonl record, a shard or the manifest while the data is prepared
again): *survived* is one ``error:`` line naming the file, every complete checkpoint verifying,
nothing half-written listed, and the next process resuming from the newest checkpoint. Both stitched
runs must equal the uninterrupted one bit for bit. *Lost anything* counts the faults after which a
committed step, a file or a number was lost (a checkpoint not resumed from or failing verification,
a workdir changed by a refused launch, a stitched run that differs).

Bad inputs are *rejected cleanly* when the error is the documented one (ValueError/TypeError naming
the field, DataError naming the file and position, CheckpointError naming the file or array, before
any array is read), or, for numbers, when the output is finite and correct (or NaN for a NaN input).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from hypothesis import HealthCheck, given, settings

from andrea_jax import runconfig, simplex, train
from andrea_jax.curriculum import bandit
from andrea_jax import checkpoint as ckpt_lib
from andrea_jax import data as data_lib
from andrea_jax import logs
from andrea_jax.simplex import Region
from andrea_jax.sources import SOURCES
from tests.faults import bad_configs, corrupt, double_launch, enospc, harness

KILL_NAMES = {
    "async_write": "SIGKILL during an async checkpoint write",
    "after_commit": "SIGKILL right after a commit (seal window)",
    "random_step": "SIGKILL after a random step",
    "random_time": "SIGKILL at a random moment (start-up incl.)",
    "sigterm": "SIGTERM after a random step",
    "sigterm_anytime": "SIGTERM at a random moment (start-up incl.)",
    "sigint": "SIGINT after a random step",
}
_LINKS = "untrusted ckpt: links / special files"
_JSON = "untrusted ckpt: malformed metadata JSON"
_ABSURD = "untrusted ckpt: absurd shape / dtype"
_OTHER = "untrusted ckpt: another config's arrays"
UNTRUSTED_CLASSES = {   # a word of the case's name -> its row (the first match wins)
    "link": _LINKS, "FIFO": _LINKS, "seal": "untrusted ckpt: forged seal", "malformed": _JSON,
    "JSON": _JSON, "MiB": _JSON, "shape of 10": _ABSURD, "dtype": _ABSURD, "config": _OTHER,
    "missing": _OTHER,
}


class Table:
  """Rows of (fault or bad input, tried, survived or rejected, faults that lost anything, steps
  lost); ``-`` where nothing could be lost (a bad input is rejected or not)."""

  def __init__(self):
    self.rows: list[tuple[str, int, int, str, str]] = []

  def add(self, name: str, tried: int, ok: int, lost: int | str = "-",
          lost_any: int | str = "-"):
    self.rows.append((name, tried, ok, str(lost_any), str(lost)))

  def merge(self, name: str, tried: int, ok: int):
    for i, (n, t, o, lost_any, lost) in enumerate(self.rows):
      if n == name:
        self.rows[i] = (n, t + tried, o + ok, lost_any, lost)
        return
    self.add(name, tried, ok)

  def print(self):
    width = max(len(r[0]) for r in self.rows)
    print(f"{'fault / bad input':<{width}}  {'tried':>6}  {'survived/rejected':>17}  "
          f"{'lost anything':>13}  {'steps lost':>10}")
    for name, tried, ok, lost_any, lost in self.rows:
      print(f"{name:<{width}}  {tried:>6}  {ok:>17}  {lost_any:>13}  {lost:>10}")


def _log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


# --- kills and signals -------------------------------------------------------------------------


@dataclasses.dataclass
class Reference:
  """The uninterrupted run every campaign is compared with, and its warm rerun's timing."""
  config: ml_collections.ConfigDict
  env: dict[str, str]
  workdir: Path
  warm: harness.Segment

  def same(self, workdir: Path) -> bool:
    """``workdir`` holds this run bit for bit: every record of metrics.jsonl, the final state."""
    final = f"checkpoints/{self.config.train.num_steps}"
    return ((workdir / "metrics.jsonl").read_text()
            == (self.workdir / "metrics.jsonl").read_text()
            and not harness.differences(harness.read_state(workdir / final),
                                        harness.read_state(self.workdir / final)))


def reference_runs(table: Table, root: Path, quick: bool) -> Reference:
  num_steps = 60 if quick else 240   # room for every fault: a segment advances <= 6 steps
  config = harness.fault_config(num_steps)
  env = harness.environment(str(root / "xla_cache"))
  rng = np.random.default_rng(0)
  reference = root / "reference" / "run"
  reference.parent.mkdir()
  seg = harness.run_segment(config, reference, "none", env=env, rng=rng, num_steps=num_steps,
                            log=root / "reference.log")
  assert seg.returncode == 0, seg.output[-3000:]
  _log(f"reference run (compiles): {seg.seconds:.1f} s")
  warm = root / "warm" / "run"
  warm.parent.mkdir()
  seg = harness.run_segment(config, warm, "none", env=env, rng=rng, num_steps=num_steps,
                            log=root / "warm.log")
  _log(f"warm uninterrupted run: {seg.seconds:.1f} s")
  ref = Reference(config, env, reference, seg)
  table.add("rerun from the compilation cache = reference", 1, int(ref.same(warm)))
  return ref


def kill_campaign(table: Table, root: Path, quick: bool, ref: Reference) -> None:
  per_kill, per_signal = (2, 2) if quick else (6, 10)
  config, env, reference, seg = ref.config, ref.env, ref.workdir, ref.warm
  num_steps = config.train.num_steps
  final = f"checkpoints/{num_steps}"
  rng = np.random.default_rng(0)
  plan = [k for k in harness.KILLS for _ in range(per_kill)]
  plan += (["sigterm"] * (per_signal // 2) + ["sigterm_anytime"] * (per_signal - per_signal // 2)
           + ["sigint"] * per_signal)
  rng.shuffle(plan)
  workdir = root / "campaign" / "run"
  workdir.parent.mkdir()
  progress = lambda k, s: _log(
      f"  {k:2d} {s.fault:12s} rc={s.returncode:4d} fired={s.fired!s:5} resumed={s.resumed_from} "
      f"newest {s.newest_before}->{s.newest_after} left={len(s.leftovers_after)} {s.seconds:.1f}s")
  # Random moments fall in the start-up or the next few steps (a segment must not end the run).
  per_step = (seg.seconds - seg.started_after) / num_steps
  segments = harness.campaign(config, workdir, plan, env=env, seed=1, step_window=6,
                              random_time_max=seg.started_after + 6 * per_step, progress=progress)
  check = harness.check_campaign(segments)
  for problem in check.problems:
    _log("PROBLEM " + problem)
  for fault, name in KILL_NAMES.items():
    table.add(name, check.injected.get(fault, 0), check.survived.get(fault, 0),
              check.steps_lost.get(fault, 0), check.lost_any.get(fault, 0))
  # Cleaned by the first later segment that opened the checkpoints (one killed during its start-up
  # had no chance to).
  left = cleaned = 0
  for k, s in enumerate(segments[:-1]):
    if s.leftovers_after:
      left += 1
      opened = next((n for n in segments[k + 1:] if n.initialised), None)
      cleaned += opened is not None and not (s.leftovers_after & opened.leftovers_after)
  table.add("kills leaving temporaries -> cleaned at restart", left, cleaned)
  stitched = ref.same(workdir)
  table.add("stitched run = uninterrupted, bit for bit", 1, int(stitched), "-", int(not stitched))

  # A damaged last checkpoint of a finished run: the command run again recovers.
  damaged = root / "damaged" / "run"
  shutil.copytree(reference, damaged)
  bad = corrupt.damage(damaged / final, "flip_byte", rng)
  seg = harness.run_segment(config, damaged, "none", env=env, rng=rng, num_steps=num_steps,
                            log=root / "damaged.log")
  ok = (seg.returncode == 0 and str(bad) in seg.output
        and seg.resumed_from == num_steps - config.train.checkpoint_every
        and (damaged / "metrics.jsonl").read_text() == (reference / "metrics.jsonl").read_text()
        and not harness.differences(harness.read_state(damaged / final),
                                    harness.read_state(reference / final)))
  table.add("damaged last checkpoint of a real run", 1, int(ok), 0 if ok else "?", int(not ok))

  # NaN steps (a token id outside the embedding) in a real run: skipped, weights unchanged.
  nan_steps = [5, num_steps - 2, num_steps - 1]
  nan = root / "nan" / "run"
  nan.parent.mkdir()
  seg = harness.run_segment(
      config, nan, "none", env=harness.environment(
          str(root / "xla_cache"), ANDREA_FAULTS_NAN_STEPS=",".join(map(str, nan_steps))),
      rng=rng, num_steps=num_steps, log=root / "nan.log", module="faults.nan_driver")
  records = [r for r in logs.read_jsonl(str(nan / "metrics.jsonl")) if "loss" in r]
  before = harness.read_state(nan / f"checkpoints/{num_steps - 2}")
  after = harness.read_state(nan / final)
  weights = [k for k in before if k.startswith(("['params']", "['opt_state']"))]
  ok = (seg.returncode == 0 and [r["step"] for r in records if not r["finite"]] == nan_steps
        and all(before[k].tobytes() == after[k].tobytes() for k in weights)
        and all(math.isfinite(r["loss"]) for r in records if r["step"] not in nan_steps))
  table.add("NaN steps in a real run: skipped, weights kept", len(nan_steps),
            len(nan_steps) if ok else 0)


# --- two runs in one workdir, a full disk -------------------------------------------------------


def lock_campaign(table: Table, root: Path, quick: bool, ref: Reference) -> None:
  """Second launches on a held workdir and takeovers after SIGKILL (tests/faults/double_launch)."""
  other = harness.fault_config(ref.config.train.num_steps)
  other.optim.peak_lr *= 2   # had it written anything, the stitched run would differ
  workdir = root / "lock" / "run"
  progress = lambda k, t: _log(f"  {k:2d} second launch refused={t.refused} untouched={t.untouched}"
                               f" in {t.refused_after:.1f} s; killed at newest "
                               f"{t.newest_after_kill}")
  trials, last = double_launch.campaign(ref.config, other, workdir, 2 if quick else 6,
                                        env=ref.env, seed=4, progress=progress)
  lost = double_launch.takeovers(trials, last, workdir)
  seconds = sorted(t.refused_after for t in trials)
  table.add(f"second launch on a held workdir (refused in {seconds[len(seconds) // 2]:.1f} s, "
            "median)", len(trials), sum(t.refused and t.untouched for t in trials), "-",
            sum(not t.untouched for t in trials))
  table.add("SIGKILL of the lock holder -> taken over", len(trials),
            sum(n == 0 for n in lost), sum(n for n in lost if n), sum(n != 0 for n in lost))
  same = last.returncode == 0 and ref.same(workdir)
  table.add("double launches + takeovers = uninterrupted", 1, int(same), "-", int(not same))


ENOSPC_NAMES = {
    "checkpoint": "ENOSPC: orbax array write (async)",
    "commit": "ENOSPC: orbax commit marker",
    "seal": "ENOSPC: checkpoint seal",
    "log": "ENOSPC: metrics.jsonl record",
    "shard": "ENOSPC: shard, preparing data",
    "manifest": "ENOSPC: manifest.json, preparing data",
}


def enospc_campaign(table: Table, root: Path, quick: bool, ref: Reference) -> None:
  """A full disk (injected, tests/faults/enospc.py) at each write site of a real run, each followed
  by the command run again; the stitched run against the uninterrupted one."""
  config = harness.fault_config(ref.config.train.num_steps)
  config.data.cache_dir = str(root / "enospc" / "cache")   # its own prepared data, removed at will
  rng = np.random.default_rng(6)
  plan = []
  for site in list(enospc.SITES) * (1 if quick else 3):
    plan.append({"checkpoint": f"{site}@+{2 * rng.integers(1, 4)}",
                 "commit": f"{site}@+{2 * rng.integers(1, 4)}",
                 "seal": f"{site}@+{2 * rng.integers(1, 4)}", "log": f"{site}@+{rng.integers(1, 6)}",
                 "shard": f"{site}@{rng.choice(SOURCES)}",
                 "manifest": f"{site}@{rng.integers(1, len(SOURCES) + 2)}"}[site])
  rng.shuffle(plan)
  workdir = root / "enospc" / "run"
  workdir.parent.mkdir(parents=True, exist_ok=True)
  progress = lambda k, f, s: _log(f"  {k:2d} {f:20s} rc={s.returncode} resumed={s.resumed_from} "
                                  f"newest {s.newest_before}->{s.newest_after} {s.seconds:.1f}s")
  faults, segments = enospc.campaign(config, workdir, plan, env=ref.env, progress=progress)
  outcomes = enospc.check(segments, faults, workdir, config.data.cache_dir)
  for o in outcomes:
    if not o["named"] or o["lost"]:
      _log(f"PROBLEM {o['fault']}: named={o['named']} lost={o['lost']}\n{o['output']}")
  for site, name in ENOSPC_NAMES.items():
    mine = [o for o in outcomes if o["site"] == site]
    table.add(name, len(mine), sum(o["named"] and not o["lost"] for o in mine),
              sum(o["steps_lost"] for o in mine), sum(bool(o["lost"]) for o in mine))
  same = segments[-1].returncode == 0 and ref.same(workdir)
  table.add("full disks, resumed = uninterrupted, bit for bit", 1, int(same), "-", int(not same))


# --- checkpoints -------------------------------------------------------------------------------


def damaged_checkpoints(table: Table, root: Path, quick: bool) -> None:
  base = root / "three" / "checkpoints"
  corrupt.write_checkpoints(base, (1, 2, 3))
  rng = np.random.default_rng(2)
  abstract = corrupt.abstract(corrupt.tiny_state(0))
  repeats = 8 if quick else 25
  for kind in corrupt.DAMAGE:
    ok = lost = lost_any = 0
    for trial in range(repeats):
      directory = root / f"damage-{kind}-{trial}" / "checkpoints"
      shutil.copytree(base, directory)
      bad = corrupt.damage(directory / "3", kind, rng)
      ckpts = ckpt_lib.Checkpoints(str(directory))
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step, state, _ = ckpts.restore_latest(abstract)
      lost += 2 - step
      named = len(caught) == 1 and str(bad) in str(caught[0].message)
      want = np.asarray(corrupt.tiny_state(2)["params"]["w"])
      same = state["params"]["w"].tobytes() == want.tobytes()
      ckpts.save(3, corrupt.tiny_state(3), {"step": 3})   # the resumed run writes step 3 again
      ckpts.close()
      ok += named and same and step == 2 and ckpt_lib.verify(str(directory / "3")) is None
      lost_any += not (same and step == 2)
      shutil.rmtree(directory.parent)
    table.add(f"damaged latest checkpoint: {kind.replace('_', ' ')}", repeats, ok, lost,
              lost_any)

  plain = root / "plain" / "checkpoints"
  corrupt.write_plain_checkpoint(plain, 1, corrupt.tiny_state(1))
  for i, (case, forge) in enumerate(corrupt.UNTRUSTED.items()):
    directory = root / f"untrusted-{i}" / "checkpoints"
    shutil.copytree(plain, directory, symlinks=True)
    expect = forge(directory / "1")
    ckpts = ckpt_lib.Checkpoints(str(directory))
    reads = []
    ckpts._mngr.restore = lambda *a, **k: reads.append(1)
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ckpts.restore_latest(abstract)
      ok = False
    except ckpt_lib.CheckpointError as e:
      ok = bool(re.search(expect, str(e))) and not reads
    ckpts.close()
    name = next(v for k, v in UNTRUSTED_CLASSES.items() if k in case)
    table.merge(name, 1, int(ok))


# --- configs and data --------------------------------------------------------------------------


def hostile_configs(table: Table, quick: bool) -> None:
  base = harness.fault_config().to_dict()
  counts: dict[str, list[int]] = {}

  @settings(max_examples=400 if quick else 2000, deadline=None, database=None,
            suppress_health_check=list(HealthCheck))
  @given(bad_configs.breakages())
  def run(breakage):
    tried_ok = counts.setdefault(breakage.kind, [0, 0])
    tried_ok[0] += 1
    try:
      with harness.count_compiles() as compiles:
        runconfig.build(ml_collections.ConfigDict(breakage.apply(base)))
    except (ValueError, TypeError) as e:
      tried_ok[1] += bool(re.search(breakage.expect, str(e))) and compiles.count == 0

  run()
  for kind, (tried, ok) in sorted(counts.items()):
    table.add(f"config: {kind}", tried, ok)


def hostile_data(table: Table, root: Path, quick: bool) -> None:
  config = harness.fault_config()
  prepared = data_lib.ensure_builtin(config.data.cache_dir, data_lib.load_tokenizer("bytes"),
                                     config.data.builtin_scale)
  seeds = 1 if quick else 3
  for i, (case, forge) in enumerate(corrupt.HOSTILE_DATA.items()):
    ok = 0
    for seed in range(seeds):
      copy = root / f"data-{i}-{seed}" / "prepared"
      shutil.copytree(prepared, copy)
      expect = forge(copy, np.random.default_rng(seed))
      c = harness.fault_config()
      c.data.prepared_dir = str(copy)
      c.train.progress_bar = False
      try:
        train.train_and_evaluate(c, str(copy.parent / "run"))
      except data_lib.DataError as e:
        ok += bool(re.search(expect, str(e)))
      shutil.rmtree(copy.parent)
    table.add(f"data: {case}", seeds, ok)


# --- numbers -----------------------------------------------------------------------------------


def numerics(table: Table, root: Path, quick: bool) -> None:
  rng = np.random.default_rng(3)
  n = 200 if quick else 1000
  region = Region.from_bounds({"hermes3-general": 0.7}, {"dictionary": 0.25},
                              exclude=("repo-docs", "repo-docstrings"))
  lower, upper = jnp.asarray(region.lower, jnp.float32), jnp.asarray(region.upper, jnp.float32)
  specials = np.array([0, 1e-45, -1e-45, 1e-40, 1e30, -1e30, 3.4e38, -3.4e38, np.inf, -np.inf, 0.5],
                      np.float32)
  ok = 0
  for i in range(n):
    x = np.where(rng.random(16) < 0.5, rng.choice(specials, 16),
                 np.float32(10.0 ** rng.uniform(-40, 30, 16) * rng.choice([-1, 1], 16)))
    x = x.astype(np.float32)
    w = np.asarray(simplex.project(x, lower, upper, method=("pairwise", "sort")[i % 2]))
    ok += bool(np.isfinite(w).all() and abs(w.astype(np.float64).sum() - 1) < 1e-5
               and np.abs(w - harness.exact_projection(x, lower, upper)).max() < 4e-6)
  table.add("project: 1e30, +-inf, denormals (vs exact)", n, ok)
  ok = 0
  for _ in range(50):
    x = jnp.zeros(16).at[int(rng.integers(16))].set(jnp.nan)
    ok += bool(np.isnan(simplex.project(x, lower, upper)).all())
  table.add("project: NaN in -> NaN out (never hidden)", 50, ok)

  data = data_lib.PreparedData.open(
      data_lib.ensure_builtin(harness.fault_config().data.cache_dir,
                              data_lib.load_tokenizer("bytes"), 0.25), verify=False)
  sampler = data_lib.MixtureSampler(data, seq_len=32, global_batch_size=16, seed=0)
  bad_values = [np.nan, np.inf, -np.inf, -1e-300, 1e30, -1.0]
  ok = 0
  for _ in range(60):
    w = np.full(16, 1 / 16)
    i = int(rng.integers(16))
    w[i] = rng.choice(bad_values)
    try:
      sampler.batch(int(rng.integers(100)), w)
    except ValueError as e:
      ok += SOURCES[i] in str(e) or "weights sum to" in str(e)
  table.add("sampler: NaN/inf/negative/1e30 weights", 60, ok)

  bad_bounds = [([np.nan] + [0.0] * 15, [1.0] * 16), ([0.0] * 16, [np.inf] + [1.0] * 15),
                ([-1e-30] + [0.0] * 15, [1.0] * 16), ([0.5] + [0.0] * 15, [0.25] + [1.0] * 15),
                ([0.1] * 16, [1.0] * 16), ([0.0] * 16, [0.05] * 16)]
  ok = 0
  for lo, hi in bad_bounds:
    try:
      simplex.sample_uniform(jax.random.key(0), jnp.asarray(lo), jnp.asarray(hi), 8)
    except ValueError:
      ok += 1
  draw = jax.jit(lambda lo, hi: simplex.sample_uniform(jax.random.key(0), lo, hi, 8)[0])
  ok += bool(np.isnan(draw(jnp.full(16, 0.1), jnp.ones(16))).all())
  table.add("sample_uniform: bad / empty bounds", len(bad_bounds) + 1, ok)
  ok = tried = 0
  for floor in (1e-45, 1e-38, 1 / 16 - 1e-7, 1 / 16):
    for ceiling in (1.0, 1e30):
      w, _ = simplex.sample_uniform(jax.random.key(tried), jnp.full(16, floor, jnp.float32),
                                    jnp.full(16, ceiling, jnp.float32), 64)
      w = np.asarray(w, np.float64)
      tried += 1
      ok += bool(np.isfinite(w).all() and np.abs(w.sum(-1) - 1).max() < 1e-5
                 and (w >= np.float32(floor)).all())
  table.add("sample_uniform: denormal / tight / 1e30 bounds", tried, ok)

  params = bandit.BanditParams()
  step = jax.jit(lambda s, l, t: bandit.close_window(params, bandit.observe(s, l, t)))
  specials = np.array([1e30, -1e30, 1e-45, np.nan, np.inf, -np.inf, 0.0, 2.0], np.float32)
  ok = 0
  for _ in range(n // 4):
    state = bandit.init(16)
    for _window in range(int(rng.integers(1, 6))):
      losses, tokens = rng.choice(specials, 16), rng.choice(specials, 16)
      state = step(state, jnp.asarray(losses), jnp.asarray(tokens))
    ok += bool(np.isfinite(bandit.ucb_index(params, state)).all()
               and np.isfinite(state.counts).all() and np.isfinite(state.progress).all())
  table.add("bandit: 1e30/NaN/inf/denormal observations", n // 4, ok)
  state = bandit.init(16)
  for loss in (3.0, 2.0, 2.0):
    state = step(state, jnp.full(16, loss), jnp.full(16, 64.0))
  index = np.asarray(bandit.ucb_index(params, state))
  table.add("bandit: all rewards equal -> equal indices", 1, int((index == index[0]).all()))
  extreme = [bandit.BanditParams(exploration=1e30, min_count=1e-30),
             bandit.BanditParams(exploration=1e300, min_count=1e-300, prior_count=1e-300),
             bandit.BanditParams(discount=1e-30, reward_knee=1e30, prior_count=1e30)]
  ok = sum(bool(np.isfinite(bandit.ucb_index(p, bandit.init(16))).all()) for p in extreme)
  table.add("bandit: extreme parameters", len(extreme), ok)


PARTS = ("kills", "lock", "enospc", "checkpoints", "configs", "data", "numerics")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer kills, signals and cases")
  parser.add_argument("--keep", action="store_true", help="keep the working directory")
  parser.add_argument("--only", default=",".join(PARTS),
                      help=f"comma-separated parts to run, of {','.join(PARTS)}")
  args = parser.parse_args()
  parts = args.only.split(",")
  if set(parts) - set(PARTS):
    parser.error(f"--only: unknown part(s) {sorted(set(parts) - set(PARTS))}; of {PARTS}")
  root = Path(tempfile.mkdtemp(prefix="andrea_faults_"))
  _log(f"working in {root}")
  table = Table()
  start = time.perf_counter()
  try:
    if {"kills", "lock", "enospc"} & set(parts):
      ref = reference_runs(table, root, args.quick)
    if "kills" in parts:
      kill_campaign(table, root, args.quick, ref)
    if "lock" in parts:
      lock_campaign(table, root, args.quick, ref)
    if "enospc" in parts:
      enospc_campaign(table, root, args.quick, ref)
    if "checkpoints" in parts:
      damaged_checkpoints(table, root, args.quick)
    if "configs" in parts:
      hostile_configs(table, args.quick)
    if "data" in parts:
      hostile_data(table, root, args.quick)
    if "numerics" in parts:
      numerics(table, root, args.quick)
  finally:
    if not args.keep:
      shutil.rmtree(root, ignore_errors=True)
  table.print()
  print(f"({time.perf_counter() - start:.0f} s; CPU, jax {jax.__version__})")


if __name__ == "__main__":
  main()

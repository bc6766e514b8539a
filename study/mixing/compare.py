r"""Does the curriculum help? Every mixing strategy trained side by side, scored on held-out loss.

    .venv/bin/python -m study.mixing.compare [--out runs/compare_mixers] \
        [--figure study/mixing/figures/compare_mixers.png] [--arms uniform,static,andrea,...] \
        [--seeds 0,1,2] [--tune] [--fit-elasticity] [--quick]

Each arm of ``study/mixing/arms.py`` (a strategy and a geometry schedule, with the
hyper-parameters picked by ``--tune``) is trained with :func:`andrea_jax.train.train_and_evaluate`
for every seed: the same model, steps, tokens, optimizer and held-out windows; the same seed gives
the same initial weights and the same random streams in every arm. A finished run is reused (its
``done.json``), so an interrupted comparison continues where it stopped.

Measured, per arm (mean over seeds; paired differences use the same seed's ``uniform`` run):

* the final mean held-out loss over the 16 sources, equal weights (``eval/mean_loss``), and each
  source's;
* the steps needed to reach the ``uniform`` arm's final mean held-out loss (same seed), interpolated
  linearly between evaluations; "fewer steps" is ``1 - steps / num_steps``; and the other way
  round, the step at which ``uniform`` reaches the arm's final loss (mean over seeds: a strategy
  that loses needs about ``num_steps`` where ``uniform`` needs this many; ``never`` when the arm
  ends below ``uniform``'s final loss);
* mid-run: ``1 - steps / uniform's steps`` to reach the loss ``uniform`` has at 1/4, 1/2 and 3/4
  of the run (``MID_RUN``; uniform's own first crossing, same seed). Unlike the end-of-run crossing
  it stays meaningful where the curve is flat at the end (in a long run uniform's held-out loss can
  touch its final value well before the last step);
* the step-time overhead against ``static``: the jitted training steps of all arms timed in turns in
  this one process, on the same batch, with their curricula running; the median of the per-round
  ratios to ``static`` with their quartiles in brackets (the spread says how well this machine
  resolves it), in CPU time of the process (robust to other processes sharing the cores) and in
  wall-clock time; the cost of ``curriculum.update`` alone, amortised over 2000 steps in a
  ``lax.scan`` (decisions included), as a share of the step's CPU time: the precise figure the
  step timing can only bound; and the whole runs' wall-clock ratio to ``uniform`` (noisier:
  compilation, evaluation and the machine's load are in it);
* the share of the batches each source really got, averaged over the run and over its last 10% of
  steps, and how much a source's final loss follows its late share (:func:`recency`); the
  learning-progress signal-to-noise of one phase window on the uniform runs (:func:`progress_snr`).

Writes ``<out>/<name>.md`` and ``.json`` (tables, curves, settings; ``--name`` defaults to
``compare_mixers``), prints the main table, and draws ``--figure`` (default ``<out>/<name>.png``):
mean held-out loss against step per arm (mean and min-max band over seeds) and the final
per-source loss against ``uniform``. The step times are kept in ``<out>/<name>_overhead.json``
and reused (``--remeasure`` to measure again).

``--tune`` runs instead the tuning budget (``TUNING``, three settings per strategy with knobs, and
``TUNING_ARMS``, three arms for a recipe whose settings are geometries) at ``TUNING_SEED`` and
picks each strategy's setting on the *training* split: the equal-weight mean over sources of their
training loss over the last 10% of steps. Write the picks into ``SELECTED``. ``--tune
influence,exp3`` runs only the strategies named (into ``<out>/tuning_influence_exp3.{md,json}``).

``--fit-elasticity``: instead of the report, fit each source's data elasticity on the training
losses of the ``--arms`` runs (:func:`fit_elasticity`) and print the mixture it implies, the
``FITTED_ELASTICITY`` behind the ``static_fitted`` probe; then how well each single run's own
estimate (:func:`within_run_elasticity`, from the run's share variation alone, as an online mixer
would have to) agrees with that pooled fit.

``--fit-proxy``: run the designed probes of :mod:`study.mixing.proxy` (``PROBE_ARMS``,
20 static mixtures in a two-level orthogonal array) at ``TUNING_SEED`` and fit each source's
elasticity on their training losses: the ``PROXY_ELASTICITY`` behind the ``proxy_early`` arm.

``--steps`` and ``--data-scale`` (``data.builtin_scale``) run the same arms longer, on a corpus
large enough not to repeat (``--steps 12800 --data-scale 4`` stays under half an epoch of every
source under the uniform mixture).

``--quick``: a trivially small setting (80 steps of a 1-layer model, two seeds) to check the
machinery in a minute.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_ARMS = ("uniform", "static", "andrea", "bandit_only", "random_only", "exp3", "elastic",
                "elastic_andrea")
BASELINE = "uniform"
MID_RUN = (0.25, 0.5, 0.75)   # fractions of the run at which the mid-run speed-up is read
OVERHEAD_REFERENCE = "static"


def load_experiment():
  """The study's arms (:mod:`study.mixing.arms`)."""
  from study.mixing import arms
  return arms


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


def train_runner(config, workdir: str) -> dict:
  """Trains one run in this process (the default runner); returns the trainer's summary."""
  from andrea_jax import train
  return train.train_and_evaluate(config, workdir)


class RunInterrupted(Exception):
  """A run stopped by SIGTERM/SIGINT before its end: not finished, its checkpoint kept."""


def config_diff(old, new, prefix: str = "") -> list[str]:
  """The dotted paths at which two JSON-like configs differ (floats equal to 1e-12 relative: a
  computed mixture that an algebraically equal change of code moves in its last bit is the same
  run; the trainer holds mixtures in float32).

  Elsewhere only the fields both have are compared (a field added to the config since ``old`` was
  written did not exist for that run), but under ``curriculum.geometries`` a name or field on one
  side only is a difference: geometries are keyed by name, and an entry's optional ``mixture``
  changes the run when present.
  """
  if isinstance(old, dict) and isinstance(new, dict):
    strict = prefix == "curriculum.geometries" or prefix.startswith("curriculum.geometries.")
    out = []
    for key in sorted(set(old) | set(new) if strict else set(old) & set(new)):
      path = f"{prefix}.{key}" if prefix else str(key)
      if key not in old or key not in new:
        out.append(path)
      else:
        out += config_diff(old[key], new[key], path)
    return out
  if isinstance(old, float) and isinstance(new, float) and math.isclose(old, new, rel_tol=1e-12):
    return []
  return [] if old == new else [prefix or "(root)"]


def run_arm(config, workdir: str, runner: Callable = train_runner) -> float:
  """Runs (or reuses) one training run; returns its wall-clock seconds.

  A finished run leaves ``done.json`` with its time; the final checkpoint is deleted (unused here,
  and the only large file). A finished run is reused only if it was made with the same config (the
  ``config.json`` the trainer wrote); otherwise a ``ValueError`` names the fields that differ,
  rather than reporting an old run under a changed arm. A run the runner reports interrupted
  (``interrupted_at`` in its summary: SIGTERM or SIGINT) raises :class:`RunInterrupted` with its
  checkpoint kept, so that the same command resumes it rather than scoring its last evaluation.
  """
  done = os.path.join(workdir, "done.json")
  if os.path.exists(done):
    stored = os.path.join(workdir, "config.json")
    if os.path.exists(stored):
      with open(stored) as f:
        old = json.load(f)
      changed = config_diff(old, json.loads(config.to_json_best_effort(sort_keys=True)))
      if changed:
        raise ValueError(
            f"{workdir} holds a finished run made with another config ({', '.join(changed[:5])}"
            f"{', ...' if len(changed) > 5 else ''} differ); delete it or pass another --out")
    with open(done) as f:
      return float(json.load(f)["wall_s"])
  t0 = time.perf_counter()
  summary = runner(config, workdir)
  wall = time.perf_counter() - t0
  if isinstance(summary, dict) and "interrupted_at" in summary:
    raise RunInterrupted(f"{workdir} was interrupted at step {summary['interrupted_at']} "
                         "(checkpoint kept): run the same command again to resume it")
  shutil.rmtree(os.path.join(workdir, "checkpoints"), ignore_errors=True)
  with open(done, "w") as f:
    json.dump({"wall_s": wall, "num_steps": int(config.train.num_steps)}, f)
  return wall


def read_run(workdir: str, sources: Sequence[str]) -> dict:
  """Curves and mixtures from ``metrics.jsonl``.

  Returns ``eval_steps [E]``, ``eval_mean [E]``, ``eval_source {name: [E]}``, ``weights [S]`` (the
  mixture averaged over the logged steps), ``shares [S]`` (the shares of the batches' tokens each
  source really got: the sampler rounds the mixture to whole rows), ``late_weights``,
  ``late_shares`` (the same over the last 10% of the logged steps), ``train_loss {name:
  [(step, loss)]}``, and the logged shares themselves: ``share_steps [T]``, ``share_series [T, S]``.
  """
  evals, weights, shares, train_loss = [], [], [], {s: [] for s in sources}
  share_steps = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      rec = json.loads(line)
      if "eval/mean_loss" in rec:
        evals.append(rec)
      elif "loss" in rec and f"weight/{sources[0]}" in rec:
        weights.append([rec[f"weight/{s}"] for s in sources])
        shares.append([rec.get(f"share/{s}", math.nan) for s in sources])
        share_steps.append(rec["step"])
        for s in sources:
          if f"loss/{s}" in rec:
            train_loss[s].append((rec["step"], rec[f"loss/{s}"]))
  evals.sort(key=lambda r: r["step"])

  def average(rows, late=False):
    if not rows:
      return np.full(len(sources), np.nan)
    rows = np.array(rows, np.float64)
    return np.mean(rows[-max(len(rows) // 10, 1):] if late else rows, axis=0)

  return {
      "eval_steps": np.array([r["step"] for r in evals], np.int64),
      "eval_mean": np.array([r["eval/mean_loss"] for r in evals], np.float64),
      "eval_source": {s: np.array([r.get(f"eval/loss/{s}", np.nan) for r in evals])
                      for s in sources},
      "weights": average(weights), "late_weights": average(weights, late=True),
      "shares": average(shares), "late_shares": average(shares, late=True),
      "train_loss": train_loss,
      "share_steps": np.array(share_steps, np.int64),
      "share_series": np.array(shares, np.float64).reshape(len(shares), len(sources)),
  }


# --------------------------------------------------------------------------------------------------
# Measures
# --------------------------------------------------------------------------------------------------


def steps_to_reach(steps: np.ndarray, losses: np.ndarray, target: float) -> float:
  """First step at which the curve reaches ``target``, interpolated linearly; NaN if never.

  Before the first evaluation nothing is known: a curve already at the target there counts its
  step.

  Example: ``steps_to_reach([50, 100, 150], [3.0, 2.0, 1.5], 2.5) == 75.0``.
  """
  steps = np.asarray(steps, np.float64)
  losses = np.asarray(losses, np.float64)
  hit = np.flatnonzero(losses <= target)
  if hit.size == 0:
    return math.nan
  i = int(hit[0])
  if i == 0:
    return float(steps[0])
  s0, s1, l0, l1 = steps[i - 1], steps[i], losses[i - 1], losses[i]
  return float(s0 + (l0 - target) / (l0 - l1) * (s1 - s0))


def validation_signal(train_loss: dict, num_steps: int, last_fraction: float = 0.1) -> float:
  """Equal-weight mean over sources of the training loss over the last ``last_fraction`` of steps.

  A source without a logged loss in that window counts with its last logged one (a strategy that
  starves a source keeps its stale, high loss); a source never logged is left out.

  Example: ``{"a": [(5, 9.), (95, 2.)], "b": [(50, 3.)]}`` over 100 steps gives ``(2 + 3) / 2``.
  """
  start = num_steps * (1 - last_fraction)
  values = []
  for points in train_loss.values():
    if not points:
      continue
    late = [l for s, l in points if s >= start]
    values.append(float(np.mean(late)) if late else float(points[-1][1]))
  return float(np.mean(values))


def progress_snr(train_loss: dict, lo: int, hi: int, window: float) -> dict:
  """How well one phase window resolves each source's learning progress, from its training losses.

  Over the logged steps in ``[lo, hi)`` a line is fitted to each source's batch loss; the progress
  over a window of ``window`` steps is ``-slope * window`` and the noise of the difference of two
  window means is ``sd * sqrt(2 / window)`` (``sd`` the residual standard deviation of one step's
  loss): the learning-progress reward a bandit gets from one window has this signal-to-noise ratio.

  Returns ``{source: {"slope", "sd", "snr"}}``.

  Example: losses ``3 - 0.001 t`` plus noise of sd 0.1, windows of 24 steps: SNR ``0.024 / (0.1
  sqrt(2 / 24)) = 0.83``.
  """
  out = {}
  for src, points in train_loss.items():
    pts = np.array([(t, l) for t, l in points if lo <= t < hi], np.float64)
    if len(pts) < 3:
      continue
    a = np.stack([pts[:, 0], np.ones(len(pts))], axis=1)
    coef, *_ = np.linalg.lstsq(a, pts[:, 1], rcond=None)
    sd = float(np.std(pts[:, 1] - a @ coef, ddof=2))
    out[src] = {"slope": float(-coef[0]), "sd": sd,
                "snr": float(-coef[0] * window / max(sd * math.sqrt(2 / window), 1e-12))}
  return out


def measure_overhead(configs: dict, rounds: int, steps_per_round: int) -> dict:
  """Per-step time of each arm's jitted training step, timed in turns on one batch.

  Returns ``{arm: {clock: {"step_ms", "ratio", "ratio_lo", "ratio_hi"}}}`` for the clocks
  ``"wall"`` (elapsed time) and ``"cpu"`` (CPU time of this process, all its threads: insensitive
  to other processes competing for the cores): the median step time, and the median (and
  quartiles) over rounds of the round's ratio to :data:`OVERHEAD_REFERENCE`. The arms run one after
  the other inside each round, in a rotating order, so a change of machine load hits all of them.
  """
  import jax

  from andrea_jax import data as data_lib
  from andrea_jax import runconfig
  from andrea_jax import step as step_lib
  from andrea_jax import train

  arms = list(configs)
  first = configs[arms[0]]
  run0 = runconfig.build(first)
  data = data_lib.open_training_data(run0.data, required=run0.evaluated)
  sampler = data_lib.MixtureSampler(data, seq_len=first.data.seq_len,
                                    global_batch_size=first.data.global_batch_size, seed=0,
                                    process_index=0, process_count=1)
  num = len(run0.sources)
  batch = jax.device_put(sampler.batch(0, np.full(num, 1.0 / num)))
  root = jax.random.PRNGKey(0)
  keys = {n: jax.random.fold_in(root, i) for i, n in enumerate(("params", "curriculum", "eval"))}
  fns, states = {}, {}
  for arm in arms:
    run = runconfig.build(configs[arm])
    fns[arm] = step_lib.jit_step(run.step)
    states[arm] = jax.jit(lambda run=run: train.init_state(run, keys))()
    for _ in range(3):                       # compile, and pass the first phase decisions
      states[arm], m = fns[arm](states[arm], batch)
    jax.block_until_ready(m)
  times = {arm: {"wall": [], "cpu": []} for arm in arms}
  for r in range(rounds):
    for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
      w0, c0 = time.perf_counter(), time.process_time()
      for _ in range(steps_per_round):
        states[arm], m = fns[arm](states[arm], batch)
      jax.block_until_ready(m)
      times[arm]["wall"].append((time.perf_counter() - w0) / steps_per_round)
      times[arm]["cpu"].append((time.process_time() - c0) / steps_per_round)
  out = {}
  for arm in arms:
    out[arm] = {}
    for clock in ("wall", "cpu"):
      t = np.array(times[arm][clock])
      ref = np.array(times.get(OVERHEAD_REFERENCE, times[arm])[clock])
      ratios = t / ref
      out[arm][clock] = {"step_ms": 1e3 * float(np.median(t)), "ratio": float(np.median(ratios)),
                         "ratio_lo": float(np.percentile(ratios, 25)),
                         "ratio_hi": float(np.percentile(ratios, 75))}
  return out


def measure_update_cost(configs: dict, num_steps: int = 2000, repeats: int = 5) -> dict:
  """CPU microseconds per step of each arm's ``curriculum.update`` alone, amortised in a scan.

  ``num_steps`` steps of random per-source losses (all sources observed), phase decisions
  included; the median over ``repeats`` runs after compilation. Far below the step's time, this is
  the resolution the interleaved step timing cannot reach on a loaded machine.

  Returns ``{arm: microseconds per step}``.
  """
  import jax
  import jax.numpy as jnp

  from andrea_jax import curriculum
  from andrea_jax import runconfig

  rng = np.random.default_rng(0)
  out = {}
  for arm, config in configs.items():
    spec = runconfig.build(config).curriculum
    num = spec.num_sources
    losses_TxS = jnp.asarray(rng.uniform(1.0, 4.0, (num_steps, num)), jnp.float32)
    tokens_TxS = jnp.full((num_steps, num), 128.0, jnp.float32)

    @jax.jit
    def run(state, losses_TxS, tokens_TxS, spec=spec):
      def body(state, inputs):
        t, losses_S, tokens_S = inputs
        return curriculum.update(spec, state, t, losses_S, tokens_S), None
      steps = jnp.arange(num_steps, dtype=jnp.int32)
      return jax.lax.scan(body, state, (steps, losses_TxS, tokens_TxS))[0]

    state = curriculum.init(spec, jax.random.key(0))
    jax.block_until_ready(run(state, losses_TxS, tokens_TxS))
    times = []
    for _ in range(repeats):
      c0 = time.process_time()
      jax.block_until_ready(run(state, losses_TxS, tokens_TxS))
      times.append(time.process_time() - c0)
    out[arm] = 1e6 * float(np.median(times)) / num_steps
  return out


# --------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------


def summarize(runs: dict, num_steps: int, sources: Sequence[str]) -> dict:
  """Per-arm results from ``runs[arm][seed] = read_run(...) + {"wall_s"}``."""
  base = runs[BASELINE]
  summary = {}
  for arm, by_seed in runs.items():
    seeds = sorted(by_seed)
    final = np.array([by_seed[s]["eval_mean"][-1] for s in seeds])
    paired = np.array([by_seed[s]["eval_mean"][-1] - base[s]["eval_mean"][-1]
                       for s in seeds if s in base])
    reach = np.array([steps_to_reach(by_seed[s]["eval_steps"], by_seed[s]["eval_mean"],
                                     base[s]["eval_mean"][-1]) for s in seeds if s in base])
    reached = np.isfinite(reach)
    # The other way round: when the uniform run reaches this arm's final loss (NaN if never:
    # "never in k/n seeds" in the table).
    behind = np.array([steps_to_reach(base[s]["eval_steps"], base[s]["eval_mean"],
                                      by_seed[s]["eval_mean"][-1]) for s in seeds if s in base])
    # Mid-run: the steps to reach the loss uniform has at a quarter, half, three quarters of the
    # run, against uniform's own (robust where the end of the curve is flat, and before the
    # learning rate has decayed).
    speedup = {}
    for frac in MID_RUN:
      ratios = []
      for s in seeds:
        if s not in base:
          continue
        u = base[s]
        target = float(np.interp(frac * num_steps, u["eval_steps"], u["eval_mean"]))
        mine = steps_to_reach(by_seed[s]["eval_steps"], by_seed[s]["eval_mean"], target)
        ratios.append(1 - mine / steps_to_reach(u["eval_steps"], u["eval_mean"], target))
      speedup[frac] = float(np.mean(ratios)) if ratios else math.nan
    walls = np.array([by_seed[s]["wall_s"] / base[s]["wall_s"] for s in seeds if s in base])
    per_source = {src: float(np.nanmean([by_seed[s]["eval_source"][src][-1] for s in seeds]))
                  for src in sources}
    summary[arm] = {
        "seeds": seeds,
        "final_mean": float(final.mean()), "final_sd": float(final.std(ddof=1)) if len(seeds) > 1
                                                     else 0.0,
        "delta_vs_uniform": float(paired.mean()) if paired.size else math.nan,
        "delta_sd": float(paired.std(ddof=1)) if paired.size > 1 else 0.0,
        "steps_to_uniform_final": [float(x) for x in reach],
        "reached": int(reached.sum()),
        "mean_steps": float(reach.mean()) if reached.all() and reach.size else math.nan,
        "fewer_steps": float(1 - reach.mean() / num_steps) if reached.all() and reach.size
                       else math.nan,
        "uniform_steps_to_arm_final": [float(x) for x in behind],
        "mid_run_fewer_steps": speedup,
        "wall_ratio": float(np.median(walls)) if walls.size else math.nan,
        "final_per_source": per_source,
        "weights": {src: float(w) for src, w in
                    zip(sources, np.mean([by_seed[s]["weights"] for s in seeds], axis=0))},
        **{key: {src: float(w) for src, w in zip(
            sources, np.mean([by_seed[s][key] for s in seeds], axis=0))}
           for key in ("late_weights", "shares", "late_shares")},
    }
  return summary


def recency(runs: dict, sources: Sequence[str], exclude: str = "extra-06") -> dict:
  """How much a source's final held-out loss follows the share of the batches it got.

  Pooled over the non-baseline arms and seeds, per source (the noise source left out: it has
  nothing to learn): the Spearman rank correlation between its realised share (of the last 10% of
  logged steps, or of the whole run) and its final held-out loss minus the same seed's ``uniform``
  run. Strongly negative late: a source's loss tracks what it got recently (a small model forgets
  a source it stops seeing), so a mixture that moves around pays for every dip at the end.

  Returns ``{"late_shares" | "shares": {"spearman", "points"}}``.
  """
  from scipy import stats

  base = runs[BASELINE]
  out = {}
  for key in ("late_shares", "shares"):
    xs, ys = [], []
    for arm, by_seed in runs.items():
      if arm == BASELINE:
        continue
      for seed, r in by_seed.items():
        for i, src in enumerate(sources):
          if src == exclude or seed not in base or not np.isfinite(r[key][i]):
            continue
          xs.append(r[key][i])
          ys.append(r["eval_source"][src][-1] - base[seed]["eval_source"][src][-1])
    if len(xs) > 2 and np.ptp(xs) > 0 and np.ptp(ys) > 0:
      out[key] = {"spearman": float(stats.spearmanr(xs, ys)[0]), "points": len(xs)}
  return out


def late_train_loss(points: Sequence, num_steps: int, last_fraction: float = 0.1) -> float:
  """Mean of the logged training losses ``[(step, loss)]`` over the last ``last_fraction`` of steps
  (NaN if none)."""
  late = [l for s, l in points if s >= num_steps * (1 - last_fraction)]
  return float(np.mean(late)) if late else math.nan


def fit_elasticity(runs: dict, sources: Sequence[str], num_steps: int,
                   floor: float = 0.02) -> dict:
  """Each source's data elasticity, fitted after the fact on the *training* losses of many runs.

  Per source, over the non-baseline arms and seeds: its late training loss (last 10% of steps)
  minus the same seed's ``uniform`` run's, regressed by least squares on ``ln(16 share)``, the log
  of the share of the batches it got over the run: ``loss ~ c - b ln(16 share)``. Under a power
  law in each source's tokens the equal-weight mean loss of a fixed mixture is smallest at shares
  proportional to ``b``; ``mixture`` is ``max(b, floor)`` normalised.

  Returns ``{"b": {source: b}, "r2": {source: R^2}, "points": {source: n}, "mixture": [S]}``.

  Example: losses ``c_s - b_s ln(16 share_s)`` exactly give back ``b_s``.
  """
  base = runs[BASELINE]
  b, r2, n = {}, {}, {}
  for i, src in enumerate(sources):
    xs, ys = [], []
    for arm, by_seed in runs.items():
      if arm == BASELINE:
        continue
      for seed, r in by_seed.items():
        if seed not in base:
          continue
        share = r["shares"][i]
        y = (late_train_loss(r["train_loss"][src], num_steps)
             - late_train_loss(base[seed]["train_loss"][src], num_steps))
        if share > 0 and np.isfinite(y):
          xs.append(math.log(len(sources) * share))
          ys.append(y)
    a = np.stack([np.asarray(xs), np.ones(len(xs))], axis=1)
    coef, *_ = np.linalg.lstsq(a, np.asarray(ys), rcond=None)
    resid = np.asarray(ys) - a @ coef
    b[src] = float(-coef[0])
    r2[src] = float(1 - resid @ resid / max(np.sum((ys - np.mean(ys)) ** 2), 1e-300))
    n[src] = len(xs)
  w = np.maximum(np.array([b[s] for s in sources]), floor)
  return {"b": b, "r2": r2, "points": n, "mixture": (w / w.sum()).tolist()}


def within_run_elasticity(run: dict, sources: Sequence[str], start: int = 150,
                          memory: float = 100.0) -> np.ndarray:
  """Each source's elasticity estimated from ONE run: what an online mixer could know.

  Per source, its logged training losses from step ``start`` on are regressed by least squares on
  ``[1, ln(t + 1), ln(S r_t)]``, where ``r_t`` is its recent share of the batches (an exponential
  average of the logged shares with a time constant of ``memory`` steps, from ``1/S``); ``b`` is
  minus the last coefficient. The ``ln(t + 1)`` term absorbs the common fall (and the transfer from the
  other sources), so ``b`` is identified only by how the run *varied* the source's share. Compared
  with the pooled, after-the-fact :func:`fit_elasticity` it says whether a run's own share
  variation carries enough signal to find the mixture (NaN where a source's share never varied).

  Example: losses ``c - 0.1 ln(t + 1) - b ln(S r_t)`` exactly give back ``b``.
  """
  steps, series = run["share_steps"], run["share_series"]
  num = len(sources)
  recent = np.empty_like(series)
  r, last = np.full(num, 1.0 / num), 0
  for k, (step, share) in enumerate(zip(steps, series)):
    keep = math.exp(-max(int(step) - last, 0) / memory)
    r = keep * r + (1 - keep) * np.nan_to_num(share, nan=0.0)
    recent[k], last = r, int(step)
  at = {int(s): k for k, s in enumerate(steps)}
  out = np.full(num, np.nan)
  for i, src in enumerate(sources):
    pts = [(s, l) for s, l in run["train_loss"][src] if s >= start and s in at]
    if len(pts) < 4:
      continue
    t = np.array([s for s, _ in pts], np.float64)
    x = np.log(np.maximum(num * recent[[at[int(s)] for s in t], i], 1e-6))
    if np.ptp(x) < 1e-9:
      continue
    a = np.stack([np.ones_like(t), np.log(t + 1.0), x], axis=1)
    coef, *_ = np.linalg.lstsq(a, np.array([l for _, l in pts]), rcond=None)
    out[i] = -coef[2]
  return out


def within_run_agreement(runs: dict, sources: Sequence[str],
                         pooled: Sequence[Sequence[float]], **kwargs) -> list[dict]:
  """For each pooled after-the-fact fit ``b`` in ``pooled``, ``{arm: [Pearson r per seed]}``: how
  well each run's :func:`within_run_elasticity` (computed once per run) agrees with it (sources
  with a NaN estimate left out)."""
  out = [{} for _ in pooled]
  for arm, by_seed in runs.items():
    if arm == BASELINE:
      continue
    for agree in out:
      agree[arm] = []
    for seed in sorted(by_seed):
      est = within_run_elasticity(by_seed[seed], sources, **kwargs)
      ok = np.isfinite(est)
      for agree, b in zip(out, pooled):
        agree[arm].append(float(np.corrcoef(est[ok], np.asarray(b)[ok])[0, 1])
                          if ok.sum() > 2 else math.nan)
  return out


def _per_seed(values: Sequence[float]) -> str:
  return ", ".join(f"{r:+.2f}" if math.isfinite(r) else "—" for r in values)


def _span_and_mean(values: Sequence[float]) -> tuple[str, str]:
  """``("min .. max", "mean")`` of the finite ``values``, ``("—", "—")`` if there are none."""
  v = np.asarray(values, np.float64)
  v = v[np.isfinite(v)]
  if not v.size:
    return "—", "—"
  return f"{v.min():+.2f} .. {v.max():+.2f}", f"{v.mean():+.2f}"


def _fmt_steps(row: dict, num_steps: int) -> tuple[str, str]:
  n = len(row["steps_to_uniform_final"])
  if row["reached"] < n:
    return f"> {num_steps} ({row['reached']}/{n} seeds reach it)", "—"
  steps = ", ".join(f"{x:.0f}" for x in row["steps_to_uniform_final"])
  return f"{row['mean_steps']:.0f} ({steps})", f"{100 * row['fewer_steps']:+.1f}%"


def main_table(summary: dict, settings: dict, overhead: dict | None, num_steps: int,
               exp) -> list[list[str]]:
  """The rows of the main table (header first)."""
  rows = [["arm", "strategy / geometry", "settings", "final mean held-out loss",
           "vs uniform (paired)", "steps to uniform's final", "fewer steps",
           "uniform reaches this final at",
           "fewer steps to uniform's loss at 1/4, 1/2, 3/4 of the run",
           "step CPU time vs static", "step wall time vs static",
           "curriculum.update alone (share of a step)", "run time / uniform"]]
  for arm, r in summary.items():
    strategy, kind = exp.ARMS[arm][:2]
    steps, fewer = _fmt_steps(r, num_steps)
    over = {}
    for clock in ("cpu", "wall"):
      if overhead and arm in overhead:
        o = overhead[arm][clock]
        over[clock] = (f"{100 * (o['ratio'] - 1):+.1f}% [{100 * (o['ratio_lo'] - 1):+.1f}, "
                       f"{100 * (o['ratio_hi'] - 1):+.1f}]")
      else:
        over[clock] = "—"
    if overhead and arm in overhead and "update_us" in overhead[arm]:
      step_us = 1e3 * overhead[arm]["cpu"]["step_ms"]
      over["update"] = (f"{overhead[arm]['update_us']:.0f} µs "
                        f"({100 * overhead[arm]['update_us'] / step_us:.2f}%)")
    else:
      over["update"] = "—"
    behind = r["uniform_steps_to_arm_final"]
    behind = (f"{np.mean(behind):.0f}" if np.all(np.isfinite(behind)) else
              f"never in {int(np.sum(~np.isfinite(behind)))}/{len(behind)} seeds")
    rows.append([arm, f"{strategy} / {kind}", json.dumps(settings.get(arm, {})) or "{}",
                 f"{r['final_mean']:.4f} ± {r['final_sd']:.4f}",
                 f"{r['delta_vs_uniform']:+.4f} ± {r['delta_sd']:.4f}", steps, fewer, behind,
                 ", ".join(f"{100 * v:+.1f}%" if math.isfinite(v) else "never"
                           for v in r["mid_run_fewer_steps"].values()),
                 over["cpu"],
                 over["wall"], over["update"], f"{r['wall_ratio']:.2f}"])
  return rows


def json_safe(value):
  """``value`` with every non-finite float replaced by None (strict JSON has no NaN)."""
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, dict):
    return {k: json_safe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_safe(v) for v in value]
  return value


def text_table(rows: list[list[str]]) -> str:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
  rule = "  ".join("-" * w for w in widths)
  return "\n".join([line(rows[0]), rule] + [line(r) for r in rows[1:]])


def markdown_table(rows: list[list[str]]) -> str:
  out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
  return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows[1:]])


def source_tables(summary: dict, sources: Sequence[str]) -> str:
  """Markdown: final held-out loss per source, and the mixture used, per arm."""
  short = [s.replace("hermes3-", "h3-").replace("repo-doc", "rd") for s in sources]
  loss = [["arm"] + short]
  weights = [["arm"] + short]
  late = [["arm"] + short]
  for arm, r in summary.items():
    loss.append([arm] + [f"{r['final_per_source'][s]:.3f}" for s in sources])
    weights.append([arm] + [f"{r['shares'][s]:.3f}" for s in sources])
    late.append([arm] + [f"{r['late_shares'][s]:.3f}" for s in sources])
  return ("Final held-out loss per source (nats/byte, mean over seeds):\n\n" + markdown_table(loss)
          + "\n\nShare of the batches' tokens each source got (the mixture rounded to whole "
          "rows by the sampler), averaged over the run:\n\n" + markdown_table(weights)
          + "\n\nThe same over the last 10% of steps:\n\n" + markdown_table(late))


def snr_table(by_seed: dict, num_steps: int, window: float = 24.5) -> str:
  """Markdown: learning-progress signal-to-noise per phase window, on the ``uniform`` runs' middle
  half (every source sampled alike), averaged over seeds."""
  lo, hi = int(0.375 * num_steps), int(0.875 * num_steps)
  per_seed = [progress_snr(r["train_loss"], lo, hi, window) for r in by_seed.values()]
  rows = [["source", "progress (nats/step)", "one step's loss sd",
           f"SNR of one {window}-step window"]]
  for src in per_seed[0]:
    vals = [p[src] for p in per_seed if src in p]
    rows.append([src, f"{np.mean([v['slope'] for v in vals]):.1e}",
                 f"{np.mean([v['sd'] for v in vals]):.3f}",
                 f"{np.mean([v['snr'] for v in vals]):.2f}"])
  return (f"Learning-progress signal-to-noise on the uniform runs, steps {lo}-{hi} (a line fitted "
          "to each source's logged batch loss; the bandit's reward of one phase window is the "
          "fall between two window means):\n\n" + markdown_table(rows))


def plot(runs: dict, summary: dict, sources: Sequence[str], path: str, title: str,
         boundaries: Sequence[tuple[int, str]] = ()) -> str:
  """Mean held-out loss vs step per arm (mean, min-max band over seeds; ``boundaries`` as vertical
  lines) and the per-source final loss difference to ``uniform``."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax, hm) = plt.subplots(1, 2, figsize=(15, 5.6), gridspec_kw={"width_ratios": [1, 1.25]})
  colors = plt.get_cmap("tab10")
  lows, highs = [], []
  for i, (arm, by_seed) in enumerate(runs.items()):
    seeds = sorted(by_seed)
    steps = by_seed[seeds[0]]["eval_steps"]
    curves = np.stack([by_seed[s]["eval_mean"] for s in seeds])
    mean = curves.mean(axis=0)
    # Past ten arms the colours repeat: the second round is dashed, the third dotted.
    style = {"linewidth": 2.4 if arm == BASELINE else 1.4, "color": "black" if arm == BASELINE
             else colors(i % 10), "linestyle": ("-", "--", ":")[(i // 10) % 3]}
    ax.plot(steps, mean, label=f"{arm} ({len(seeds)} seeds)", **style)
    ax.fill_between(steps, curves.min(axis=0), curves.max(axis=0), alpha=0.15,
                    color=style["color"])
    lows.append(curves.min())
    highs.extend([mean[min(2, len(mean) - 1)], curves.max(axis=0)[-1]])
  for step, name in boundaries:
    ax.axvline(step, color="0.5", linestyle="--", linewidth=0.8)
    ax.text(step, 0.98, f" {name}", transform=ax.get_xaxis_transform(), fontsize=8, va="top",
            color="0.35")
  target = summary[BASELINE]["final_mean"]
  ax.axhline(target, color="black", linestyle=":", linewidth=1,
             label=f"uniform's final ({target:.3f})")
  ax.set_ylim(min(lows) - 0.02, max(highs) + 0.02)
  ax.set_xlabel("step")
  ax.set_ylabel("mean held-out loss over 16 sources (nats/byte)")
  ax.set_title("held-out loss, mean and min-max over seeds")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)

  arms = [a for a in summary if a != BASELINE]
  if arms:
    _per_source_heatmap(fig, hm, summary, arms, sources)
  else:   # the baseline's seeds alone: nothing to compare with it
    hm.set_axis_off()
  fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _per_source_heatmap(fig, hm, summary: dict, arms: Sequence[str], sources: Sequence[str]):
  """Each arm's final held-out loss minus the baseline's, per source, on axes ``hm``."""
  delta = np.array([[summary[a]["final_per_source"][s] - summary[BASELINE]["final_per_source"][s]
                     for s in sources] for a in arms])
  lim = max(float(np.nanmax(np.abs(delta))), 1e-3)
  im = hm.imshow(delta, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
  hm.set_xticks(range(len(sources)), sources, rotation=60, ha="right", fontsize=8)
  hm.set_yticks(range(len(arms)), arms, fontsize=9)
  for (i, j), v in np.ndenumerate(delta):
    hm.text(j, i, f"{v:+.2f}", ha="center", va="center", fontsize=6.5)
  hm.set_title("final held-out loss minus uniform's, per source (blue = better)")
  fig.colorbar(im, ax=hm, fraction=0.03)


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def _config(exp, arm: str, seed: int, args, settings: dict | None = None):
  """``arm``'s run config for ``seed`` under the command line's ``--steps``, ``--data-scale``,
  ``--layers``, ``--d-model`` and ``--quick``."""
  c = exp.arm_config(arm, num_steps=args.num_steps, settings=settings, seed=seed)
  if args.quick:
    c.model.update(num_layers=1, num_heads=1, d_model=32, d_mlp=64, max_len=32)
    c.data.update(seq_len=32, global_batch_size=8)
    c.eval.update(every=20, sequences_per_source=4)
    c.optim.warmup_steps = 5
  if args.data_scale is not None:
    c.data.builtin_scale = args.data_scale
  if args.layers is not None:
    c.model.num_layers = args.layers
  if args.d_model is not None:  # 32-wide heads and a 4x MLP, as in the study's model
    c.model.update(d_model=args.d_model, num_heads=max(1, args.d_model // 32),
                   d_mlp=4 * args.d_model)
  return exp.fit_to_model(c, arm)


def tune(exp, args, runner, only: Sequence[str] | None = None) -> int:
  """Runs every setting of ``TUNING`` and ``TUNING_ARMS`` (or of the strategies ``only``) at
  ``TUNING_SEED``; writes and prints the picks."""
  from andrea_jax.sources import SOURCES
  grids = {**{k: ("settings", v) for k, v in exp.TUNING.items()},
           **{k: ("arms", v) for k, v in exp.TUNING_ARMS.items()}}
  names = list(grids) if only is None else list(only)
  rows = [["strategy", "setting", "validation signal (train loss, last 10%)", "picked"]]
  picks, arm_picks = {}, {}
  for strategy in names:
    kind, grid = grids[strategy]
    scores = []
    for i, setting in enumerate(grid):
      if kind == "arms":  # each setting is a whole arm of the experiment
        c = _config(exp, setting, exp.TUNING_SEED, args)
        workdir = os.path.join(args.out, "tune", strategy, setting)
      else:
        c = _config(exp, strategy, exp.TUNING_SEED, args, settings=setting)
        workdir = os.path.join(args.out, "tune", strategy, f"setting{i}")
      run_arm(c, workdir, runner)
      scores.append(validation_signal(read_run(workdir, SOURCES)["train_loss"], args.num_steps))
    best = int(np.argmin(scores))
    (arm_picks if kind == "arms" else picks)[strategy] = grid[best]
    for i, (setting, score) in enumerate(zip(grid, scores)):
      rows.append([strategy, setting if kind == "arms" else json.dumps(setting), f"{score:.4f}",
                   "yes" if i == best else ""])
  print(text_table(rows))
  stem = "tuning" if only is None else "tuning_" + "_".join(names)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"{stem}.md"), "w") as f:
    f.write(f"Tuning at seed {exp.TUNING_SEED}, {args.num_steps} steps; signal: equal-weight mean "
            "of the per-source training loss over the last 10% of steps.\n\n"
            + markdown_table(rows) + "\n")
  with open(os.path.join(args.out, f"{stem}.json"), "w") as f:
    json.dump({"seed": exp.TUNING_SEED, "picks": picks, "arm_picks": arm_picks, "rows": rows},
              f, indent=1)
  if picks:
    print(f"\npicks (copy into SELECTED of study/mixing/arms.py): {json.dumps(picks)}")
  if arm_picks:
    print(f"\nrecipe picks (the arm of TUNING_ARMS to report): {json.dumps(arm_picks)}")
  return 0


def fit_proxy(exp, args, runner) -> int:
  """Runs the designed probes (``PROBE_ARMS``) at ``TUNING_SEED`` and fits each source's
  elasticity on their training losses (:func:`study.mixing.proxy.fit_elasticity`); prints
  and writes ``<out>/proxy_fit.{md,json}`` with ``PROXY_ELASTICITY`` to copy into the experiment,
  its agreement with ``FITTED_ELASTICITY`` (the hindsight fit) and the probes' cost."""
  from study.mixing import proxy
  from andrea_jax.sources import SOURCES
  shares, losses, walls = [], [], []
  for arm in exp.PROBE_ARMS:
    c = _config(exp, arm, exp.TUNING_SEED, args)
    workdir = os.path.join(args.out, "proxy", arm)
    walls.append(run_arm(c, workdir, runner))
    r = read_run(workdir, SOURCES)
    shares.append(r["weights"])   # the design's mixture: the sampler realises it exactly on average
    losses.append([late_train_loss(r["train_loss"][s], args.num_steps) for s in SOURCES])
    print(f"{arm}: mean late training loss {np.mean(losses[-1]):.4f} ({walls[-1]:.0f} s)",
          flush=True)
  try:
    fit = proxy.fit_elasticity(np.array(shares), np.array(losses))
  except ValueError as e:  # e.g. a source with no rows late in a probe: batches too small
    print(f"cannot fit the probes' elasticities: {e} (runs under {args.out}/proxy)",
          file=sys.stderr)
    return 2
  mixture = proxy.elasticity_mixture(fit.b)
  hindsight = np.asarray(exp.FITTED_ELASTICITY)
  r = float(np.corrcoef(mixture, hindsight)[0, 1])
  rows = [["source", "b (nats per unit of ln share)", "R^2", "mixture share (lambda 1)",
           "FITTED_ELASTICITY (hindsight)"]]
  rows += [[s, f"{b:+.3f}", f"{q:.2f}", f"{w:.3f}", f"{h:.3f}"]
           for s, b, q, w, h in zip(SOURCES, fit.b, fit.r2, mixture, hindsight)]
  c0 = _config(exp, exp.PROBE_ARMS[0], exp.TUNING_SEED, args)
  head = (f"{len(exp.PROBE_ARMS)} probes at seed {exp.TUNING_SEED}, {args.num_steps} steps, "
          f"{c0.model.num_layers}-layer d={c0.model.d_model}; probe wall time {sum(walls):.0f} s "
          f"in all; Pearson r of the mixture with FITTED_ELASTICITY {r:+.2f}")
  code = "PROXY_ELASTICITY = (" + ", ".join(f"{b:.3f}" for b in fit.b) + ")"
  print(f"\n{head}\n{text_table(rows)}\n\n{code}")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "proxy_fit.md"), "w") as f:
    f.write(f"{head}\n\n{markdown_table(rows)}\n\n{code}\n")
  with open(os.path.join(args.out, "proxy_fit.json"), "w") as f:
    json.dump({"b": fit.b.tolist(), "r2": json_safe(fit.r2.tolist()),
               "mixture": mixture.tolist(), "pearson_vs_hindsight": r, "probe_wall_s": walls},
              f, indent=1)
  return 0


def main(argv: Sequence[str] | None = None, runner: Callable = train_runner) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="runs/compare_mixers",
                      help="directory for the runs, tables and JSON (default runs/compare_mixers)")
  parser.add_argument("--figure", default=None, help="PNG path (default <out>/<name>.png)")
  parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                      help="comma-separated arms of study/mixing/arms.py (uniform first)")
  parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2)")
  parser.add_argument("--steps", type=int, default=None, help="steps per run (default the study's)")
  parser.add_argument("--name", default="compare_mixers",
                      help="stem of the report files under --out (runs are shared between names)")
  parser.add_argument("--tune", nargs="?", const="", default=None, metavar="STRATEGIES",
                      help="run the tuning budget instead (TUNING and TUNING_ARMS; optionally "
                           "only the comma-separated strategies named)")
  parser.add_argument("--data-scale", type=float, default=None,
                      help="size of the built-in corpus (data.builtin_scale; default the "
                           "study's, 1 MB per source): raise it for long runs, to keep them off "
                           "repeated data")
  parser.add_argument("--layers", type=int, default=None,
                      help="decoder layers (default the study's 2)")
  parser.add_argument("--d-model", type=int, default=None,
                      help="model width (default the study's 64), with 32-wide heads and a 4x MLP")
  parser.add_argument("--quick", action="store_true", help="a trivially small setting")
  parser.add_argument("--no-overhead", action="store_true", help="skip the step-time measurement")
  parser.add_argument("--remeasure", action="store_true",
                      help="measure the step times again, not reuse <out>/<name>_overhead.json")
  parser.add_argument("--fit-elasticity", action="store_true",
                      help="print the elasticities fitted on the --arms' training losses instead "
                           "of a report (FITTED_ELASTICITY of study/mixing/arms.py)")
  parser.add_argument("--fit-proxy", action="store_true",
                      help="run the designed probes (PROBE_ARMS) at the tuning seed and print "
                           "the PROXY_ELASTICITY fitted on their training losses")
  parser.add_argument("--overhead-rounds", type=int, default=30)
  parser.add_argument("--overhead-steps", type=int, default=20)
  args = parser.parse_args(argv)
  exp = load_experiment()
  if args.d_model is not None and (args.d_model < 32 or args.d_model % 32):
    parser.error(f"--d-model must be a positive multiple of 32 (32-wide heads), got {args.d_model}")
  if args.layers is not None and args.layers < 1:
    parser.error(f"--layers must be >= 1, got {args.layers}")
  args.num_steps = args.steps or (80 if args.quick else exp.NUM_STEPS)
  if args.tune is not None:
    known = [*exp.TUNING, *exp.TUNING_ARMS]
    only = None
    if args.tune.strip():  # bare --tune: the whole budget
      only = list(dict.fromkeys(t.strip() for t in args.tune.split(",") if t.strip()))
      if not only:
        parser.error(f"--tune names no strategy: {args.tune!r}; give a comma-separated list of "
                     f"{', '.join(known)}, or --tune alone for all of them")
      unknown = [t for t in only if t not in known]
      if unknown:
        parser.error(f"--tune: unknown strategies {unknown}; those with a tuning budget: "
                     f"{', '.join(known)}")
    recipes = [t for t in (only or known) if t in exp.TUNING_ARMS]
    if recipes and (args.layers is not None or args.d_model is not None):
      parser.error(f"--tune {','.join(recipes)}: those arms hold fits made on the study's 2-layer "
                   "d=64 model; with --layers/--d-model name only the strategies of TUNING")
    return tune(exp, args, runner, only)
  if args.fit_proxy:
    return fit_proxy(exp, args, runner)

  from andrea_jax.sources import SOURCES
  arms = [a.strip() for a in args.arms.split(",") if a.strip()]
  unknown = [a for a in arms if a not in exp.ARMS]
  if unknown:
    parser.error(f"unknown arms {unknown}; known: {', '.join(exp.ARMS)}")
  if BASELINE not in arms:
    arms.insert(0, BASELINE)
  seeds = ([int(s) for s in args.seeds.split(",")] if args.seeds
           else ([0, 1] if args.quick else [0, 1, 2]))
  if exp.TUNING_SEED in seeds:
    parser.error(f"seed {exp.TUNING_SEED} chose the hyper-parameters; report other seeds")

  runs: dict = {arm: {} for arm in arms}
  settings = {}
  for seed in seeds:
    for arm in arms:
      c = _config(exp, arm, seed, args)
      settings[arm] = exp.arm_settings(arm)
      workdir = os.path.join(args.out, "runs", arm, f"seed{seed}")
      wall = run_arm(c, workdir, runner)
      runs[arm][seed] = dict(read_run(workdir, SOURCES), wall_s=wall)
      print(f"{arm:18s} seed {seed}: final mean held-out loss "
            f"{runs[arm][seed]['eval_mean'][-1]:.4f} ({wall:.0f} s)", flush=True)

  if args.fit_elasticity:
    fit = fit_elasticity(runs, SOURCES, args.num_steps)
    rows = [["source", "b (nats per unit of ln share)", "R^2", "mixture share"]]
    rows += [[s, f"{fit['b'][s]:+.3f}", f"{fit['r2'][s]:.2f}", f"{w:.3f}"]
             for s, w in zip(SOURCES, fit["mixture"])]
    counts = sorted(set(fit["points"].values()))
    print(f"\n{'-'.join(map(str, counts))} runs per source\n" + text_table(rows))
    print("\nFITTED_ELASTICITY = (" + ", ".join(f"{w:.3f}" for w in fit["mixture"]) + ")")
    # Against this fit (made partly from the same runs) and against the experiment's
    # FITTED_ELASTICITY (made from other runs: independent of these).
    agree, other = within_run_agreement(
        runs, SOURCES, [[fit["b"][s] for s in SOURCES], exp.FITTED_ELASTICITY])
    rows = [["arm", "r per seed (this fit)", "mean", "r per seed (FITTED_ELASTICITY)", "mean"]]
    rows += [[arm, _per_seed(agree[arm]), _span_and_mean(agree[arm])[1],
              _per_seed(other[arm]), _span_and_mean(other[arm])[1]]
             for arm in agree if agree[arm]]
    every = [r for rs in agree.values() for r in rs]
    rows.append([f"all {len(every)} runs", *_span_and_mean(every),
                 *_span_and_mean([r for rs in other.values() for r in rs])])
    print("\nOne run's own estimate (within_run_elasticity) against a pooled fit, Pearson r:\n"
          + text_table(rows))
    return 0

  overhead = None
  overhead_path = os.path.join(args.out, f"{args.name}_overhead.json")
  if not args.no_overhead:
    cached = {}
    if os.path.exists(overhead_path) and not args.remeasure:
      with open(overhead_path) as f:
        cached = json.load(f)
    if all(a in cached and "update_us" in cached[a] for a in arms):
      overhead = cached
    elif all(a in cached for a in arms):
      overhead = cached
      configs = {arm: _config(exp, arm, 0, args) for arm in arms}
      for arm, us in measure_update_cost(configs).items():
        overhead[arm]["update_us"] = us
      with open(overhead_path, "w") as f:
        json.dump(overhead, f, indent=1)
    else:
      configs = {arm: _config(exp, arm, 0, args) for arm in arms}
      if OVERHEAD_REFERENCE not in configs:
        configs[OVERHEAD_REFERENCE] = _config(exp, OVERHEAD_REFERENCE, 0, args)
      overhead = measure_overhead(configs, args.overhead_rounds, args.overhead_steps)
      for arm, us in measure_update_cost(configs).items():
        overhead[arm]["update_us"] = us
      with open(overhead_path, "w") as f:
        json.dump(overhead, f, indent=1)

  summary = summarize(runs, args.num_steps, SOURCES)
  rows = main_table(summary, settings, overhead, args.num_steps, exp)
  import platform
  hardware = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores "
              f"(load average {os.getloadavg()[0]:.1f} at the end), "
              + __import__("jax").default_backend())
  c0 = _config(exp, BASELINE, seeds[0], args)
  setup = (f"{args.num_steps} steps of {c0.data.global_batch_size} x {c0.data.seq_len} tokens, "
           f"{c0.model.num_layers}-layer d={c0.model.d_model} byte-level decoder, seeds "
           f"{', '.join(map(str, seeds))}, evaluations every {c0.eval.every} steps on "
           f"{c0.eval.sequences_per_source} held-out windows per source"
           + (f", built-in corpus at scale {c0.data.builtin_scale:g}"
              if c0.data.builtin_scale != 1.0 else "") + f"; {hardware}")
  print("\n" + setup + "\n")
  print(text_table(rows))
  figure = args.figure or os.path.join(args.out, f"{args.name}.png")
  boundaries = []
  if any(exp.ARMS[a][1] == "andrea" for a in arms):
    g = exp.geometries("andrea", args.num_steps)
    boundaries = sorted((g[n].start_step, n) for n in g if g[n].start_step > 0)
  plot(runs, summary, SOURCES, figure,
       f"mixing strategies on the built-in 16-source corpus: {args.num_steps} steps, "
       f"{c0.model.num_layers}-layer d={c0.model.d_model} decoder, seeds "
       f"{', '.join(map(str, seeds))}", boundaries)
  snr = snr_table(runs[BASELINE], args.num_steps)
  rec = recency(runs, SOURCES)
  if rec:
    snr += ("\n\nRecency: over the other arms and seeds, Spearman correlation of a source's "
            "final held-out loss minus uniform's with the share of the batches it got (noise "
            "source left out): "
            + "; ".join(f"{'last 10% of steps' if k == 'late_shares' else 'whole run'} "
                        f"{v['spearman']:+.2f}" for k, v in rec.items())
            + f" ({next(iter(rec.values()))['points']} points).")
  with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
    f.write(f"# Mixing strategies compared\n\n{setup}\n\n{markdown_table(rows)}\n\n"
            f"{source_tables(summary, SOURCES)}\n\n{snr}\n\nFigure: {figure}\n")
  with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
    json.dump(json_safe({"setup": setup, "num_steps": args.num_steps, "seeds": seeds, "settings": settings,
               "summary": summary, "overhead": overhead, "table": rows, "recency": rec,
               "curves": {arm: {str(s): {"steps": r["eval_steps"].tolist(),
                                         "mean": r["eval_mean"].tolist(),
                                         "per_source": {k: v.tolist()
                                                        for k, v in r["eval_source"].items()}}
                                for s, r in by_seed.items()} for arm, by_seed in runs.items()}}),
              f, indent=1, allow_nan=False)
  print(f"\nwrote {args.out}/{args.name}.md, {args.out}/{args.name}.json and {figure}")
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except RunInterrupted as e:
    print(f"\n{e}", file=sys.stderr)
    sys.exit(1)

r"""Fit a mixture schedule on small proxy runs, then train with it.

  python -m study.mixing.fit_proxy --config=experiments/synthetic.py --workdir=runs/proxy \
      --config.model.num_layers=2 --config.model.d_model=64 --config.model.d_mlp=256
  python -m andrea_jax.main --config=study/mixing/proxy_config.py:runs/proxy --workdir=runs/with_proxy

The first command trains the config's run once per designed probe mixture
(:func:`study.mixing.proxy.probe_mixtures`: 20 runs for 16 sources, each source 4x more
in half of them), with the static strategy on the full simplex and the model as overridden here
(make it the small proxy: the probes' compute is the recipe's cost, printed first in runs of
the config file's own model, :func:`probe_cost`), into ``<workdir>/probe_<k>/``. Each probe stops
after ``--stop`` of ``train.num_steps`` (``train.stop_step``: its learning-rate schedule still
that of the whole run). The command then
fits each source's data elasticity on the probes' training losses over the last ``--late`` of the
steps they ran and writes ``<workdir>/proxy_fit.json``: the elasticities, their R^2, the mixture
``elasticity_mixture(b, --lam, power=--power)`` and ``--hold``. A probe already finished is
reused and one interrupted resumes, so the command can simply be run again. The defaults
(``--stop 0.5 --late 0.25``) are the recipe measured best: the first half of each probe, fitted
on its last quarter, as good as whole probes fitted on their last 10% (``--stop 1 --late 0.1``)
at half the cost.
``--probes=schedule`` runs each probe as the target runs (its mixture for the first ``--hold``,
uniform after) and fits the losses after the switch (``--stop 1 --late 0.25``).

``--method influence`` replaces the 20 probes with one uniform pilot run of the config, stopped
after its last measurement (step 379 of 800 by default), whose truncated-horizon influence
(:mod:`study.mixing.influence`) is measured at ``--at`` (fractions of
``train.num_steps``) with ``--cg_iters`` conjugate-gradient iterations per source and the
Gauss-Newton matrix on ``--gn_rows`` rows (default: the measured step's own batch; 0: all), into
``<workdir>/pilot.json`` (reused when run again with the same config) and the same
``proxy_fit.json`` (:func:`fit_influence`).

The second command trains the config file the probes were made from (*without* the proxy's
overrides: the target's own model) under that mixture for the first ``hold`` of its steps, then
the uniform mixture (``study/mixing/proxy_config.py``). Measured on the built-in corpus
(``study/mixing/LOG.md``, "A designed proxy"): with probes of the target's own size and the default
``--power 1.5``, the uniform mixture's final held-out loss in 23.4% fewer steps at 0.13M
parameters (nine seeds) and 23.2% at 0.85M (nine); 18.7% at 2.76M (nine) from fits at 0.13M
and 0.85M read at its size (``study/mixing/proxy_config.py:fit_a,fit_b``); a 0.13M fit alone, 17-20% at
0.85-2.76M. Power 1 gave 16-19.5% at 0.13-6.4M.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
from collections.abc import Callable, Sequence

import ml_collections
import numpy as np

from andrea_jax.curriculum import mixer_config

FIT_FILE = "proxy_fit.json"


def probe_config(config: ml_collections.ConfigDict, mixture: Sequence[float],
                 sources: Sequence[str], stop_step: int = 0,
                 hold: float = 1.0) -> ml_collections.ConfigDict:
  """``config`` with the static strategy holding ``mixture`` (source order ``sources``) on the
  full simplex for the first ``round(hold * train.num_steps)`` steps (``hold = 1``: throughout),
  then the uniform mixture (whatever static mixture the config held), stopped after
  ``stop_step`` steps (0: the whole run); checkpoints only at the end, no plots or progress bar."""
  from study.mixing import proxy
  geometries = proxy.proxy_schedule(np.asarray(mixture, np.float64), int(config.train.num_steps),
                                    hold=hold, sources=sources, name="probe")
  c = copy.deepcopy(config)
  with c.unlocked():
    # The static mixer, uniform ("then uniform", whatever static mixture the config sets).
    c.curriculum.mixer = mixer_config("static", c.sources)
    c.curriculum.geometries = geometries
    c.train.stop_step = int(stop_step)
    c.train.checkpoint_every = 0
    c.train.progress_bar = False
    c.train.plot = False
  return c


def late_start(num_steps: int, late: float) -> int:
  """The first step of the last ``late`` of ``num_steps`` steps (at least one):
  ``num_steps - max(1, floor(late num_steps + 0.5))``; e.g. ``late_start(800, 0.25) == 600``."""
  return num_steps - max(1, int(late * num_steps + 0.5))


def late_losses(metrics_path: str, sources: Sequence[str], num_steps: int,
                late: float) -> np.ndarray:
  """Each source's mean logged training loss over the last ``late`` of a run's first
  ``num_steps`` steps, ``late_start(num_steps, late) <= step < num_steps`` (``[S]``; the window's
  length rounded half up, at least one step); a
  ``ValueError`` names the file and the source if it has none there. Skipped (non-finite) steps
  and non-finite losses do not count."""
  points = {s: [] for s in sources}
  first = late_start(num_steps, late)
  with open(metrics_path) as f:
    for line in f:
      rec = json.loads(line)
      # A skipped (non-finite) step is logged too, its losses as the strings "nan" or "inf".
      if first <= rec.get("step", -1) < num_steps and rec.get("finite", True) is not False:
        for s in sources:
          v = rec.get(f"loss/{s}")
          if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            points[s].append(v)
  missing = [s for s in sources if not points[s]]
  if missing:
    raise ValueError(f"{metrics_path}: no training loss logged for {', '.join(missing)} in the "
                     f"last {late:.0%} of the {num_steps} steps (log more often with "
                     "train.log_every, use larger batches or a larger --late)")
  return np.array([np.mean(points[s]) for s in sources])


def _changed(old, new, path: str = "") -> list[str]:
  """The dotted paths at which two JSON configs differ (a field on one side only included; floats
  equal to 1e-12 relative, as a mixture recomputed by algebraically equal code may not be)."""
  if not (isinstance(old, dict) and isinstance(new, dict)):
    if isinstance(old, float) and isinstance(new, float):
      return [] if math.isclose(old, new, rel_tol=1e-12) else [path or "the config"]
    return [] if old == new else [path or "the config"]
  out = []
  for key in sorted(set(old) | set(new), key=str):
    sub = f"{path}.{key}" if path else str(key)
    out += [sub] if key not in old or key not in new else _changed(old[key], new[key], sub)
  return out


def model_params(config: ml_collections.ConfigDict) -> int:
  """The parameter count of ``config``'s model (the padded embedding rows included), from shapes
  alone (nothing is initialised)."""
  import jax
  from andrea_jax import model, runconfig
  shapes = jax.eval_shape(model.init_params, runconfig.model_config(config), jax.random.key(0))
  return model.count_params(shapes)


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """:func:`andrea_jax.config.load_config_file`, its error naming the fit file that recorded it."""
  from andrea_jax.config import load_config_file as load
  try:
    return load(spec)
  except ValueError as e:
    raise ValueError(f"{e} (recorded in {FIT_FILE}); run from the directory the probes were run "
                     "from") from None


def _checkpointed_to(probe_dir: str) -> int:
  """The step of the newest checkpoint directory of a probe (0 when it has none)."""
  try:
    names = os.listdir(os.path.join(probe_dir, "checkpoints"))
  except OSError:
    return 0
  return max((int(n) for n in names if n.isdigit()), default=0)


def probe_cost(probe: ml_collections.ConfigDict, target: ml_collections.ConfigDict,
               num_probes: int, probe_steps: int) -> float:
  """The probes' compute in target runs, counted as parameters x tokens: ``num_probes *
  probe_steps * T_p * N_p / (num_steps * T_t * N_t)``, ``T`` the tokens of a step
  (``data.global_batch_size * data.seq_len``), ``N`` :func:`model_params`, ``num_steps`` the
  target's ``train.num_steps``. An estimate of the share of the time: it leaves out attention's
  term in the sequence length, which weighs more on a small model, so for a small proxy it is low.

  Example: 20 probes of 400 steps on the 0.13M model for an 800-step run of ``tiny.py``'s 0.86M,
  same batches: ``20 * 400 * 132864 / (800 * 858880) = 1.55`` target runs.
  """
  def tokens(c):
    return int(c.data.global_batch_size) * int(c.data.seq_len)
  return (num_probes * probe_steps * tokens(probe) * model_params(probe)
          / (int(target.train.num_steps) * tokens(target) * model_params(target)))


def _check_target_schedule(target: ml_collections.ConfigDict, sources: Sequence[str],
                           hold: float) -> None:
  """A ``ValueError`` if the target run's schedule (a mixture for ``hold`` of its steps, then
  uniform) is invalid, e.g. a hold shorter than a phase."""
  from andrea_jax import runconfig
  from study.mixing import proxy
  check = target.copy_and_resolve_references()
  check.curriculum.mixer = mixer_config("static", check.sources)
  check.curriculum.geometries = proxy.proxy_schedule(
      np.full(len(sources), 1 / len(sources)), int(check.train.num_steps), hold=hold,
      sources=sources)
  try:
    runconfig.build(check)
  except ValueError as e:
    raise ValueError(f"hold = {hold} gives the target run an invalid schedule: {e}") from None


def fit(config: ml_collections.ConfigDict, workdir: str, *, ratio: float = 4.0, lam: float = 1.0,
        hold: float = 0.5, stop: float = 0.5, late: float = 0.25, probes: str = "static",
        power: float = 1.5, config_file: str | None = None,
        target: ml_collections.ConfigDict | None = None,
        runner: Callable | None = None) -> dict:
  """Runs (or reuses) the probes of ``config`` under ``workdir`` and writes the fit.

  Each probe runs the first ``stop`` of ``config.train.num_steps`` (``train.stop_step``); each
  source's loss is the mean of its logged training losses over the last ``late`` of those steps.
  ``probes="static"`` holds each probe's mixture throughout; ``probes="schedule"`` runs the
  probes as the target will run, the probe mixture for the first ``hold`` of the steps and
  uniform after, and fits the losses after the switch (the window must lie there): what a
  source's early share still buys once every source gets the same share. The mixture is
  ``proxy.elasticity_mixture(b, lam, power=power)``.
  Returns (and writes to ``<workdir>/proxy_fit.json``) ``{"sources", "b", "r2", "intercept",
  "mixture", "lam", "power", "hold", "ratio", "num_steps", "probe_steps", "stop", "late", "probes",
  "probe_mixtures", "late_losses", "config_file", "num_params"}`` (``num_params``: the probes'
  model's, for reading fits at two sizes at a target's: ``study/mixing/proxy_config.py``) and, when
  ``target`` (the config the fit is for: the config file without the proxy's overrides) is given,
  ``"target_params"`` and ``"probe_cost"`` (:func:`probe_cost`, printed before the probes run).
  ``runner(config, workdir)`` trains one probe (default
  :func:`andrea_jax.train.train_and_evaluate`).
  """
  from andrea_jax import runconfig
  from study.mixing import proxy
  for name, value, low_open in (("stop", stop, True), ("late", late, True), ("hold", hold, True),
                                ("lam", lam, False)):
    if not ((0 < value if low_open else 0 <= value) and value <= 1):   # before any run
      raise ValueError(f"{name} must be in {'(' if low_open else '['}0, 1], got {value!r}")
  if not (power > 0 and math.isfinite(power)):
    raise ValueError(f"power must be a finite number > 0, got {power!r}")
  if probes not in ("static", "schedule"):
    raise ValueError(f"probes must be 'static' or 'schedule', got {probes!r}")
  sources = runconfig.build(config).sources
  mixtures = proxy.probe_mixtures(len(sources), ratio=ratio)
  if runner is None:
    from andrea_jax import train
    runner = train.train_and_evaluate
  num_steps = int(config.train.num_steps)
  probe_steps = int(stop * num_steps + 0.5)     # the nearest step
  if probe_steps < 1:
    raise ValueError(f"stop = {stop} of train.num_steps = {num_steps} leaves no step to run")
  probe_hold = hold if probes == "schedule" else 1.0
  if probes == "schedule":
    switch, first = round(hold * num_steps), late_start(probe_steps, late)
    if not 1 <= switch < num_steps:
      raise ValueError(f"probes='schedule' needs a switch to uniform inside the run, but hold = "
                       f"{hold} of train.num_steps = {num_steps} puts it at step {switch}")
    if first < switch:
      most = (probe_steps - switch) / probe_steps
      raise ValueError(f"probes='schedule' fits the losses after the switch to uniform at step "
                       f"{switch} (hold = {hold}), but the last late = {late} of the "
                       f"{probe_steps} steps run (stop = {stop}) starts at step {first}: "
                       + (f"late <= {most:.3g} fits" if most > 0 else "raise stop or lower hold"))
  # The target's schedule must be valid before any probe runs (a hold too short for a phase).
  _check_target_schedule(target if target is not None else config, sources, hold)
  cost = None
  if target is not None:
    cost = probe_cost(config, target, len(mixtures), probe_steps)
    target_params = model_params(target)
    print(f"{len(mixtures)} probes of {probe_steps} steps at {model_params(config):,} parameters: "
          f"{cost:.3g} runs of the target ({target_params:,} parameters, "
          f"{int(target.train.num_steps)} steps) in parameters x tokens", flush=True)
  losses = []
  for k, mixture in enumerate(mixtures):
    probe_dir = os.path.join(workdir, f"probe_{k:02d}")
    probe = probe_config(config, mixture, sources,
                         stop_step=probe_steps if probe_steps < num_steps else 0, hold=probe_hold)
    stored = json.loads(probe.to_json_best_effort(sort_keys=True))
    done = os.path.join(probe_dir, "done.json")
    finished = os.path.exists(done)
    # A finished probe is reused, an interrupted one (its config.json, no done.json) resumed: both
    # only if made with this very config, but for train.stop_step.
    record = done if finished else os.path.join(probe_dir, "config.json")
    if os.path.exists(record):
      with open(record) as f:
        old = json.load(f)
      old.setdefault("train", {}).setdefault("stop_step", 0)   # probes from before stop_step
      changed = _changed(old, stored)
      if changed == ["train.stop_step"]:
        # The same probe run to another step: when it ran further, its log's first probe_steps
        # steps are this probe's; one that stopped short goes on from its checkpoint.
        changed = []
        if (finished and (old["train"]["stop_step"] or num_steps) < probe_steps
            and _checkpointed_to(probe_dir) < probe_steps):
          finished = False
          os.remove(done)
        elif not finished and _checkpointed_to(probe_dir) >= probe_steps:
          # Interrupted past this probe's end: every record of a step before its checkpoint was
          # written before it, so the log already holds this probe (resuming would be refused).
          finished = True
          with open(done, "w") as f:
            json.dump(stored, f)
      if changed:
        raise ValueError(f"{probe_dir} {'is a finished' if finished else 'holds an interrupted'} "
                         f"probe of another config ({', '.join(changed[:5])}"
                         f"{', ...' if len(changed) > 5 else ''} differ): pass another --workdir, "
                         "or delete it to run it again")
    if not finished:
      print(f"probe {k + 1}/{len(mixtures)} -> {probe_dir}", flush=True)
      summary = runner(probe, probe_dir)
      if isinstance(summary, dict) and "interrupted_at" in summary:
        raise ValueError(f"probe {probe_dir} was interrupted at step {summary['interrupted_at']} "
                         "(checkpoint saved): run the same command again to resume it")
      with open(done, "w") as f:
        json.dump(stored, f)
    losses.append(late_losses(os.path.join(probe_dir, "metrics.jsonl"), sources, probe_steps,
                              late))
  result = proxy.fit_elasticity(mixtures, np.array(losses))
  out = {"sources": list(sources), "b": result.b.tolist(),
         "r2": [None if math.isnan(r) else r for r in result.r2.tolist()],
         "intercept": result.intercept.tolist(),
         "mixture": proxy.elasticity_mixture(result.b, lam=lam, power=power).tolist(),
         "lam": lam, "power": power,
         "hold": hold, "ratio": ratio, "num_steps": num_steps, "probe_steps": probe_steps,
         "stop": stop, "late": late, "probes": probes,
         "probe_mixtures": mixtures.tolist(), "late_losses": np.array(losses).tolist(),
         "config_file": config_file, "num_params": model_params(config)}
  if target is not None:
    out.update(target_params=target_params, probe_cost=cost)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, FIT_FILE), "w") as f:
    json.dump(out, f, indent=1)
  return out


PILOT_AT = (0.375, 0.40625, 0.4375, 0.46875)   # steps 300, 325, 350, 375 of 800


def pilot_steps(num_steps: int, at: Sequence[float], batches: int) -> list[int]:
  """The steps ``round(f * num_steps)`` of the fractions ``at``; a ``ValueError`` names a fraction
  outside (0, 1), NaN, two fractions on one step, or a measurement whose ``batches`` batches run
  past the run's end."""
  at = [float(f) for f in at]
  bad = [f for f in at if not 0 < f < 1]      # NaN fails too
  if not at or bad:
    raise ValueError(f"at must be fractions of train.num_steps in (0, 1), got {at!r}")
  steps = sorted(round(f * num_steps) for f in at)
  if steps[0] < 1:
    raise ValueError(f"at = {min(at)} of train.num_steps = {num_steps} is step 0, before any "
                     "update: measure later")
  if len(set(steps)) != len(steps):
    raise ValueError(f"at = {at} puts two measurements on one step of train.num_steps = "
                     f"{num_steps}: {steps}")
  if steps[-1] + batches > num_steps:
    raise ValueError(f"at = {max(at)} puts the last measurement at step {steps[-1]}, whose "
                     f"{batches} batches run past train.num_steps = {num_steps}")
  return steps


def pilot_cost(pilot: ml_collections.ConfigDict, target: ml_collections.ConfigDict,
               num_sources: int, steps_run: int, measurements: int, rows: int, iters: int,
               gn_rows: int | None) -> float:
  """The pilot's compute in target runs, counted as parameters x tokens like :func:`probe_cost`:
  ``steps_run`` training steps and ``measurements`` measurements of ``rows`` rows
  (:func:`study.mixing.influence.measurement_tokens`: an upper bound)."""
  from study.mixing import influence
  seq_len = int(pilot.data.seq_len)
  tokens = (steps_run * int(pilot.data.global_batch_size) * seq_len
            + measurements * influence.measurement_tokens(num_sources, rows, seq_len, iters,
                                                          gn_rows))
  return (tokens * model_params(pilot) / (int(target.train.num_steps) * int(
      target.data.global_batch_size) * int(target.data.seq_len) * model_params(target)))


def fit_influence(config: ml_collections.ConfigDict, workdir: str, *,
                  at: Sequence[float] = PILOT_AT, batches: int = 4, iters: int = 10,
                  gn_rows: int | None = None, source_batch: int | None = None,
                  lam: float = 1.0, hold: float = 0.5, power: float = 1.5,
                  config_file: str | None = None,
                  target: ml_collections.ConfigDict | None = None,
                  pilot_fn: Callable | None = None) -> dict:
  """One uniform pilot run of ``config`` in place of the probes: its truncated-horizon influence
  (:mod:`study.mixing.influence`) measured at the steps ``at`` (fractions of
  ``train.num_steps``) on ``batches`` batches each, ``iters`` conjugate-gradient iterations per
  source, the Gauss-Newton matrix on the first ``gn_rows`` rows of them (``None``: one batch,
  ``data.global_batch_size`` rows, the measured step's own; 0: all), averaged. The defaults are the
  settings measured best on the built-in corpus (``study/mixing/influence_pilot.py``). ``source_batch``:
  the sources solved at once (``None``: all; fewer on a large model, for memory).

  Writes ``<workdir>/proxy_fit.json`` with the fields :func:`fit` writes that the target run reads
  (``sources``, ``b``, ``mixture``, ``lam``, ``power``, ``hold``, ``num_steps``, ``config_file``,
  ``num_params``; ``target_params`` and ``"probe_cost"``, here the pilot's, when ``target`` is
  given), ``"method": "influence"`` and the pilot's record (``measurements``, ``steps_run``,
  ``train_s``, ``measure_s``, ``at``, ``batches``, ``iters``, ``gn_rows``). A pilot already
  measured with this very config is reused. ``pilot_fn`` (default
  :func:`study.mixing.influence.pilot`) is for tests.
  """
  from andrea_jax import runconfig
  from study.mixing import influence, proxy
  for name, value, low_open in (("hold", hold, True), ("lam", lam, False)):
    if not ((0 < value if low_open else 0 <= value) and value <= 1):
      raise ValueError(f"{name} must be in {'(' if low_open else '['}0, 1], got {value!r}")
  if not (power > 0 and math.isfinite(power)):
    raise ValueError(f"power must be a finite number > 0, got {power!r}")
  if source_batch is not None and (isinstance(source_batch, bool) or not isinstance(
      source_batch, int) or source_batch < 1):
    raise ValueError(f"source_batch must be an integer >= 1, got {source_batch!r}")
  if gn_rows is None:
    gn_rows = int(config.data.global_batch_size)
  for name, value, least in (("batches", batches, 1), ("iters", iters, 1), ("gn_rows", gn_rows, 0)):
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
      raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
  sources = runconfig.build(config).sources
  num_steps = int(config.train.num_steps)
  steps = pilot_steps(num_steps, at, batches)
  rows = batches * int(config.data.global_batch_size)
  if gn_rows > rows:
    raise ValueError(f"gn_rows = {gn_rows} is more than the {rows} rows a measurement reads "
                     f"({batches} batches of data.global_batch_size = "
                     f"{int(config.data.global_batch_size)})")
  uniform = probe_config(config, np.full(len(sources), 1 / len(sources)), sources,
                         stop_step=steps[-1] + batches)
  # The target's schedule must be valid before the pilot runs (a hold too short for a phase).
  _check_target_schedule(target if target is not None else config, sources, hold)
  settings = {"at": [float(f) for f in at], "batches": batches, "iters": iters,
              "gn_rows": gn_rows, "config": json.loads(uniform.to_json_best_effort(sort_keys=True))}
  cost = None
  if target is not None:
    cost = pilot_cost(config, target, len(sources), steps[-1] + batches, len(steps), rows, iters,
                      gn_rows or None)
    target_params = model_params(target)
    print(f"one uniform pilot of {steps[-1] + batches} steps at {model_params(config):,} "
          f"parameters, measured at steps {', '.join(map(str, steps))} ({len(sources)} solves "
          f"of at most {iters + 1} Gauss-Newton products on {gn_rows or rows} rows each): at most "
          f"{cost:.3g} runs of the target ({target_params:,} parameters, "
          f"{int(target.train.num_steps)} steps) in parameters x tokens", flush=True)
  record = os.path.join(workdir, "pilot.json")
  found = None
  if os.path.exists(record):
    try:
      with open(record) as f:
        found = json.load(f)
      if not isinstance(found, dict) or not isinstance(found.get("result"), dict):
        raise ValueError("not a pilot's record")
    except ValueError as e:       # json's errors included
      raise ValueError(f"{record} is damaged ({e}): delete it to run the pilot again") from None
    changed = _changed(found.get("settings"), settings)
    if changed:
      raise ValueError(f"{record} holds a pilot of another config ({', '.join(changed[:5])}"
                       f"{', ...' if len(changed) > 5 else ''} differ): pass another --workdir, or "
                       "delete it to run it again")
  if found is None:
    os.makedirs(workdir, exist_ok=True)
    result = (pilot_fn or influence.pilot)(uniform, steps, batches=batches, iters=iters,
                                           gn_rows=gn_rows or None, source_batch=source_batch,
                                           log=lambda m: print(m, flush=True))
    found = {"settings": settings, "result": result}
    with open(record, "w") as f:
      json.dump(found, f)
  result = found["result"]
  b = np.asarray(result["b"], np.float64)
  if b.shape != (len(sources),) or not np.isfinite(b).all():
    raise ValueError(f"{record}: the pilot's elasticities are not {len(sources)} finite numbers: "
                     f"{result['b']!r}")
  out = {"sources": list(sources), "b": b.tolist(), "method": "influence",
         "mixture": proxy.elasticity_mixture(b, lam=lam, power=power).tolist(),
         "lam": lam, "power": power, "hold": hold, "num_steps": num_steps,
         "at": settings["at"], "batches": batches, "iters": iters, "gn_rows": gn_rows,
         "measurements": result["measurements"], "steps_run": result["steps_run"],
         "train_s": result["train_s"], "measure_s": result["measure_s"],
         "config_file": config_file, "num_params": model_params(config)}
  if target is not None:
    out.update(target_params=target_params, probe_cost=cost)
  with open(os.path.join(workdir, FIT_FILE), "w") as f:
    json.dump(out, f, indent=1)
  return out


def main(argv: Sequence[str]) -> None:
  from absl import app
  from absl import flags
  from ml_collections import config_flags
  from absl import logging
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # orbax logs every save at INFO
  from andrea_jax import train
  from andrea_jax.checkpoint import CheckpointError
  from andrea_jax.data import DataError
  config_flag = flags.FLAGS["config"]
  config_file = config_flags.get_config_filename(config_flag)
  FLAGS = flags.FLAGS
  try:
    if FLAGS.method == "influence":
      out = fit_influence(config_flag.value, FLAGS.workdir, at=[float(f) for f in FLAGS.at],
                          batches=FLAGS.batches, iters=FLAGS.cg_iters, gn_rows=FLAGS.gn_rows,
                          source_batch=FLAGS.source_batch,
                          lam=FLAGS.lam, hold=FLAGS.hold, power=FLAGS.power,
                          config_file=config_file, target=load_config_file(config_file))
    else:
      out = fit(config_flag.value, FLAGS.workdir, ratio=FLAGS.ratio, lam=FLAGS.lam,
                hold=FLAGS.hold, stop=FLAGS.stop, late=FLAGS.late, probes=FLAGS.probes,
                power=FLAGS.power, config_file=config_file, target=load_config_file(config_file))
  except (ValueError, TypeError, DataError, CheckpointError, train.TrainingHalted) as e:
    # Bad input or a halted probe: the message names the field, file or step (finished probes
    # are kept and reused by the next run of the command).
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  width = max(map(len, out["sources"]))
  print(f"{'source':{width}s}  b (nats per unit of ln share)  R^2    mixture")
  r2s = out.get("r2") or [None] * len(out["b"])      # the pilot's estimate has no R^2
  for s, b, r2, w in zip(out["sources"], out["b"], r2s, out["mixture"]):
    print(f"{s:{width}s}  {b:+29.3f}  {'—' if r2 is None else f'{r2:.2f}':5s}  {w:.3f}")
  print(f"\nwrote {os.path.join(flags.FLAGS.workdir, FIT_FILE)}; train with it:\n  python -m "
        f"andrea_jax.main --config=study/mixing/proxy_config.py:{flags.FLAGS.workdir} --workdir=<dir>")


def run() -> None:
  from absl import app
  from absl import flags
  from ml_collections import config_flags
  config_flags.DEFINE_config_file("config", None, "the run's config file (experiments/*.py); "
                                  "override its model here to make the small proxy (the target "
                                  "is the file's own config: the probes' cost is counted in its "
                                  "runs)", lock_config=True)
  from andrea_jax.data import formats   # --config.data.files.<source>.format, as for a run
  formats.switch_on_parse(flags.FLAGS["config"])
  flags.DEFINE_string("workdir", None, "directory for the probes and proxy_fit.json")
  flags.DEFINE_float("ratio", 4.0, "a high source's share over a low one's in each probe")
  flags.DEFINE_float("lam", 1.0, "the fitted mixture's weight; 1 - lam stays uniform")
  flags.DEFINE_float("power", 1.5, "the mixture proportional to max(b, 0.02) ** power: > 1 "
                     "sharpens it toward the high-b sources, 1 is the plain fit "
                     "(study/mixing/LOG.md, 'A sharper mixture')")
  flags.DEFINE_float("hold", 0.5, "fraction of the target run under the mixture, uniform after")
  flags.DEFINE_float("stop", 0.5, "fraction of train.num_steps each probe runs (train.stop_step: "
                     "the learning-rate schedule still the whole run's)")
  flags.DEFINE_float("late", 0.25, "fraction of the probes' last steps (of those they ran) whose "
                     "losses are fitted")
  flags.DEFINE_enum("probes", "static", ["static", "schedule"], "static: each probe holds its "
                    "mixture throughout; schedule: for the first --hold of the run, then uniform "
                    "(fitted after the switch: needs --stop 1, say, with --hold 0.5)")
  flags.DEFINE_enum("method", "probes", ["probes", "influence"], "probes: the designed probe "
                    "runs; influence: one uniform pilot run, its truncated-horizon influence "
                    "measured late in its first half (study.mixing.influence)")
  flags.DEFINE_list("at", [str(f) for f in PILOT_AT], "influence: the measured steps, as "
                    "fractions of train.num_steps")
  flags.DEFINE_integer("batches", 4, "influence: the batches each measurement reads")
  flags.DEFINE_integer("cg_iters", 10, "influence: conjugate-gradient iterations per source")
  flags.DEFINE_integer("gn_rows", None, "influence: the rows the Gauss-Newton matrix is read on "
                       "(default: one batch, the measured step's own; 0: all the measurement's "
                       "rows)")
  flags.DEFINE_integer("source_batch", None, "influence: the sources' solves run at once "
                       "(default all; fewer on a large model, for memory)")
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)


if __name__ == "__main__":
  run()

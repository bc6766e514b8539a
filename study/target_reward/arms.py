r"""The study's runs, one config file: ``arm=<name>,seed=<int>,steps=<int>,width=<1|2>``.

  python -m andrea_jax.main --config=study/target_reward/arms.py:arm=andrea_gain,seed=0 \
      --workdir=runs/target_reward/andrea_gain/s0

Every run is the demo (``experiments/tiny.py``: the ``stdlib`` corpus, the 0.9M-parameter model,
1000 steps of 32 x 128 tokens, its optimizer) with one thing changed: the mixture. The protocol
(:data:`ARMS`, :data:`GRID`, :data:`SEEDS`, the lengths and the scoring in ``run.py``) was fixed
before any of the study's runs. The score is ``eval/target_loss`` at the last step: the held-out
loss on the corpus's declared target (docstrings, reference and notes, equally), on 32 windows per
source (the demo evaluates 8; more windows, less noise, the same for every arm).

``steps`` changes the run's length with its schedules (the warmup stays 20 steps, the cosine decay
spans the run); ANDREA's geometries keep their fractions of the run. ``width=2`` doubles the model's
width (d_model 256, MLP 1024, 4 heads of 64) for the larger-scale repeat.
"""

from __future__ import annotations

import pathlib

import numpy as np

from andrea_jax import curriculum
from andrea_jax.config import load_config_file
from andrea_jax.data.corpora.stdlib import STDLIB_SOURCES, STDLIB_TARGET

DEMO = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "tiny.py"
TARGET = tuple(STDLIB_TARGET)            # docstrings, reference, notes
OTHERS = tuple(s for s in STDLIB_SOURCES if s not in TARGET)   # python-code, licenses, noisy
GAIN_EVERY = 4                           # probes.target_gain.every of the gain-rewarded walk

# name -> what the arm is (its mixture); every arm is scored on 3 seeds at 1000 steps.
ARMS = {
    "andrea": "ANDREA's curriculum as the demo runs it: three geometries, random and bandit "
              "phases, the bandit rewarded by learning progress",
    "andrea_gain": "the same walk and geometries, the bandit rewarded by target gain "
                   f"(measured every {GAIN_EVERY} steps)",
    "geometry_static": "the same three geometries, each held at its uniform mixture",
    "uniform": "uniform over the six sources, the whole run",
    "target_only": "the target's three sources alone, uniform",
    "proportional": "the sources in proportion to their training tokens",
    "best_static": "the best of GRID at the selection seed (a fixed mixture, the whole run)",
}
# A small grid of fixed mixtures over (target sources, others), chosen before any run: the target's
# three sources equally, the rest as given. The best at SELECTION_SEED is the arm best_static.
GRID = {
    "t75_rest": (0.75, {"python-code": 1, "licenses": 1, "noisy-docstrings": 1}),
    "t90_rest": (0.90, {"python-code": 1, "licenses": 1, "noisy-docstrings": 1}),
    "t75_code": (0.75, {"python-code": 1}),
    "t60_code": (0.60, {"python-code": 1}),
}
SEEDS = (0, 1, 2)
SELECTION_SEED = 100
LENGTHS = (1.0, 1.25, 1.5, 2.0)          # the equal-compute baselines' own run lengths
BASELINES = ("uniform", "target_only")   # run at every length of LENGTHS
STEPS = 1000


def grid_mixture(name: str) -> dict[str, float]:
  """The mixture of grid point ``name``: source -> weight, summing to 1."""
  share, rest = GRID[name]
  out = {s: share / len(TARGET) for s in TARGET}
  total = sum(rest.values())
  out.update({s: (1 - share) * w / total for s, w in rest.items()})
  return out


def proportional_mixture(config) -> dict[str, float]:
  """Each source's share of the training tokens of the corpus ``config`` trains on."""
  from andrea_jax import data as data_lib
  data = data_lib.open_training_data(data_lib.data_spec(config.data, config.sources),
                                     progress=False)
  tokens = {s: data.num_tokens(s, "train") for s in config.sources}
  total = sum(tokens.values())
  return {s: n / total for s, n in tokens.items()}


def _hold(c, mixture: dict[str, float], only: tuple[str, ...] | None = None) -> None:
  """One full-simplex geometry (or ``only`` those sources) holding ``mixture`` the whole run."""
  import ml_collections
  g = ml_collections.ConfigDict()
  g.all = curriculum.geometry("all", 0, only=only, sources=c.sources)
  c.curriculum.geometries = g
  curriculum.set_mixer(c, "static", mixture=[mixture.get(s, 0.0) for s in c.sources])


def _parse(arg: str) -> dict[str, str]:
  out = dict(part.split("=", 1) for part in arg.split(",") if part)
  unknown = set(out) - {"arm", "seed", "steps", "width", "grid"}
  if unknown or ("arm" in out) == ("grid" in out):
    raise ValueError(f"study/target_reward/arms.py takes arm=<{'|'.join(ARMS)}> (or "
                     f"grid=<{'|'.join(GRID)}>),seed=<int>,steps=<int>,width=<1|2>; got {arg!r}")
  return out


def get_config(arg: str = "arm=andrea"):
  args = _parse(arg)
  c = load_config_file(DEMO)
  steps = int(args.get("steps", STEPS))
  with c.unlocked():
    c.seed = int(args.get("seed", 0))
    c.train.update(num_steps=steps, plot=False, progress_bar=False, tensorboard=False,
                   checkpoint_every=0)
    c.eval.update(every=steps, sequences_per_source=32)
    # ANDREA's geometries at their fractions of this run's length (the demo's are laid out for
    # 1000 steps; a longer run keeps the same shape).
    for name in c.curriculum.geometries:
      start = c.curriculum.geometries[name].start_step
      c.curriculum.geometries[name].start_step = round(start * steps / STEPS)
    if args.get("width", "1") == "2":
      c.model.update(d_model=256, d_mlp=1024, num_heads=4)
  arm = args.get("arm")
  if arm is None:
    _hold(c, grid_mixture(args["grid"]))
  elif arm == "andrea_gain":
    c.probes.target_gain.every = GAIN_EVERY
    curriculum.set_mixer(c, "andrea", reward="target_gain")
  elif arm == "geometry_static":
    curriculum.set_mixer(c, "static")
  elif arm == "uniform":
    _hold(c, {s: 1.0 for s in c.sources})
  elif arm == "target_only":
    _hold(c, {s: 1.0 for s in TARGET}, only=TARGET)
  elif arm == "proportional":
    _hold(c, proportional_mixture(c))
  elif arm == "best_static":
    from study.target_reward import run
    _hold(c, grid_mixture(run.selected_grid_point()))
  elif arm != "andrea":
    raise ValueError(f"unknown arm {arm!r}; arms are: {', '.join(ARMS)}")
  return c


def mixture_of(c) -> np.ndarray | None:
  """The fixed mixture a config holds (``None`` for a walk), in source order (for the report)."""
  if c.curriculum.mixer.name != "static" or len(c.curriculum.geometries) != 1:
    return None
  w = np.array([c.curriculum.mixer.mixture[curriculum.source_key(s)] for s in c.sources])
  return w / w.sum()

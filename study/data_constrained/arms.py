r"""The study's runs, one config file: ``arm=<name>,seed=<int>,steps=<int>[,target=8k]``.

  python -m study.data_constrained.prep --out runs/data_constrained/pieces      # once
  python -m andrea_jax.main --config=study/data_constrained/arms.py:arm=walk_gain,seed=0 \
      --workdir=runs/data_constrained/armwalk_gain_seed0

Every run is the demo (``experiments/tiny.py``: the 0.9M-parameter byte model, 1000 steps of
32 x 128 tokens, AdamW 2e-3 with a 20-step warmup and cosine decay to 10%, weight decay 0.1) with
its sources and its mixture changed. The sources are the pieces ``prep.py`` cuts from the
``stdlib`` corpus, read as files (:func:`set_files`, the one place that writes ``data.files``):
five trainable, :data:`TRAINABLE` (T = ``doc-small``, the small target; N, R, C, L), on one
full-simplex geometry, and two never trained on (``eval.untrained``): ``doc-dev``, the declared
target (``eval.target``; its training split, dev-A, gives the target gain's target rows; its
held-out split, dev-B, is ``eval/target_loss``, the selection metric :data:`SELECT_KEY`), and
``doc-test``, whose held-out loss is the score (:data:`SCORE_KEY`).

Arms (:data:`ARMS`), and the pilot's mixtures named by :func:`static_name` (``t40_nrcl``: 40% on
T, the rest equally on N, R, C, L; ``late_t40_nr``: a two-phase schedule, see
:func:`schedule_mixtures`). ``best_static`` and ``best_schedule`` are the pilot's picks, resolved
from the pilot's runs by ``score.py``'s rules. ``steps`` changes the run's length with its schedules
(the warmup stays 20 steps, the cosine spans the run; a schedule's switch stays at 60%).
``target=8k`` reads the regime check's fallback pieces (doc-small about 8K tokens).
"""

from __future__ import annotations

import os
import pathlib
import re

import ml_collections

from andrea_jax import curriculum
from andrea_jax.config import load_config_file, with_sources
from andrea_jax.sources import source_key

REPO = pathlib.Path(__file__).resolve().parents[2]
DEMO = REPO / "experiments" / "tiny.py"
PIECES = {"32k": os.environ.get("DATA_CONSTRAINED_PIECES",
                                str(REPO / "runs" / "data_constrained" / "pieces")),
          "8k": os.environ.get("DATA_CONSTRAINED_PIECES_8K",
                               str(REPO / "runs" / "data_constrained" / "pieces-8k"))}
"""Where ``prep.py`` wrote the pieces, per target size (``--out``; ``--target-tokens 8000``)."""

TARGET, DEV, TEST = "doc-small", "doc-dev", "doc-test"
TRAINABLE = (TARGET, "noisy-docstrings", "reference", "python-code", "licenses")
UNTRAINED = (DEV, TEST)
SOURCES = TRAINABLE + UNTRAINED
LETTERS = {"n": "noisy-docstrings", "r": "reference", "c": "python-code", "l": "licenses"}
SCORE_KEY = "eval/loss/doc-test"     # the score, and nothing else
SELECT_KEY = "eval/target_loss"      # dev-B: the pilot's picks

STEPS = 1000
EVAL_EVERY = 250
# Held-out windows per source (the demo evaluates 8): 256 windows of 129 tokens spread evenly over
# doc-test's 95K held-out tokens read a third of them, and cover dev-B's 16K twice over.
EVAL_WINDOWS = 256
GAIN = {"every": 4, "rows_per_source": 2, "target_rows": 8, "precondition": True,
        "target_split": "train"}
"""``probes.target_gain`` of the arms that read the gain (the design's, not tuned)."""
SCHEDULE_SWITCH = 0.6                # a schedule's second phase starts at 60% of the run
UNIMAX_EPOCHS = 16                   # UniMax's cap (Muennighoff et al.'s ~16-epoch knee)

ARMS = {
    "walk_gain": "ANDREA's walk (defaults), the bandit rewarded by the target gain toward dev-A",
    "best_static": "the pilot's pick of a fixed mixture (by dev-B at the selection seed)",
    "best_schedule": "the pilot's pick of two two-phase schedules built from best_static",
    "target_only": "doc-small alone",
    "uniform": "the five trainable sources equally",
    "unimax16": f"UniMax: equal token budgets capped at {UNIMAX_EPOCHS} epochs per source",
    "exp3": "the project's ODM (EXP3 on the training loss), defaults",
    "walk_progress": "ANDREA's walk with its shipped reward, learning progress",
    "dga": "multiplicative weights on the target gains (study.data_constrained.mixers:dga)",
    "target_only_dev": "doc-small and all of doc-dev trained on (the piece doc-plus-dev)",
}
GAIN_ARMS = ("walk_gain", "dga")
_STATIC = re.compile(r"(?:(late|early)_)?t(\d{2,3})_([nrcl]*)")


def static_name(share: float, rest: str, kind: str | None = None) -> str:
  """The name of a pilot mixture: ``t40_nrcl`` (T at 40%, the rest equally over N, R, C, L), or
  with ``kind`` (``"late"``, ``"early"``) its schedule."""
  name = f"t{round(share * 100):02d}_{rest}"
  return f"{kind}_{name}" if kind else name


def static_mixture(share: float, rest: str) -> dict[str, float]:
  """T at ``share``, ``1 - share`` equally over the sources ``rest`` letters name."""
  if not rest and share < 1:
    raise ValueError(f"a mixture of T at {share} names no other source")
  out = {TARGET: share}
  out.update({LETTERS[x]: (1 - share) / len(rest) for x in rest})
  return out


def schedule_mixtures(share: float, rest: str, kind: str) -> tuple[dict, dict]:
  """The two phases of a schedule from a fixed mixture (T at ``share``, ``rest``): ``"late"`` is
  T at ``share / 2`` for the first 60% of the run, then at ``min(2 share, 1)``; ``"early"`` the
  reverse. The rest keeps its composition."""
  low = static_mixture(share / 2, rest)
  high = {TARGET: 1.0} if 2 * share >= 1 else static_mixture(2 * share, rest)
  return (low, high) if kind == "late" else (high, low)


def unimax_mixture(tokens: dict[str, int], budget: float, max_epochs: float) -> dict[str, float]:
  """UniMax (Chung et al., 2023): the budget spread equally over the sources, none past
  ``max_epochs`` epochs of its tokens; what a capped source leaves goes equally to the others.

  Example (the design's numbers): T 32K, L 39K, R 436K, N 1.5M, C 7.6M tokens, budget 4.096M,
  16 epochs: T 512K (12.5%), L 623K (15.2%), R, N, C 987K each (24.1%).
  """
  left, out = float(budget), {}
  todo = sorted(tokens, key=tokens.get)
  while todo:
    share = left / len(todo)
    s = todo.pop(0)
    out[s] = min(share, max_epochs * tokens[s])
    left -= out[s]
  return {s: out[s] / budget for s in tokens}


def set_files(c: ml_collections.ConfigDict, pieces_dir: str, renames: dict[str, str] | None = None
              ) -> None:
  """Every source of ``c`` read from ``pieces_dir/<piece>.jsonl`` with the piece's held-out share:
  the one function that writes ``c.data.files`` (the data section's shape may change)."""
  from study.data_constrained import prep
  renames = renames or {}
  c.data.corpus = "files"
  for s in c.sources:
    piece = renames.get(s, s)
    f = c.data.files[source_key(s)]
    f.paths = os.path.join(pieces_dir, f"{piece}.jsonl")
    f.format = "jsonl"
    f.eval_fraction = prep.EVAL_FRACTION[piece]


def piece_tokens(pieces_dir: str) -> dict[str, int]:
  """Training tokens per piece, from the manifest ``prep.py`` wrote."""
  import json
  from study.data_constrained import prep
  path = os.path.join(pieces_dir, prep.MANIFEST)
  if not os.path.exists(path):
    raise FileNotFoundError(f"no pieces at {pieces_dir}: python -m study.data_constrained.prep "
                            f"--out {pieces_dir}")
  return {r["source"]: r["train_tokens"] for r in json.load(open(path))["pieces"]}


def _parse(arg: str) -> dict[str, str]:
  out = dict(part.split("=", 1) for part in arg.split(",") if part)
  if set(out) - {"arm", "seed", "steps", "target"} or "arm" not in out:
    raise ValueError("study/data_constrained/arms.py takes arm=<name>,seed=<int>,steps=<int>"
                     f"[,target=8k]; arms are {', '.join(ARMS)} or a pilot mixture such as "
                     f"t40_nrcl, late_t40_nr; got {arg!r}")
  if out.get("target", "32k") not in PIECES:
    raise ValueError(f"target= takes {' or '.join(PIECES)}, got {out['target']!r}")
  return out


def _hold(c, mixture: dict[str, float]) -> None:
  curriculum.set_mixer(c, "static", mixture=[mixture.get(s, 0.0) for s in c.sources])


def _schedule(c, first: dict[str, float], second: dict[str, float], steps: int) -> None:
  g = ml_collections.ConfigDict()
  g.first = curriculum.geometry("first", 0, sources=c.sources, mixture=_full(first, c.sources))
  g.second = curriculum.geometry("second", round(SCHEDULE_SWITCH * steps), sources=c.sources,
                                 mixture=_full(second, c.sources))
  c.curriculum.geometries = g
  curriculum.set_mixer(c, "static")


def _full(mixture: dict[str, float], sources) -> dict[str, float]:
  return {s: mixture.get(s, 0.0) for s in sources}


def base(steps: int = STEPS, seed: int = 0, target: str = "32k",
         sources: tuple[str, ...] = SOURCES, renames: dict[str, str] | None = None):
  """The demo over the study's sources, before any arm's mixture: the full simplex over the
  trainable ones, ``doc-dev`` and ``doc-test`` evaluated only, ``doc-dev`` the target."""
  c = with_sources(load_config_file(DEMO), sources)
  with c.unlocked():
    c.seed = seed
    set_files(c, PIECES[target], renames)
    c.train.update(num_steps=steps, plot=False, progress_bar=False, tensorboard=False,
                   checkpoint_every=EVAL_EVERY)
    c.eval.update(every=EVAL_EVERY, sequences_per_source=EVAL_WINDOWS,
                  untrained=",".join(UNTRAINED))
    for s in c.eval.target:
      c.eval.target[s] = 0.0
    c.eval.target[source_key(DEV)] = 1.0
    c.eval.prompts = ("The ", "Return the ")
    c.cliff.respond = False       # pinned: memorising doc-small may look like a cliff; logged only
  return c


def get_config(arg: str = "arm=uniform"):
  args = _parse(arg)
  arm, steps = args["arm"], int(args.get("steps", STEPS))
  seed, target = int(args.get("seed", 0)), args.get("target", "32k")
  if arm == "target_only_dev":
    c = base(steps, seed, target, renames={TARGET: "doc-plus-dev"})
    _hold(c, {TARGET: 1.0})
    return c
  c = base(steps, seed, target)
  if arm in ("best_static", "best_schedule"):
    from study.data_constrained import score
    arm = score.pilot_pick(arm, target, score.ROOT)
  if arm in GAIN_ARMS:
    c.probes.target_gain.update(GAIN)
  if arm == "walk_gain":
    curriculum.set_mixer(c, "andrea", reward="target_gain")
  elif arm == "walk_progress":
    curriculum.set_mixer(c, "andrea")
  elif arm == "exp3":
    curriculum.set_mixer(c, "exp3")
  elif arm == "dga":
    curriculum.set_mixer(c, "study.data_constrained.mixers:dga")
  elif arm == "uniform":
    _hold(c, {s: 1.0 for s in TRAINABLE})
  elif arm == "target_only":
    _hold(c, {TARGET: 1.0})
  elif arm == "unimax16":
    tokens = piece_tokens(PIECES[target])
    budget = steps * c.data.global_batch_size * c.data.seq_len
    _hold(c, unimax_mixture({s: tokens[s] for s in TRAINABLE}, budget, UNIMAX_EPOCHS))
  elif (m := _STATIC.fullmatch(arm)) is not None:
    kind, share, rest = m.group(1), int(m.group(2)) / 100, m.group(3)
    if kind is None:
      _hold(c, static_mixture(share, rest))
    else:
      _schedule(c, *schedule_mixtures(share, rest, kind), steps)
  else:
    raise ValueError(f"unknown arm {arm!r}; arms are {', '.join(ARMS)} or a pilot mixture such "
                     "as t40_nrcl, late_t40_nr")
  return c

r"""The study's figures, from the runs' logs (small PNGs under ``figures/``).

  python -m study.data_constrained.run --figures

* ``mixture_paths.png``: the mixture over the run (``weight/<source>``, stacked) of the online
  arms (``walk_gain``, ``dga``, ``exp3``, ``walk_progress``), seed 0;
* ``gains.png``: ``walk_gain``'s per-source target gains over the run (seed 0, a running mean),
  and doc-small's training loss beside doc-test's held-out loss for the arms that train most on
  it: memorisation as a widening gap;
* ``scores.png``: ``eval/loss/doc-test`` at each evaluation, mean over seeds, per arm.
"""

from __future__ import annotations

import os

import numpy as np

from study.data_constrained import arms, report, score

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures")
ONLINE = ("walk_gain", "dga", "exp3", "walk_progress")
COLORS = dict(zip(arms.TRAINABLE, ("#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#7f7f7f")))


def _plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _save(plt, fig, out: str, name: str) -> str:
  fig.tight_layout()
  path = os.path.join(out, name)
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def _series(recs: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  got = [(r["step"], r[key]) for r in recs if key in r]
  return (np.array([g[0] for g in got]), np.array([g[1] for g in got])) if got else (
      np.array([]), np.array([]))


def _running_mean(x: np.ndarray, n: int) -> np.ndarray:
  if x.size < n:
    return x
  c = np.cumsum(np.insert(x, 0, 0.0))
  return np.concatenate([c[1:n] / np.arange(1, n), (c[n:] - c[:-n]) / n])


def mixture_paths(root: str, target: str, out: str) -> str | None:
  plt = _plt()
  got = [(a, score.records({"arm": a, "seed": 0, "target": target}, root)) for a in ONLINE]
  got = [(a, r) for a, r in got if r]
  if not got:
    return None
  fig, axes = plt.subplots(1, len(got), figsize=(3.2 * len(got), 2.6), sharey=True, squeeze=False)
  for ax, (a, recs) in zip(axes[0], got):
    steps = [r["step"] for r in recs if "weight/doc-small" in r]
    w = np.array([[r[f"weight/{s}"] for s in arms.TRAINABLE] for r in recs
                  if "weight/doc-small" in r]).T
    ax.stackplot(steps, w, colors=[COLORS[s] for s in arms.TRAINABLE], labels=arms.TRAINABLE)
    ax.set_title(a, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
  axes[0][0].set_ylabel("mixture", fontsize=8)
  axes[0][-1].legend(fontsize=6, loc="lower right")
  return _save(plt, fig, out, "mixture_paths.png")


def gains(root: str, target: str, out: str) -> str | None:
  plt = _plt()
  recs = score.records({"arm": "walk_gain", "seed": 0, "target": target}, root)
  if not recs:
    return None
  fig, (ax, bx) = plt.subplots(1, 2, figsize=(8, 2.8))
  for s in arms.TRAINABLE:
    x, y = _series(recs, f"target_gain/{s}")
    if x.size:
      ax.plot(x, _running_mean(y, 5), color=COLORS[s], lw=1, label=s)
  ax.axhline(0, color="k", lw=0.5)
  ax.set_yscale("symlog", linthresh=1.0)
  ax.set_title("walk_gain, seed 0: target gain per source (running mean of 5)", fontsize=8)
  ax.set_xlabel("step", fontsize=8)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=6)
  for a, style in (("target_only", "-"), ("best_static", "--"), ("walk_gain", ":")):
    r = score.records({"arm": a, "seed": 0, "target": target}, root)
    x, y = _series(r, "loss/doc-small")
    if x.size:
      bx.plot(x, _running_mean(y, 10), "k" + style, lw=0.8, label=f"{a}: doc-small, train")
      ex, ey = _series(r, arms.SCORE_KEY)
      bx.plot(ex, ey, "o" + style, color="#d62728", ms=3, lw=0.8, label=f"{a}: doc-test")
  bx.set_title("doc-small's training loss and doc-test's held-out loss, seed 0", fontsize=8)
  bx.set_xlabel("step", fontsize=8)
  bx.set_ylim(0, 3.5)
  bx.legend(fontsize=5)
  for x in (ax, bx):
    x.tick_params(labelsize=7)
  return _save(plt, fig, out, "gains.png")


def scores(root: str, target: str, out: str) -> str | None:
  plt = _plt()
  fig, ax = plt.subplots(figsize=(5, 3))
  drawn = False
  for a in arms.ARMS:
    runs = report.finished(a, target, root)
    curves = [_series(score.records({"arm": a, "seed": s, "target": target}, root),
                      arms.SCORE_KEY) for s, _ in runs]
    if not curves:
      continue
    n = min(len(c[0]) for c in curves)
    ax.plot(curves[0][0][-n:], np.mean([c[1][-n:] for c in curves], axis=0), marker="o", ms=2,
            lw=0.8, label=f"{a} ({len(curves)})")
    drawn = True
  if not drawn:
    plt.close(fig)
    return None
  ax.set_xlabel("step", fontsize=8)
  ax.set_ylabel(arms.SCORE_KEY, fontsize=8)
  ax.tick_params(labelsize=7)
  ax.legend(fontsize=6)
  return _save(plt, fig, out, "scores.png")


def make_all(root: str = score.ROOT, out: str = OUT) -> list[str]:
  target = score.regime(root)
  if target in (None, "none"):
    return []
  os.makedirs(out, exist_ok=True)
  return [p for p in (mixture_paths(root, target, out), gains(root, target, out),
                      scores(root, target, out)) if p]

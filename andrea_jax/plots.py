"""The end-of-run summary figure, drawn from ``metrics.jsonl``.

Three panels: the training loss with the held-out mean loss; the per-source training loss; the mixture
weights as stacked areas with the curriculum's regimes (geometries) marked.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from andrea_jax import logs


def _series(records, key):
  pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
  return (np.array([p[0] for p in pts]), np.array([p[1] for p in pts], np.float64)) if pts else None


def summary_plot(workdir: str, sources: Sequence[str],
                 regimes: Sequence[tuple[int, str]] = (), path: str | None = None) -> str:
  """Write ``summary.png`` (or ``path``) for the run in ``workdir``; returns the file's path.

  ``regimes`` is a list of ``(start_step, name)``, drawn as vertical lines with labels.
  """
  import matplotlib.pyplot as plt
  fig = summary_figure(workdir, sources, regimes)
  path = path or os.path.join(workdir, "summary.png")
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def summary_figure(workdir: str, sources: Sequence[str],
                   regimes: Sequence[tuple[int, str]] = ()):
  """The figure :func:`summary_plot` saves (a ``matplotlib.figure.Figure``), each source's curves
  labelled with its name."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = logs.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  train = [r for r in records if "loss" in r]
  evals = [r for r in records if "eval/mean_loss" in r]
  fig, axes = plt.subplots(3, 1, figsize=(10, 11), sharex=True)
  cmap = plt.get_cmap("tab20")
  colours = [cmap(i % 20) for i in range(len(sources))]

  ax = axes[0]
  s = _series(train, "loss")
  if s is not None:
    ax.plot(*s, lw=1, label="training loss")
  s = _series(evals, "eval/mean_loss")
  if s is not None:
    ax.plot(*s, "o-", lw=1.5, label="held-out loss (mean over sources)")
  ax.set_ylabel("loss (nats/token)")
  ax.legend(loc="upper right")
  ax.set_title("ANDREA training summary")

  ax = axes[1]
  for name, c in zip(sources, colours):
    s = _series(train, f"loss/{name}")
    if s is not None:
      ax.plot(*s, lw=0.8, color=c, label=name)
  ax.set_ylabel("per-source training loss")
  ax.legend(loc="upper right", fontsize=6, ncol=4)

  ax = axes[2]
  steps = np.array([r["step"] for r in train])
  if len(steps):
    w = np.array([[r.get(f"weight/{n}", 0.0) for n in sources] for r in train]).T
    ax.stackplot(steps, w, colors=colours, labels=sources, linewidth=0)
  ax.set_ylim(0, 1)
  ax.set_ylabel("mixture weights")
  ax.set_xlabel("step")
  ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=6)
  for start, name in regimes:
    for a in axes:
      a.axvline(start, color="k", ls="--", lw=0.8)
    axes[0].annotate(name, (start, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                     va="top", ha="right", fontsize=8)
  fig.tight_layout()
  return fig

r"""The study's report, from what has run: the pilot, the scoreboard, the comparisons the verdict
reads, the verdict, the equal-compute curves, and what to read beside the score.

  python -m study.data_constrained.run --report

Every number is read from the runs' ``metrics.jsonl`` by :mod:`study.data_constrained.score`'s
rules; nothing here decides anything.
"""

from __future__ import annotations

import numpy as np

from study.data_constrained import arms, score

# The comparisons the verdict reads (a, b: "a beats b"), and the secondary readings.
PAIRS = (("walk_gain", "best_static"), ("walk_gain", "target_only"),
         ("best_schedule", "walk_gain"), ("best_static", "walk_gain"),
         ("best_schedule", "best_static"), ("best_static", "target_only"),
         ("walk_gain", "uniform"), ("walk_gain", "unimax16"),
         ("walk_gain", "dga"), ("dga", "walk_gain"), ("walk_gain", "walk_progress"),
         ("exp3", "walk_gain"), ("walk_gain", "exp3"), ("target_only_dev", "target_only"),
         ("target_only_dev", "best_static"))
GAP_WINDOW = 100    # steps before the end over which doc-small's training loss is averaged


def finished(arm: str, target: str, root: str, steps: int = arms.STEPS) -> list[tuple[int, dict]]:
  """``(seed, final record)`` of the arm's finished runs."""
  out = []
  for s in score.seeds_of(arm):
    r = score.result({"arm": arm, "seed": s, "steps": steps, "target": target}, root)
    if r is not None:
      out.append((s, r))
  return out


def scores(target: str, root: str) -> dict[str, list[float]]:
  return {a: [r[arms.SCORE_KEY] for _, r in finished(a, target, root)] for a in arms.ARMS}


def beside(arm: str, target: str, root: str) -> dict | None:
  """What to read beside the score, mean over the arm's finished seeds: final epochs per
  trainable source, the run's mean mixture, doc-small's train-minus-held-out gap at the end
  (its training loss over the last :data:`GAP_WINDOW` steps less ``eval/loss/doc-test``), and
  the steps the cliff detector flagged."""
  rows = []
  for s, final in finished(arm, target, root):
    recs = score.records({"arm": arm, "seed": s, "target": target}, root)
    steps = [r for r in recs if "loss" in r and "weight/doc-small" in r]
    last = [r for r in steps if "data/epochs/doc-small" in r][-1]
    train_small = [r["loss/doc-small"] for r in steps
                   if r["step"] >= arms.STEPS - GAP_WINDOW and "loss/doc-small" in r]
    rows.append({
        "epochs": [last.get(f"data/epochs/{x}", 0.0) for x in arms.TRAINABLE],
        "mixture": [np.mean([r[f"weight/{x}"] for r in steps]) for x in arms.TRAINABLE],
        "gap": (np.mean(train_small) - final[arms.SCORE_KEY]) if train_small else np.nan,
        "cliff": sum(1 for r in recs if "cliff/source" in r)})
  if not rows:
    return None
  return {k: np.mean([r[k] for r in rows], axis=0) for k in rows[0]}


def _fmt_worth(w: tuple[float, str] | None) -> str:
  if w is None:
    return ""
  value, rel = w
  return {"=": f"{value:.2f}x", "<": f"<{value:.2f}x", ">": f">{value:.2f}x"}.get(
      rel, f">{value:.2f}x (not reachable)")


def pilot_lines(root: str) -> list[str]:
  lines = []
  for target in ("32k", "8k"):
    names = list(score.GRID)
    pick = score.grid_pick(target, root)
    if pick not in (None, "target_only"):
      names.append(score.informed_name(pick))
      static = score.static_pick(target, root)
      if static is not None:
        names += score.schedule_names(static)
    got = [(n, score.result({"arm": n, "seed": score.SELECTION_SEED, "target": target}, root))
           for n in names]
    if not any(r for _, r in got):
      continue
    lines += [f"\nThe pilot, doc-small {target}, seed {score.SELECTION_SEED} (picked on dev-B; "
              "doc-test shown, never used):\n",
              "| run | dev-B (eval/target_loss) | doc-test |", "| --- | ---: | ---: |"]
    lines += [f"| `{n}` | {r[arms.SELECT_KEY]:.4f} | {r[arms.SCORE_KEY]:.4f} |" if r else
              f"| `{n}` | (not run) | |" for n, r in got]
    lines.append(f"\ngrid pick: {pick}; best_static: {score.static_pick(target, root)}; "
                 f"best_schedule: {score.schedule_pick(target, root)}")
  lines.append(f"regime (pieces the scored runs use): {score.regime(root)}")
  return lines


def report(root: str = score.ROOT) -> str:
  lines = pilot_lines(root)
  target = score.regime(root)
  if target in (None, "none"):
    return "\n".join(lines)
  overhead = score.gain_overhead(root)
  table = scores(target, root)
  curves = {b: score.curve(b, target, root) for b in ("best_static", "uniform")}
  lines += [f"\nScored runs, doc-small {target}, {arms.STEPS} steps; score "
            f"{arms.SCORE_KEY} at the last step (nats/byte), mean and sd over seeds; the target "
            f"gain's FLOPs per step: {overhead:.3f}.\n",
            "| arm | seeds | doc-test | sd | per seed | dev-B | worth in best_static's steps "
            "| worth in uniform's steps |",
            "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
  worths = {}
  for a in sorted((a for a in table if table[a]), key=lambda a: np.mean(table[a])):
    runs = finished(a, target, root)
    mean, sd, n = score.stats(table[a])
    cost = overhead if a in arms.GAIN_ARMS else 0.0
    w = {b: score.worth(mean, c[0], c[1], cost) for b, c in curves.items()}
    worths[a] = w["best_static"]
    lines.append(f"| `{a}` | {n} | {mean:.4f} | {sd:.4f} | "
                 f"{', '.join(f'{r[arms.SCORE_KEY]:.4f}' for _, r in runs)} | "
                 f"{np.mean([r[arms.SELECT_KEY] for _, r in runs]):.4f} | "
                 f"{_fmt_worth(w['best_static'])} | {_fmt_worth(w['uniform'])} |")
  lines += ["\nComparisons (a beats b: mean lower by more than the larger sd; Welch one-sided p "
            "beside, deciding nothing):\n",
            "| a | b | mean a - mean b | larger sd | a beats b | Welch p (a < b) |",
            "| --- | --- | ---: | ---: | --- | ---: |"]
  for a, b in PAIRS:
    if len(table.get(a, ())) and len(table.get(b, ())):
      d = np.mean(table[a]) - np.mean(table[b])
      sd = max(score.stats(table[a])[1], score.stats(table[b])[1])
      p = score.welch_p(table[a], table[b])
      lines.append(f"| `{a}` | `{b}` | {d:+.4f} | {sd:.4f} | {score.beats(table[a], table[b])} | "
                   f"{'' if p is None else f'{p:.3f}'} |")
  v = score.verdict(table, worths.get("walk_gain"), pilot_passed=True)
  lines += [f"\nVerdict: **{v['verdict']}**"] + [f"- {k}: {x}" for k, x in v["conditions"].items()]
  for b, (lengths, means, seeds) in curves.items():
    if lengths:
      lines.append(f"\n{b} on its own schedules (seeds {seeds}): " + ", ".join(
          f"{n} steps {m:.4f}" for n, m in zip(lengths, means)))
  lines += ["\nBeside the score (mean over seeds): epochs of each trainable source at the end, the "
            "run's mean mixture, doc-small's training loss over the last 100 steps minus "
            "doc-test's held-out loss, cliff flags:\n",
            "| arm | epochs T / N / R / C / L | mean mixture T / N / R / C / L | gap "
            "| cliff flags |",
            "| --- | --- | --- | ---: | ---: |"]
  for a in arms.ARMS:
    b = beside(a, target, root)
    if b is not None:
      lines.append(f"| `{a}` | {' / '.join(f'{x:.1f}' for x in b['epochs'])} | "
                   f"{' / '.join(f'{x:.2f}' for x in b['mixture'])} | {b['gap']:+.3f} | "
                   f"{b['cliff']:.1f} |")
  return "\n".join(lines)

"""The prepared GPU check's verdicts and what it prints: the figures of its stages (bench/
device_check.py) read into ``{name: {"value", "target", "pass"}}`` verdicts, and the lines the check
prints when it ends, most important first: the targets (with how far a miss is), the levers, the
curriculum's overhead, the GPU tests, where a step's time goes (the parts), then the tables and the
stages' statuses, and the command that runs what did not finish.
"""

from __future__ import annotations

from bench import curriculum_gpu
from bench import gpu
from bench import gpu_parts

# Seconds: (cap, least worth starting) per stage, on the GPU and in the dry run on a 2-core CPU.
# The targets' rows first: if compiling ANDREA-120M's step takes much over 30 s, the later stages
# do not fit in 8 minutes, and the summary prints the command that runs them.
CAPS = {"env": (45, 10), "install": (45, 10), "bench": (240, 120), "parts": (120, 60),
        "curriculum": (150, 90), "tests": (120, 45), "bench_more": (240, 60)}
DRY_CAPS = {"env": (120, 10), "install": (180, 10), "bench": (900, 60), "parts": (600, 60),
            "curriculum": (600, 60), "tests": (300, 30), "bench_more": (900, 60)}
# Seconds for the whole check: 8 minutes less the margin to stop a stage cleanly (5 s for SIGTERM,
# 5 s after SIGKILL) and to write the summary.
GPU_BUDGET = 460


def _rows(results: dict) -> list[dict]:
  """Every bench row that ran, the bench stage's then bench_more's, each with its ``result``."""
  stages = results["stages"]
  return [row for name in ("bench", "bench_more")
          for row in stages.get(name, {}).get("figures", {}).get("rows", [])]


def summary(results: dict) -> dict:
  """The targets' verdicts from the stages' figures: ``{name: {"value", "target", "pass"}}``, plus
  ``levers`` (bench/gpu.py's :func:`levers` over every row) and ``step_rest_ms`` (the product
  row's step less the sum of the parts, when both ran)."""
  stages = results["stages"]
  bench = stages.get("bench", {}).get("figures", {})
  out = dict(bench.get("verdicts", {}))
  out.pop("best", None)
  out.pop("torch_mode", None)
  rows = _rows(results)
  by = {row["name"]: row["result"] for row in rows}
  if rows:
    out["levers"] = gpu.levers(rows, [row["result"] for row in rows])
  cur = stages.get("curriculum", {}).get("figures", {})
  if cur.get("overhead"):
    out["curriculum_overhead"] = cur["overhead"]
  # The host pipeline: the static run's step (real batches from the sampler) over the bench's
  # packed cuDNN row (the same model and mask, synthetic batches already on the device).
  packed, static = by.get("cudnn-packed", {}), cur.get("runs", {}).get("static", {})
  if packed.get("step_s") and static.get("median_step_s"):
    out["host_pipeline_overhead"] = {"value": static["median_step_s"] / packed["step_s"] - 1,
                                     "target": None, "pass": None}
  tests = stages.get("tests", {})
  out["gpu_tests"] = {"value": tests.get("figures"), "target": "all pass",
                      "pass": None if "status" not in tests else tests["status"] == "ok"}
  parts = stages.get("parts", {}).get("figures", {}).get("parts", {})
  now = [parts.get(p, {}).get("now", {}).get("ms") for p in gpu_parts.PARTS]
  if by.get("cudnn", {}).get("step_s") and None not in now and parts:
    out["step_rest_ms"] = 1e3 * by["cudnn"]["step_s"] - sum(now)
  return out


def _miss(key: str, c: dict, step_s: float | None) -> str:
  """How far a failed target is: short by x% (a floor), over by y points (the overhead's ceiling)."""
  if c.get("pass") is not False or not c.get("value"):
    return ""
  if key == "curriculum_overhead":
    return f" (over by {c['value'] - c['target']:.2%} of a step)"
  short = c["value"] / c["target"] - 1
  text = f" (short by {-short:.1%}"
  if key == "tokens_per_s" and step_s:
    text += f": {1e3 * step_s:.1f} ms a step where {1e3 * step_s * c['value'] / c['target']:.1f} " \
            "would do"
  return text + ")"


def verdict_lines(results: dict) -> list[str]:
  """The verdicts, most important first: targets, levers and flags, curriculum, host, tests."""
  v = results["verdicts"]
  word = lambda p: {True: "PASS", False: "FAIL", None: "n/a "}[p]
  best = next((row["result"] for row in _rows(results)
               if row["name"] == results["stages"].get("bench", {}).get("figures", {}).get(
                   "verdicts", {}).get("best")), {})
  fmt = {"tokens_per_s": lambda x: f"{x:,.0f} tokens/s", "mfu": lambda x: f"{x:.1%} MFU",
         "vs_torch": lambda x: f"{x:.2f}x the PyTorch yardstick",
         "curriculum_overhead": lambda x: f"{x:+.2%} curriculum overhead",
         "host_pipeline_overhead":
             lambda x: f"{x:+.2%} host pipeline (static run / packed row - 1)"}
  target = {"tokens_per_s": f">= {gpu.TARGET_TOKENS:,.0f} (aim {gpu.AIM_TOKENS:,.0f})",
            "mfu": f">= {gpu.TARGET_MFU:.0%} (aim {gpu.AIM_MFU:.0%})",
            "vs_torch": f">= {gpu.TARGET_RATIO}x",
            "curriculum_overhead": f"< {curriculum_gpu.TARGET_OVERHEAD:.0%} of a step",
            "host_pipeline_overhead": "(no target)"}
  lines = ["verdicts" + (" (dry run on the CPU: they check the plumbing, not a speed)"
                         if results["dry"] else "") + ":"]

  def line(key):
    c = v[key]
    shown = fmt[key](c["value"]) if c["value"] is not None else f"{key} n/a"
    return (f"  {word(c['pass']) if c['target'] else 'info'} {shown}  -- target {target[key]}"
            + _miss(key, c, best.get("step_s")))
  lines += [line(k) for k in ("tokens_per_s", "mfu", "vs_torch") if k in v]
  lines += ["  " + x for x in gpu.lever_lines(v.get("levers", {}))]
  lines += [line(k) for k in ("curriculum_overhead", "host_pipeline_overhead") if k in v]
  t = v.get("gpu_tests", {})
  lines.append(f"  {word(t.get('pass'))} GPU tests {t.get('value') or 'n/a'}")
  return lines


def _bench_table(results: dict) -> list[str]:
  rows = _rows(results)
  if not rows:
    return []
  ref = next((row["result"].get("tokens_per_s") for row in rows if row["name"] == "torch"), None)
  lines = [f"{'row':38s} {'tokens/s':>11s} {'MFU':>6s} {'peak GiB':>8s} {'step ms':>8s} "
           f"{'compile':>8s} {'attn':>6s} {'vs torch':>8s}"]
  return lines + [gpu._fmt_row(row["label"], row["result"], ref) for row in rows]


def lines(results: dict) -> list[str]:
  """Everything the check prints when it ends (see the module doc)."""
  out = verdict_lines(results)
  stages = results["stages"]
  parts = stages.get("parts", {}).get("figures", {}).get("parts")
  if parts and "error" not in parts:
    out += ["", "where a step's time goes (python -m bench.gpu --parts):"] + gpu_parts.table(parts)
    rest = results["verdicts"].get("step_rest_ms")
    if rest is not None:
      out.append(f"{'rest of step':14s} {'':>10s} {rest:>8.2f}   (the product row's step less "
                 "the parts: sums, curriculum, detector, less any overlap)")
  table = _bench_table(results)
  if table:
    out += ["", "python -m bench.gpu (ANDREA-120M, bf16, B=64 T=1024; the full table in "
            "bench_gpu.txt):"] + table
  runs = stages.get("curriculum", {}).get("figures", {}).get("runs", {})
  if runs:
    out += ["", "python -m bench.curriculum_gpu: median step " + ", ".join(
        f"{k} {1e3 * r['median_step_s']:.1f} ms" if "median_step_s" in r else f"{k} failed"
        for k, r in runs.items())]
  out += ["", "stage        status      seconds"]
  out += [f"{name:12s} {s['status']:11s} {s['seconds']:7.0f}" for name, s in stages.items()]
  redo = rerun(results)
  if redo:
    out.append(f"\nnot finished; to run it (on the same machine, while it is warm: the XLA cache "
               f"is kept in /tmp):\n  {redo}")
  return out


def rerun(results: dict) -> str | None:
  """The command that runs again the stages that did not finish (skipped, failed, timed out)."""
  redo = [name for name, s in results["stages"].items()
          if s["status"] != "ok" and name not in ("env", "install")]
  if not redo:
    return None
  caps = DRY_CAPS if results["dry"] else CAPS
  budget = min(GPU_BUDGET, 20 + sum(caps[name][0] for name in ("install", *redo)))
  return (f"bash bench/device_check.sh --only={','.join(redo)}"
          + (" --dry" if results["dry"] else f" --budget={budget}"))

"""The prepared GPU check: everything this project must measure on its first GPU, in one command of
at most 8 minutes on one NVIDIA GPU, each stage under its own time cap.

    bash bench/device_check.sh                 # = python3 -m bench.device_check; on the GPU machine
    bash bench/device_check.sh --dry           # CPU, tiny shapes, the same stages and output files
    bash bench/device_check.sh --only=curriculum,bench_more --budget=300   # what did not fit

Before: ``make gpu-wheels`` here fills ``.whl/`` with the wheels that the GPU machine's image lacks
(ml-collections, tensorboardX; under ``.whl/build/``, setuptools, wheel and packaging to build this
package there). The machine has Python 3.12, jax, flax, optax, orbax, torch and no network; the
device tool's call carries ``.whl`` (``carry: [".whl"]``) and runs ``bash bench/device_check.sh``
with a ``timeout_s`` of 540.

Stages, in order (``--only`` picks some; a stage that fails or times out leaves the next ones their
time; the process group of a stage past its cap is killed, so no GPU work outlives it):

1. ``env``: ``python -m bench.device_env`` (the versions, devices, cuDNN), and whether XLA accepts
   the tuned flags (if not, the bench and the curriculum runs take the default ones).
2. ``install``: the carried wheels (``pip install --no-index --no-deps --target``), then this
   package from its source (``--no-deps``: over the machine's own jax, flax, optax, orbax), and an
   import of ``andrea_jax.train`` from the installed copy alone. Every later stage runs the working
   tree (the repository root first on ``PYTHONPATH``, the installed wheels after it).
3. ``tests``: the GPU-only tests: the cuDNN attention against XLA (tests/test_attention.py) and
   inside the bf16 model against float32 (tests/test_gpu.py), the bf16 embedding gradient
   (tests/test_model.py), the unstubbed cuDNN lowering (tests/test_lower_cuda.py).
4. ``bench``: ``python -m bench.gpu`` at B=64, T=1024, 20 timed steps per row: cuDNN and XLA
   attention, plain causal, tuned flags, and the PyTorch yardstick in the same run (the targets).
5. ``curriculum``: ``python -m bench.curriculum_gpu``: two 200-step ANDREA-120M runs by the real
   launcher with the real host sampler, the ANDREA curriculum and the static mixture: the
   curriculum's overhead at GPU speed.
6. ``bench_more``: ``python -m bench.gpu`` again for the other rows: cuDNN packed (the document
   mask, as the curriculum runs train), cuDNN with remat, XLA packed, cuDNN with the default flags.
   The static run's step over the packed cuDNN row's (synthetic batches already on the device) is
   the host pipeline's cost, printed for information.
Rows that would start with under a minute of their stage's cap left are skipped (their line says
so). If compiling ANDREA-120M's step takes much over 40 s, the whole does not fit in 8 minutes: the
summary then prints the command that runs what is left.

Output (``$OUT`` when set, else ``bench/out/device_check``; five files, none in a sub-folder):
``results.json`` (every stage's status, seconds and figures, the versions, and the verdicts),
``check.log`` (this console), ``tests.txt``, ``bench_gpu.txt`` and ``curriculum_gpu.txt`` (the
tables). The last lines printed are the verdicts against the targets:

* ANDREA-120M at B=64, T=1024 on one H100-class GPU: >= 470K tokens/s (40% MFU by 6N + 12 L d T
  FLOPs per token), aiming at 520K (45%);
* >= 1.1x the PyTorch yardstick measured in the same run;
* the curriculum's overhead under 1% of a step.

This check has not run on a GPU yet; ``--dry`` runs it end to end on a CPU
(tests/test_bench_gpu.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from bench import curriculum_gpu
from bench import gpu

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
STAGES = ("env", "install", "tests", "bench", "curriculum", "bench_more")
# Seconds: (cap, least worth starting) per stage, on the GPU and in the dry run on a 2-core CPU. The
# work outgrows 8 minutes if compiling ANDREA-120M's step takes much over 40 s: the stages come in
# the order of what the targets need, and the summary prints the command that reruns the rest.
CAPS = {"env": (45, 10), "install": (45, 10), "tests": (90, 30), "bench": (200, 100),
        "curriculum": (240, 150), "bench_more": (240, 45)}
DRY_CAPS = {"env": (120, 10), "install": (180, 10), "tests": (300, 30), "bench": (600, 60),
            "curriculum": (600, 60), "bench_more": (900, 60)}
OUTPUTS = ("results.json", "check.log", "tests.txt", "bench_gpu.txt", "curriculum_gpu.txt")
# Seconds for the whole check: 8 minutes less the margin to stop a stage cleanly (5 s for SIGTERM,
# 5 s after SIGKILL) and to write the summary.
GPU_BUDGET = 460
BENCH_ROWS = ("cudnn", "torch", "xla")                 # the targets: the best causal row, PyTorch
UNTUNED_ROWS = ("cudnn-default", "torch", "xla-default")   # if this XLA rejects the tuned flags
MORE_ROWS = ("cudnn-packed", "cudnn-remat", "xla-packed", "cudnn-default")
# The GPU-only tests, less the two that compile a whole training step (the bench compiles and runs
# the real one; tests/test_gpu.py::test_train_step_with_cudnn_in_bf16_matches_float32 and
# tests/test_lower_cuda.py stay in the suite for a machine with more time).
GPU_TESTS = ["tests/test_gpu.py::test_cudnn_model_in_bf16_matches_float32_xla",
             "tests/test_gpu.py::test_peak_flops_known_for_this_gpu",
             "tests/test_attention.py::test_cudnn_matches_xla_in_bf16",
             "tests/test_attention.py::test_bf16_inputs_keep_float32_softmax",
             "tests/test_model.py::test_bf16_compute_keeps_float32_params_and_logits",
             "tests/test_model.py::test_bf16_embedding_gradient_is_accumulated_in_float32",
             "tests/test_lower_cuda.py::test_lower_cudnn_attention_for_cuda_without_a_stub"]


class Check:
  """The stages' shared state: output folder, deadline, console log, results."""

  def __init__(self, out: str, dry: bool, budget: float, wheels: str):
    self.out, self.dry, self.wheels = out, dry, wheels
    self.started = time.perf_counter()
    self.budget = budget
    self.caps = DRY_CAPS if dry else CAPS
    self.site = tempfile.mkdtemp(prefix="andrea_site_")
    self.work = tempfile.mkdtemp(prefix="andrea_check_")
    self.results: dict = {"dry": dry, "budget_s": budget, "stages": {}}
    self.tuned_flags = True   # whether XLA accepts bench/gpu.py's tuned flags (the env stage asks)
    self.log = open(os.path.join(out, "check.log"), "a")

  def say(self, text: str) -> None:
    print(text, flush=True)
    self.log.write(text + "\n")
    self.log.flush()

  def close(self) -> None:
    self.log.close()
    shutil.rmtree(self.work, ignore_errors=True)
    shutil.rmtree(self.site, ignore_errors=True)

  def left(self) -> float:
    return self.budget - (time.perf_counter() - self.started) if self.budget else float("inf")

  def env(self, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, self.site] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    # One XLA compilation cache for every stage: a rerun on the same (warm) machine skips compiling.
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(),
                                                             "andrea_device_check_xla_cache"))
    env.setdefault("ANDREA_JAX_CACHE", os.path.join(self.work, "data_cache"))
    if self.dry:
      env["JAX_PLATFORMS"] = "cpu"
    env.update(extra or {})
    return env

  def run(self, cmd: list[str], timeout: float, tee: str | None = None, env: dict | None = None,
          cwd: str = REPO) -> tuple[int | None, str]:
    """Runs ``cmd`` in its own process group, its output streamed to the console, check.log and
    ``tee``; ``(exit code or None if killed at timeout, output)``."""
    self.say("$ " + " ".join(cmd))
    sink = open(os.path.join(self.out, tee), "a") if tee else None
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or self.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    lines: list[str] = []

    def pump():
      for line in proc.stdout:
        lines.append(line)
        self.say(line.rstrip("\n"))
        if sink:
          sink.write(line)
          sink.flush()
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
      code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      code = None
      self.say(f"[timed out after {timeout:.0f} s: stopping its process group]")
      for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
          os.killpg(proc.pid, sig)
        except ProcessLookupError:
          break
        try:
          proc.wait(timeout=grace)
          break
        except subprocess.TimeoutExpired:
          continue
    reader.join(timeout=5)
    if sink:
      sink.close()
    return code, "".join(lines)


# ------------------------------------------------------------------------------------------------
# Stages: each returns (status, figures); status is "ok", "failed" or "timed out".


def stage_env(ck: Check, timeout: float):
  code, text = ck.run([sys.executable, "-m", "bench.device_env"], timeout)
  found = [line[4:] for line in text.splitlines() if line.startswith("ENV ")]
  info = json.loads(found[-1]) if found else {}
  # An XLA that does not know a flag aborts at start-up: ask before the stages use them.
  probe = "import jax; jax.devices(); print('flags accepted')"
  flags_code, flags_text = ck.run([sys.executable, "-c", probe], min(timeout, 60), env=ck.env(
      {"XLA_FLAGS": gpu.FLAG_SETS["tuned"]}))
  ck.tuned_flags = flags_code == 0 and "flags accepted" in flags_text
  info["tuned_flags_accepted"] = ck.tuned_flags
  if not ck.tuned_flags:
    ck.say(f"XLA rejects the tuned flags ({gpu.FLAG_SETS['tuned']}): the bench and the curriculum "
           "runs use the default ones")
  ok = code == 0 and bool(found) and (ck.dry or info.get("backend") == "gpu")
  return ("ok" if ok else "timed out" if code is None else "failed"), info


def _pip(ck: Check, args: list[str], timeout: float, offline: bool = True):
  env = ck.env()
  if offline:   # the same pip here and there: no index, no local links or constraints
    env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
  return ck.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                 "--no-cache-dir", "--disable-pip-version-check", "--target", ck.site]
                + (["--no-index"] if offline else []) + args, timeout, env=env)


def _setuptools_at_hand() -> bool:
  """Whether this interpreter's setuptools reads pyproject.toml's SPDX license (77 or newer)."""
  try:
    import setuptools
  except ImportError:
    return False
  return int(setuptools.__version__.split(".")[0]) >= 77


def _source_copy(ck: Check) -> str:
  """What pip builds this package from, copied out of the working tree (a build leaves build/ and
  *.egg-info/ beside the sources it reads)."""
  src = os.path.join(ck.work, "src")
  shutil.copytree(os.path.join(REPO, "andrea_jax"), os.path.join(src, "andrea_jax"),
                  ignore=shutil.ignore_patterns("__pycache__"))
  for name in ("pyproject.toml", "setup.cfg", "README.md", "LICENSE"):
    shutil.copy(os.path.join(REPO, name), src)
  return src


def stage_install(ck: Check, timeout: float):
  deadline = time.perf_counter() + timeout
  figures: dict = {"site": ck.site}
  wheels = sorted(f for f in os.listdir(ck.wheels) if f.endswith(".whl")) if os.path.isdir(
      ck.wheels) else []
  figures["wheels"] = wheels
  if wheels:
    code, _ = _pip(ck, [os.path.join(ck.wheels, w) for w in wheels], deadline - time.perf_counter())
    if code != 0:
      return ("timed out" if code is None else "failed"), figures
  elif not ck.dry:
    ck.say(f"no wheels in {ck.wheels}: run `make gpu-wheels` before the check and carry .whl")
    return "failed", figures
  # This package from the working tree, over the machine's jax, flax, optax and orbax (--no-deps),
  # built in isolation with the carried setuptools (the machine's own may predate pyproject.toml's
  # license field). A dry run without them builds with the setuptools at hand if it is recent
  # enough, else with one from the package index.
  build = os.path.join(ck.wheels, "build")
  if os.path.isdir(build):
    figures["project_build"], how, offline = "carried setuptools", ["--find-links", build], True
  elif _setuptools_at_hand():
    figures["project_build"], how, offline = "setuptools at hand", ["--no-build-isolation"], True
  else:
    figures["project_build"], how, offline = "setuptools from the index", [], False
  code, _ = _pip(ck, how + [_source_copy(ck)], deadline - time.perf_counter(), offline=offline)
  if code != 0:
    return ("timed out" if code is None else "failed"), figures
  # The installed copy alone (no repository on the path), with the machine's jax, flax, optax and
  # orbax.
  probe = ("import andrea_jax, andrea_jax.train, ml_collections, tensorboardX; "
           "print('installed', andrea_jax.__file__)")
  env = ck.env({"PYTHONPATH": ck.site})
  code, text = ck.run([sys.executable, "-c", probe], deadline - time.perf_counter(), env=env,
                      cwd=ck.work)
  figures["imported_from"] = next((line.split(" ", 1)[1] for line in text.splitlines()
                                   if line.startswith("installed ")), None)
  ok = code == 0 and (figures["imported_from"] or "").startswith(ck.site)
  return ("ok" if ok else "timed out" if code is None else "failed"), figures


def stage_tests(ck: Check, timeout: float):
  code, text = ck.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                       *GPU_TESTS], timeout, tee="tests.txt")
  counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)",
                                             text.splitlines()[-1] if text.strip() else "")}
  status = "timed out" if code is None else "ok" if code == 0 else "failed"
  return status, counts


def _bench(ck: Check, timeout: float, rows: tuple[str, ...], name: str):
  path = os.path.join(ck.work, f"{name}.json")
  cmd = [sys.executable, "-m", "bench.gpu", f"--rows={','.join(rows)}",
         f"--budget={max(timeout - 15, 1):.0f}", "--timeout=180", f"--json={path}"]
  cmd += ["--cpu", "--steps=2"] if ck.dry else ["--steps=20"]
  code, _ = ck.run(cmd, timeout, tee="bench_gpu.txt")
  figures = json.load(open(path)) if os.path.exists(path) else {}
  done = [row for row in figures.get("rows", []) if "tokens_per_s" in row.get("result", {})]
  status = "timed out" if code is None else "ok" if code == 0 and len(done) == len(rows) else \
      "failed"
  return status, figures


def stage_bench(ck: Check, timeout: float):
  return _bench(ck, timeout, BENCH_ROWS if ck.tuned_flags else UNTUNED_ROWS, "bench")


def stage_bench_more(ck: Check, timeout: float):
  return _bench(ck, timeout, MORE_ROWS, "bench_more")


def stage_curriculum(ck: Check, timeout: float):
  path = os.path.join(ck.work, "curriculum_gpu.json")
  cmd = [sys.executable, "-m", "bench.curriculum_gpu", f"--budget={max(timeout - 10, 1):.0f}",
         f"--workdir={os.path.join(ck.work, 'runs')}", f"--json={path}"]
  cmd += ["--cpu", "--steps=20", "--log_every=5"] if ck.dry else []
  cmd += [] if ck.tuned_flags else ["--flags=default"]
  code, _ = ck.run(cmd, timeout, tee="curriculum_gpu.txt")
  figures = json.load(open(path)) if os.path.exists(path) else {}
  shutil.rmtree(os.path.join(ck.work, "runs"), ignore_errors=True)   # checkpoints: GBs on a GPU
  ok = code == 0 and figures.get("overhead", {}).get("value") is not None
  return ("ok" if ok else "timed out" if code is None else "failed"), figures


def stage_timeout(caps: dict, stages: list[str], i: int, left: float) -> float | None:
  """Seconds stage ``stages[i]`` may take: its cap, less the least that each later stage needs;
  ``None`` (skip it) when that is under its own least.

  Example: caps ``{"a": (100, 10), "b": (200, 50)}`` with 120 s left give stage a 70 s."""
  cap, least = caps[stages[i]]
  timeout = min(cap, left - sum(caps[s][1] for s in stages[i + 1:]))
  return timeout if timeout >= least else None


STAGE_FNS = {"env": stage_env, "install": stage_install, "tests": stage_tests,
             "bench": stage_bench, "curriculum": stage_curriculum, "bench_more": stage_bench_more}


# ------------------------------------------------------------------------------------------------
# Verdicts and the summary.


def summary(results: dict) -> dict:
  """The targets' verdicts from the stages' figures: ``{name: {"value", "target", "pass"}}``."""
  stages = results["stages"]
  bench = stages.get("bench", {}).get("figures", {})
  out = dict(bench.get("verdicts", {}))
  out.pop("best", None)
  out.pop("torch_mode", None)
  cur = stages.get("curriculum", {}).get("figures", {})
  if cur.get("overhead"):
    out["curriculum_overhead"] = cur["overhead"]
  # The host pipeline: the static run's step (real batches from the sampler) over the bench's
  # packed cuDNN row (the same model and mask, synthetic batches already on the device).
  rows = bench.get("rows", []) + stages.get("bench_more", {}).get("figures", {}).get("rows", [])
  packed = next((row["result"] for row in rows if row["name"] == "cudnn-packed"), {})
  static = cur.get("runs", {}).get("static", {})
  if packed.get("step_s") and static.get("median_step_s"):
    out["host_pipeline_overhead"] = {"value": static["median_step_s"] / packed["step_s"] - 1,
                                     "target": None, "pass": None}
  tests = stages.get("tests", {})
  out["gpu_tests"] = {"value": tests.get("figures"), "target": "all pass",
                      "pass": None if "status" not in tests else tests["status"] == "ok"}
  return out


def _summary_lines(results: dict) -> list[str]:
  word = lambda p: {True: "PASS", False: "FAIL", None: "n/a "}[p]
  lines = ["", "stage        status      seconds"]
  for name, s in results["stages"].items():
    lines.append(f"{name:12s} {s['status']:11s} {s['seconds']:7.0f}")
  v = results["verdicts"]
  fmt = {"tokens_per_s": lambda x: f"{x:,.0f} tokens/s", "mfu": lambda x: f"{x:.1%} MFU",
         "vs_torch": lambda x: f"{x:.2f}x PyTorch",
         "curriculum_overhead": lambda x: f"{x:+.2%} curriculum overhead",
         "host_pipeline_overhead":
             lambda x: f"{x:+.2%} host pipeline (static run / packed row - 1)"}
  target = {"tokens_per_s": f">= {gpu.TARGET_TOKENS:,.0f} (aim {gpu.AIM_TOKENS:,.0f})",
            "mfu": f">= {gpu.TARGET_MFU:.0%} (aim {gpu.AIM_MFU:.0%})",
            "vs_torch": f">= {gpu.TARGET_RATIO}x",
            "curriculum_overhead": f"< {curriculum_gpu.TARGET_OVERHEAD:.0%} of a step",
            "host_pipeline_overhead": "(no target)"}
  lines.append("")
  if results["dry"]:
    lines.append("(dry run on the CPU: the verdicts check the plumbing, not a speed)")
  for key, show in fmt.items():
    if key in v:
      value = v[key]["value"]
      lines.append(f"{word(v[key]['pass']) if v[key]['target'] else 'info'} "
                   f"{show(value) if value is not None else key + ' n/a'}  -- target {target[key]}")
  t = v.get("gpu_tests", {})
  lines.append(f"{word(t.get('pass'))} GPU tests {t.get('value') or 'n/a'}")
  redo = rerun(results)
  if redo:
    lines.append(f"\nnot finished; to run it (on the same machine, while it is warm: the XLA cache "
                 f"is kept in /tmp):\n  {redo}")
  return lines


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


def main(argv: list[str] | None = None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--dry", action="store_true", help="CPU, tiny shapes, the same stages and files")
  ap.add_argument("--only", default="", help=f"comma-separated stages of {', '.join(STAGES)}")
  ap.add_argument("--budget", type=float, default=-1,
                  help=f"seconds for the whole check (default {GPU_BUDGET}; dry run: no limit)")
  ap.add_argument("--out", default="", help="output folder (default $OUT, else "
                  "bench/out/device_check)")
  ap.add_argument("--wheels", default=os.path.join(REPO, ".whl"), help="the carried wheels")
  args = ap.parse_args(argv)
  stages = [s for s in args.only.split(",") if s] if args.only else list(STAGES)
  unknown = [s for s in stages if s not in STAGES]
  if unknown:
    raise SystemExit(f"bench/device_check.py: unknown stage(s) {', '.join(unknown)}; the stages "
                     f"are {', '.join(STAGES)}")
  if "install" not in stages and set(stages) - {"env"}:
    # The later stages import ml_collections and tensorboardX from the installed wheels.
    stages.insert(1 if stages[0] == "env" else 0, "install")
  out = args.out or os.environ.get("OUT") or os.path.join(REPO, "bench", "out", "device_check")
  os.makedirs(out, exist_ok=True)
  for name in OUTPUTS:   # each call writes its own (the stages' tables are appended as they run)
    if os.path.exists(os.path.join(out, name)):
      os.remove(os.path.join(out, name))
  budget = args.budget if args.budget >= 0 else (0 if args.dry else GPU_BUDGET)
  ck = Check(out, args.dry, budget, args.wheels)
  ck.say(f"bench/device_check.py: stages {', '.join(stages)}; "
         + ("dry run on the CPU" if args.dry else "one NVIDIA GPU")
         + (f"; {budget:.0f} s budget" if budget else "") + f"; output in {out}")
  try:
    for i, name in enumerate(stages):
      timeout = stage_timeout(ck.caps, stages, i, ck.left())
      t0 = time.perf_counter()
      if timeout is None:
        status, figures = "skipped", {"why": f"{ck.left():.0f} s of the budget left"}
        ck.say(f"\n== {name}: skipped ({figures['why']}) ==")
      else:
        ck.say(f"\n== {name} (cap {timeout:.0f} s) ==")
        try:
          status, figures = STAGE_FNS[name](ck, timeout)
        except Exception as e:  # pylint: disable=broad-except -- the next stages still run
          status, figures = "failed", {"error": f"{type(e).__name__}: {e}"}
          ck.say(f"[{name} raised {type(e).__name__}: {e}]")
      ck.results["stages"][name] = {"status": status, "seconds": time.perf_counter() - t0,
                                    "figures": figures}
      ck.say(f"== {name}: {status} ({time.perf_counter() - t0:.0f} s) ==")
      if name == "env":
        ck.results["env"] = figures
  finally:
    ck.results["verdicts"] = summary(ck.results)
    ck.results["seconds"] = time.perf_counter() - ck.started
    with open(os.path.join(out, "results.json"), "w") as f:
      json.dump(ck.results, f, indent=1, default=str)
    for line in _summary_lines(ck.results):
      ck.say(line)
    ck.close()


if __name__ == "__main__":
  main()

"""The prepared GPU check: everything this project must measure on its first GPU, in one command of
at most 8 minutes on one NVIDIA GPU, each stage under its own time cap.

    bash bench/device_check.sh                 # = python3 -m bench.device_check; on the GPU machine
    bash bench/device_check.sh --dry           # CPU, tiny shapes, the same stages and output files
    bash bench/device_check.sh --only=tests,bench_more --budget=300   # what did not fit

Before: ``make gpu-wheels`` here fills ``.whl/`` with the wheels that the GPU machine's image lacks
(ml-collections, tensorboardX; under ``.whl/build/``, setuptools, wheel and packaging to build this
package there). The machine has Python 3.12, jax, flax, optax, orbax, torch and no network; the
device tool's call carries ``.whl`` (``carry: [".whl"]``) and runs ``bash bench/device_check.sh``
with a ``timeout_s`` of 540.

Stages, in the order of what matters most (``--only`` picks some; a stage that fails or times out
leaves the next ones their time; the process group of a stage past its cap is killed, so no GPU
work outlives it):

1. ``env``: ``python -m bench.device_env`` (the versions, devices, cuDNN), and which of
   bench/gpu.py's XLA flag sets this XLA accepts (one that it does not aborts jax at start-up: the
   tuned set falls back to none, a flag row is skipped).
2. ``install``: the carried wheels (``pip install --no-index --no-deps --target``), then this
   package from its source (``--no-deps``: over the machine's own jax, flax, optax, orbax), and an
   import of ``andrea_jax.train`` from the installed copy alone. Every later stage runs the working
   tree (the repository root first on ``PYTHONPATH``, the installed wheels after it).
3. ``bench``: ``python -m bench.gpu`` at B=64, T=1024, 20 timed steps per row: the product (cuDNN,
   plain causal, every lever, tuned flags) and the PyTorch yardstick (the targets), then the step
   with no lever and with each lever alone (fused loss, lean update, split qkv), all JAX rows in one
   process.
4. ``parts``: ``python -m bench.gpu --parts``: the blocks, the head and loss, and the update timed
   alone, each without and with its lever.
5. ``curriculum``: ``python -m bench.curriculum_gpu --steps=60``: two ANDREA-120M runs by the real
   launcher with the real host sampler, the ANDREA curriculum and the static mixture: the
   curriculum's overhead at GPU speed (60 steps: earlier checks found it far under the target).
6. ``tests``: the GPU-only tests, each under a 60 s cap where pytest-timeout is installed: the cuDNN
   attention against XLA (tests/test_attention.py) and inside the bf16 model against float32
   (tests/test_gpu.py), the fused loss in bf16 (tests/test_gpu.py), the bf16 embedding gradient
   (tests/test_model.py), the unstubbed cuDNN lowering (tests/test_lower_cuda.py); sharing the
   check's XLA cache, so that a rerun on a warm machine skips their compilations.
7. ``bench_more``: ``python -m bench.gpu`` for the other rows: the earlier yardstick (the loss
   outside ``torch.compile``), each flag of XLA's GPU guidance that this XLA accepts (kept only if
   it beats the product by 1%), the default flags, cuDNN packed (the document mask, as the
   curriculum runs train: the static run's step over it is the host pipeline's cost), XLA, remat.
Rows that would start with under a minute of their stage's cap left are skipped (their line says
so). If compiling ANDREA-120M's step takes much over 30 s, the whole does not fit in 8 minutes: the
summary then prints the command that runs what is left.

Output (``$OUT`` when set, else ``bench/out/device_check``; six files, none in a sub-folder):
``results.json`` (every stage's status, seconds and figures, the versions, and the verdicts),
``check.log`` (every stage's whole output), ``tests.txt``, ``bench_gpu.txt`` (the bench and parts
tables) and ``curriculum_gpu.txt``, and ``hlo.zip``: each JAX row's and part's optimized HLO, one
member each. The console stays quiet while the stages run (``--verbose`` streams them) and prints,
when the check ends, the verdicts first, most important first:

* ANDREA-120M at B=64, T=1024 on one H100-class GPU: >= 470K tokens/s (40% MFU by 6N + 12 L d T
  FLOPs per token), aiming at 520K (45%), and how far a miss is;
* >= 1.1x the PyTorch yardstick measured in the same run;
* what each lever brings alone and all together, and which flags win;
* the curriculum's overhead under 1% of a step;
then where a step's time goes (the parts), the tables, the stages' statuses.

This check has not run on a GPU yet in this form; ``--dry`` runs it end to end on a CPU
(tests/test_bench_gpu.py).
"""

from __future__ import annotations

import argparse
import importlib.util
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

from bench import device_summary as summary_lib
from bench import gpu

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
STAGES = ("env", "install", "bench", "parts", "curriculum", "tests", "bench_more")
OUTPUTS = ("results.json", "check.log", "tests.txt", "bench_gpu.txt", "curriculum_gpu.txt",
           "hlo.zip")
BENCH_ROWS = gpu.DEFAULT_ROWS             # the targets (product, yardstick) and the levers
MORE_ROWS = ("torch-eager-loss", *gpu.FLAG_ROWS, "cudnn-default", "cudnn-packed", "xla",
             "cudnn-remat")
CURRICULUM_STEPS, CURRICULUM_LOG_EVERY = 60, 10     # dry run: 20 and 5
TEST_CAP_S = 60                           # per GPU test, where pytest-timeout is installed
# The GPU-only tests, less the two that compile a whole training step (the bench compiles and runs
# the real one; tests/test_gpu.py::test_train_step_with_cudnn_in_bf16_matches_float32 and
# tests/test_lower_cuda.py's stubbed lowerings stay in the suite for a machine with more time).
GPU_TESTS = ["tests/test_gpu.py::test_cudnn_model_in_bf16_matches_float32_xla",
             "tests/test_gpu.py::test_fused_loss_in_bf16_on_the_gpu_matches_float64",
             "tests/test_gpu.py::test_peak_flops_known_for_this_gpu",
             "tests/test_attention.py::test_cudnn_matches_xla_in_bf16",
             "tests/test_attention.py::test_bf16_inputs_keep_float32_softmax",
             "tests/test_model.py::test_bf16_compute_keeps_float32_params_and_logits",
             "tests/test_model.py::test_bf16_embedding_gradient_is_accumulated_in_float32",
             "tests/test_lower_cuda.py::test_lower_cudnn_attention_for_cuda_without_a_stub"]


class Check:
  """The stages' shared state: output folder, deadline, console log, results."""

  def __init__(self, out: str, dry: bool, budget: float, wheels: str, verbose: bool = False):
    self.out, self.dry, self.wheels, self.verbose = out, dry, wheels, verbose
    self.started = time.perf_counter()
    self.budget = budget
    self.caps = summary_lib.DRY_CAPS if dry else summary_lib.CAPS
    self.site = tempfile.mkdtemp(prefix="andrea_site_")
    self.work = tempfile.mkdtemp(prefix="andrea_check_")
    self.results: dict = {"dry": dry, "budget_s": budget, "stages": {}}
    self.tuned_flags = True   # whether XLA accepts bench/gpu.py's tuned flags (the env stage asks)
    self.flag_rows = list(gpu.FLAG_ROWS)   # the flag rows whose flags XLA accepts (likewise)
    self.log = open(os.path.join(out, "check.log"), "a")

  def say(self, text: str, console: bool = False) -> None:
    """To check.log; to the console too with ``console`` or ``--verbose`` (the console gets the
    verdicts first, at the end)."""
    if console or self.verbose:
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
    """Runs ``cmd`` in its own process group, its output streamed to check.log and ``tee``;
    ``(exit code or None if killed at timeout, output)``."""
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


def probe_flags(ck: Check, names: list[str], timeout: float) -> dict[str, bool]:
  """Which of bench/gpu.py's flag sets this XLA accepts (an unknown flag aborts jax at start-up),
  each asked in its own process, all at once."""
  probe = "import jax; jax.devices(); print('flags accepted')"
  procs = {name: subprocess.Popen([sys.executable, "-c", probe], cwd=REPO, text=True,
                                  env=ck.env({"XLA_FLAGS": gpu.FLAG_SETS[name]}),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True) for name in names}
  deadline, out = time.perf_counter() + timeout, {}
  for name, proc in procs.items():
    try:
      text, _ = proc.communicate(timeout=max(deadline - time.perf_counter(), 1))
      out[name] = proc.returncode == 0 and "flags accepted" in text
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
      out[name], text = False, "timed out"
    if not out[name]:
      ck.say(f"XLA rejects the flag set {name} ({gpu.FLAG_SETS[name]}): "
             + (text.strip().splitlines() or ["no output"])[-1][:200])
  return out


def stage_env(ck: Check, timeout: float):
  code, text = ck.run([sys.executable, "-m", "bench.device_env"], timeout)
  found = [line[4:] for line in text.splitlines() if line.startswith("ENV ")]
  info = json.loads(found[-1]) if found else {}
  sets = ["tuned"] + [gpu.ROWS[row]["flags"] for row in gpu.FLAG_ROWS]
  accepted = probe_flags(ck, sets, min(timeout, 60))
  ck.tuned_flags = accepted["tuned"]
  ck.flag_rows = [row for row in gpu.FLAG_ROWS if accepted[gpu.ROWS[row]["flags"]]]
  info["tuned_flags_accepted"], info["flag_sets_accepted"] = ck.tuned_flags, accepted
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
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *GPU_TESTS]
  if importlib.util.find_spec("pytest_timeout"):
    cmd.insert(-len(GPU_TESTS), f"--timeout={TEST_CAP_S}")
  # conftest.py keeps the XLA cache it is handed only in a pytest-xdist worker (elsewhere it makes
  # a fresh one per run): the tests say they are one, so that they share the check's cache and a
  # rerun on the same machine skips their compilations.
  cache = ck.env()["JAX_COMPILATION_CACHE_DIR"]
  env = ck.env({"ANDREA_JAX_TEST_XLA_CACHE": cache, "PYTEST_XDIST_WORKER": "gw0"})
  code, text = ck.run(cmd, timeout, tee="tests.txt", env=env)
  counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)",
                                             text.splitlines()[-1] if text.strip() else "")}
  status = "timed out" if code is None else "ok" if code == 0 else "failed"
  return status, counts


def _bench(ck: Check, timeout: float, args: list[str], name: str, want: int | None):
  """``python -m bench.gpu`` with ``args``; ok when it exits 0 having measured ``want`` rows
  (None: the parts)."""
  path = os.path.join(ck.work, f"{name}.json")
  cmd = [sys.executable, "-m", "bench.gpu", *args, f"--budget={max(timeout - 15, 1):.0f}",
         "--timeout=240", f"--json={path}", f"--hlo={os.path.join(ck.out, 'hlo.zip')}"]
  cmd += ["--cpu", "--steps=2"] if ck.dry else ["--steps=20"]
  cmd += [] if ck.tuned_flags else ["--flags=default"]
  code, _ = ck.run(cmd, timeout, tee="bench_gpu.txt")
  figures = json.load(open(path)) if os.path.exists(path) else {}
  if want is None:
    done = "error" not in figures.get("parts", {"error": "none"})
  else:
    done = sum("tokens_per_s" in row.get("result", {}) for row in figures.get("rows", [])) == want
  status = "timed out" if code is None else "ok" if code == 0 and done else "failed"
  return status, figures


def stage_bench(ck: Check, timeout: float):
  return _bench(ck, timeout, [f"--rows={','.join(BENCH_ROWS)}"], "bench", len(BENCH_ROWS))


def stage_parts(ck: Check, timeout: float):
  return _bench(ck, timeout, ["--parts"], "parts", None)


def stage_bench_more(ck: Check, timeout: float):
  rows = [r for r in MORE_ROWS if not r.startswith("flag-") or r in ck.flag_rows]
  return _bench(ck, timeout, [f"--rows={','.join(rows)}"], "bench_more", len(rows))


def stage_curriculum(ck: Check, timeout: float):
  path = os.path.join(ck.work, "curriculum_gpu.json")
  cmd = [sys.executable, "-m", "bench.curriculum_gpu", f"--budget={max(timeout - 10, 1):.0f}",
         f"--workdir={os.path.join(ck.work, 'runs')}", f"--json={path}"]
  cmd += (["--cpu", "--steps=20", "--log_every=5"] if ck.dry else
          [f"--steps={CURRICULUM_STEPS}", f"--log_every={CURRICULUM_LOG_EVERY}"])
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


STAGE_FNS = {"env": stage_env, "install": stage_install, "bench": stage_bench,
             "parts": stage_parts, "curriculum": stage_curriculum, "tests": stage_tests,
             "bench_more": stage_bench_more}


def main(argv: list[str] | None = None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--dry", action="store_true", help="CPU, tiny shapes, the same stages and files")
  ap.add_argument("--only", default="", help=f"comma-separated stages of {', '.join(STAGES)}")
  ap.add_argument("--budget", type=float, default=-1, help="seconds for the whole check (default "
                  f"{summary_lib.GPU_BUDGET}; dry run: no limit)")
  ap.add_argument("--out", default="", help="output folder (default $OUT, else "
                  "bench/out/device_check)")
  ap.add_argument("--wheels", default=os.path.join(REPO, ".whl"), help="the carried wheels")
  ap.add_argument("--verbose", action="store_true", help="stream every stage's output here too")
  args = ap.parse_args(argv)
  stages = [s for s in args.only.split(",") if s] if args.only else list(STAGES)
  unknown = [s for s in stages if s not in STAGES]
  if unknown:
    raise SystemExit(f"bench/device_check.py: unknown stage(s) {', '.join(unknown)}; the stages "
                     f"are {', '.join(STAGES)}")
  # The later stages import ml_collections and tensorboardX from the installed wheels, and take the
  # flag sets XLA accepts from env: both come first whatever --only says.
  stages = [s for s in ("env", "install") if s in stages or set(stages) - {"env", "install"}] + [
      s for s in stages if s not in ("env", "install")]
  out = args.out or os.environ.get("OUT") or os.path.join(REPO, "bench", "out", "device_check")
  os.makedirs(out, exist_ok=True)
  for name in OUTPUTS:   # each call writes its own (the stages' tables are appended as they run)
    if os.path.exists(os.path.join(out, name)):
      os.remove(os.path.join(out, name))
  budget = args.budget if args.budget >= 0 else (0 if args.dry else summary_lib.GPU_BUDGET)
  ck = Check(out, args.dry, budget, args.wheels, args.verbose)
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
        ck.say(f"== {name}: {status} ({time.perf_counter() - t0:.0f} s) ==")
      ck.results["stages"][name] = {"status": status, "seconds": time.perf_counter() - t0,
                                    "figures": figures}
      if name == "env":
        ck.results["env"] = figures
  finally:
    ck.results["verdicts"] = summary_lib.summary(ck.results)
    ck.results["seconds"] = time.perf_counter() - ck.started
    with open(os.path.join(out, "results.json"), "w") as f:
      json.dump(ck.results, f, indent=1, default=str)
    ck.say("")
    for line in summary_lib.lines(ck.results):
      ck.say(line, console=True)
    ck.close()


if __name__ == "__main__":
  main()

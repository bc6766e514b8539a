"""Test-wide settings (for tests/ and the studies' tests): strict rank promotion (catches silent broadcasting bugs), a jit switch, and
property tests that draw the same examples on every run (``HYPOTHESIS_PROFILE=explore`` draws new
ones; ``python bench/faults.py`` runs the randomised campaigns)."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import hypothesis
import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")
# float32 matmuls in float32 on a GPU too (XLA may use TF32 there by default): the tests compare
# float32 results to 1e-6. On the CPU this is already the case.
jax.config.update("jax_default_matmul_precision", "highest")

# One XLA compilation cache for the whole run, shared with the processes the tests start: the suite
# builds the same small training and evaluation programs in test after test, and compiling them,
# not running them, is most of its time on 2 CPU cores. A fresh directory per run, so a test never
# reads what an older jax or an edited model compiled.
# Under pytest-xdist (``make test`` runs two workers) the process that starts the workers makes the
# directory and they inherit it through the environment, so the workers share their compilations;
# only a worker takes a directory it is handed (one left in a shell's environment is not reused).
_XLA_CACHE = os.environ.get("ANDREA_JAX_TEST_XLA_CACHE") if os.environ.get(
    "PYTEST_XDIST_WORKER") else None
if _XLA_CACHE is None:
  _XLA_CACHE = tempfile.mkdtemp(prefix="andrea_jax_test_xla_cache_")
  os.environ["ANDREA_JAX_TEST_XLA_CACHE"] = _XLA_CACHE
  atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
# And compiled with jax's "try not to do much optimization work" (LLVM at -O0, its expensive passes
# off; XLA's own graph passes unchanged), here and in the processes the tests start: the programs
# are tiny and run for a few steps, so the time LLVM spends optimising them is never won back (a
# third of the suite's CPU time: 40.3 -> 27.9 min on a 2-core EPYC, the tests 28.0 -> 20.6 min).
# Every bit-for-bit comparison in the suite is between programs compiled the same way; those against
# hand-worked numbers or PyTorch keep their tolerances. Users' runs keep the full optimisation.
os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
jax.config.update("jax_disable_most_optimizations", True)
# XLA's CPU runtime without its Eigen intra-op thread pool, here and in the processes the tests
# start (read when the backend starts, after this): two test workers already share the 2 cores, and
# the pool once wedged for good in CI while a worker waited on a small vmapped QR program (a known
# XLA CPU hang on vmapped graphs; this flag avoids it).
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_multi_thread_eigen=false"]).strip()
# And with XLA's older CPU fusion emitters (LLVM IR written directly, not through MLIR), here and in
# the processes the tests start: a small training step compiles in 1.5 s against 3.3 s at -O0 and
# runs as fast, with the same loss (test_step and test_curriculum_mixer: 142 -> 115 s). The process
# that starts the workers asks this XLA whether it knows the flag (an unknown flag aborts jax at
# start-up; a later XLA may drop this one) and hands the answer on through XLA_FLAGS.
_FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false"


def _xla_accepts(flag: str) -> bool:
  probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True,
                         env=dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS="cpu"), timeout=300)
  return probe.returncode == 0


if not os.environ.get("PYTEST_XDIST_WORKER") and _FAST_COMPILE not in os.environ["XLA_FLAGS"] \
    and _xla_accepts(_FAST_COMPILE):
  os.environ["XLA_FLAGS"] += " " + _FAST_COMPILE

hypothesis.settings.register_profile("repeatable", derandomize=True)
hypothesis.settings.register_profile("explore", derandomize=False)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(params=["eager", "jit"])
def maybe_jit(request):
  """Runs a test twice: once with the function as is, once under ``jax.jit``."""
  if request.param == "jit":
    return jax.jit
  return lambda f, **kw: f


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
  """One built-in corpus cache for the whole session (subprocesses inherit it through the env)."""
  import os
  path = str(tmp_path_factory.mktemp("andrea_cache"))
  old = os.environ.get("ANDREA_JAX_CACHE")
  os.environ["ANDREA_JAX_CACHE"] = path
  yield path
  if old is None:
    os.environ.pop("ANDREA_JAX_CACHE", None)
  else:
    os.environ["ANDREA_JAX_CACHE"] = old

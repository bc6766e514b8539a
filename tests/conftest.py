"""Test-wide settings: strict rank promotion (catches silent broadcasting bugs), a jit switch, and
property tests that draw the same examples on every run (``HYPOTHESIS_PROFILE=explore`` draws new
ones; ``python bench/faults.py`` runs the randomised campaigns)."""

import atexit
import os
import pathlib
import shutil
import struct
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

hypothesis.settings.register_profile("repeatable", derandomize=True)
hypothesis.settings.register_profile("explore", derandomize=False)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(params=["eager", "jit"])
def maybe_jit(request):
  """Runs a test twice: once with the function as is, once under ``jax.jit``."""
  if request.param == "jit":
    return jax.jit
  return lambda f, **kw: f


REPO = pathlib.Path(__file__).resolve().parent.parent


def small_run_config(num_steps: int = 30, **overrides):
  """The main job's config shrunk for tests: a 2-layer 32-wide model, 16 x 32-token batches.

  The curriculum keeps its three geometries, placed inside the short run.
  """
  import importlib.util

  from andrea_jax.curriculum import andrea_geometries

  spec = importlib.util.spec_from_file_location("tiny_config", REPO / "experiments" / "tiny.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.model.update(num_layers=2, num_heads=2, d_model=32, d_mlp=128, max_len=64)
  c.data.update(seq_len=32, global_batch_size=16, builtin_scale=0.25)
  # No TensorBoard files: tensorboardX imports torch when it is installed (seconds per process).
  c.train.update(num_steps=num_steps, log_every=5, checkpoint_every=10, progress_bar=False,
                 plot=False, tensorboard=False)
  c.eval.update(every=0, sequences_per_source=2, sample_tokens=8, prompts=("The ",))
  c.optim.update(warmup_steps=5, peak_lr=3e-3)
  # The three regimes at 0, 30% and 60% of the run (phases of 7-42 steps need room).
  c.curriculum.geometries = andrea_geometries(10**6)
  c.curriculum.geometries.v2_firehose.start_step = max(7, int(0.3 * num_steps))
  c.curriculum.geometries.v3_polish.start_step = max(14, int(0.6 * num_steps))
  c.cliff.update(window=10, warmup=10, cooldown=10)
  for key, value in overrides.items():
    section, field = key.split("__")
    c[section][field] = value
  return c


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


def tensorboard_scalars(logdir: pathlib.Path) -> list[tuple[str, int, float]]:
  """The scalars TensorBoard shows for ``logdir``, in the order written: its event files read in
  name order, a ``SessionLog.START`` at step s dropping the events read before it with step >= s (as
  TensorBoard's event accumulator does). Wall-clock tags are left out."""
  from tensorboardX.proto import event_pb2
  shown = []
  for name in sorted(os.listdir(logdir)):
    data = (logdir / name).read_bytes()
    at = 0
    while at < len(data):   # TFRecord: u64 length, u32 crc, payload, u32 crc
      (length,) = struct.unpack("<Q", data[at:at + 8])
      event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
      at += 12 + length + 4
      if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
        shown = [s for s in shown if s[1] < event.step]
      for v in event.summary.value:
        if v.tag not in ("tokens_per_s", "mfu"):
          shown.append((v.tag, event.step, v.simple_value))
  return shown

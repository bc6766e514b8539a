"""Session fixtures of the fault suite: a shared XLA compilation cache and the uninterrupted run."""

import numpy as np
import pytest

from andrea_jax import data as data_lib
from andrea_jax.data.corpora import synthetic
from tests.faults import harness


@pytest.fixture(scope="session")
def xla_cache(tmp_path_factory):
  """A persistent compilation cache for the suite's subprocesses (filled by the reference run)."""
  return str(tmp_path_factory.mktemp("xla_cache"))


@pytest.fixture(scope="session")
def reference(data_cache, xla_cache, tmp_path_factory):
  """The uninterrupted run of ``harness.fault_config()``: its workdir (it compiles everything)."""
  workdir = tmp_path_factory.mktemp("reference") / "run"
  config = harness.fault_config()
  seg = harness.run_segment(config, workdir, "none", env=harness.environment(xla_cache),
                            rng=np.random.default_rng(0), log=workdir.parent / "run.log",
                            num_steps=config.train.num_steps)
  assert seg.returncode == 0, seg.output[-3000:]
  return workdir


@pytest.fixture(scope="session")
def prepared(data_cache):
  """The built-in corpus of ``harness.fault_config()``, prepared once in the session's cache."""
  config = harness.fault_config()
  return synthetic.ensure_builtin(config.data.cache_dir, data_lib.load_tokenizer("bytes"),
                                 config.data.builtin_scale)

"""The mesh, the FSDP rule, and sharded training equal to single-device training.

The sharded runs need eight devices, which XLA simulates on the CPU only when
``--xla_force_host_platform_device_count=8`` is set before jax starts: they run in subprocesses
(this file run as a script), and their ``metrics.jsonl`` are compared here with a run in this
process, on its one CPU device.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from andrea_jax import logs
from andrea_jax import runconfig
from andrea_jax import sharding
from andrea_jax import train
from andrea_jax.model import andrea_120m, init_params
from tests.util import REPO, small_run_config

MESHES = ("8x1", "1x8", "2x4")
# float32 rounding, compounded over 24 AdamW steps: the batch's loss and gradient are sums that a
# mesh splits over devices and all-reduces, so their terms are added in another order (measured: at
# most 1.1e-6 relative, on a gradient norm; 3e-7 on the losses).
RTOL = 2e-5


def reference_config() -> ml_collections.ConfigDict:
  """The run every sharded or multi-process run is compared with (also used by test_multihost)."""
  c = small_run_config(num_steps=24)
  c.train.log_every = 1            # every step's loss, weights and curriculum state are compared
  c.train.checkpoint_every = 8
  c.eval.sample_tokens = 0         # no sampling: its compilation would dominate the test
  return c


@functools.cache
def _reference_records(basetemp: str) -> tuple:
  workdir = os.path.join(basetemp, "single_device_reference")
  train.train_and_evaluate(reference_config(), workdir)
  return tuple(logs.read_jsonl(os.path.join(workdir, "metrics.jsonl")))


def reference_records(tmp_path_factory) -> list[dict]:
  """``metrics.jsonl`` of :func:`reference_config` on this process's one device (once a session)."""
  return list(_reference_records(str(tmp_path_factory.getbasetemp())))


def assert_same_records(got: list[dict], want: list[dict], rtol: float = RTOL):
  """Same steps, same keys, equal integers and strings, floats within ``rtol``."""
  assert [r["step"] for r in got] == [r["step"] for r in want]
  for g, w in zip(got, want):
    assert g.keys() == w.keys(), (w["step"], sorted(g.keys() ^ w.keys()))
    for k, v in w.items():
      if isinstance(v, float):
        np.testing.assert_allclose(g[k], v, rtol=rtol, atol=1e-7, err_msg=f"step {w['step']} {k}")
      else:
        assert g[k] == v, (w["step"], k, g[k], v)


def _mesh_cfg(data=-1, fsdp=1, fsdp_min_size=2**16):
  return ml_collections.ConfigDict(dict(data=data, fsdp=fsdp, fsdp_min_size=fsdp_min_size))


def test_mesh_shape_resolves_and_names_the_field():
  assert sharding.mesh_shape(_mesh_cfg(), 8) == (8, 1)
  assert sharding.mesh_shape(_mesh_cfg(fsdp=4), 8) == (2, 4)
  assert sharding.mesh_shape(_mesh_cfg(data=2, fsdp=4), 8) == (2, 4)
  assert sharding.mesh_shape(_mesh_cfg(), 1) == (1, 1)
  with pytest.raises(ValueError, match="mesh.fsdp = 3 does not divide the 8 devices"):
    sharding.mesh_shape(_mesh_cfg(fsdp=3), 8)
  with pytest.raises(ValueError, match=r"mesh.data x mesh.fsdp = 3 x 2 = 6 does not divide the 8"):
    sharding.mesh_shape(_mesh_cfg(data=3, fsdp=2), 8)
  with pytest.raises(ValueError, match=r"= 4 uses only part of the 8 devices"):
    sharding.mesh_shape(_mesh_cfg(data=2, fsdp=2), 8)
  with pytest.raises(ValueError, match=r"= 4 needs more than the 2 devices"):
    sharding.mesh_shape(_mesh_cfg(data=2, fsdp=2), 2)
  with pytest.raises(ValueError, match="mesh.data must be -1"):
    sharding.mesh_shape(_mesh_cfg(data=0), 8)
  with pytest.raises(ValueError, match="mesh.fsdp must be >= 1, got 0"):
    sharding.mesh_shape(_mesh_cfg(fsdp=0), 8)
  with pytest.raises(TypeError, match="mesh.fsdp must be an integer"):
    sharding.mesh_shape(_mesh_cfg(fsdp=2.0), 8)


def test_runconfig_rejects_a_mesh_or_batch_that_does_not_fit_before_compiling():
  c = small_run_config()
  c.mesh.fsdp = 2                 # this process has one CPU device
  with pytest.raises(ValueError, match="mesh.fsdp = 2 does not divide the 1 devices"):
    runconfig.build(c)
  c = small_run_config()          # 16 rows
  c.optim.grad_accum_steps = 3
  with pytest.raises(ValueError, match=r"data.global_batch_size = 16 is not a multiple of "
                                       r"optim.grad_accum_steps x devices = 3 x 1"):
    runconfig.build(c)
  mesh = runconfig.build(small_run_config()).mesh
  assert sharding.mesh_shape(mesh, 1) == (1, 1) and (mesh.data, mesh.fsdp) == (-1, 1)


def test_fsdp_rule_on_hand_worked_shapes():
  # The largest dimension divisible by the fsdp size; the lower index on ties; else replicated.
  assert sharding.fsdp_spec((768, 3072), 8, 2**16) == P(None, "fsdp")
  assert sharding.fsdp_spec((50304, 768), 8, 2**16) == P("fsdp", None)
  assert sharding.fsdp_spec((768, 768), 8, 2**16) == P("fsdp", None)
  assert sharding.fsdp_spec((12, 9), 3, 1) == P("fsdp", None)     # 12 > 9, both divisible
  assert sharding.fsdp_spec((10, 9), 3, 1) == P(None, "fsdp")     # only 9 is divisible
  assert sharding.fsdp_spec((5, 7), 2, 1) == P()                  # nothing divisible
  assert sharding.fsdp_spec((3072,), 8, 2**16) == P()             # small: replicated
  assert sharding.fsdp_spec((3072,), 8, 3072) == P("fsdp")        # at the threshold: split
  assert sharding.fsdp_spec((), 8, 0) == P()                      # scalars
  assert sharding.fsdp_spec((768, 3072), 1, 0) == P()             # fsdp = 1: plain DP


def test_fsdp_rule_on_andrea_120m_splits_every_matrix_and_no_vector():
  shapes = jax.eval_shape(init_params, andrea_120m(), jax.random.key(0))
  specs = {jax.tree_util.keystr(p): sharding.fsdp_spec(x.shape, 8, 2**16)
           for p, x in jax.tree_util.tree_flatten_with_path(shapes)[0]}
  for name, spec in specs.items():
    leaf_ndim = len(spec) if spec != P() else None
    if name.endswith("['bias']") or name.endswith("['scale']"):
      assert spec == P(), name
    else:
      assert leaf_ndim == 2 and "fsdp" in spec, name
  assert specs["['wte']['embedding']"] == P("fsdp", None)          # [50304, 768]
  assert specs["['h_0']['attn']['c_attn']['kernel']"] == P(None, "fsdp")   # [768, 2304]
  assert specs["['h_0']['attn']['c_proj']['kernel']"] == P("fsdp", None)   # [768, 768], a tie
  assert specs["['h_0']['mlp']['c_proj']['kernel']"] == P("fsdp", None)    # [3072, 768]


def test_one_device_mesh_holds_the_whole_batch():
  mesh = sharding.make_mesh(_mesh_cfg())
  assert dict(mesh.shape) == {"data": 1, "fsdp": 1}
  bs = sharding.batch_sharding(mesh)
  assert sharding.process_rows(bs, 16) == (0, 16)
  local = {"inputs": np.arange(32, dtype=np.int32).reshape(16, 2)}
  np.testing.assert_array_equal(sharding.global_batch(local, bs, 16)["inputs"], local["inputs"])


@pytest.mark.slow
def test_eight_devices_train_like_one_for_every_mesh(tmp_path, tmp_path_factory, data_cache):
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=8",
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"))   # the report's init: cached
  # One subprocess per mesh, started first, so their compilations overlap the reference run's.
  procs = {m: subprocess.Popen([sys.executable, "-m", "tests.test_sharding", str(tmp_path), m],
                               cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for m in MESHES}
  try:
    want = reference_records(tmp_path_factory)
    outs = {m: p.communicate(timeout=400) for m, p in procs.items()}
  finally:
    for p in procs.values():
      if p.poll() is None:
        p.kill()
  report = {}
  for m, p in procs.items():
    assert p.returncode == 0, outs[m][0][-3000:] + outs[m][1][-3000:]
    report[m] = json.loads(outs[m][0].strip().splitlines()[-1])
    assert report[m]["devices"] == 8
    assert report[m]["mesh"] == [int(n) for n in m.split("x")]
  # Parameters and moments were created split: 1/8 of wte's 384 rows (and of its Adam moment) per
  # device on the fsdp = 8 mesh, a LayerNorm scale [32] split into 4s, nothing split on 8x1.
  assert report["1x8"]["wte"] == [48, 32] and report["1x8"]["wte_mu"] == [48, 32]
  assert report["1x8"]["ln_f"] == [4]
  assert report["2x4"]["wte"] == [96, 32]
  assert report["8x1"]["wte"] == [384, 32]
  for m in MESHES:
    assert_same_records(logs.read_jsonl(str(tmp_path / m / "metrics.jsonl")), want)


def _sharded_run(root: str, name: str) -> None:
  """(Subprocess, eight devices) Train the reference config on mesh ``name``; print a report."""
  data, fsdp = (int(n) for n in name.split("x"))
  c = reference_config()
  c.mesh.update(data=data, fsdp=fsdp, fsdp_min_size=1)   # split every divisible parameter
  train.train_and_evaluate(c, os.path.join(root, name))
  # The state as the loop creates it: what one device holds of a few arrays.
  run = runconfig.build(c)
  mesh = sharding.make_mesh(c.mesh)
  state, _ = sharding.init_sharded(lambda: train.init_state(run, train.run_keys(c.seed)),
                                   lambda s: sharding.state_shardings(s, mesh, 1))
  local = {jax.tree_util.keystr(p): list(x.addressable_shards[0].data.shape)
           for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}
  pick = lambda *parts: [v for k, v in local.items() if all(q in k for q in parts)][0]
  print(json.dumps({"devices": jax.device_count(), "mesh": [mesh.shape["data"], mesh.shape["fsdp"]],
                    "wte": pick(".params", "wte"), "wte_mu": pick(".mu", "wte"),
                    "ln_f": pick(".params", "ln_f", "scale")}))


if __name__ == "__main__":
  _sharded_run(sys.argv[1], sys.argv[2])

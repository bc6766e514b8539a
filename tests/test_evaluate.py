"""The held-out evaluation: chunked to a training micro-batch, split over the mesh, and equal to the
per-token cross-entropy worked out row by row with numpy.

The four-device check needs ``--xla_force_host_platform_device_count`` before jax starts: it runs in
a subprocess (this file run as a script).
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from andrea_jax import data as data_lib
from andrea_jax import evaluate as eval_lib
from andrea_jax import runconfig
from andrea_jax import sharding
from andrea_jax import train
from tests.util import REPO, small_run_config


def _config():
  c = small_run_config()
  # 40-row training batches (micro-batches of 40): 16 sources x 3 held-out windows = 48 rows, so
  # two chunks (as many as 40-row ones would need) of 24.
  c.data.global_batch_size = 40
  c.eval.update(sequences_per_source=3, sample_tokens=0)
  return c


def _setup(c):
  run = runconfig.build(c)
  tokenizer = run.data.tokenizer
  data = data_lib.open_training_data(run.data, required=run.evaluated, progress=False)
  params = jax.jit(lambda: train.init_state(run, train.run_keys(c.seed)))().params
  return run, tokenizer, data, params


def _by_hand(run, params, batch) -> dict[str, float]:
  """Mean cross-entropy per source, one row at a time through the model, log-softmax in numpy."""
  model = run.step.model
  sums, counts = {}, {}
  for i in range(len(batch["inputs"])):
    row = {k: v[i:i + 1] for k, v in batch.items()}
    logits = np.asarray(model.apply({"params": params}, row["inputs"],
                                    segment_ids=row["segment_ids"], positions=row["positions"]),
                        np.float64)[0]
    m = logits.max(-1, keepdims=True)
    logz = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    nll = logz - logits[np.arange(len(logits)), row["targets"][0]]
    keep = row["segment_ids"][0] > 0
    name = run.sources[int(row["source_ids"][0])]
    sums[name] = sums.get(name, 0.0) + float(nll[keep].sum())
    counts[name] = counts.get(name, 0) + int(keep.sum())
  return {n: sums[n] / counts[n] for n in sums}


def test_eval_chunks_cut_and_pad_by_hand():
  batch = {"inputs": np.arange(10, dtype=np.int32).reshape(5, 2),
           "segment_ids": np.ones((5, 2), np.int32)}
  chunks = eval_lib.eval_chunks(batch, 2)
  assert [c["inputs"].shape for c in chunks] == [(2, 2)] * 3
  np.testing.assert_array_equal(chunks[2]["inputs"], [[8, 9], [0, 0]])
  np.testing.assert_array_equal(chunks[2]["segment_ids"], [[1, 1], [0, 0]])   # padding counts 0
  assert chunks[0]["inputs"].dtype == np.int32
  assert len(eval_lib.eval_chunks(batch, 5)) == 1
  for bad, error, message in ((0, ValueError, "must be >= 1, got 0"),
                              (-1, ValueError, "must be >= 1, got -1"),
                              (2.0, TypeError, "must be an integer, got 2.0"),
                              (True, TypeError, "must be an integer, got True")):
    with pytest.raises(error, match=f"eval_chunks: chunk_rows {message}"):
      eval_lib.eval_chunks(batch, bad)


@pytest.mark.slow
def test_losses_equal_the_cross_entropy_worked_out_row_by_row(data_cache):
  c = _config()
  run, tokenizer, data, params = _setup(c)
  evaluator = eval_lib.HeldOut(run, data, tokenizer)
  assert len(evaluator.batch["inputs"]) == 48 and evaluator.chunk_rows == 24
  assert len(evaluator._chunks) == 2
  got = evaluator.losses(params)
  want = _by_hand(run, params, evaluator.batch)
  assert got.keys() == want.keys()
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=2e-5, err_msg=name)
  # Micro-batches of 10 rows (grad_accum_steps 4): five chunks of 10, the last with 2 rows of
  # padding, the same losses.
  c.optim.grad_accum_steps = 4
  small = eval_lib.HeldOut(runconfig.build(c), data, tokenizer)
  assert small.chunk_rows == 10 and len(small._chunks) == 5
  for name, v in small.losses(params).items():
    np.testing.assert_allclose(v, want[name], rtol=2e-5, err_msg=name)


@pytest.mark.slow
def test_four_devices_each_evaluate_a_quarter_of_the_rows(tmp_path, data_cache):
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=4")
  p = subprocess.run([sys.executable, "-m", "tests.test_evaluate"], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  report = json.loads(p.stdout.strip().splitlines()[-1])
  c = _config()
  run, tokenizer, data, params = _setup(c)
  want = _by_hand(run, params, eval_lib.HeldOut(run, data, tokenizer).batch)
  for mesh, got in report.items():
    assert got["rows_per_device"] == [6, 6], mesh    # 24-row chunks, a quarter on each device
    assert got["losses"].keys() == want.keys()
    for name in want:
      np.testing.assert_allclose(got["losses"][name], want[name], rtol=2e-5, err_msg=(mesh, name))


def _four_device_report() -> None:
  """(Subprocess, four devices) Evaluate on a 4 x 1 and a 2 x 2 mesh; print what each holds."""
  c = _config()
  run, tokenizer, data, params = _setup(c)
  report = {}
  for data_axis, fsdp in ((4, 1), (2, 2)):
    c.mesh.update(data=data_axis, fsdp=fsdp, fsdp_min_size=1)
    mesh = sharding.make_mesh(c.mesh)
    placed = jax.device_put(params, sharding.fsdp_shardings(params, mesh, 1))
    evaluator = eval_lib.HeldOut(run, data, tokenizer, mesh=mesh)
    rows = [{s.data.shape[0] for s in chunk["inputs"].addressable_shards}
            for chunk in evaluator._chunks]
    assert all(len(r) == 1 for r in rows), rows
    report[f"{data_axis}x{fsdp}"] = {"rows_per_device": [r.pop() for r in rows],
                                     "losses": evaluator.losses(placed)}
  print(json.dumps(report))


if __name__ == "__main__":
  _four_device_report()

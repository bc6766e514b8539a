"""The terrain's memory budget: chunk sizes from it, and chunked results equal to unchunked ones."""

import dataclasses
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import config as config_lib
from andrea_jax import step as step_lib
from andrea_jax import resume, terrain
from andrea_jax.model import Transformer, init_params, tiny
from andrea_jax.terrain import budget as budget_lib
from andrea_jax.terrain import run as terrain_run

GIB = 2 ** 30


def test_compiled_bytes_is_the_programs_own_allocation():
  # outer(x, x) of 1000 floats allocates its 1000 x 1000 float32 output and nothing else; the
  # argument (4000 bytes) is not counted.
  assert budget_lib.compiled_bytes(lambda x: jnp.outer(x, x), jnp.ones(1000)) == 1000 * 1000 * 4
  # Abstract shapes are enough: nothing runs.
  shape = jax.ShapeDtypeStruct((250,), jnp.float32)
  assert budget_lib.compiled_bytes(lambda x: jnp.outer(x, x), shape) == 250 * 250 * 4


def test_default_budget_is_half_the_reported_memory_else_2_gib():
  assert budget_lib.default_memory_budget() == 2 * GIB   # the CPU reports no memory
  gpu = types.SimpleNamespace(memory_stats=lambda: {"bytes_limit": 100 * GIB, "bytes_in_use": 0})
  assert budget_lib.default_memory_budget(gpu) == 50 * GIB
  assert budget_lib.budget_bytes(0) == budget_lib.budget_bytes(None) == 2 * GIB
  assert budget_lib.budget_bytes(1.5) == 3 * 2 ** 29
  for bad, error, rule in ((-1, ValueError, "must be >= 0, got -1.0"),
                           (float("nan"), ValueError, "must be finite, got nan"),
                           (float("inf"), ValueError, "must be finite, got inf"),
                           ("2", TypeError, "must be a number or None, got '2'"),
                           (True, TypeError, "must be a number or None, got True")):
    with pytest.raises(error) as e:
      budget_lib.budget_bytes(bad, name="terrain.memory_budget_gib")
    assert str(e.value) == f"terrain.memory_budget_gib {rule} (a number of GiB; 0 = automatic)"
  assert budget_lib.format_bytes(3 * 2 ** 29) == "1.50 GiB"
  assert budget_lib.format_bytes(5 * 2 ** 20) == "5.0 MiB"


def test_per_chunk_counts_what_fits_and_refuses_what_does_not():
  assert budget_lib.per_chunk(300, 1000, what="perturbed loss") == 3
  assert budget_lib.per_chunk(300, 1000, what="perturbed loss", limit=2) == 2
  assert budget_lib.per_chunk(1000, 1000, what="perturbed loss") == 1
  with pytest.raises(ValueError, match=r"one perturbed loss needs 2.0 MiB, over the memory budget "
                                       r"of 1.0 MiB"):
    budget_lib.per_chunk(2 * 2 ** 20, 2 ** 20, what="perturbed loss")


def _small_model():
  """A 2-layer byte model and 7 held-out rows of 16 tokens, two documents per row, one padding
  row (segment id 0: it must not count), shaped like the trainer's evaluation batch."""
  cfg = tiny(num_layers=2, num_heads=2, d_model=32, d_mlp=64, max_len=16)
  params = init_params(cfg, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  rows, t = 7, 16
  seg = np.where(np.arange(t) < 9, 1, 2)[None].repeat(rows, 0).astype(np.int32)
  seg[-1] = 0
  pos = np.concatenate([np.arange(9), np.arange(t - 9)])[None].repeat(rows, 0).astype(np.int32)
  batch = {"inputs": rng.integers(0, 257, (rows, t)).astype(np.int32),
           "targets": rng.integers(0, 257, (rows, t)).astype(np.int32),
           "segment_ids": seg, "positions": pos, "source_ids": np.arange(rows, dtype=np.int32)}
  return cfg, params, batch


@pytest.mark.slow
def test_window_chunks_change_no_value_gradient_or_hvp():
  cfg, params, batch = _small_model()
  whole = terrain_run.heldout_loss_fn(cfg, batch)
  # Independent of the chunking: the masked mean token loss written out over rows one at a time.
  model = Transformer(dataclasses.replace(cfg, attention_impl="xla", dtype="float32"))
  row_sum = jax.jit(lambda p, b: step_lib.token_losses(model, p, b)[0].sum())
  total = sum(float(row_sum(params, {k: v[i:i + 1] for k, v in batch.items()})) for i in range(7))
  assert float(jax.jit(whole)(params)) == pytest.approx(total / (6 * 16), rel=1e-6)
  v = terrain.random_direction(jax.random.key(1), params, ignore_1d=False)

  def value_grad_hvp(p, v, window_batch):
    f = terrain_run.heldout_loss_fn(cfg, batch, window_batch=window_batch)
    return f(p), jax.grad(f)(p), terrain.hvp(f, p, v)

  value_grad_hvp = jax.jit(value_grad_hvp, static_argnums=2)
  ref = value_grad_hvp(params, v, None)
  for windows in (1, 3, 6):   # 7 rows: uneven chunks get a padding row
    got = value_grad_hvp(params, v, windows)
    assert float(got[0]) == pytest.approx(float(ref[0]), rel=1e-6)
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(ref[1])):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    for a, b in zip(jax.tree.leaves(got[2]), jax.tree.leaves(ref[2])):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  with pytest.raises(ValueError, match="heldout_loss_fn: window_batch must be >= 1, got 0"):
    terrain_run.heldout_loss_fn(cfg, batch, window_batch=0)


def test_window_chunks_cut_the_memory_of_a_gradient():
  cfg, params, batch = _small_model()
  batch = {k: np.concatenate([v] * 8) for k, v in batch.items()}   # 56 rows
  whole = budget_lib.hvp_bytes(terrain_run.heldout_loss_fn(cfg, batch), params)
  chunked = budget_lib.hvp_bytes(terrain_run.heldout_loss_fn(cfg, batch, window_batch=4), params)
  assert chunked < whole / 4   # the activations of 4 rows at a time, not 56


@pytest.mark.slow
def test_windows_per_chunk_fits_the_budget():
  cfg, params, batch = _small_model()
  rows = batch["inputs"].shape[0]
  assert terrain_run.windows_per_chunk(cfg, batch, params, 2 * GIB) == rows
  one = budget_lib.hvp_bytes(terrain_run.heldout_loss_fn(cfg, {k: v[:1] for k, v in batch.items()}),
                             params)
  whole = budget_lib.hvp_bytes(terrain_run.heldout_loss_fn(cfg, batch), params)
  budget = (one + whole) // 2
  count = terrain_run.windows_per_chunk(cfg, batch, params, budget)
  assert 1 <= count < rows
  chunked = terrain_run.heldout_loss_fn(cfg, batch, window_batch=count)
  assert budget_lib.hvp_bytes(chunked, params) <= budget
  with pytest.raises(ValueError, match=r"one Hessian-vector product on one held-out window needs "
                                       r".* beside .* of Lanczos basis, over the memory budget"):
    terrain_run.windows_per_chunk(cfg, batch, params, 2 * GIB, reserve=2 * GIB)


@pytest.mark.slow
def test_samples_and_points_computed_a_chunk_at_a_time_are_the_same():
  """A sample's (or a point's) value does not depend on the others computed with it: the same
  indices in another order give the same numbers, reordered; chunked calls equal one call."""
  cfg, params, batch = _small_model()
  loss_fn = terrain_run.heldout_loss_fn(cfg, batch)
  key = jax.random.key(3)
  sig = [0.05, 0.2]
  losses = jax.jit(lambda p, ids: terrain.perturbed_losses(loss_fn, p, key, sig, ids))
  all_NxK = losses(params, jnp.arange(4))
  np.testing.assert_allclose(losses(params, jnp.array([2, 3, 0, 1])), np.asarray(all_NxK)[[2, 3, 0, 1]],
                             rtol=1e-6)
  sharp = jax.jit(lambda p: terrain.perturbation_sharpness(loss_fn, p, key, sig, 4,
                                                           batch_size=3))(params)
  np.testing.assert_allclose(sharp.increase_KxN, all_NxK.T - sharp.base_loss, rtol=1e-5,
                             atol=1e-6)
  quad = jax.jit(lambda p, ids: terrain.hutchinson_samples(loss_fn, p, key, ids))
  np.testing.assert_allclose(quad(params, jnp.array([1, 0])), quad(params, jnp.array([0, 1]))[::-1],
                             rtol=1e-5)
  dx = terrain.random_direction(jax.random.key(4), params)
  dy = terrain.random_direction(jax.random.key(5), params)
  g = jnp.linspace(-1.0, 1.0, 3)
  grid = jax.jit(lambda p: terrain.loss_slice_2d(loss_fn, p, dx, dy, g, g, batch_size=4))(params)
  on_plane = jax.jit(lambda p, a, b: terrain.loss_on_plane(loss_fn, p, dx, dy, a, b))
  np.testing.assert_allclose(on_plane(params, jnp.array([1.0, -1.0]), jnp.array([0.0, 1.0])),
                             [grid[2, 1], grid[0, 2]], rtol=1e-6)
  with pytest.raises(ValueError, match="same shape"):
    terrain.loss_on_plane(loss_fn, params, dx, dy, [1.0, 0.0], [0.0])


_SETTINGS = {"sigmas": [0.2], "num_samples": 2, "hessian_k": 2, "hessian_iters": 3,
             "trace_samples": 1, "slice_points": 3}


def _numbers(rep):
  """The measured numbers of a report (not its timings or chunk sizes)."""
  keep = ("loss", "param_norm", "sharpness", "slice_1d", "slice_2d", "hessian")
  return {k: rep[k] for k in keep}


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _assert_same_numbers(a, b, rtol):
  """Equal to float32 precision: ``rtol`` on every number, and an absolute 1e-5 (2e-6 of the loss,
  ~5.5: a few float32 ulps) on the sharpness increases, differences of two such losses."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  np.testing.assert_allclose(_flat(a), _flat(b), rtol=rtol, atol=1e-5)


@pytest.mark.slow
def test_basin_report_in_chunks_equals_the_report_at_once():
  """One point and one window at a time against everything at once: float32 rounding apart, the
  same numbers (the Lanczos eigenvalues sum their HVPs in another order: a looser tolerance)."""
  cfg, params, batch = _small_model()
  key = jax.random.key(0)
  at_once = terrain.basin_report(terrain_run.heldout_loss_fn(cfg, batch), params, key,
                                 batch_size=1000, **_SETTINGS)
  chunked = terrain.basin_report(terrain_run.heldout_loss_fn(cfg, batch, window_batch=2), params,
                                 key, batch_size=1, **_SETTINGS)
  assert at_once["complete"] and chunked["complete"]
  _assert_same_numbers(_numbers(chunked), _numbers(at_once), rtol=2e-5)
  assert chunked["chunks"]["points"] == 1 and at_once["chunks"]["points"] == 1000
  # A budget of 2.5 perturbed losses: chunks of 2 points, the last one padded (9 points).
  loss_fn = terrain_run.heldout_loss_fn(cfg, batch)
  budget = 5 * budget_lib.point_bytes(loss_fn, params) // 2
  no_hessian = dict(_SETTINGS, hessian_k=0, trace_samples=0)
  budgeted = terrain.basin_report(loss_fn, params, key, memory_budget=budget, **no_hessian)
  assert budgeted["chunks"]["memory_budget_bytes"] == budget
  assert budgeted["chunks"]["points"] == 2
  for part in ("loss", "sharpness", "slice_1d", "slice_2d"):
    _assert_same_numbers(budgeted[part], at_once[part], rtol=2e-5)


def test_chunk_plan_follows_the_budget_and_refuses_what_cannot_fit():
  cfg, params, batch = _small_model()
  loss_fn = terrain_run.heldout_loss_fn(cfg, batch)
  loss_b = budget_lib.point_bytes(loss_fn, params)
  hvp_b = budget_lib.hvp_bytes(loss_fn, params)
  weights = sum(x.size * 4 for x in jax.tree.leaves(params))
  budget = 10 * hvp_b
  plan = terrain.chunk_plan(loss_fn, params, memory_budget=budget)
  assert plan == {"memory_budget_bytes": budget, "perturbed_loss_bytes": loss_b, "hvp_bytes": hvp_b,
                  "points": budget // loss_b, "sharpness_samples": budget // (loss_b + weights),
                  "trace_samples": budget // (hvp_b + weights)}
  assert terrain.chunk_plan(loss_fn, params, batch_size=5)["points"] == 5
  with pytest.raises(ValueError, match="one perturbed loss needs"):
    terrain.chunk_plan(loss_fn, params, memory_budget=loss_b - 1)
  num = sum(x.size for x in jax.tree.leaves(params))
  # 30 Lanczos steps keep 30 * num float32 numbers: a budget of 20 such steps cannot hold them.
  with pytest.raises(ValueError, match=r"30 Lanczos steps \(hessian_iters\) keep a basis of .* "
                                       r"lower hessian_iters"):
    terrain.chunk_plan(loss_fn, params, memory_budget=20 * num * 4, lanczos_iters=30)


@pytest.mark.slow
def test_an_interrupted_report_keeps_the_parts_it_measured(tmp_path):
  cfg, params, batch = _small_model()
  loss_fn = terrain_run.heldout_loss_fn(cfg, batch)

  def stop_after_the_1d_slice(report, part):
    if part == "hessian":
      raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    terrain.write_basin_report(loss_fn, params, jax.random.key(0), tmp_path, batch_size=4,
                               on_part=stop_after_the_1d_slice, **_SETTINGS)
  on_disk = json.loads((tmp_path / "basin.json").read_text())
  assert on_disk["complete"] is False
  assert list(on_disk["seconds"]) == ["loss", "sharpness", "slice_1d"]
  assert len(on_disk["slice_1d"]["losses"]) == 3 and "slice_2d" not in on_disk
  assert (tmp_path / "sharpness.png").exists() and (tmp_path / "slice_1d.png").exists()
  assert not (tmp_path / "slice_2d.png").exists()
  assert on_disk["slice_1d"]["losses"][0] is not None


@pytest.mark.slow
def test_the_progress_bar_counts_every_evaluation(capsys):
  cfg, params, batch = _small_model()
  terrain.basin_report(terrain_run.heldout_loss_fn(cfg, batch), params, jax.random.key(0),
                       batch_size=4, progress=True, **_SETTINGS)
  err = capsys.readouterr().err
  # 1 loss + 2 samples x 1 sigma + 3 points + 3 Lanczos steps + 1 Hutchinson vector + 9 points.
  assert "19/19" in err and "slice_2d" in err


def test_the_budget_is_a_config_field_that_a_resume_may_change():
  c = config_lib.base_config()
  assert c.terrain.memory_budget_gib == 0.0   # automatic
  now = c.to_dict()
  before = {k: v for k, v in now.items() if k != "terrain"}   # a run trained before the field
  assert resume.config_changes(before, now) == []
  changed = dict(now, terrain={"memory_budget_gib": 8.0})
  assert resume.config_changes(changed, now) == []
  assert resume.config_changes(dict(now, seed=1), now) == ["seed: 1 -> 0"]
